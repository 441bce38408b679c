"""Paper B's scaling laws: excess loss against T for GD and Muon, and a data-scaling envelope.

Synthetic part (Li et al. 2026, arXiv 2602.05725; statements and readings in
``docs/science.md#paper-b``). Task space (E = Ẽ = I; the dynamics do not depend
on orthonormal embeddings), hierarchical prior ``p_j = p̃_g / C`` with
``p̃_g ∝ g^{-β}``, label noise α, loss ``L(W) = -Σ_j p_j Σ_i p(i|j) log p̂(i|j)`` with
Bayes optimum ``L*`` (``amemory.data.memory_tasks.optimal_loss``). From ``W_0 = 0``:

* GD with constant ``η = c_GD / p_1``: ``L^GD(T) - L* ≳ log K · T^{-(1-1/β)}`` (lower
  bound, visible while ``T ≪ M^β``);
* Muon (no momentum, exact msgn) with ``η = c log K / T``, a fresh run per T:
  ``L^Muon(T) - L* ≲ (log K / T)^2``, independent of β (upper bound).

Real-corpus part: for each step budget the minimum final validation loss over a
learning-rate grid (the envelope), for Adam and Muon.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import ConfigDict

from amemory.analysis import one_step, plots
from amemory.analysis.scaling import fit_power_law
from amemory.data import frequencies, memory_tasks
from amemory.models import memory
from experiments import common, train_runs


def _loss(W: jax.Array, prior: jax.Array, noise: jax.Array) -> jax.Array:
    eye = jnp.eye(W.shape[0], dtype=W.dtype)
    return memory.population_loss(W, eye, eye, prior, noise)


@functools.partial(jax.jit, static_argnums=(0,))
def gd_curve(steps: int, prior: jax.Array, noise: jax.Array, lr: jax.Array) -> jax.Array:
    """GD ``W ← W - lr ∇L`` from 0 in task space; loss after t = 0..steps steps ``[steps+1]``."""
    K = prior.shape[0]

    def body(W, _):
        loss, g = jax.value_and_grad(_loss)(W, prior, noise)
        return W + lr * one_step.unit_update("gd", g), loss

    W, losses = jax.lax.scan(body, jnp.zeros((K, K), prior.dtype), None, length=steps)
    return jnp.append(losses, _loss(W, prior, noise))


@jax.jit
def muon_final_loss(T: jax.Array, prior: jax.Array, noise: jax.Array, lr: jax.Array) -> jax.Array:
    """Loss after T steps of Muon ``W ← W - lr msgn(∇L)`` from 0 (exact polar factor,
    :func:`amemory.analysis.one_step.unit_update`; T traced: one compile)."""
    K = prior.shape[0]

    def body(_, W):
        return W + lr * one_step.unit_update("muon", jax.grad(_loss)(W, prior, noise))

    W = jax.lax.fori_loop(0, T, body, jnp.zeros((K, K), prior.dtype))
    return _loss(W, prior, noise)


def synthetic(cfg: ConfigDict, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Excess loss against T for GD and Muon for every β of ``cfg.betas``.

    Returns:
      {"K", "logK", "T", "by_beta": {β: {"gd": [nT], "muon": [nT], "L_star", "p1",
      "gd_fit", "muon_fit", "muon_normalised": [nT]}}} with excess losses in nats.
    """
    K = cfg.M * cfg.C
    T = np.asarray(cfg.T_grid, dtype=np.int64)
    out: dict[str, Any] = {"K": K, "logK": math.log(K), "T": T, "by_beta": {}}
    noise = jnp.float32(cfg.noise)
    for beta in cfg.betas:
        p = frequencies.hierarchical(cfg.M, cfg.C, beta)
        L_star = memory_tasks.optimal_loss(p, cfg.noise)
        prior = jnp.asarray(p, jnp.float32)
        gd_lr = jnp.float32(cfg.gd_lr_times_p1_inv / p.max())
        gd = np.asarray(gd_curve(int(T.max()), prior, noise, gd_lr))[T] - L_star
        mu = []
        for t in T:
            lr = jnp.float32(cfg.muon_c * math.log(K) / t)
            mu.append(float(muon_final_loss(jnp.int32(t), prior, noise, lr)) - L_star)
        mu = np.asarray(mu)
        res = {"gd": gd, "muon": mu, "L_star": L_star, "p1": float(p.max())}
        for name, y in (("gd", gd), ("muon", mu)):
            ok = y > 0
            if ok.sum() >= 3:
                f = fit_power_law(T[ok], y[ok])
                res[f"{name}_fit"] = {"slope": f.slope, "intercept": f.intercept,
                                      "slope_ci": f.slope_ci, "r2": f.r2}  # fmt: skip
        res["muon_normalised"] = mu * (T / math.log(K)) ** 2
        res["gd_reference_slope"] = -(1 - 1 / beta)
        out["by_beta"][str(beta)] = res
        progress(f"synthetic beta={beta}")
    return out


