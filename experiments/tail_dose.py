"""Dose-response: does Muon's lead over Adam grow as the frequency tail gets heavier?

Paper A (Wang et al. 2025, arXiv 2509.26030, Secs. 4-5) argues that Muon beats Adam
*because* real data are heavy-tailed. Each leg holds the model, steps, tokens and facts
fixed and moves only the frequency law:

* ``qa``: biography QA over the same 2^m people, selection law S_g = round(2^(alpha (m-g)))
  (alpha = 0 uniform, 1 the paper's law). Score: first-token accuracy, ``all`` (people
  weighed equally), ``head`` (groups g <= m/2), ``tail`` (group m).
* ``lm``: Shakespeare with a BPE vocabulary of V tokens (dose log2 V). Score: minus the
  validation loss, ``all``, ``head`` (bucket 0), ``tail`` (the last seen bucket); the
  buckets (:func:`amemory.data.stats.frequency_buckets`) are log-spaced rank bands, so
  bucket b covers the same fifth of log-rank at every V.

Learning rates are chosen on a grid by seed 0, then the held-out seeds are run. Lead =
final score - Adam's (same seed); steps ratio = steps Muon needs to reach Adam's final
``all`` score / steps. The lead's growth is the per-seed slope's interval
(:func:`amemory.analysis.stats.slope_interval`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from ml_collections import ConfigDict

from amemory.analysis import plots, stats
from amemory.data.biographies import group_sizes
from experiments import common, tail_qa, train_runs

PARTS = ("all", "head", "tail")


def point_config(cfg: ConfigDict, leg: str, x: float) -> ConfigDict:
    """The run config of one dose: ``qa`` at Zipf exponent ``x``, ``lm`` at vocabulary ``x``."""
    c = ConfigDict((cfg.qa_base if leg == "qa" else cfg.lm_base).to_dict())
    if leg == "qa":
        c.data.biographies.zipf = float(x)
    else:
        c.data.vocab_size = int(x)
    return c


def scores(leg: str, run: dict[str, Any], m: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(eval steps [n], part -> score [n, seeds]); higher is better (FTA, or -loss)."""
    if leg == "qa":
        steps, fta = tail_qa.fta_curves(run, m)  # (n, m + 1, seeds)
        w = group_sizes(m).astype(float)
        head = np.arange(m + 1) <= m // 2
        return steps, {"all": np.einsum("ngs,g->ns", fta, w / w.sum()),
                       "head": np.einsum("ngs,g->ns", fta[:, head], w[head] / w[head].sum()),
                       "tail": fta[:, m]}  # fmt: skip
    steps, loss = train_runs.eval_series(run["records"], "loss")
    _, buckets, labels = train_runs.bucket_curves(run)
    seen = [i for i, lab in enumerate(labels) if lab != "unseen"]
    return steps, {"all": -loss.reshape(len(steps), -1), "head": -buckets[:, 0],
                   "tail": -buckets[:, seen[-1]]}  # fmt: skip


def grid(cfg: ConfigDict, leg: str) -> ConfigDict:
    """The learning-rate grids of a leg: ``qa_lr_grid`` or ``lr_grid``."""
    return cfg.qa_lr_grid if leg == "qa" else cfg.lr_grid


def point_name(leg: str, x: float) -> str:
    """A point's name (``given_lr``'s keys, figure panels): ``alpha<x>`` or ``V<x>``."""
    return f"{'alpha' if leg == 'qa' else 'V'}{x:g}"


def n_units(cfg: ConfigDict) -> int:
    """Training runs: per point, every optimizer's grid (none where ``given_lr`` states the
    rates) and one seeded run."""
    points = [(leg, x) for leg in cfg.legs for x in (cfg.alphas if leg == "qa" else cfg.vocabs)]
    swept = [leg for leg, x in points if not cfg.given_lr.get(point_name(leg, x))]
    grids = sum(len(grid(cfg, leg)[o]) for leg in swept for o in cfg.optimizers)
    return grids + len(points) * len(cfg.optimizers)


