"""Learning-rate transfer across width: is the rate tuned at a small width right at a large one?

Under the standard parametrization Adam's optimal rate shrinks with width (Yang et al.,
Tensor Programs V, arXiv 2203.03466, Fig. 1); Qiu et al. (arXiv 2512.05620) find Muon's
gain over AdamW holds at scale only with spectral/muP scaling. At every width of
``widths`` (``base`` shrunk or widened as steps_ratio does) and for every optimizer of
``optimizers`` (label -> ``NAME[:FIELD=VALUE,...]``, as ``amemory coordcheck --variant``;
the Adam half of a Muon run keeps ``base``'s ``adam_lr``), seed 0 sweeps the rate grid
(factor 2), extended by one point while the best rate is at an edge (``max_extend``
times, then flagged); the held-out ``seeds`` train at the chosen rate and at half and
twice it, and each seed's optimal log2 rate is the vertex of the parabola through those
three final losses (within one grid step). A diverged run counts as an infinite loss.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from amemory.analysis import plots
from amemory.train import coordcheck, guard
from amemory.train.config import apply_overrides, validate
from experiments import common, steps_ratio, train_runs


def _config(cfg: Any, width: int, label: str, lr: float) -> Any:
    """The run config of optimizer ``label`` at ``width`` and peak rate ``lr``."""
    base, spec = cfg.base, cfg.optimizers[label]
    point = {"d_model": width, "n_layers": base.model.n_layers, "vocab_size": base.data.vocab_size}
    c = train_runs.run_config(steps_ratio.size_config(base, point), spec.partition(":")[0], lr,
                              float(base.optimizer.adam_lr))  # fmt: skip
    validate(apply_overrides(c, coordcheck.overrides(spec)[1:]))
    return c


def _train(cfg: Any, width: int, label: str, lr: float, stage: common.Stage, seeds=()):
    """``(eval steps [n], val loss [n, seeds])`` of one run (inf where it diverged)."""
    c = train_runs.seeded(_config(cfg, width, label, lr), seeds)
    tag = f"lrt-{label}-d{width}-lr{lr:g}{'-seeds' if seeds else ''}"
    try:
        run = train_runs.train_cached(c, stage.cache_dir, tag)
    except (guard.NonFiniteLossError, guard.DivergenceError):
        return np.array([float(c.steps)]), np.full((1, max(len(seeds), 1)), np.inf)
    steps, loss = train_runs.eval_series(run["records"], "loss")
    return steps, np.nan_to_num(loss.reshape(len(steps), -1), nan=np.inf)


def sweep(cfg: Any, width: int, label: str, stage: common.Stage) -> dict[str, Any]:
    """Seed 0 on the grid (extended at an edge), then ``seeds`` at the chosen rate x 1/2, 1, 2."""
    grid = sorted(float(x) for x in cfg.lr_grid[label])
    for attempt in range(int(cfg.max_extend) + 1):
        loss = [_train(cfg, width, label, lr, stage)[1][-1, 0] for lr in grid]
        best = int(np.argmin(loss))
        if 0 < best < len(grid) - 1 or attempt == cfg.max_extend:
            break
        grid = [grid[0] / 2, *grid] if best == 0 else [*grid, grid[-1] * 2]
    lr = grid[best]
    a, b, c = (_train(cfg, width, label, lr * f, stage, cfg.seeds)[1][-1] for f in (0.5, 1, 2))
    curv = a - 2 * b + c  # the vertex of the parabola in log2(rate), else the best of three
    safe = np.where(np.isfinite(curv) & (curv > 0), curv, 1.0)
    off = np.where(safe == curv, np.clip((a - c) / (2 * safe), -1, 1), np.argmin([a, b, c], 0) - 1)
    stage.progress(f"{label} d={width}")
    edge = best in (0, len(grid) - 1)
    return {"grid": grid, "seed0_loss": loss, "chosen_lr": lr, "at_edge": edge, "final": b,
            "log2_opt": np.log2(lr) + off}  # fmt: skip


def run(cfg: Any, stage: common.Stage) -> dict[str, Any]:
    """Sweep every width and optimizer; claims at ``test_width`` against ``base_width``.

    Raises:
      ValueError: ``base_width`` / ``test_width`` not in ``widths``, fewer than 2 seeds,
        no "adam" and "muon" optimizers, a width or optimizer field the run config rejects
        (all before training).
    """
    widths, small, big = [int(w) for w in cfg.widths], int(cfg.base_width), int(cfg.test_width)
    if {small, big} - set(widths) or len(cfg.seeds) < 2 or {"adam", "muon"} - set(cfg.optimizers):
        raise ValueError(f"lr_transfer: base_width {small} and test_width {big} must be in "
                         f"widths {widths}, seeds >= 2, optimizers with adam and muon")  # fmt: skip
    for o in cfg.optimizers:  # bad widths, names and fields fail before any training
        for w in widths:
            _config(cfg, w, o, 1.0)
    m = {o: {w: sweep(cfg, w, o, stage) for w in widths} for o in cfg.optimizers}
    moved = {o: _train(cfg, big, o, v[small]["chosen_lr"], stage, cfg.seeds) for o, v in m.items()}
    fig = stage.out_dir / "figures"
    figures = [
        plots.plot_curves(
            {f"d={w}": (v["grid"], np.minimum(v["seed0_loss"], 1e9)) for w, v in by_w.items()},
            fig / f"loss_vs_rate_{o}.png", xlabel="peak learning rate", logx=True, marker="o",
            ylabel="final val loss (seed 0)", title=f"{o}: loss against rate per width",
        )
        for o, by_w in m.items()
    ]  # fmt: skip
    best = {o: (widths, [2 ** np.mean(v[w]["log2_opt"]) for w in widths]) for o, v in m.items()}
    fits = {o: tuple(np.polyfit(np.log(x), np.log(y), 1)) for o, (x, y) in best.items()}
    figures.append(plots.plot_scaling(best, fits, fig / "optimal_rate.png", xlabel="width d",
                                      ylabel="optimal rate (seed mean)"))  # fmt: skip
    metrics = {"sweeps": m, "rate_slope": {o: f[0] for o, f in fits.items()},
               "transferred_final": {o: r[1][-1] for o, r in moved.items()}}  # fmt: skip
    return {"metrics": metrics, "figures": [stage.figure(f) for f in figures],
            "claims": claims(cfg, m, moved)}  # fmt: skip


def claims(cfg: Any, m: dict, moved: dict) -> list[common.Claim]:
    """(a) optimal-rate shift from ``base_width`` to ``test_width``; (b) the loss cost of the
    transferred rate at ``test_width``; (c) Muon's steps-to-Adam's-loss ratio there."""
    small, big = int(cfg.base_width), int(cfg.test_width)
    where, qiu = f"d={small} -> d={big}", "Qiu et al., arXiv 2512.05620"
    shift = {o: v[big]["log2_opt"] - v[small]["log2_opt"] for o, v in m.items()}  # [seeds]
    iv, above = common.seed_verdict(shift["muon"], direction="greater", threshold=-1.0)
    below = common.seed_verdict(shift["muon"], direction="less", threshold=1.0)[1]
    held = False if False in (above, below) else (True if above and below else None)
    tuned = m["muon"][big]["final"]
    sd = float(np.std(tuned, ddof=1))
    penalty = {o: moved[o][1][-1] - v[big]["final"] for o, v in m.items()}
    steps, muon = moved["muon"]
    ratio = train_runs.steps_to_target(steps, muon, moved["adam"][1][-1]) / steps[-1]
    return [
        common.Claim(
            "lr_transfer/muon_rate_stable", qiu,
            "Muon with spectral scaling keeps its optimal rate within 2x across width",
            "within 2x", f"{where}: log2 shift {common.describe(iv)}", held,
            "95% interval of the per-seed log2 shift inside (-1, 1); not held if wholly outside",
            common.interval_dict(iv, "inside", 1.0),
        ),
        common.seed_claim(
            "lr_transfer/adam_rate_shifts", "Yang et al., arXiv 2203.03466, Fig. 1",
            "Adam's (standard parametrization) optimal rate falls at least 4x", ">= 4x lower",
            f"{where}: log2 fall ", "95% interval of the per-seed log2 fall > 2",
            -shift["adam"], direction="greater", threshold=2.0,
        ),
        common.seed_claim(
            "lr_transfer/muon_transferred_loss", qiu,
            f"Muon at d={big} with d={small}'s rate reaches the tuned rate's loss within the "
            "seed spread", "no loss penalty", "penalty (nats) " + ", ".join(
                f"{o} {common.seed_mean(p)}" for o, p in penalty.items()) + "; Muon: ",
            f"95% interval of Muon's per-seed penalty < the tuned seeds' sd {sd:.3g}",
            penalty["muon"], direction="less", threshold=sd,
        ),
        common.seed_claim(
            "lr_transfer/steps_ratio", "peers (Moonlight, arXiv 2502.16982)",
            f"with rates from d={small}, Muon reaches Adam's final loss at d={big} in about "
            "half the steps", "about half", "steps ratio ",
            f"95% interval of the ratio < {cfg.half_threshold} (never reached: 1)",
            np.where(np.isfinite(ratio), ratio, 1.0), direction="less",
            threshold=float(cfg.half_threshold),
        ),
    ]  # fmt: skip


def n_units(cfg: Any) -> int:
    """One progress call per width and optimizer."""
    return len(cfg.widths) * len(cfg.optimizers)


EXPERIMENT = common.Experiment("lr_transfer", run, units=n_units)  # CPU hours: not default
