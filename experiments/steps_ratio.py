"""Steps Muon needs to reach Adam's final validation loss, against model size.

Peers report that Muon reaches AdamW's loss with about half of its compute (Moonlight,
arXiv 2502.16982, Sec. 3; arXiv 2509.24406: 48-52%). At every size of a one-factor sweep
around tail_lm's quick model (width, depth, vocabulary), learning rates are chosen on a
grid by seed 0, both optimizers run on the held-out seeds, and per seed the ratio = (first
step, interpolated, at which Muon reaches Adam's final validation loss of the same seed) /
steps. At ``reference_sizes`` the plain optax + flax loop of ``experiments/reference_lm.py``
checks the engine's Adam (it must match within seed noise) and gives optax's Muon ratio.
``budget_fractions`` trains Muon on shorter schedules, ``adam_betas`` Adam with other betas.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ml_collections import ConfigDict

from amemory.analysis import plots
from experiments import common, reference_lm, train_runs

AXES = ("width", "depth", "vocab")


def base_point(cfg: ConfigDict) -> dict[str, int]:
    """The size every axis passes through: ``cfg.base``'s width, depth and vocabulary."""
    m = cfg.base.model
    return {"d_model": int(m.d_model), "n_layers": int(m.n_layers),
            "vocab_size": int(cfg.base.data.vocab_size)}  # fmt: skip


def sizes(cfg: ConfigDict) -> dict[str, dict[str, Any]]:
    """The sweep's sizes, ``d<width>`` / ``L<depth>`` / ``V<vocab>`` -> {"d_model", "n_layers",
    "vocab_size", "axes": [...]}, one factor at a time around :func:`base_point`."""
    base = base_point(cfg)
    out: dict[str, dict[str, Any]] = {}

    def add(name: str, axis: str, **over: int) -> None:
        point = {**base, **over}
        if point == base:
            name = f"d{base['d_model']}"
        out.setdefault(name, {**point, "axes": []})["axes"].append(axis)

    for d in cfg.widths:
        add(f"d{d}", "width", d_model=int(d))
    for n in cfg.depths:
        add(f"L{n}", "depth", n_layers=int(n))
    for v in cfg.vocabs:
        add(f"V{v}", "vocab", vocab_size=int(v))
    out.setdefault(f"d{base['d_model']}", {**base, "axes": list(AXES)})
    return out


def size_config(base: ConfigDict, point: dict[str, Any]) -> ConfigDict:
    """``base`` with the size of ``point``: width, depth and vocabulary.

    The head dimension and the FFN ratio d_ff / d of ``base`` are kept, so ``base``'s own
    size gives ``base`` unchanged.

    Raises:
      ValueError: if the width is not a positive multiple of ``base``'s head dimension.
    """
    m = base.model
    head_dim, ffn_ratio = m.d_model // m.n_heads, m.d_ff / m.d_model
    d = int(point["d_model"])
    if d <= 0 or d % head_dim:
        raise ValueError(
            f"steps_ratio widths must be positive multiples of the head dimension {head_dim}, "
            f"got {d}"
        )
    c = ConfigDict(base.to_dict())
    c.model.d_model = d
    c.model.n_heads = d // head_dim
    c.model.d_ff = int(round(ffn_ratio * d))
    c.model.n_layers = int(point["n_layers"])
    c.data.vocab_size = int(point["vocab_size"])
    return c


def n_units(cfg: ConfigDict) -> int:
    """Training runs (progress bar): sweeps, two multi-seed runs per size, references."""
    n = 0
    for name in sizes(cfg):
        if name not in cfg.fixed_lr_sizes:
            n += sum(len(g) for g in grid(cfg, name).values())
        n += 2
    return n + 2 * len(cfg.reference_sizes) + len(cfg.budget_fractions) + len(cfg.adam_betas)


def grid(cfg: ConfigDict, name: str) -> dict[str, tuple[float, ...]]:
    """The learning-rate grid of size ``name``: ``lr_grid_small`` for ``small_grid_sizes``."""
    g = cfg.lr_grid_small if name in cfg.small_grid_sizes else cfg.lr_grid
    return {k: tuple(float(x) for x in v) for k, v in g.to_dict().items()}


def _ratio(steps: np.ndarray, muon: np.ndarray, adam_final: np.ndarray, total: float):
    reach = train_runs.steps_to_target(steps, muon, adam_final)
    return reach / float(total)


