"""NorMuon's premise on the corpus LM: per-neuron update norms, and loss at equal steps.

NorMuon (Li et al. 2025, arXiv 2510.05491, Sec. 3) starts from Muon's orthogonalised
updates having very unequal per-neuron norms and adds a per-neuron second moment that
equalises them. On tail_lm's model and corpus we measure (1) the coefficient of variation
of the per-neuron update norms of every hidden matrix, for Muon and NorMuon, logged by the
plain loop of ``experiments/reference_lm.py``; (2) their validation loss at equal steps on
the held-out seeds, each at its learning rate chosen on a grid by seed 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ml_collections import ConfigDict

from amemory.analysis import plots
from experiments import common, reference_lm, train_runs

OPTIMIZERS = ("muon", "normuon")


def run(cfg: ConfigDict, stage: common.Stage) -> dict[str, Any]:
    """Run the experiment; ``ValueError`` for fewer than 2 seeds (before training)."""
    if len(cfg.seeds) < 2:
        raise ValueError(f"normuon config field 'seeds' needs >= 2 seeds, got {cfg.seeds}")
    out_dir, cache_dir, progress = stage.out_dir, stage.cache_dir, stage.progress
    tl = ConfigDict({
        "base": cfg.base, "optimizers": ("adam",) + OPTIMIZERS, "muon_roles": cfg.muon_roles,
        "lr_grid": cfg.lr_grid.to_dict(), "seeds": tuple(cfg.seeds),
    })  # fmt: skip
    chosen, _, tables = train_runs.choose_lrs(tl, cache_dir, progress=progress)
    runs = train_runs.seeded_runs(tl, chosen, cache_dir, progress=progress, optimizers=OPTIMIZERS)
    metrics: dict[str, Any] = {"chosen_lr": chosen, "lr_sweep": tables, "seeds": list(cfg.seeds)}
    curves, cv = {}, {}
    for opt in OPTIMIZERS:
        steps, loss = train_runs.eval_series(runs[opt]["records"], "loss")
        curves[opt] = (steps, loss.reshape(len(steps), -1))
        rc = train_runs.run_config(cfg.base, opt, chosen[opt], chosen["adam"], cfg.muon_roles)
        ref = reference_lm.cached_run(rc, opt, tuple(cfg.seeds), cache_dir)
        cv[opt] = {
            "steps": np.asarray(ref["cv_steps"], float),
            "by_role": {r: np.asarray(v, float) for r, v in ref["neuron_cv"].items()},
            "plain_final_loss": np.asarray(ref["val_loss"], float)[-1],
        }
        progress(f"{opt} neuron norms")
    for opt in OPTIMIZERS:
        roles = cv[opt]["by_role"]
        # (seeds,) averages over the logged steps (NaN: a step whose update was 0)
        cv[opt]["time_mean"] = {r: np.nanmean(v, axis=0) for r, v in roles.items()}
        cv[opt]["all"] = np.mean(list(cv[opt]["time_mean"].values()), axis=0)
    metrics["val_loss"] = {o: c[1] for o, c in curves.items()}
    metrics["eval_steps"] = curves["muon"][0]
    metrics["final"] = {o: c[1][-1] for o, c in curves.items()}
    metrics["neuron_cv"] = cv
    panels = {
        f"{role} neuron-norm CV": {o: (cv[o]["steps"], cv[o]["by_role"][role]) for o in OPTIMIZERS}
        for role in cv["muon"]["by_role"]
    }
    p1 = plots.plot_band_curves(panels, out_dir / "figures" / "normuon_neuron_cv.png", ncols=3)
    p2 = plots.plot_curves(
        {o: curves[o] for o in OPTIMIZERS}, out_dir / "figures" / "normuon_val_loss.png",
        xlabel="step", ylabel="validation loss (nats/token)",
        title="NorMuon vs Muon (95% seed bands)",
    )  # fmt: skip
    metrics["report_md"] = report_md(metrics)
    return {"metrics": metrics, "figures": [stage.figure(p1), stage.figure(p2)],
            "claims": make_claims(metrics)}  # fmt: skip


def report_md(m: dict[str, Any]) -> str:
    """Markdown: learning rates; neuron-norm CV per role; final validation loss."""
    lr, cv, sm = m["chosen_lr"], m["neuron_cv"], common.seed_mean
    lines = [
        f"Learning rates (grid, final validation loss of seed 0): Adam {lr['adam']:g}, Muon "
        f"{lr['muon']:g}, NorMuon {lr['normuon']:g}. Seeds {', '.join(map(str, m['seeds']))}: "
        "mean ± 95% interval.", "",
        "Coefficient of variation of the per-output-neuron norms of the update (average over "
        "the logged steps and the layers):", "",
    ]  # fmt: skip
    rows = [(r, *(sm(cv[o]["time_mean"][r]) for o in OPTIMIZERS)) for r in cv["muon"]["time_mean"]]
    lines += common.table(
        ("matrix", "Muon", "NorMuon"), rows + [("all", *(sm(cv[o]["all"]) for o in OPTIMIZERS))]
    )
    plain = {o: cv[o]["plain_final_loss"] for o in OPTIMIZERS}
    engine, plain = (
        f"Muon {sm(x['muon'])}, NorMuon {sm(x['normuon'])}" for x in (m["final"], plain)
    )
    lines += ["", f"Final validation loss (engine): {engine} nats/token; plain loop: {plain}."]
    return "\n".join(lines)


CLAIMS = common.claim_specs("normuon")


def make_claims(m: dict[str, Any]) -> list[common.Claim]:
    """:data:`CLAIMS` (paired seed intervals): neuron-norm CV; final loss at equal steps."""
    cv, final = m["neuron_cv"], m["final"]
    return [
        CLAIMS["neuron_norms"].claim(cv["muon"]["all"], cv["normuon"]["all"], ours="CV: "),
        CLAIMS["val_loss"].claim(final["muon"], final["normuon"]),
    ]


EXPERIMENT = common.Experiment(
    "normuon", run,
    units=lambda cfg: (sum(len(cfg.lr_grid[o]) for o in ("adam",) + OPTIMIZERS)
                       + 2 * len(OPTIMIZERS)),
)  # fmt: skip
