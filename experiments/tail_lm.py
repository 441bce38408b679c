"""Transformer on the real corpus: Muon vs Adam vs SignGD, validation loss per frequency bucket.

Paper A (Wang et al. 2025, arXiv 2509.26030, Sec. 4): Muon's advantage over Adam is
largest on the tail (rare tokens). The same decoder and data order are trained with Adam,
and with Muon (or SignGD) on the hidden matrices and Adam elsewhere, each at the learning
rate chosen on a grid by seed ``base.seed`` (Adam's first: the others' Adam half), then on
the held-out seeds ``cfg.seeds``. Measured: validation loss per token-frequency bucket
(``amemory.data.corpus``), steps to Adam's final loss, and the end isotropy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ml_collections import ConfigDict

from amemory.analysis import plots
from experiments import common, train_runs


def run(cfg: ConfigDict, stage: common.Stage) -> dict[str, Any]:
    """Choose the learning rates (``metrics["chosen_lr"]``, other stages' ``lr_from``), train
    the seeds, compare per bucket."""
    out_dir, cache_dir, progress = stage.out_dir, stage.cache_dir, stage.progress
    chosen, _, tables = train_runs.choose_lrs(cfg, cache_dir, progress=progress)
    runs = train_runs.seeded_runs(cfg, chosen, cache_dir, progress=progress)
    metrics: dict[str, Any] = {
        "chosen_lr": chosen, "lr_sweep": tables, "runs": {}, "seeds": list(cfg.seeds),
        "sweep_seed": int(cfg.base.seed),
    }  # fmt: skip
    curves_steps, curves_loss, bucket_losses, labels = {}, {}, {}, []
    for opt, r in runs.items():
        steps, loss = train_runs.eval_series(r["records"], "loss")
        loss = loss.reshape(len(steps), -1)  # (n, seeds)
        _, barr, labels_r = train_runs.bucket_curves(r)
        labels = labels_r or labels
        curves_steps[opt], curves_loss[opt], bucket_losses[opt] = steps, loss, barr
        metrics["runs"][opt] = {
            "workdir": r["workdir"], "lr": chosen[opt], "eval_steps": steps, "val_loss": loss,
            "bucket_loss": barr, "final_val_loss": loss[-1] if loss.size else [],
            "final_bucket_loss": barr[-1] if barr.size else [],
            "spectrum": train_runs.final_spectrum(r), "wall_s": r["summary"].get("wall_s"),
            "tokens_per_s": r["summary"].get("tokens_per_s"),
        }  # fmt: skip
    metrics["bucket_labels"] = labels
    adam_final = curves_loss["adam"][-1]  # (seeds,)
    metrics["steps_to_adam_final"] = {
        opt: train_runs.steps_to_target(curves_steps[opt], curves_loss[opt], adam_final)
        for opt in runs
    }
    figures = []
    if labels:
        figures.append(stage.figure(plots.plot_bucket_losses(
            {o: curves_steps[o] for o in runs}, bucket_losses, labels,
            out_dir / "figures" / "tail_lm_bucket_loss.png",
            title="validation loss per token-frequency bucket (head → tail), 95% seed bands",
        )))  # fmt: skip
    p = plots.plot_curves(
        {o: (curves_steps[o], curves_loss[o]) for o in runs},
        out_dir / "figures" / "tail_lm_val_loss.png", xlabel="step",
        ylabel="validation loss (nats/token)", hline=float(np.nanmean(adam_final)),
        title="validation loss (dashed: Adam's final, seed mean)",
    )  # fmt: skip
    figures.append(stage.figure(p))
    metrics["report_md"] = report_md(cfg, metrics)
    return {"metrics": metrics, "figures": figures, "claims": make_claims(metrics)}


def report_md(cfg: ConfigDict, m: dict[str, Any]) -> str:
    """Markdown tables: LR grid and choice; final loss per bucket (seed mean ± 95% CI)."""
    lines = [f"Learning rates (grid, lowest final validation loss of seed {m['sweep_seed']} "
             "chosen):", ""]  # fmt: skip
    lines += common.table(("optimizer", "grid", "final val loss per lr", "chosen"), (
        (opt, ", ".join(f"{r['lr']:g}" for r in rows),
         ", ".join(common.fmt(r["final_loss"]) for r in rows),
         f"{m['chosen_lr'][opt]:g}" + (" (grid edge)" if any(r["at_edge"] for r in rows) else ""))
        for opt, rows in m["lr_sweep"].items()))  # fmt: skip
    labels = m.get("bucket_labels", [])
    seeds = ", ".join(map(str, m["seeds"])) or str(m["sweep_seed"])
    if labels:
        lines += ["", "Final validation loss (nats/token) per frequency bucket, mean ± 95% "
                  f"interval over initialisation seeds {seeds} (same data order):", ""]  # fmt: skip
        lines += common.table(("optimizer", "all", *labels, "steps to Adam's final"), (
            (opt, common.seed_mean(r["final_val_loss"]),
             *map(common.seed_mean, np.asarray(r["final_bucket_loss"])),
             common.seed_mean(m["steps_to_adam_final"][opt], 0))
            for opt, r in m["runs"].items()))  # fmt: skip
    specs = {o: r["spectrum"] for o, r in m["runs"].items() if r["spectrum"]}
    if specs:
        ends = ("/entropy", "/effective_rank")
        keys = sorted({k for s in specs.values() for k in s if k.endswith(ends)})
        lines += ["", "Isotropy of the hidden matrices at the end (higher = more isotropic):", ""]
        lines += common.table(("optimizer", *(k.removeprefix("spectrum/") for k in keys)), (
            (opt, *(common.seed_mean(s[k]) if k in s else "-" for k in keys))
            for opt, s in specs.items()))  # fmt: skip
    return "\n".join(lines)


CLAIMS = common.claim_specs("tail_lm")


def make_claims(m: dict[str, Any]) -> list[common.Claim]:
    """:data:`CLAIMS` decided on the final bucket losses (paired seed intervals)."""
    runs, labels = m["runs"], m.get("bucket_labels", [])
    if "muon" not in runs or not labels:
        return []
    mu = np.asarray(runs["muon"]["final_bucket_loss"], float)  # (buckets, seeds)
    ad = np.asarray(runs["adam"]["final_bucket_loss"], float)
    gain = ad - mu
    return [CLAIMS["tail_bucket_loss"].claim(ad[-1], mu[-1], tail=labels[-1]),
            CLAIMS["gain_in_tail"].claim(gain[-1], gain[0], ours="Adam − Muon: ")]  # fmt: skip


EXPERIMENT = common.Experiment(
    "tail_lm", run, units=lambda cfg: sum(len(cfg.lr_grid[o]) + 1 for o in cfg.optimizers),
    default=True, reduced={"optimizers": ("adam", "muon")},  # SignGD carries no claim
    headline=("tail_lm/tail_bucket_loss",),
)  # fmt: skip
