"""Isotropy of the VO and FFN matrices over training, Muon vs Adam, mean and spread over seeds.

Paper A (Wang et al. 2025, arXiv 2509.26030, Sec. 4): with q_i = σ_i² / Σσ_j²,
normalised SVD entropy, effective rank, top-k energy and Q75/25 of VO, W_in, W_out;
Muon is more isotropic from the start with negligible seed variance, Adam fluctuates.
The metrics come from the training loop's spectrum records of the seeded runs. The
entropy claim rests on the paired Muon − Adam interval at every logged step of every
matrix, the spread claim on the F interval of the ratio of seed variances.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from ml_collections import ConfigDict

from amemory.analysis import plots, stats
from experiments import common, train_runs


def spectrum_series(records: Sequence[dict[str, Any]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``spectrum/<role>/<metric>`` -> (steps [n], values [n, seeds]) from metrics.jsonl rows."""
    keys = {
        k for r in records if r.get("kind") == "spectrum" for k in r if k.startswith("spectrum/")
    }
    series = {k: train_runs.eval_series(records, k, kind="spectrum") for k in sorted(keys)}
    return {k: (steps, v[:, None] if v.ndim == 1 else v) for k, (steps, v) in series.items()}


def run(cfg: ConfigDict, stage: common.Stage) -> dict[str, Any]:
    """Train each optimizer on all seeds at once; figures under ``stage.out_dir``."""
    out_dir, cache_dir, progress = stage.out_dir, stage.cache_dir, stage.progress
    series = {}
    for opt in cfg.optimizers:
        rc = train_runs.run_config(cfg.base, opt, cfg.lr[opt], cfg.lr.adam, cfg.muon_roles)
        r = train_runs.train_cached(train_runs.seeded(rc, cfg.seeds), cache_dir, f"iso-{opt}")
        series[opt] = spectrum_series(r["records"])
        progress(opt)
    summary: dict[str, Any] = {}
    panels = {}
    keys = sorted(set.intersection(*(set(s) for s in series.values())))
    for k in keys:
        _, role, metric = k.split("/", 2)
        if metric not in cfg.metrics:
            continue
        panels[f"{role} {metric}"] = {opt: s[k] for opt, s in series.items()}
        for opt, s in series.items():
            steps, v = s[k]  # (n, seeds)
            summary.setdefault(k, {})[opt] = {
                "steps": steps, "values": v,
                "mean": np.nanmean(v, axis=1),
                "time_mean": np.nanmean(v, axis=0),  # (seeds,) average over logged steps
            }  # fmt: skip
    figures = []
    if panels:
        figures.append(stage.figure(plots.plot_band_curves(
            panels, out_dir / "figures" / "isotropy.png", ncols=4)))  # fmt: skip
    metrics = {"series": summary, "seeds": list(cfg.seeds), "lr": dict(cfg.lr),
               "lr_source": cfg.lr_source}  # fmt: skip
    metrics["report_md"] = report_md(summary, metrics)
    return {"metrics": metrics, "figures": figures, "claims": make_claims(summary)}


def report_md(summary: dict[str, Any], m: dict[str, Any]) -> str:
    """Markdown table: time-averaged value per role/metric and optimizer, seed mean ± 95% CI."""
    lr = ", ".join(f"{k} {v:g}" for k, v in m["lr"].items())
    seeds = ", ".join(map(str, m["seeds"]))
    lines = [f"Learning rates: {lr} ({m['lr_source']}); seeds {seeds}.",
             "Values: average over the logged steps, mean ± 95% interval over seeds.",
             ""]  # fmt: skip
    return "\n".join(lines + common.table(("matrix / metric", "Adam", "Muon"), (
        (k.removeprefix("spectrum/"),
         *(common.seed_mean(by[o]["time_mean"]) if o in by else "-" for o in ("adam", "muon")))
        for k, by in summary.items())))  # fmt: skip


CLAIMS = common.claim_specs("isotropy")


def make_claims(summary: dict[str, Any]) -> list[common.Claim]:
    """:data:`CLAIMS`: Muon's entropy higher at every logged step; smaller seed spread."""
    ent = {k.split("/")[1]: v for k, v in summary.items()
           if k.endswith("/entropy") and {"adam", "muon"} <= set(v)}  # fmt: skip
    if not ent:
        return []
    per_step, worst, spread, spread_held = [], {}, {}, []
    for role, v in ent.items():
        mu, ad = np.asarray(v["muon"]["values"]), np.asarray(v["adam"]["values"])
        for t in range(mu.shape[0]):
            iv, held = common.seed_verdict(mu[t], ad[t], direction="greater")
            per_step.append(held)
            if iv is not None and (role not in worst or iv.lo < worst[role].lo):
                worst[role] = iv
        a, b = np.asarray(v["muon"]["time_mean"]), np.asarray(v["adam"]["time_mean"])
        if a.size >= 2 and b.size >= 2 and np.isfinite(a).all() and np.isfinite(b).all():
            spread[role] = stats.variance_ratio_interval(a, b)
            spread_held.append(stats.verdict(spread[role], "less", 1.0))
        else:
            spread_held.append(None)
    counts = {h: sum(x is h for x in per_step) for h in (True, False)}
    ours = (f"{counts[True]} of {len(per_step)} (matrix, step) intervals held, {counts[False]} "
            "not held; lowest Muon − Adam per matrix: "
            + ", ".join(f"{r} {common.describe(iv)}" for r, iv in worst.items()))  # fmt: skip
    ratio = "seed-variance ratio Muon/Adam of the time-averaged entropy: " + ", ".join(
        f"{r} {iv.describe_range()}" for r, iv in spread.items()
    )
    return [
        CLAIMS["muon_more_isotropic"].claim(ours=ours, held=stats.all_verdicts(per_step)),
        CLAIMS["seed_spread"].claim(ours=ratio, held=stats.all_verdicts(spread_held)),
    ]


EXPERIMENT = common.Experiment(
    "isotropy", run, units=lambda cfg: len(cfg.optimizers), default=True, lr_from="tail_lm"
)
