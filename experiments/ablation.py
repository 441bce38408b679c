"""Paper A Table 1 on the real corpus: Muon on a subset of roles, Adam on the rest.

For each subset S of the hidden roles (none, qk, vo, v, o, w_in, w_out, ffn, vo+ffn,
all) the same decoder is trained with Muon on S and Adam elsewhere (embeddings, head
and norms always Adam), for the non-gated (GELU) and gated (SwiGLU) FFN. Reported: the
final validation loss and the share of Muon's gain each subset recovers,

    share(S) = (L_none - L_S) / (L_none - L_all),

beside the paper's Table 1 (Wang et al. 2025, arXiv 2509.26030, Table 1), at tail_lm's
learning rates for every subset and FFN kind. The share is computed per seed (tail_lm's
seeds, trained at once) and judged by its 95% interval against the claim's threshold.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from ml_collections import ConfigDict

from amemory.analysis import plots, stats
from experiments import common, train_runs
from experiments.configs.ablation import PAPER_TABLE


def subset_config(base: ConfigDict, subset: str, muon_lr: float, adam_lr: float) -> ConfigDict:
    """Run config with Muon on ``subset`` ("none" = all Adam, "all" = every hidden matrix)."""
    if subset == "none":
        return train_runs.run_config(base, "adam", adam_lr, adam_lr)
    roles = "hidden" if subset == "all" else subset
    return train_runs.run_config(base, "muon", muon_lr, adam_lr, roles)


def gain_share(l_none: Any, l_subset: Any, l_all: Any) -> Any:
    """Share of Muon's gain recovered by a subset, ``(L_none - L_S) / (L_none - L_all)``.

    Scalars give a float; per-seed arrays ``[seeds]`` give ``[seeds]`` (elementwise).
    NaN where Muon-on-all does not improve on all-Adam (the share is then undefined).
    """
    ln, ls, la = (np.asarray(x, float) for x in (l_none, l_subset, l_all))
    denom = ln - la
    ok = np.isfinite(denom) & (denom > 0) & np.isfinite(ls)
    out = np.where(ok, (ln - ls) / np.where(ok, denom, 1.0), np.nan)
    return float(out) if out.ndim == 0 else out


def paper_shares(ffn: str) -> dict[str, float]:
    """The paper's share of gain per subset from Table 1 (paper A, arXiv 2509.26030)."""
    t = PAPER_TABLE[ffn]
    return {s: gain_share(t["none"], v, t["all"]) for s, v in t.items()}


def run(cfg: ConfigDict, stage: common.Stage) -> dict[str, Any]:
    """Run the ablation; ``ValueError`` for an unknown subset or FFN kind (before training)."""
    subsets = ("none", "qk", "vo", "v", "o", "w_in", "w_out", "w_gate", "ffn", "vo+ffn", "all")
    common.check_values("ablation", cfg, subsets=subsets, ffn_kinds=("gelu", "swiglu"))
    out_dir, cache_dir, progress = stage.out_dir, stage.cache_dir, stage.progress
    chosen, _, tables = train_runs.choose_lrs(
        cfg, cache_dir, progress=progress, optimizers=("adam", "muon")
    )
    losses: dict[str, dict[str, np.ndarray]] = {}
    for ffn in cfg.ffn_kinds:
        base = ConfigDict(cfg.base.to_dict())
        if not (ffn == "gelu" and base.model.ffn in (None, "gelu")):
            base.model.ffn = ffn  # gelu on the default base stays identical to tail_lm's
        losses[ffn] = {}
        for subset in cfg.subsets:
            rc = subset_config(base, subset, chosen["muon"], chosen["adam"])
            r = train_runs.train_cached(
                train_runs.seeded(rc, cfg.seeds), cache_dir, f"ablation-{ffn}-{subset}-seeds"
            )
            losses[ffn][subset] = train_runs.final_eval_seeds(r)
            progress(f"{ffn} {subset}")
    shares = {ffn: {s: gain_share(v.get("none", math.nan), x, v.get("all", math.nan))
                    for s, x in v.items()} for ffn, v in losses.items()}  # fmt: skip
    metrics = {
        "chosen_lr": chosen, "lr_sweep": tables, "val_loss": losses, "share": shares,
        "seeds": list(cfg.seeds),
    }  # fmt: skip
    figures = [stage.figure(plots.plot_bars(
        {s: shares[ffn][s] for s in cfg.subsets}, out_dir / "figures" / f"ablation_share_{ffn}.png",
        ylabel="share of Muon's gain", reference=paper_shares(ffn),
        title=f"Muon on subset, Adam elsewhere ({ffn} FFN), 95% seed intervals",
    )) for ffn in cfg.ffn_kinds]  # fmt: skip
    metrics["report_md"] = report_md(cfg, metrics)
    claims = make_claims(cfg, metrics)
    return {"metrics": metrics, "figures": figures, "claims": claims}


def report_md(cfg: ConfigDict, m: dict[str, Any]) -> str:
    """Markdown table: final loss and share of gain per subset (seed mean ± 95% CI), paper's."""
    lr = m["chosen_lr"]
    lines = [f"Learning rates: Adam {lr['adam']:g}, Muon {lr['muon']:g} (tail_lm's grid choice; "
             f"the same for every subset). Seeds {', '.join(map(str, m['seeds']))}: mean ± 95% "
             "interval.", ""]  # fmt: skip
    for ffn, losses in m["val_loss"].items():
        ps = paper_shares(ffn)
        lines += [f"{ffn} FFN: final validation loss (nats/token) and share of Muon's gain", ""]
        lines += common.table(
            ("Muon on", "our loss", "our share", "paper loss (160M)", "paper share"),
            ((s, common.seed_mean(v), common.seed_mean(m["share"][ffn][s], 2),
              common.fmt(PAPER_TABLE[ffn].get(s)), common.fmt(ps.get(s), 2))
             for s, v in losses.items()),
        ) + [""]  # fmt: skip
    return "\n".join(lines)


CLAIMS = common.claim_specs("ablation")
SUBSETS = {"vo+ffn": "vo_ffn_share", "qk": "qk_share"}  # the subset each claim is about


def make_claims(cfg: ConfigDict, m: dict[str, Any]) -> list[common.Claim]:
    """:data:`CLAIMS` on the per-seed share, held for every FFN kind (the interval shown in
    the report: the GELU one)."""
    claims = []
    for subset, key in SUBSETS.items():
        spec = CLAIMS[key]
        vals = {ffn: sh[subset] for ffn, sh in m["share"].items() if subset in sh}
        if not vals:
            continue
        t = cfg.vo_ffn_min_share if subset == "vo+ffn" else cfg.qk_max_share
        paper = ", ".join(f"{ffn} {paper_shares(ffn)[subset]:.2f}" for ffn in vals)
        per = {f: spec.claim(v, ours=f"{f} ", threshold=t, digits=2, paper=paper)
               for f, v in vals.items()}  # fmt: skip
        first = per.get("gelu") or next(iter(per.values()))
        first.ours = "; ".join(c.ours for c in per.values())
        first.held = stats.all_verdicts([c.held for c in per.values()])
        claims.append(first)
    return claims


EXPERIMENT = common.Experiment(
    "ablation", run, default=True,  # units: the LR sweeps, then a run per subset and FFN
    units=lambda c: len(c.lr_grid.adam) + len(c.lr_grid.muon) + len(c.subsets) * len(c.ffn_kinds),
    reduced={"subsets": ("none", "qk", "vo+ffn", "all"), "ffn_kinds": ("gelu",)},
    headline=("ablation/vo_ffn_share", "ablation/qk_share"),
)  # fmt: skip
