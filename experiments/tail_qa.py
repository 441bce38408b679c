"""Heavy-tailed knowledge QA (paper A, A.3): first-token accuracy per frequency group.

Synthetic biographies (``amemory.data.biographies``): group g = 0..m holds 2^(g-1)
individuals, each seen in 2^(m-g) selections, so group m is the rarest. The decoder of
tail_lm is trained on the biographies and QA rows with Muon (hidden matrices; Adam on
embeddings, head, norms), Adam, SGD with momentum, Muon on VO+FFN only and Muon on QK
only; first-token accuracy (FTA) of each group's questions is measured over training,
beside the paper's (Wang et al. 2025, arXiv 2509.26030, Sec. 5; ``PAPER_FTA``).

Learning rates come from a grid on ``base.seed`` (or from tail_lm's choice inside
``amemory reproduce``); every variant is then trained on the seeds ``cfg.seeds`` at once,
and the claims rest on the 95% interval of the paired per-seed difference.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ml_collections import ConfigDict

from amemory.analysis import plots
from experiments import common, train_runs
from experiments.configs.tail_qa import PAPER_FTA


def variant_config(
    base: ConfigDict, variant: str, lr: dict[str, float], sgd_momentum: float = 0.9
) -> ConfigDict:
    """Run config of a variant: ``adam``, ``muon``, ``sgd``, ``signgd`` or ``muon_<roles>``;
    ``ValueError`` for another."""
    if variant == "adam":
        return train_runs.run_config(base, "adam", lr["adam"], lr["adam"])
    if variant in ("muon", "signgd"):
        return train_runs.run_config(base, variant, lr[variant], lr["adam"], "hidden")
    if variant.startswith("muon_"):
        return train_runs.run_config(base, "muon", lr["muon"], lr["adam"], variant[5:])
    if variant == "sgd":
        c = train_runs.run_config(base, "sgd", lr["sgd"], lr["adam"], "all")
        c.optimizer.momentum = float(sgd_momentum)
        return c
    raise ValueError(
        f"tail_qa variant must be adam, muon, sgd, signgd or muon_<roles>, got {variant!r}"
    )


def n_units(cfg: ConfigDict) -> int:
    """Training runs: the sweeps (when ``cfg.sweep``) plus one multi-seed run per variant."""
    swept = [v for v in ("adam", "muon", "sgd") if v in cfg.variants] if cfg.sweep else []
    return sum(len(cfg.lr_grid[v]) for v in swept) + len(cfg.variants)


def fta_curves(run: dict[str, Any], m: int) -> tuple[np.ndarray, np.ndarray]:
    """(eval steps [n], FTA [n, m + 1, seeds]) per group of one run (seeds = 1 for one seed)."""
    cols = []
    steps = np.zeros(0)
    for g in range(m + 1):
        steps, v = train_runs.eval_series(run["records"], f"fta/group_{g}")
        cols.append(v.reshape(len(steps), -1))
    return steps, np.stack(cols, axis=1)


def run(cfg: ConfigDict, stage: common.Stage) -> dict[str, Any]:
    """Run the experiment (see the module docstring); figures under ``stage.out_dir``."""
    for v in cfg.variants:
        variant_config(cfg.base, v, {"adam": 1.0, "muon": 1.0, "sgd": 1.0, "signgd": 1.0})
    out_dir, cache_dir, progress = stage.out_dir, stage.cache_dir, stage.progress
    m = int(cfg.base.data.biographies.m)
    lr = {k: float(v) for k, v in cfg.lr.items()}
    tables: dict[str, list] = {}
    if cfg.sweep:
        order = [v for v in ("adam", "muon", "sgd") if v in cfg.variants]
        for v in order:  # Adam first: its LR is the Adam half of the others
            chosen, _, rows = train_runs.lr_sweep(
                lambda x, v=v: variant_config(cfg.base, v, {**lr, v: x}, cfg.sgd_momentum),
                cfg.lr_grid[v], cache_dir, f"bio-{v}", progress=progress, key="train_loss",
                score=train_runs.final_train_loss,  # biographies evals report FTA only
            )  # fmt: skip
            lr[v], tables[v] = chosen, rows
    runs: dict[str, Any] = {}
    for v in cfg.variants:
        rc = variant_config(cfg.base, v, lr, cfg.sgd_momentum)
        runs[v] = train_runs.train_cached(
            train_runs.seeded(rc, cfg.seeds), cache_dir, f"bio-{v}-seeds"
        )
        progress(v)
    used = {"muon", "adam"} | {v.split("_")[0] for v in cfg.variants}
    lr = {k: v for k, v in lr.items() if k in used}
    metrics: dict[str, Any] = {
        "lr": lr, "lr_sweep": tables, "swept": bool(cfg.sweep), "lr_source": cfg.lr_source,
        "seeds": list(cfg.seeds), "sweep_seed": int(cfg.base.seed), "runs": {},
    }  # fmt: skip
    tail_groups = [m - o for o in cfg.tail_offsets if m - o >= 0]
    final_fta, curves = {}, {}
    for v, r in runs.items():
        steps, fta = fta_curves(r, m)  # (n, m + 1, seeds)
        final_fta[v] = fta[-1] if fta.size else np.full((m + 1, 1), np.nan)
        curves[v] = (steps, fta)
        metrics["runs"][v] = {
            "workdir": r["workdir"], "eval_steps": steps, "fta": fta,
            "final_fta": final_fta[v],  # (m + 1, seeds)
            "final_train_loss": train_runs.final_train_loss_seeds(r),
            "tail_fta": final_fta[v][tail_groups],  # (tail groups, seeds)
        }  # fmt: skip
    metrics["tail_groups"] = tail_groups
    p1 = plots.plot_group_accuracy(
        list(range(m + 1)), final_fta, out_dir / "figures" / "tail_qa_fta_per_group.png",
        title=f"first-token accuracy per group, step {cfg.base.steps} (m = {m}), 95% band",
    )  # fmt: skip
    p2 = plots.plot_curves(
        {v: (curves[v][0], curves[v][1][:, m]) for v in runs},
        out_dir / "figures" / "tail_qa_rarest_group.png", xlabel="step",
        ylabel=f"FTA, group {m} (rarest)", title="rarest group over training (95% seed bands)",
    )  # fmt: skip
    metrics["report_md"] = report_md(cfg, metrics)
    return {"metrics": metrics, "figures": [stage.figure(p1), stage.figure(p2)],
            "claims": make_claims(metrics)}  # fmt: skip


def report_md(cfg: ConfigDict, m: dict[str, Any]) -> str:
    """Markdown: learning rates and tail-group FTA (seed mean ± 95% CI), paper's beside."""
    groups = m["tail_groups"]
    src = m["lr_source"]
    if m["swept"]:
        grids = "; ".join(f"{v}: " + ", ".join(f"{r['lr']:g}" for r in rows)
                          for v, rows in m["lr_sweep"].items())  # fmt: skip
        src = f"grid {grids}; lowest final training loss of seed {m['sweep_seed']}"
    lr = ", ".join(f"{k} {v:g}" for k, v in m["lr"].items())
    lines = [f"Learning rates: {lr} ({src}). Seeds {', '.join(map(str, m['seeds']))}: "
             "mean ± 95% interval.", ""]  # fmt: skip
    head = ("variant", "FTA groups " + "/".join(map(str, groups)) + " (ours)",
            "paper, groups 11/13/15 of m=15", "final train loss")  # fmt: skip
    return "\n".join(lines + common.table(head, (
        (v, " / ".join(common.seed_mean(x, 3) for x in np.asarray(r["tail_fta"])),
         " / ".join(f"{x:.3f}" for x in PAPER_FTA.get(v, ())) or "-",
         common.seed_mean(r["final_train_loss"])) for v, r in m["runs"].items())))  # fmt: skip