def run(cfg: ConfigDict, stage: common.Stage) -> dict[str, Any]:
    """Train every leg and point; ``ValueError`` (before training) for a leg other than qa /
    lm, an optimizer list without adam and muon, or fewer than 2 seeds."""
    if set(cfg.legs) - {"qa", "lm"} or not {"adam", "muon"} <= set(cfg.optimizers):
        raise ValueError(f"tail_dose legs must be from ('qa', 'lm') and optimizers include adam "
                         f"and muon, got {cfg.legs} and {cfg.optimizers}")  # fmt: skip
    if len(cfg.seeds) < 2:
        raise ValueError(f"tail_dose config field 'seeds' needs >= 2 seeds, got {cfg.seeds}")
    out_dir, cache_dir, progress = stage.out_dir, stage.cache_dir, stage.progress
    m = int(cfg.qa_base.data.biographies.m)
    metrics: dict[str, Any] = {"seeds": list(cfg.seeds), "legs": {}}
    figures, claims = [], []
    for leg in cfg.legs:
        doses = sorted(cfg.alphas if leg == "qa" else cfg.vocabs)  # the last is the heaviest
        points, panels = [], {}
        for x in doses:
            tl = ConfigDict({"base": point_config(cfg, leg, x), "seeds": tuple(cfg.seeds),
                             "optimizers": tuple(cfg.optimizers), "muon_roles": "hidden",
                             "lr_grid": grid(cfg, leg)})  # fmt: skip
            score = train_runs.final_train_loss if leg == "qa" else None  # QA evals: FTA only
            given = cfg.given_lr.get(point_name(leg, x))
            if given:  # rates stated in the config: no grid at this point
                chosen, tables = {o: float(given[o]) for o in cfg.optimizers}, {}
            else:
                chosen, _, tables = train_runs.choose_lrs(tl, cache_dir, progress=progress,
                                                       score=score)  # fmt: skip
            runs = train_runs.seeded_runs(tl, chosen, cache_dir, progress=progress)
            curves = {o: scores(leg, r, m) for o, r in runs.items()}
            steps, adam = curves["adam"]
            final = {o: {p: c[1][p][-1] for p in PARTS} for o, c in curves.items()}
            reach = train_runs.steps_to_target(steps, -curves["muon"][1]["all"], -adam["all"][-1])
            points.append({
                "dose": x, "chosen_lr": chosen, "lr_sweep": tables, "eval_steps": steps,
                "final": final, "curves": {o: c[1] for o, c in curves.items()},
                "lead": {o: {p: final[o][p] - final["adam"][p] for p in PARTS}
                         for o in runs if o != "adam"},
                "ratio": np.where(np.isfinite(reach), reach, steps[-1]) / steps[-1],
            })  # fmt: skip
            for p in ("head", "tail"):
                panels[f"{'alpha' if leg == 'qa' else 'V'}={x:g}, {p}"] = {
                    o: (c[0], c[1][p]) for o, c in curves.items()
                }
        xs = np.array([float(x) if leg == "qa" else math.log2(x) for x in doses])
        lead = {(o, p): np.stack([pt["lead"][o][p] for pt in points])
                for o in points[0]["lead"] for p in PARTS}  # fmt: skip
        metrics["legs"][leg] = {
            "dose": "alpha" if leg == "qa" else "V", "x": xs, "points": points,
            "slope": {f"{o}/{p}": common.interval_dict(stats.slope_interval(xs, v), "greater")
                      for (o, p), v in lead.items() if len(xs) > 1},
        }  # fmt: skip
        figures += leg_figures(leg, xs, lead, panels, out_dir)
        claims += leg_claims(leg, xs, points, lead)
    metrics["report_md"] = report_md(metrics)
    return {"metrics": metrics, "figures": figures, "claims": claims}


def leg_figures(leg: str, xs, lead, panels, out_dir) -> list[str]:
    """Lead against the dose (95% seed bands); head and tail score curves per dose."""
    what = "FTA" if leg == "qa" else "-val loss (nats/token)"
    p1 = plots.plot_curves(
        {f"{o} - adam, {p}": (xs, v) for (o, p), v in lead.items() if p != "head"},
        out_dir / "figures" / f"tail_dose_{leg}_lead.png",
        xlabel="Zipf exponent alpha" if leg == "qa" else "log2 vocabulary",
        ylabel=f"lead over Adam ({what})", title=f"{leg}: lead vs tail heaviness (95% seed bands)",
        hline=0.0, marker="o",
    )  # fmt: skip
    p2 = plots.plot_band_curves(
        panels, out_dir / "figures" / f"tail_dose_{leg}_curves.png", ncols=2
    )
    return [str(p.relative_to(out_dir)) for p in (p1, p2)]