def run(cfg: ConfigDict, stage: common.Stage) -> dict[str, Any]:
    """Run the sweep; ``ValueError`` for a ``test_size``, ``reference_sizes``, ``fixed_lr_sizes``
    or ``small_grid_sizes`` entry not among the sweep's sizes, or fewer than 2 seeds."""
    points = sizes(cfg)
    fields = ("reference_sizes", "fixed_lr_sizes", "small_grid_sizes")
    common.check_values("steps_ratio", cfg, **dict.fromkeys(fields, points))
    if cfg.test_size not in points:
        raise ValueError(f"steps_ratio config field 'test_size': {cfg.test_size!r} not in "
                         f"{list(points)}")  # fmt: skip
    if len(cfg.seeds) < 2:
        raise ValueError(f"steps_ratio config field 'seeds' needs >= 2 seeds, got {cfg.seeds}")
    out_dir, cache_dir, progress = stage.out_dir, stage.cache_dir, stage.progress
    by_size: dict[str, Any] = {}
    for name, point in points.items():
        base = size_config(cfg.base, point)
        tl = ConfigDict({
            "base": base, "optimizers": ("adam", "muon"), "muon_roles": "hidden",
            "lr_grid": grid(cfg, name), "seeds": tuple(cfg.seeds),
        })  # fmt: skip
        if name in cfg.fixed_lr_sizes:
            chosen, tables = {"adam": float(cfg.lr.adam), "muon": float(cfg.lr.muon)}, {}
        else:
            chosen, _, tables = train_runs.choose_lrs(tl, cache_dir, progress=progress)
        runs = train_runs.seeded_runs(tl, chosen, cache_dir, progress=progress)
        curves = {}
        for opt, r in runs.items():
            steps, loss = train_runs.eval_series(r["records"], "loss")
            curves[opt] = (steps, loss.reshape(len(steps), -1))
        adam_final = curves["adam"][1][-1]
        by_size[name] = {
            **{k: point[k] for k in ("d_model", "n_layers", "vocab_size", "axes")},
            "n_params": runs["adam"]["summary"].get("n_params"),
            "chosen_lr": chosen, "lr_sweep": tables,
            "lr_source": cfg.lr_source if name in cfg.fixed_lr_sizes else (
                "grid " + "; ".join(f"{o} {', '.join(f'{x:g}' for x in g)}"
                                    for o, g in grid(cfg, name).items()) + " on seed 0"
            ),
            "eval_steps": curves["adam"][0],
            "val_loss": {o: c[1] for o, c in curves.items()},
            "final": {o: c[1][-1] for o, c in curves.items()},
            "ratio": _ratio(*curves["muon"], adam_final, base.steps),
        }  # fmt: skip
        if name in cfg.reference_sizes:
            by_size[name]["reference"] = reference_block(cfg, base, chosen, runs, cache_dir)
            progress(f"{name} reference")
    metrics: dict[str, Any] = {"sizes": by_size, "seeds": list(cfg.seeds)}
    if cfg.budget_fractions:
        metrics["budget"] = budget_block(cfg, points, by_size, cache_dir, progress)
    if cfg.adam_betas:
        metrics["adam_betas"] = betas_block(cfg, points, by_size, cache_dir, progress)
    metrics["report_md"] = report_md(cfg, metrics)
    return {"metrics": metrics, "figures": [figure(cfg, by_size, out_dir)],
            "claims": make_claims(cfg, metrics)}  # fmt: skip


def reference_block(
    cfg: ConfigDict, base: ConfigDict, chosen: dict[str, float], runs: dict[str, Any], cache_dir
) -> dict[str, Any]:
    """Plain optax + flax runs at one size beside the engine's: Adam match and optax's ratio."""
    adam_cfg = train_runs.run_config(base, "adam", chosen["adam"], chosen["adam"])
    muon_cfg = train_runs.run_config(base, "muon", chosen["muon"], chosen["adam"])
    ref_adam = reference_lm.cached_run(adam_cfg, "adam", tuple(cfg.seeds), cache_dir)
    ref_muon = reference_lm.cached_run(muon_cfg, "optax_muon", tuple(cfg.seeds), cache_dir)
    engine_adam = train_runs.final_eval_seeds(runs["adam"])
    plain_adam = np.asarray(ref_adam["val_loss"], float)[-1]
    plain_muon = np.asarray(ref_muon["val_loss"], float)
    steps = np.asarray(ref_muon["eval_steps"], float)
    diff, _ = common.seed_verdict(engine_adam, plain_adam, direction="greater")
    return {
        "engine_adam_final": engine_adam,
        "plain_adam_final": plain_adam,
        "plain_muon_final": plain_muon[-1],
        "adam_difference": common.interval_dict(diff, "equal"),
        "adam_seed_sd": float(np.std(engine_adam, ddof=1)),
        "plain_ratio": _ratio(steps, plain_muon, plain_adam, base.steps),
        "plain_val_loss": {"adam": ref_adam["val_loss"], "optax_muon": ref_muon["val_loss"]},
    }


