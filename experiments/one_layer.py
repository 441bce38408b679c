"""Paper A Fig. 4 on the one-layer memory: gap Δ against loss for GD, SignGD and Muon.

Model (Wang et al. 2025, arXiv 2509.26030, Section 5): ``f_W(E_k) = softmax(Ẽᵀ W E_k)``,
population loss ``L(W) = -Σ_k p_k log f_W(E_k)_k``, ``W_0 = 0``. Optimizers without
momentum: GD ``W ← W - η ∇L``; SignGD ``W ← W - η sign(∇L)``; Muon
``W ← W - η msgn(∇L)`` (exact polar factor), all from the science kernel
:mod:`amemory.analysis.one_step`, which the theory checks use too.

For each prior (paper A's two-level prior, and one from the word counts of the real
corpus) and embedding (decoupled ``E = Ẽ = I``; coupled, paper A's ZYZ blocks) we record
the curve (loss, Δ) of one step ``W_η = η U(∇L(W_0))`` over a sweep of η with its one-step
balance ``ϱ^ε`` (``docs/science.md#one-step-balance``), and along many constant-η steps.

``Δ(W) = max_i f_W(E_i)_i - min_j f_W(E_j)_j``. Expected (paper A): GD imbalanced;
Muon balanced for both embeddings; SignGD balanced when decoupled, imbalanced when
coupled.
"""

from __future__ import annotations

import collections
import functools
import math
import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from amemory.analysis import one_step, plots
from amemory.data import frequencies
from amemory.models import memory
from experiments import common

OPTIMIZERS = one_step.OPTIMIZERS
# name -> K -> (E, Et) [K, K]; coupled needs K % 3 == 0
EMBEDDINGS = {"decoupled": memory.decoupled, "coupled": memory.coupled_rotation}
PRIORS = ("two_level", "corpus")


_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def word_counts(texts: Sequence[str], K: int) -> tuple[list[str], np.ndarray]:
    """(words [K], counts [K] float64, non-increasing) of the K most frequent lower-cased
    words in ``texts``; ``ValueError`` if the texts hold fewer than K distinct words."""
    counter: collections.Counter[str] = collections.Counter()
    for t in texts:
        counter.update(_WORD.findall(t.lower()))
    if len(counter) < K:
        raise ValueError(f"corpus has {len(counter)} distinct words, fewer than K={K}")
    top = counter.most_common(K)
    return [w for w, _ in top], np.array([c for _, c in top], dtype=np.float64)