CLAIMS = common.claim_specs("tail_dose")


def leg_claims(leg: str, xs, points, lead) -> list[common.Claim]:
    """:data:`CLAIMS`: lead grows with the dose; none at alpha = 0 (qa); SignGD below Muon at
    the heaviest dose."""
    dose, unit = ("alpha", "FTA") if leg == "qa" else ("log2 V", "nats/token")
    iv = stats.slope_interval(xs, lead["muon", "all"]) if len(xs) > 1 else None
    per = ", ".join(f"{pt['dose']:g}: {common.seed_mean(v)}"
                    for pt, v in zip(points, lead["muon", "all"], strict=True))  # fmt: skip
    out = [CLAIMS["{leg}_lead_grows"].claim(
        interval=iv, ours=f"slope {common.describe(iv)} {unit} per unit {dose}; lead per dose "
        f"{per}", leg=leg, dose=dose)]  # fmt: skip
    doses = [float(pt["dose"]) for pt in points]
    if leg == "qa" and 0.0 in doses:
        at0 = lead["muon", "all"][doses.index(0.0)]
        iv0, _ = common.seed_verdict(at0, direction="greater")
        margin = abs(float(np.mean(lead["muon", "all"][-1])))
        held = None if iv0 is None else (False if iv0.lo > 0 or iv0.hi < 0 else
                                         True if iv0.half_width < margin else None)  # fmt: skip
        c = CLAIMS["qa_no_lead_uniform"].claim(at0, ours="lead ", held=held)
        c.ours += f" FTA; margin (mean lead at the heaviest alpha) {margin:.3f}"
        out.append(c)
    if ("signgd", "all") in lead:
        d = lead["muon", "all"][-1] - lead["signgd", "all"][-1]
        c = CLAIMS["{leg}_signgd_not_muon"].claim(
            d, ours="Muon - SignGD ", leg=leg, dose=dose.split()[-1], heaviest=points[-1]["dose"]
        )
        c.ours += f" {unit}"
        out.append(c)
    return out


def report_md(m: dict[str, Any]) -> str:
    """Markdown per leg: LRs (grid edges), leads (all / head / tail), steps ratio, slopes."""
    lines = [
        f"Seeds {', '.join(map(str, m['seeds']))} (held out from the LR choice); mean ± "
        "95% interval. Lead = final score - Adam's (FTA, or nats/token of -val loss)."
    ]
    for leg, v in m["legs"].items():
        lines += [
            "",
            f"| {leg}: {v['dose']} | LR adam / muon / signgd | Muon lead all / head "
            "/ tail | SignGD lead all / tail | steps ratio |",
            "|---|---|---|---|---|",
        ]
        for pt in v["points"]:
            edge = any(r["at_edge"] for rows in pt["lr_sweep"].values() for r in rows)
            lr = " / ".join(f"{x:g}" for x in pt["chosen_lr"].values())
            lr += "" if pt["lr_sweep"] else " (given, not tuned here)"
            lead = {o: " / ".join(common.seed_mean(pt["lead"][o][p]) for p in ps)
                    for o, ps in (("muon", PARTS), ("signgd", ("all", "tail")))
                    if o in pt["lead"]}  # fmt: skip
            lines.append(f"| {pt['dose']:g} | {lr}{' (grid edge)' if edge else ''} | "
                         f"{lead['muon']} | {lead.get('signgd', '-')} | "
                         f"{common.seed_mean(pt['ratio'], 2)} |")  # fmt: skip
        lines += ["", f"Slopes against {'alpha' if leg == 'qa' else 'log2 V'}: " + "; ".join(
            f"{k} {s['estimate']:.3g} [{s['lo']:.3g}, {s['hi']:.3g}]"
            for k, s in v["slope"].items() if s)]  # fmt: skip
    return "\n".join(lines)


EXPERIMENT = common.Experiment("tail_dose", run, units=n_units)  # not default: CPU hours