def _base_size(cfg: ConfigDict, points: dict[str, Any]) -> tuple[str, ConfigDict]:
    """The base size's name and run config (:func:`base_point`)."""
    name = f"d{base_point(cfg)['d_model']}"
    return name, size_config(cfg.base, points[name])


def budget_block(cfg, points, by_size, cache_dir, progress) -> dict[str, Any]:
    """Muon at the base size on schedules of ``budget_fractions`` of the steps (seeded runs).

    Returns fractions [k + 1] (the last is 1), Muon's final loss per fraction and seed
    [k + 1, seeds], and per seed the smallest fraction whose final loss reaches Adam's
    final loss (linear interpolation in the fraction; NaN if none does).
    """
    name, base = _base_size(cfg, points)
    chosen = by_size[name]["chosen_lr"]
    finals = []
    fractions = sorted(float(f) for f in cfg.budget_fractions)
    for f in fractions:
        c = train_runs.run_config(base, "muon", chosen["muon"], chosen["adam"])
        c.steps = max(2, int(round(f * base.steps)))
        c.schedule.warmup_steps = max(1, int(round(f * base.schedule.warmup_steps)))
        c.eval_every = max(1, int(round(f * base.eval_every)))
        r = train_runs.train_cached(train_runs.seeded(c, cfg.seeds), cache_dir, f"sr-budget-{f:g}")
        finals.append(train_runs.final_eval_seeds(r))
        progress(f"muon budget {f:g}")
    finals.append(np.asarray(by_size[name]["final"]["muon"], float))
    fr = np.array(fractions + [1.0])
    finals = np.stack(finals)  # (k + 1, seeds)
    adam = np.asarray(by_size[name]["final"]["adam"], float)
    need = np.array(
        [train_runs.steps_to_reach(fr, finals[:, s], adam[s]) for s in range(adam.size)]
    )
    return {"fractions": fr, "muon_final": finals, "adam_final": adam, "fraction_needed": need}


def betas_block(cfg, points, by_size, cache_dir, progress) -> dict[str, Any]:
    """Adam at the base size with other (b1, b2) at its chosen LR: is (0.8, 0.95) a handicap?

    Returns ``"b1,b2"`` -> {"final": [seeds], "ratio": [seeds]} (Muon's ratio against that
    Adam's final loss of the same seed), beside the base run's own betas.
    """
    name, base = _base_size(cfg, points)
    v = by_size[name]
    steps, muon = np.asarray(v["eval_steps"], float), np.asarray(v["val_loss"]["muon"], float)
    out = {}
    for b1, b2 in cfg.adam_betas:
        c = train_runs.run_config(base, "adam", v["chosen_lr"]["adam"], v["chosen_lr"]["adam"])
        c.optimizer.b1, c.optimizer.b2 = float(b1), float(b2)
        r = train_runs.train_cached(
            train_runs.seeded(c, cfg.seeds), cache_dir, f"sr-adam-b{b1:g}-{b2:g}"
        )
        final = train_runs.final_eval_seeds(r)
        out[f"{b1:g},{b2:g}"] = {"final": final, "ratio": _ratio(steps, muon, final, base.steps)}
        progress(f"adam betas {b1:g}, {b2:g}")
    return out


def figure(cfg: ConfigDict, by_size: dict[str, Any], out_dir: Any) -> str:
    """Ratio (seed mean, 95% band) against parameter count, one series per sweep axis."""
    series = {}
    for axis in AXES:
        pts = sorted((v["n_params"], np.asarray(v["ratio"], float)) for v in by_size.values()
                     if axis in v["axes"] and v["n_params"])  # fmt: skip
        if pts:
            series[axis] = (np.array([p[0] for p in pts], float), np.stack([p[1] for p in pts]))
    p = plots.plot_curves(
        series, out_dir / "figures" / "steps_ratio.png", xlabel="parameters",
        ylabel="Muon steps to Adam's final loss / steps", logx=True, marker="o",
        title="steps-to-Adam ratio vs size (95% seed bands)", hline=float(cfg.half_threshold),
    )  # fmt: skip
    return str(p.relative_to(out_dir))