def make_prior(kind: str, cfg: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """The prior ``[K]`` float64 for ``kind`` in :data:`PRIORS` plus an info dict.

    ``corpus``: p_k ∝ count of the k-th most frequent word of the corpus's train split
    (:func:`amemory.data.frequencies.from_counts`); info holds the top words and counts.
    """
    if kind == "two_level":
        p = frequencies.two_level(cfg.K, cfg.alpha, cfg.beta)
        return p, {"alpha": cfg.alpha, "beta": cfg.beta}
    from amemory.data.sources import load_text_corpus

    words, counts = word_counts(load_text_corpus(cfg.corpus).train_texts, cfg.K)
    info = {"corpus": cfg.corpus, "top_words": words[:10], "count_max": float(counts[0]),
            "count_min": float(counts[-1]), "total_words_top_K": float(counts.sum())}  # fmt: skip
    return frequencies.from_counts(counts), info


def _first_update(name: str, E: jax.Array, Et: jax.Array, prior: jax.Array) -> jax.Array:
    """``U(∇L(W_0))`` at ``W_0 = 0`` (``one_step.unit_update``), ``[d_out, d_in]``."""
    W0 = jnp.zeros((Et.shape[0], E.shape[0]), E.dtype)
    return one_step.unit_update(name, jax.grad(memory.population_loss)(W0, E, Et, prior))


def _stats(W: jax.Array, E: jax.Array, Et: jax.Array, prior: jax.Array) -> tuple[jax.Array, ...]:
    """(loss, gap Δ, min_k f_kk, max_k f_kk) of W."""
    f = memory.correct_probabilities(W, E, Et)
    return memory.population_loss(W, E, Et, prior), jnp.max(f) - jnp.min(f), jnp.min(f), jnp.max(f)


def one_step_sweep(
    name: str, E: jax.Array, Et: jax.Array, prior: jax.Array, logit_grid: np.ndarray
) -> dict[str, np.ndarray]:
    """One step from W_0 = 0 with scaled η: ``W_η = η U(∇L(0))`` for a sweep of η.

    ``logit_grid`` ``[n]`` gives η as the mean correct-class logit ``t`` it produces,
    ``η = t / mean_k (Ẽᵀ (-D) E)_kk``, so one grid serves GD (tiny gradient entries) and
    SignGD/Muon alike. ``E, Et`` ``[K, K]``, ``prior`` ``[K]``.

    Returns:
      dict of ``[n]`` arrays: eta, loss, gap, min_correct, max_correct.
    """
    step = _first_update(name, E, Et, prior)  # the move of one unit of eta
    unit = float(jnp.trace(memory.task_space(step, E, Et))) / prior.shape[0]
    etas = jnp.asarray(logit_grid, E.dtype) / unit
    loss, gap, mn, mx = jax.vmap(lambda eta: _stats(eta * step, E, Et, prior))(etas)
    keys = ("eta", "loss", "gap", "min_correct", "max_correct")
    return {k: np.asarray(v) for k, v in zip(keys, (etas, loss, gap, mn, mx), strict=True)}


def one_step_rho(
    name: str, E: jax.Array, Et: jax.Array, prior: jax.Array, eps: float
) -> dict[str, float]:
    """One-step balance ``ϱ^ε`` of ``name`` from ``W_0 = 0``, first-crossing reading.

    Searched in task space by :func:`amemory.analysis.one_step.first_crossing_rho`
    (precision 1e-7 in η, enough for float32).

    Returns:
      {"rho": ϱ^ε, "eta": the crossing η}; NaN for both if no class has all margins
      positive (the threshold is never reached).
    """
    dhat = memory.task_space(_first_update(name, E, Et, prior), E, Et)
    try:
        r = one_step.first_crossing_rho(dhat, eps, rtol=1e-7)
    except ValueError:
        return {"rho": float("nan"), "eta": float("nan")}
    return {"rho": r.rho_boundary, "eta": r.eta_boundary}


def trajectory(
    name: str, E: jax.Array, Et: jax.Array, prior: jax.Array, lr: float, steps: int
) -> dict[str, np.ndarray]:
    """Many steps ``W ← W + lr U(∇L(W))`` from ``W_0 = 0`` (one compiled ``lax.scan``).

    Returns:
      dict of ``[steps + 1]`` arrays (index t = after t steps): loss, gap, min_correct,
      max_correct; and per_class_final ``[K]`` correct-class probabilities at the end.
    """
    lr = jnp.asarray(lr, E.dtype)
    W_end, outs, last = _trajectory(name, steps, E, Et, prior, lr)
    keys = ("loss", "gap", "min_correct", "max_correct")
    res = {k: np.append(np.asarray(v), float(l)) for k, v, l in zip(keys, outs, last, strict=True)}
    res["per_class_final"] = np.asarray(memory.correct_probabilities(W_end, E, Et))
    return res


@functools.partial(jax.jit, static_argnums=(0, 1))
def _trajectory(name, steps, E, Et, prior, lr):
    # Arrays are arguments, not closure constants: XLA would otherwise constant-fold them.
    W0 = jnp.zeros((Et.shape[0], E.shape[0]), E.dtype)

    def body(W, _):
        out = _stats(W, E, Et, prior)
        g = jax.grad(memory.population_loss)(W, E, Et, prior)
        return W + lr * one_step.unit_update(name, g), out

    W_end, outs = jax.lax.scan(body, W0, None, length=steps)
    return W_end, outs, _stats(W_end, E, Et, prior)


def run(cfg: Any, stage: common.Stage) -> dict[str, Any]:
    """Run the experiment; ``ValueError`` (before compiling) for unknown prior / embedding /
    optimizer names, or K % 3 != 0 with coupled embeddings."""
    out_dir, progress = stage.out_dir, stage.progress
    common.check_values("one_layer", cfg, priors=PRIORS, embeddings=EMBEDDINGS,
                        optimizers=OPTIMIZERS)  # fmt: skip
    if "coupled" in cfg.embeddings and cfg.K % 3:
        raise ValueError(f"one_layer config field 'K' must be divisible by 3, got {cfg.K}")
    logit_grid = np.geomspace(0.05, cfg.one_step_max_logit, cfg.one_step_points)
    metrics: dict[str, Any] = {"priors": {}, "runs": {}}
    panels: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    notes: list[str] = []
    for prior_kind in cfg.priors:
        try:
            prior_np, info = make_prior(prior_kind, cfg)
        except (ImportError, OSError, ValueError, RuntimeError) as e:
            notes.append(f"prior {prior_kind!r} skipped: {type(e).__name__}: {e}")
            continue
        p_max, p_min = float(prior_np.max()), float(prior_np.min())
        metrics["priors"][prior_kind] = {**info, "p_max": p_max, "p_min": p_min}
        prior = jnp.asarray(prior_np, jnp.float32)
        for emb in cfg.embeddings:
            E, Et = EMBEDDINGS[emb](cfg.K)
            one_panel, many_panel = {}, {}
            for opt in cfg.optimizers:
                sweep = one_step_sweep(opt, E, Et, prior, logit_grid)
                rho = one_step_rho(opt, E, Et, prior, cfg.eps)
                # constant; GD's relative to p_max (see configs/one_layer.py)
                lr = float(cfg.lr.gd_times_pmax_inv / p_max if opt == "gd" else cfg.lr[opt])
                traj = trajectory(opt, E, Et, prior, lr, cfg.steps)
                key = f"{prior_kind}/{emb}/{opt}"
                metrics["runs"][key] = {
                    "one_step": sweep, "one_step_rho": rho,
                    "one_step_max_gap": float(np.max(sweep["gap"])), "lr": lr,
                    "many_steps": {k: v for k, v in traj.items() if k != "per_class_final"},
                    "many_steps_max_gap": float(np.max(traj["gap"])),
                    "final_loss": float(traj["loss"][-1]),
                    "final_min_correct": float(traj["min_correct"][-1]),
                }  # fmt: skip
                one_panel[opt] = (sweep["loss"], sweep["gap"])
                many_panel[opt] = (traj["loss"], traj["gap"])
                progress(key)
            label = "two-level" if prior_kind == "two_level" else "corpus words"
            panels[f"{label}, {emb}: one step"] = one_panel
            panels[f"{label}, {emb}: {cfg.steps} steps"] = many_panel
    if "two_level" in metrics["priors"]:
        metrics["gd_rho_closed_form"] = one_step.gd_one_step_rho(
            frequencies.two_level(cfg.K, cfg.alpha, cfg.beta), cfg.eps
        )
    figures = []
    if panels:
        fig = plots.plot_gap_vs_loss(
            panels, out_dir / "figures" / "one_layer_gap_vs_loss.png", ncols=4,
            suptitle=f"gap Δ vs loss, K = {cfg.K} (paper A Fig. 4)",
        )  # fmt: skip
        figures.append(stage.figure(fig))
    claims = make_claims(metrics, cfg)
    return {"metrics": metrics, "figures": figures, "claims": claims, "notes": notes}


CLAIMS = common.claim_specs("one_layer")


def make_claims(metrics: dict, cfg: Any) -> list[common.Claim]:
    """:data:`CLAIMS`: a path is "balanced" when its largest Δ (one-step sweep and many-step
    trajectory) is below ``cfg.balanced``, "imbalanced" when it exceeds ``cfg.imbalanced``."""
    bal, imb = cfg.balanced, cfg.imbalanced

    def gaps(prior: str, opt: str) -> dict[str, float]:
        runs = {emb: metrics["runs"].get(f"{prior}/{emb}/{opt}") for emb in cfg.embeddings}
        return {emb: float("nan") if r is None else max(r["one_step_max_gap"],
                r["many_steps_max_gap"]) for emb, r in runs.items()}  # fmt: skip

    def ours(g: dict[str, float]) -> str:
        return ", ".join(f"{emb} max Δ {common.fmt(v, 2)}" for emb, v in g.items())

    def decide(values: Sequence[float], want_balanced: bool) -> bool | None:
        vals = [v for v in values if math.isfinite(v)]
        if not vals or len(vals) < len(values):
            return None
        return all(v < bal for v in vals) if want_balanced else all(v > imb for v in vals)

    claims, limits = [], {"balanced": bal, "imbalanced": imb}
    if "two_level" in metrics["priors"]:
        for opt, key, balanced in (("gd", "gd_imbalanced", False), ("muon", "muon_balanced", True)):
            g = gaps("two_level", opt)
            claims.append(CLAIMS[key].claim(ours=ours(g), held=decide(list(g.values()), balanced),
                                            **limits))  # fmt: skip
        g, held = gaps("two_level", "signgd"), None
        if "decoupled" in g and "coupled" in g:
            a, b = decide([g["decoupled"]], True), decide([g["coupled"]], False)
            held = None if a is None or b is None else (a and b)
        claims.append(CLAIMS["signgd_basis_dependent"].claim(ours=ours(g), held=held, **limits))
        r = metrics["runs"].get("two_level/decoupled/gd")
        if "gd_rho_closed_form" in metrics and r is not None:
            rho, ref = r["one_step_rho"]["rho"], metrics["gd_rho_closed_form"]
            claims.append(CLAIMS["gd_one_step_rho"].claim(
                ours=common.fmt(rho, 4), held=bool(abs(rho - ref) <= 1e-3 + 1e-2 * abs(ref)),
                eps=cfg.eps, ref=common.fmt(ref, 4), K=cfg.K))  # fmt: skip
    if "corpus" in metrics["priors"]:
        gd, mu = gaps("corpus", "gd"), gaps("corpus", "muon")
        vals = [(mu[e], gd[e]) for e in cfg.embeddings]
        finite = all(math.isfinite(a) and math.isfinite(b) for a, b in vals)
        claims.append(CLAIMS["corpus_prior"].claim(
            ours=f"Muon {ours(mu)}; GD {ours(gd)}",
            held=all(a < b for a, b in vals) if finite else None))  # fmt: skip
    return claims


EXPERIMENT = common.Experiment(
    "one_layer", run, default=True,
    units=lambda cfg: len(cfg.priors) * len(cfg.embeddings) * len(cfg.optimizers),
)  # fmt: skip