CLAIMS = common.claim_specs("tail_qa")


def make_claims(m: dict[str, Any]) -> list[common.Claim]:
    """:data:`CLAIMS` on the tail groups' FTA (paired seed intervals), where both arms ran."""
    claims, runs, groups = [], m["runs"], m["tail_groups"]
    if "muon" in runs and "adam" in runs:
        mu, ad = np.asarray(runs["muon"]["tail_fta"]), np.asarray(runs["adam"]["tail_fta"])
        per = " vs ".join(f"{o} " + "/".join(map(common.seed_mean, x))
                          for o, x in (("Muon", mu), ("Adam", ad)))  # fmt: skip
        ours = f"groups {'/'.join(map(str, groups))}: {per}; mean over these groups: "
        claims.append(CLAIMS["tail_group_fta"].claim(mu.mean(axis=0), ad.mean(axis=0), ours=ours))
    if "muon_vo+ffn" in runs and "muon_qk" in runs:
        vf, qk = (np.asarray(runs[f"muon_{r}"]["tail_fta"])[-1] for r in ("vo+ffn", "qk"))
        claims.append(CLAIMS["vo_ffn_vs_qk"].claim(vf, qk, ours=f"group {groups[-1]}: "))
    return claims


EXPERIMENT = common.Experiment(
    "tail_qa", run, units=n_units, default=True, lr_from="tail_lm",
    # Muon and Adam only: a 3-seed biography run costs about 4 CPU minutes; the VO+FFN vs QK
    # question is the ablation's on the corpus (with seeds), and --only tail_qa's.
    reduced={"variants": ("muon", "adam"), "sweep": False},
    headline=("tail_qa/tail_group_fta",),
)  # fmt: skip
