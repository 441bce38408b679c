"""A third party's associative-memory grid reproduced on our one-layer memory, then Muon.

Source: Cabannes, Dohmatob, Bietti, "Scaling laws for associative memories" (ICLR 2024,
arXiv 2310.02984), code facebookresearch/pal, ``projects/scaling_law/grid_experiments/
run.py`` (data law, training loop, grid) and ``utils.py`` (``AssMem``, the "matrix"
model), results ``res/finer_dim/all.jsonl.gz`` (10 seeds per cell; read at run time from
``config.pal_results``, never stored here).

Their matrix model and ours are the same map. pal: ``logits(x) = E[x] W U`` with fixed
``E [N, d]``, ``U [d, M]`` entries N(0, 1/d), trained ``W [d, d]`` from N(0, 1/d), label
``y = x mod M``, inputs ``x ~ p(x) ∝ (x + 1)^(-alpha)``, one pass over ``ntrain`` fresh
samples in batches. Ours (:mod:`amemory.models.memory`, ``softmax(Ẽᵀ W E_k)`` with
answer k for query k): ``E = pal's Eᵀ`` ``[d, N]``, ``W = pal's Wᵀ``, and ``Ẽ [d, N]``
whose column k is pal's ``U[:, k mod M]``. Every answer then appears ``N / M`` times,
so our cross-entropy is pal's plus the constant ``log(N / M)`` (same gradient) and our
argmax answer ``k'`` predicts pal's class ``k' mod M``. pal's "SGD" is ``optax.sgd(lr)``;
pal's "Adam" on this model is Adam with ``betas=(0, 0)`` at ``lr / d`` (a SignGD with
``eps = 1e-8``), ``optax.adam(lr / d, b1=0, b2=0)``. The error is pal's: the prior mass
of the inputs whose class is mispredicted; the tail error (pal's later ``error_tail``)
is the misclassified fraction of the last 30 inputs.

Reproduced cells: model "matrix", no layer norm (our memory has none), both optimizers,
every learning rate, batch size and ``ntrain`` of pal's grid, ``d`` in ``config.d``.
A run of ``ntrain = 102400`` gives the other two ``ntrain`` at its steps
``1024 / B`` and ``10240 / B`` (an i.i.d. stream's prefix is an i.i.d. stream). Our
seeds are pal's numbers fed to ``jax.random`` (torch's generator is not ours), so a
cell agrees when the 95% Welch interval of our mean minus pal's contains 0.
New columns: Muon (:func:`amemory.optim.muon`, defaults, rate ``lr``: the spectral norm
of its step, as pal's ``lr / d`` SignGD step of a rank-one gradient) and Adam
(``optax.adam(lr / d)``, betas 0.9, 0.999).
"""

from __future__ import annotations

import collections
import gzip
import json
import math
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from ml_collections import ConfigDict
from scipy import stats as sps

from amemory import optim
from amemory.analysis import plots
from amemory.models import memory
from experiments import common

PAL_NAMES = {"sgd": "SGD", "signgd": "Adam"}  # ours -> pal's "optimizer" field
OPTIMIZERS = ("sgd", "signgd", "muon", "adam")
CKPT = (1024, 10240, 102400)  # pal's ntrain values


def transform(name: str, lr: Any, d: int) -> optax.GradientTransformation:
    """The optimizer ``name`` (one of :data:`OPTIMIZERS`) at pal's rate ``lr`` for width d."""
    if name == "sgd":
        return optax.sgd(lr)
    if name == "signgd":
        return optax.adam(lr / d, b1=0.0, b2=0.0, eps=1e-8)
    if name == "adam":
        return optax.adam(lr / d)
    if name == "muon":
        return optim.muon(lr)
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")