def envelope(
    cfg: ConfigDict, cache_dir: Any, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Minimum final validation loss over the LR grid per step budget, Adam and Muon (Adam's
    chosen first: the Adam half of Muon's runs)."""
    res: dict[str, Any] = {"budgets": list(cfg.budgets), "adam": [], "muon": [], "lr": []}
    tokens_per_step = cfg.base.data.batch_size * cfg.base.data.seq_len
    res["tokens"] = [b * tokens_per_step for b in cfg.budgets]
    for b in cfg.budgets:
        base = ConfigDict(cfg.base.to_dict())
        base.steps = int(b)
        base.schedule.warmup_steps = min(int(base.schedule.warmup_steps), max(1, b // 10))
        base.eval_every = max(1, min(int(base.eval_every), b))
        a_lr, a_run, _ = train_runs.lr_sweep(
            lambda lr, base=base: train_runs.run_config(base, "adam", lr, lr),
            cfg.lr_grid.adam, cache_dir, "lm-adam", progress=progress,
        )  # fmt: skip
        m_lr, m_run, _ = train_runs.lr_sweep(
            lambda lr, c=base, a=a_lr: train_runs.run_config(c, "muon", lr, a, cfg.muon_roles),
            cfg.lr_grid.muon, cache_dir, f"lm-muon-{cfg.muon_roles}", progress=progress,
        )  # fmt: skip
        res["adam"].append(train_runs.final_eval(a_run))
        res["muon"].append(train_runs.final_eval(m_run))
        res["lr"].append({"adam": a_lr, "muon": m_lr})
    return res


def n_units(cfg: ConfigDict) -> int:
    """Units of work: one per β, plus the envelope's training runs."""
    n = len(cfg.betas) if "synthetic" in cfg.parts else 0
    if "envelope" in cfg.parts:
        n += len(cfg.budgets) * (len(cfg.lr_grid.adam) + len(cfg.lr_grid.muon))
    return n


def run(cfg: ConfigDict, stage: common.Stage) -> dict[str, Any]:
    """Run the selected parts; ``ValueError`` for an unknown part (synthetic, envelope)."""
    common.check_values("scaling", cfg, parts=("synthetic", "envelope"))
    out_dir, cache_dir, progress = stage.out_dir, stage.cache_dir, stage.progress
    metrics: dict[str, Any] = {}
    figures: list[str] = []
    if "synthetic" in cfg.parts:
        metrics["synthetic"] = syn = synthetic(cfg, progress)
        series, fits = {}, {}
        for beta, r in syn["by_beta"].items():
            for name in ("gd", "muon"):
                label = f"{name} β={beta}"
                ok = r[name] > 0
                series[label] = (syn["T"][ok], r[name][ok])
                if f"{name}_fit" in r:
                    fits[label] = (r[f"{name}_fit"]["slope"], r[f"{name}_fit"]["intercept"])
        p = plots.plot_scaling(
            series, fits, out_dir / "figures" / "scaling_synthetic.png",
            title=f"excess loss vs T, K = {syn['K']}, noise {cfg.noise}",
        )  # fmt: skip
        figures.append(stage.figure(p))
    if "envelope" in cfg.parts:
        metrics["envelope"] = env = envelope(cfg, cache_dir, progress)
        p = plots.plot_curves(
            {o: (env["tokens"], env[o]) for o in ("adam", "muon")},
            out_dir / "figures" / "scaling_envelope.png",
            xlabel="training tokens", ylabel="min val loss over LR grid",
            title="data-scaling envelope", logx=True,
        )  # fmt: skip
        figures.append(stage.figure(p))
    claims = make_claims(cfg, metrics)
    return {"metrics": metrics, "figures": figures, "claims": claims}


CLAIMS = common.claim_specs("scaling")


def make_claims(cfg: ConfigDict, m: dict[str, Any]) -> list[common.Claim]:
    """:data:`CLAIMS`: paper B's GD and Muon rates and the envelope ordering."""
    claims, f = [], common.fmt
    syn = m.get("synthetic")
    if syn:
        half = len(syn["T"]) // 2
        text: dict[str, list[str]] = {"gd_rate": [], "muon_rate": [], "muon_advantage_grows": []}
        ok: dict[str, list[bool]] = {k: [] for k in text}
        for beta, r in syn["by_beta"].items():
            ref, s = r["gd_reference_slope"], r.get("gd_fit", {}).get("slope", float("nan"))
            text["gd_rate"].append(f"β={beta}: slope {f(s, 2)} (bound {ref:.2f})")
            ok["gd_rate"].append(math.isfinite(s) and s >= ref - 0.15)
            nrm = np.asarray(r["muon_normalised"], float)
            ms = r.get("muon_fit", {}).get("slope", float("nan"))
            text["muon_rate"].append(f"β={beta}: excess·(T/logK)² in [{f(np.nanmin(nrm), 2)}, "
                                f"{f(np.nanmax(nrm), 2)}], slope {f(ms, 2)}")  # fmt: skip
            ok["muon_rate"].append(
                bool(np.nanmax(nrm[half:]) <= cfg.muon_bound_factor * np.nanmax(nrm[:half]))
            )
            ratio = np.asarray(r["gd"], float) / np.maximum(np.asarray(r["muon"], float), 1e-12)
            text["muon_advantage_grows"].append(
                f"β={beta}: GD/Muon {f(ratio[0], 2)} → {f(ratio[-1], 2)}"
            )
            ok["muon_advantage_grows"].append(bool(ratio[-1] > ratio[0]))
        claims += [CLAIMS[k].claim(ours="; ".join(text[k]), held=all(ok[k]),
                                   factor=cfg.muon_bound_factor) for k in text]  # fmt: skip
    env = m.get("envelope")
    if env:
        pairs = list(zip(env["muon"], env["adam"], strict=True))
        finite = all(math.isfinite(a) and math.isfinite(b) for a, b in pairs)
        claims.append(CLAIMS["envelope"].claim(
            ours=", ".join(f"{b} steps: Muon {f(a)} vs Adam {f(c)}"
                           for b, (a, c) in zip(env["budgets"], pairs, strict=True)),
            held=all(a < b for a, b in pairs) if finite else None))  # fmt: skip
    return claims


EXPERIMENT = common.Experiment("scaling", run, units=n_units)
