"""Isotropy of the VO and FFN matrices over training, Muon vs Adam, mean and spread over seeds.

Paper A (A.3): with q_i = σ_i² / Σσ_j², normalised SVD entropy, effective rank, top-k
energy and Q75/25 of VO, W_in, W_out; Muon is more isotropic from the start with
negligible seed variance, Adam fluctuates. Seeds are trained together (one vmapped
program, ``config.seeds``); the metrics come from the training loop's spectrum records.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from ml_collections import ConfigDict

from amemory.analysis import plots
from experiments import common, tail_lm

NAME = "isotropy"


def n_units(cfg: ConfigDict) -> int:
    """One multi-seed training run per optimizer."""
    return len(cfg.optimizers)


def spectrum_series(records: Sequence[dict[str, Any]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``spectrum/<role>/<metric>`` -> (steps [n], values [n, seeds]) from metrics.jsonl rows."""
    keys = sorted(
        {k for r in records if r.get("kind") == "spectrum" for k in r if k.startswith("spectrum/")}
    )
    out = {}
    for k in keys:
        steps, vals = common.eval_series(records, k, kind="spectrum")
        if vals.ndim == 1:
            vals = vals[:, None]
        out[k] = (steps, vals)
    return out


def run(
    cfg: ConfigDict,
    out_dir: Any,
    *,
    progress: Callable[[str], None] | None = None,
    cache_dir: Any = None,
) -> dict[str, Any]:
    """Train each optimizer on all seeds at once; write result.json and figures."""
    out_dir = common.make_run_dir(out_dir, NAME)
    cache_dir = cache_dir or out_dir / "train_runs"
    with common.Timer() as timer:
        series = {}
        for opt in cfg.optimizers:
            rc = tail_lm.run_config(cfg.base, opt, cfg.lr[opt], cfg.lr.adam, cfg.matrix_roles)
            r = common.train_cached(rc, cache_dir, f"iso-{opt}")
            series[opt] = spectrum_series(r["records"])
            if progress:
                progress(opt)
        summary: dict[str, Any] = {}
        panels = {}
        keys = sorted(set.intersection(*(set(s) for s in series.values())))
        for k in keys:
            _, role, metric = k.split("/", 2)
            if metric not in cfg.metrics:
                continue
            panel = {}
            for opt, s in series.items():
                steps, v = s[k]
                mean, std = np.nanmean(v, axis=1), np.nanstd(v, axis=1)
                panel[opt] = (steps, mean, std)
                summary.setdefault(k, {})[opt] = {
                    "steps": steps, "mean": mean, "std": std,
                    "mean_over_time": float(np.nanmean(mean)),
                    "seed_std_over_time": float(np.nanmean(std)),
                }  # fmt: skip
            panels[f"{role} {metric}"] = panel
        figures = []
        if panels:
            p = plots.plot_band_curves(panels, out_dir / "figures" / "isotropy.png", ncols=4)
            figures.append(str(p.relative_to(out_dir)))
        metrics = {"series": summary, "seeds": list(cfg.base.seeds), "lr": dict(cfg.lr)}
        claims = make_claims(summary)
        metrics["report_md"] = report_md(summary)
    return common.finish(NAME, cfg, out_dir, timer, metrics=metrics, figures=figures, claims=claims)


def report_md(summary: dict[str, Any]) -> str:
    """Markdown table: time-averaged mean and seed spread per role/metric and optimizer."""
    lines = ["| matrix / metric | Adam mean (seed std) | Muon mean (seed std) |", "|---|---|---|"]
    for k, by in summary.items():
        cells = []
        for opt in ("adam", "muon"):
            s = by.get(opt)
            cells.append(
                f"{common.fmt(s['mean_over_time'])} ({common.fmt(s['seed_std_over_time'])})"
                if s else "-"
            )  # fmt: skip
        lines.append(f"| {k.removeprefix('spectrum/')} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def make_claims(summary: dict[str, Any]) -> list[common.Claim]:
    """Verdicts: Muon's entropy higher at every logged step; smaller seed spread."""
    ent = {
        k: v for k, v in summary.items() if k.endswith("/entropy") and {"adam", "muon"} <= set(v)
    }
    if not ent:
        return []
    higher = {k: bool(np.all(v["muon"]["mean"] > v["adam"]["mean"])) for k, v in ent.items()}
    spread = {
        k: (v["muon"]["seed_std_over_time"], v["adam"]["seed_std_over_time"])
        for k, v in ent.items()
    }
    roles = lambda k: k.split("/")[1]  # noqa: E731
    return [
        common.Claim(
            "isotropy/muon_more_isotropic", "A, Sec. 4 (isotropy)",
            "Muon's VO / FFN matrices are more isotropic than Adam's throughout training",
            "Muon higher entropy from the start",
            ", ".join(f"{roles(k)}: {'yes' if h else 'no'}" for k, h in higher.items()),
            all(higher.values()), "mean SVD entropy Muon > Adam at every logged step, every matrix",
        ),
        common.Claim(
            "isotropy/seed_spread", "A, Sec. 4 (isotropy)",
            "Muon's isotropy varies less across seeds than Adam's",
            "negligible for Muon, Adam fluctuates",
            ", ".join(f"{roles(k)}: {common.fmt(a)} vs {common.fmt(b)}"
                      for k, (a, b) in spread.items()),
            all(a < b for a, b in spread.values()),
            "time-averaged seed std of the entropy: Muon < Adam for every matrix",
        ),
    ]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m experiments.isotropy --scale quick --out DIR``."""
    return common.experiment_main(NAME, run, argv, description=__doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