def train(cfg: ConfigDict, name: str, d: int, batch: int) -> np.ndarray:
    """Errors ``[lr, seed, ckpt, 2]`` (overall, tail) of every rate and seed of one cell.

    One compiled program per ``(name, d, batch)``: the rates and seeds are vmapped, a
    ``lax.scan`` runs ``max(CKPT) / batch`` steps and records at every ``CKPT`` entry.
    """
    N, M, steps = cfg.N, cfg.M, CKPT[-1] // batch
    k = jnp.arange(N)
    p = (k + 1.0) ** (-cfg.alpha)
    p = p / p.sum()

    def run(lr, seed):
        ke, ku, kw, kx = jax.random.split(jax.random.key(seed), 4)
        E = jax.random.normal(ke, (d, N)) / math.sqrt(d)
        Et = (jax.random.normal(ku, (d, M)) / math.sqrt(d))[:, k % M]
        W = jax.random.normal(kw, (d, d)) / math.sqrt(d)
        xs = jax.random.choice(kx, N, (steps, batch), p=p)
        tx = transform(name, lr, d)

        def errors(W):
            wrong = jnp.argmax(memory.logits(W, E, Et), axis=-1) % M != k % M
            return jnp.stack([jnp.sum(jnp.where(wrong, p, 0.0)), jnp.mean(wrong[-30:])])

        def step(carry, x):
            W, s = carry
            g = jax.grad(memory.sampled_loss)(W, E, Et, x, x)
            u, s = tx.update(g, s, W)
            return (optax.apply_updates(W, u), s), None

        out, W_t, s = [], W, tx.init(W)
        for a, b in zip((0, *CKPT[:-1]), CKPT, strict=True):
            (W_t, s), _ = jax.lax.scan(step, (W_t, s), xs[a // batch : b // batch])
            out.append(errors(W_t))
        return jnp.stack(out)

    lrs, seeds = jnp.asarray(cfg.lrs, jnp.float32), jnp.asarray(cfg.seeds)
    f = jax.jit(jax.vmap(jax.vmap(run, (None, 0)), (0, None)))
    return np.asarray(f(lrs, seeds))


def load_pal(source: str, cfg: ConfigDict) -> dict[tuple, np.ndarray]:
    """pal's errors per cell ``(optimizer, d, lr, batch, ntrain)`` -> ``[seeds]``.

    ``source`` is the path of ``projects/scaling_law/grid_experiments/res/finer_dim/
    all.jsonl.gz`` in a local clone of github.com/facebookresearch/pal (amemory downloads
    nothing at run time). Only the matrix model without layer norm at ``cfg.N, cfg.M``.

    Raises:
      ValueError: if ``source`` is not an existing file, or no row of the file matches.
    """
    path = pathlib.Path(source or "")
    if not source or not path.is_file():
        raise ValueError(
            f"config.pal_results: {source!r} is not a file; give the path of "
            "projects/scaling_law/grid_experiments/res/finer_dim/all.jsonl.gz in a clone of "
            "https://github.com/facebookresearch/pal (--set pal_results=PATH)"
        )
    cells = collections.defaultdict(list)
    for r in map(json.loads, gzip.open(path, "rt")):
        if r["model"] == "matrix" and not r.get("layernorm") and (r["N"], r["M"]) == (cfg.N, cfg.M):
            key = (r["optimizer"], r["d"], r["lr"], r["batch_size"], r["ntrain"])
            cells[key].append(r["error"])
    if not cells:
        raise ValueError(f"{source}: no matrix-model row with N={cfg.N}, M={cfg.M}")
    return {k: np.asarray(v) for k, v in cells.items()}


def agree(ours: np.ndarray, theirs: np.ndarray) -> tuple[float, float]:
    """95% Welch interval of ``mean(ours) - mean(theirs)`` (two zero-variance arms: a point)."""
    diff = ours.mean() - theirs.mean()
    va, vb = ours.var(ddof=1) / ours.size, theirs.var(ddof=1) / theirs.size
    if va + vb == 0:
        return diff, diff
    df = (va + vb) ** 2 / (va**2 / (ours.size - 1) + vb**2 / (theirs.size - 1))
    h = sps.t.ppf(0.975, df) * math.sqrt(va + vb)
    return diff - h, diff + h


def run(cfg: ConfigDict, stage: common.Stage) -> dict[str, Any]:
    """Train every optimizer over the grid, compare the reproduced cells with pal's."""
    pal = load_pal(cfg.pal_results, cfg)
    ours = {}  # (name, d, batch) -> [lr, seed, ckpt, 2]
    for name in cfg.optimizers:
        for d in cfg.d:
            for batch in cfg.batch_sizes:
                ours[name, d, batch] = train(cfg, name, d, batch)
                stage.progress(f"{name} d={d} B={batch}")
    cells = []
    for (name, d, batch), err in ours.items():
        for i, lr in enumerate(cfg.lrs):
            for j, n in enumerate(CKPT):
                row = {"optimizer": name, "d": d, "lr": lr, "batch": batch, "ntrain": n,
                       "error": err[i, :, j, 0], "tail": err[i, :, j, 1]}  # fmt: skip
                theirs = pal.get((PAL_NAMES.get(name), d, lr, batch, n))
                if theirs is not None:
                    lo, hi = agree(row["error"], theirs)
                    row.update(pal=theirs, diff_lo=lo, diff_hi=hi, agrees=lo <= 0 <= hi)
                cells.append(row)
    figures = [stage.figure(figure(cells, cfg, stage.out_dir / "figures" / "pal_replication.png"))]
    # pal's per-seed values stay out of the result (their data): mean ± 95% and count only
    kept = [{k: v for k, v in c.items() if k != "pal"} for c in cells]
    for c, k in zip(cells, kept, strict=True):
        if "pal" in c:
            k["pal_mean"], k["pal_seeds"] = common.seed_mean(c["pal"]), len(c["pal"])
    metrics = {"cells": kept, "report_md": report_md(cells, cfg)}
    return {"metrics": metrics, "figures": figures, "claims": make_claims(cells, cfg)}


def best(cells: list[dict[str, Any]], name: str, key: str) -> dict[tuple, np.ndarray]:
    """``(d, batch, ntrain) -> [seeds]`` of ``key`` at ``name``'s best rate (lowest mean error)."""
    top: dict[tuple, dict[str, Any]] = {}
    for c in cells:
        k = (c["d"], c["batch"], c["ntrain"])
        if c["optimizer"] == name and (k not in top or c["error"].mean() < top[k]["error"].mean()):
            top[k] = c
    return {k: c[key] for k, c in top.items()}


def make_claims(cells: list[dict[str, Any]], cfg: ConfigDict) -> list[common.Claim]:
    """Reproduction share; Muon's tail error against Adam's and SGD's at best rates."""
    rep = [c for c in cells if "agrees" in c]
    share = sum(c["agrees"] for c in rep) / max(len(rep), 1)
    claims = [common.Claim(
        "pal_replication/reproduced", "pal (arXiv 2310.02984), res/finer_dim",
        "our one-layer memory reproduces pal's matrix-model grid (SGD and Adam(0, 0))",
        f"{len(rep)} cells, 10 seeds each",
        f"{sum(c['agrees'] for c in rep)} of {len(rep)} cells agree ({share:.0%})",
        share >= 0.9 if rep else None,
        "per cell, the 95% Welch interval of our mean error minus pal's contains 0; "
        "held if at least 90% of the cells do",
    )]  # fmt: skip
    muon = best(cells, "muon", "tail")
    for other in ("adam", "sgd"):
        theirs = best(cells, other, "tail")
        keys = sorted(set(muon) & set(theirs))
        if keys:
            a = np.mean([muon[k] for k in keys], axis=0)
            b = np.mean([theirs[k] for k in keys], axis=0)
            claims.append(common.seed_claim(
                f"pal_replication/muon_tail_vs_{other}", "tail thesis on pal's grid",
                f"Muon misclassifies fewer of the 30 rarest inputs than {other}",
                "not measured by pal (grid files hold overall error only)",
                f"tail error averaged over {len(keys)} cells, Muon − {other}: ",
                "per seed, mean over (d, batch, ntrain) of the tail error at each optimizer's "
                "best rate; 95% paired t interval < 0", a, b, direction="less",
            ))  # fmt: skip
    return claims


def report_md(cells: list[dict[str, Any]], cfg: ConfigDict) -> str:
    """Tables: each optimizer's best-rate error and tail error per (d, batch, ntrain);
    per reproduced cell pal's and our mean error (± 95%), Welch interval, agreement."""
    per = {(o, k): best(cells, o, k) for o in cfg.optimizers for k in ("error", "tail")}
    lines = ["Best rate per optimizer and cell; error / tail error, mean ± 95% over seeds.", "",
             "| d | B | ntrain | " + " | ".join(cfg.optimizers) + " |",
             "|---|---|---|" + "---|" * len(cfg.optimizers)]  # fmt: skip
    for k in sorted(per[cfg.optimizers[0], "error"]):
        row = [f"{common.seed_mean(per[o, 'error'][k])} / {common.seed_mean(per[o, 'tail'][k])}"
               for o in cfg.optimizers]  # fmt: skip
        lines.append("| " + " | ".join(map(str, (*k, *row))) + " |")
    lines += ["", "Reproduced cells (pal's SGD = sgd, pal's Adam(0, 0) = signgd).", "",
              "| optimizer | d | lr | B | ntrain | pal | ours | ours − pal (95%) | agrees |",
              "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for c in cells:
        if "agrees" in c:
            lines.append(
                f"| {c['optimizer']} | {c['d']} | {c['lr']:g} | {c['batch']} | {c['ntrain']} "
                f"| {common.seed_mean(c['pal'])} | {common.seed_mean(c['error'])} "
                f"| [{c['diff_lo']:.3f}, {c['diff_hi']:.3f}] | {'yes' if c['agrees'] else 'NO'} |"
            )
    return "\n".join(lines)


def figure(cells: list[dict[str, Any]], cfg: ConfigDict, path: pathlib.Path) -> pathlib.Path:
    """Error against ntrain at each optimizer's best rate, pal's and ours, one panel per d."""
    panels: dict[str, dict[str, Any]] = {}
    for name in cfg.optimizers:
        for src, key in (("ours", "error"), ("pal", "pal")):
            per = best([c for c in cells if key in c], name, key)
            for d in cfg.d:
                for batch in cfg.batch_sizes[-1:]:
                    vals = [per.get((d, batch, n)) for n in CKPT]
                    if all(v is not None for v in vals):
                        label = f"{src} {PAL_NAMES.get(name, name) if src == 'pal' else name}"
                        x = np.log10(CKPT)
                        panels.setdefault(f"d={d}, B={batch}", {})[label] = (x, np.stack(vals))
    return plots.plot_band_curves(panels, path, xlabel="log10 ntrain", ncols=len(cfg.d))


EXPERIMENT = common.Experiment(
    "pal_replication",
    run,
    units=lambda cfg: len(cfg.optimizers) * len(cfg.d) * len(cfg.batch_sizes),
)