def report_md(cfg: ConfigDict, m: dict[str, Any]) -> str:
    """Markdown: per size the chosen LRs, final losses and the ratio (seed mean ± 95% CI)."""
    sm = common.seed_mean
    lines = [f"Seeds {', '.join(map(str, m['seeds']))} (held out from the LR choice; same data "
             "order); values are mean ± 95% interval over seeds. Ratio = steps Muon needs to "
             "reach Adam's final validation loss of the same seed / steps.", ""]  # fmt: skip
    rows = []
    for name, v in m["sizes"].items():
        edge = any(r.get("at_edge") for rows_ in (v["lr_sweep"] or {}).values() for r in rows_)
        lr = f"{v['chosen_lr']['adam']:g} / {v['chosen_lr']['muon']:g}" + " (grid edge)" * edge
        rows.append((f"{name} (d={v['d_model']}, L={v['n_layers']}, V={v['vocab_size']})",
                     v["n_params"], lr, sm(v["final"]["adam"]), sm(v["final"]["muon"]),
                     sm(v["ratio"], 2), v["lr_source"]))  # fmt: skip
    lines += common.table(("size", "params", "LR Adam / Muon", "Adam final", "Muon final",
                           "ratio", "LR source"), rows)  # fmt: skip
    refs = {k: v["reference"] for k, v in m["sizes"].items() if "reference" in v}
    if refs:
        lines += ["", "Plain optax + flax reference (same model, initialisation and batches): "
                  "`optax.adam` and `optax.contrib.muon` (hidden matrices; Adam elsewhere).",
                  ""]  # fmt: skip
        lines += common.table(
            ("size", "engine Adam final", "plain Adam final", "engine − plain", "seed sd",
             "plain Muon final", "plain ratio"),
            ((name, sm(r["engine_adam_final"]), sm(r["plain_adam_final"]),
              "-" if (d := r["adam_difference"]) is None
              else f"{d['estimate']:.2e} [{d['lo']:.2e}, {d['hi']:.2e}]",
              common.fmt(r["adam_seed_sd"]), sm(r["plain_muon_final"]), sm(r["plain_ratio"], 2))
             for name, r in refs.items()),
        )  # fmt: skip
    if "budget" in m:
        b = m["budget"]
        pairs = zip(b["fractions"], np.asarray(b["muon_final"]), strict=True)
        finals = ", ".join(f"{f:g}: {sm(x)}" for f, x in pairs)
        lines += ["", "Muon on shorter schedules at the base size (fraction of the steps: final "
                  "loss):", "", f"{finals}; Adam's final {sm(b['adam_final'])}; fraction needed "
                  f"{sm(b['fraction_needed'], 2)}."]  # fmt: skip
    if "adam_betas" in m:
        base = m["sizes"][f"d{base_point(cfg)['d_model']}"]
        own = f"{cfg.base.optimizer.b1:g}, {cfg.base.optimizer.b2:g}"
        lines += ["", f"Adam's betas at the base size (its chosen LR; the runs above use ({own})):"
                  " final loss and Muon's ratio against that Adam:", ""]  # fmt: skip
        for k, v in {own: {"final": base["final"]["adam"], "ratio": base["ratio"]},
                     **m["adam_betas"]}.items():  # fmt: skip
            lines.append(f"- ({k}): {sm(v['final'])}, ratio {sm(v['ratio'], 2)}")
    return "\n".join(lines)


CLAIMS = common.claim_specs("steps_ratio")


def make_claims(cfg: ConfigDict, m: dict[str, Any]) -> list[common.Claim]:
    """:data:`CLAIMS`: about half the steps at ``test_size``; engine Adam = plain optax Adam."""
    v = m["sizes"][cfg.test_size]
    ratio = np.asarray(v["ratio"], float)
    never = ~np.isfinite(ratio)
    # A seed whose Muon never reaches Adam's final loss needs more than all the steps:
    # counted as 1 (a lower bound), stated in the result.
    size = f"{cfg.test_size} (d={v['d_model']}, L={v['n_layers']}, V={v['vocab_size']})"
    half = CLAIMS["about_half"].claim(np.where(never, 1.0, ratio), ours=f"{size}: ratio ",
                           threshold=cfg.half_threshold, digits=2)  # fmt: skip
    if never.any():
        half.ours += f" ({int(never.sum())} seed(s) never reached it: counted as 1)"
    half.ours += "; other sizes: " + ", ".join(
        f"{k} {common.seed_mean(x['ratio'], 2)}" for k, x in m["sizes"].items()
        if k != cfg.test_size)  # fmt: skip
    claims = [half]
    for name, x in m["sizes"].items():
        r = x.get("reference")
        if r is not None and r["adam_difference"] is not None:
            sd = r["adam_seed_sd"]
            c = CLAIMS["adam_matches_optax_{size}"].claim(
                r["engine_adam_final"], r["plain_adam_final"], threshold=sd, size=name
            )
            c.ours += f"; seed sd {common.fmt(sd)}"
            claims.append(c)
    return claims


EXPERIMENT = common.Experiment("steps_ratio", run, units=n_units, default=True)
