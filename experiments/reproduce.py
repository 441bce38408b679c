"""`amemory reproduce`: run the papers' experiments at a chosen scale and write a report.

Usage::

    amemory reproduce                        # default stages, quick scale (CPU, < 20 min)
    amemory reproduce --scale full           # paper-sized configs (GPU/TPU hours)
    amemory reproduce --only tail_qa         # one experiment (its full quick config)
    amemory reproduce --out runs/final       # choose the run directory
    amemory reproduce --update-readme README.md   # also refresh README's results section
    amemory reproduce --scale full --set base.parallel.mode=sharded   # many devices

Default stages (quick scale): ``check`` (``amemory check --quick``), ``one_layer``,
``tail_lm`` (Adam and Muon; SignGD only with ``--only``), ``isotropy`` (on tail_lm's
seeded runs), a reduced ``ablation`` (Muon on none, qk, vo+ffn, all), a reduced
``tail_qa`` (Muon and Adam) and ``steps_ratio`` (widths 64 and 128; tail_lm's runs at
128). The reduced isotropy and tail_qa take tail_lm's chosen learning rates. Every
transformer claim of these stages rests on 3 held-out initialisation seeds trained in one
vmapped program per run, and is judged by a 95% seed interval (held / not held /
undecided). ``--only`` also accepts ``arch`` (single seed; its config's learning rates,
tail_lm's quick-scale choice), ``scaling`` and ``normuon``, and the full (non-reduced)
variants of the others.

Output: ``runs/reproduce-<UTC timestamp>/`` (or ``--out``) with one sub-directory per
stage (``result.json``, ``figures/``), ``train_runs/`` (every transformer run, shared
between stages: identical configs are trained once), ``report.md`` and
``summary.json``. The report sets each of the papers' claims beside our measurement
with a verdict (held / not held / undecided) decided by a rule stated in the table.

Full scale on accelerators: ``--scale full`` selects the paper-sized configs (each
experiment's ``configs/<name>.py``); ``--set base.parallel.mode=sharded`` (or ``pmap``)
spreads every transformer run over the local devices, and on several hosts the same
command runs on every host with ``--set base.parallel.distributed=true`` (jax.distributed;
coordinator auto-detected on SLURM/TPU or given by ``base.parallel.coordinator_address``).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import resource
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from amemory import atomic
from experiments import common

DEFAULT_STAGES = (
    "check", "one_layer", "tail_lm", "isotropy", "ablation", "tail_qa", "steps_ratio",
)  # fmt: skip
# Stages run only with --only: arch (single-seed cells, about 8 CPU minutes) and the others
# that do not fit the main job's 20-minute budget next to the seeded stages.
ALL_STAGES = DEFAULT_STAGES + ("arch", "scaling", "normuon")

# Overrides giving the reduced variants run by default (not with --only).
REDUCED: dict[str, dict[str, Any]] = {
    "tail_lm": {"optimizers": ("adam", "muon")},  # SignGD carries no claim
    "ablation": {"subsets": ("none", "qk", "vo+ffn", "all"), "ffn_kinds": ("gelu",)},
    # Muon and Adam only: a 3-seed biography run costs about 4 CPU minutes; the VO+FFN vs QK
    # question is the ablation's on the corpus (with seeds), and --only tail_qa's.
    "tail_qa": {"variants": ("muon", "adam"), "sweep": False},
}

# Reduced stages that take tail_lm's learning-rate choice instead of a grid of their
# own (their config fields lr.adam / lr.muon / lr_source), with the reason stated.
TAIL_LM_LR = {
    "isotropy": "tail_lm's grid choice; the runs are tail_lm's seeded runs",
    "tail_qa": "not swept here: tail_lm's grid choice for the same model on the corpus",
    "arch": "not swept here: tail_lm's grid choice for the same model on the corpus",
}

# Claims shown first in the summary, in this order (others follow).
HEADLINE = (
    "tail_lm/tail_bucket_loss",
    "ablation/vo_ffn_share",
    "ablation/qk_share",
    "tail_qa/tail_group_fta",
)

README_BEGIN = "<!-- BEGIN reproduce -->"
README_END = "<!-- END reproduce -->"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # noqa: D401 - argparse API
        sys.stderr.write(f"amemory reproduce: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``amemory reproduce``."""
    p = _Parser(prog="amemory reproduce", description=__doc__.splitlines()[0])
    p.add_argument("--scale", default="quick", choices=common.SCALES, help="quick (CPU) or full")
    p.add_argument(
        "--only",
        action="append",
        default=None,
        choices=ALL_STAGES,
        metavar="NAME",
        help=f"run only this stage (repeatable); one of {', '.join(ALL_STAGES)}",
    )
    p.add_argument("--out", default=None, help="run directory (default runs/reproduce-<ts>)")
    p.add_argument(
        "--update-readme",
        default=None,
        metavar="PATH",
        help=f"replace the text between {README_BEGIN} and {README_END} in PATH with the "
        "report's table and figures (copied to docs/figures/ next to PATH)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a field in every stage config that has it, e.g. "
        "--set base.parallel.mode=sharded --set base.steps=2000 (repeatable)",
    )
    return p


# ----------------------------------------------------------------------------- stages


def _progress_bar(name: str, total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"{name:10s}", unit="run", disable=not enabled, leave=True)


def run_check(scale: str, stage_dir: pathlib.Path, enabled: bool) -> dict[str, Any]:
    """Stage ``check``: ``amemory check --quick`` (``--scale full``: without ``--quick``).

    Runs in a subprocess (the checks switch jax to float64, which must not leak into the
    other stages) with ``--json`` and ``--out``; stdout/stderr go to ``check.log``. One
    claim: every check passed; the per-check table goes into the report.
    """
    stage_dir.mkdir(parents=True, exist_ok=True)
    (stage_dir / "figures").mkdir(exist_ok=True)
    json_path = stage_dir / "checks.json"
    argv = (["--quick"] if scale == "quick" else []) + [
        "--json", str(json_path), "--out", str(stage_dir / "figures"),
    ]  # fmt: skip
    code = f"import sys, theory_checks.cli as c; sys.exit(c.main({argv!r}))"
    bar = _progress_bar("check", 1, enabled)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ)
    )
    wall = time.perf_counter() - t0
    bar.update(1)
    bar.close()
    log = proc.stdout + ("\n" + proc.stderr if proc.stderr else "")
    atomic.write_text(stage_dir / "check.log", log)
    counts, failed = "", []
    if json_path.exists():
        data = common.load_json(json_path)
        meta = data.get("meta", {})
        counts = f"{meta.get('passed')}/{meta.get('total')} passed"
        failed = [r["name"] for r in data.get("results", []) if not r.get("passed")]
    if proc.returncode == 0:
        ours, held = f"all passed ({counts})" if counts else "all passed", True
    elif "No module named" in log and not counts:
        ours, held = "theory_checks not available", None
    elif counts:
        ours, held = f"{counts}; failed: {', '.join(failed)}", False
    else:
        ours, held = f"exit status {proc.returncode} (see check.log)", None
    claim = common.Claim(
        "check/theory",
        "A Thm 5.3-5.4, B (docs/science.md)",
        "numerical checks of the papers' statements (`amemory check`)",
        "statements hold",
        ours,
        held,
        "every check within its stated tolerance (`amemory check"
        + (" --quick`)" if scale == "quick" else "`)"),
    )
    table = "\n".join(line for line in proc.stdout.splitlines() if line.startswith("|"))
    figures = sorted(str(p.relative_to(stage_dir)) for p in (stage_dir / "figures").glob("*.png"))
    return common.result_dict(
        "check",
        scale,
        metrics={
            "returncode": proc.returncode,
            "counts": counts,
            "failed": failed,
            "report_md": table,
        },  # fmt: skip
        figures=figures,
        claims=[claim],
        wall_s=wall,
    )


def run_experiment(
    name: str,
    scale: str,
    stage_dir: pathlib.Path,
    enabled: bool,
    *,
    overrides: dict[str, Any] | None = None,
    cache_dir: pathlib.Path | None = None,
    sets: Sequence[str] = (),
) -> dict[str, Any]:
    """Stage for ``experiments/<name>.py``: load its config, apply overrides, run it.

    ``overrides`` maps dotted fields to values (the reduced variants); ``sets`` are
    ``FIELD=VALUE`` strings from ``--set``, applied where the config has the field.
    """
    import importlib

    module = importlib.import_module(f"experiments.{name}")
    cfg = common.load_config(name, scale)
    for k, v in (overrides or {}).items():
        node = cfg
        *parents, leaf = k.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = v
    for item in sets:
        try:
            common.apply_override(cfg, item)
        except (ValueError, KeyError, AttributeError, TypeError):
            sys.stderr.write(f"amemory reproduce: --set {item} does not apply to {name}\n")
    total = module.n_units(cfg) if hasattr(module, "n_units") else 1
    bar = _progress_bar(name, total, enabled)

    def progress(label: str) -> None:
        bar.set_postfix_str(label[-40:], refresh=False)
        bar.update(1)

    try:
        kwargs: dict[str, Any] = {"progress": progress}
        if cache_dir is not None and name not in ("one_layer",):
            kwargs["cache_dir"] = cache_dir
        return module.run(cfg, stage_dir, **kwargs)
    finally:
        bar.close()


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and its finished children so far.

    A stage's CPU time divided by the core count estimates its wall time on an idle
    machine (the report's budget figure) even when other jobs share the cores.
    """
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _failed(name: str, scale: str, err: BaseException, wall: float) -> dict[str, Any]:
    return common.result_dict(
        name,
        scale,
        metrics={"error": f"{type(err).__name__}: {err}"},
        figures=[],
        claims=[
            common.Claim(
                f"{name}/run",
                "-",
                f"stage {name} ran",
                "-",
                f"FAILED: {type(err).__name__}: {str(err)[:200]}",
                None,
                "the stage raised; see its error.txt",
            )
        ],
        wall_s=wall,
        notes=[f"stage failed: {type(err).__name__}: {err}"],
    )


# ----------------------------------------------------------------------------- report


def _claims(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    all_claims = [c for r in results for c in r.get("claims", [])]
    order = {k: i for i, k in enumerate(HEADLINE)}
    return sorted(all_claims, key=lambda c: order.get(c["key"], len(order)))


def claims_table(results: Sequence[dict[str, Any]]) -> str:
    """Markdown table: claim | source | paper | ours (this run) | verdict."""
    lines = [
        "| claim | source | paper | ours | verdict |",
        "|---|---|---|---|---|",
    ]
    for c in _claims(results):
        cells = [c["statement"], c["paper"], c["paper_value"], c["ours"], common.verdict(c["held"])]
        cells = [str(x).replace("|", "/").replace("\n", " ") for x in cells]
        if c["key"] in HEADLINE:
            cells[0] = f"**{cells[0]}**"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _figure_paths(out: pathlib.Path, results: Sequence[dict[str, Any]]) -> list[pathlib.Path]:
    paths = []
    for r in results:
        for f in r.get("figures", []):
            p = out / r["name"] / f
            if p.exists():
                paths.append(p)
    return paths


def write_report(
    out: pathlib.Path, results: Sequence[dict[str, Any]], scale: str, wall_s: float
) -> pathlib.Path:
    """Write ``out/report.md`` (table of claims, per-stage sections, figures, notes)."""
    claims = _claims(results)
    n_held = sum(c["held"] is True for c in claims)
    n_not = sum(c["held"] is False for c in claims)
    n_und = sum(c["held"] is None for c in claims)
    cpu = sum(float(r.get("cpu_s") or 0.0) for r in results)
    lines = [
        f"# amemory reproduce ({scale} scale)",
        "",
        f"Run directory `{out}`; total wall time {wall_s / 60:.1f} min, CPU time "
        f"{cpu / 60:.1f} min (so at least {cpu / 120:.1f} min of wall time on 2 cores); "
        f"{n_held} claims held, {n_not} not held, {n_und} undecided.",
        "",
        "Verdicts are decided by the rule in each stage's section (column `test` of its "
        "`result.json`). Transformer claims compare runs on the same initialisation seeds "
        "(held out from the learning-rate choice; every seed reads the same data order): "
        "a claim is held when the 95% Student-t interval of the per-seed difference excludes "
        "zero (or the stated threshold) on the claimed side, not held when it excludes it on "
        "the other side, and undecided otherwise. Quick-scale numbers come from models far "
        "smaller than the papers'; a claim that does not hold here is reported as such.",
        "",
        "## Claims beside our measurements",
        "",
        claims_table(results),
        "",
    ]
    for r in results:
        cpu_s = r.get("cpu_s")
        cpu_txt = f", CPU {cpu_s:.0f} s" if cpu_s is not None else ""
        lines += [f"## {r['name']} (wall {r['wall_s']:.0f} s{cpu_txt})", ""]
        for c in r.get("claims", []):
            lines.append(
                f"- **{common.verdict(c['held'])}**: {c['statement']}. Paper ({c['paper']}): "
                f"{c['paper_value']}. Ours: {c['ours']}. Test: {c['test']}."
            )
        extra = r.get("metrics", {}).get("report_md")
        if extra:
            lines += ["", extra]
        for note in r.get("notes", []):
            lines.append(f"- note: {note}")
        lines.append("")
        for f in r.get("figures", []):
            lines.append(f"![{pathlib.Path(f).stem}]({r['name']}/{f})")
        lines.append("")
    path = out / "report.md"
    atomic.write_text(path, "\n".join(lines) + "\n")
    return path


def update_readme(readme: pathlib.Path, out: pathlib.Path, results: Sequence[dict]) -> None:
    """Replace the text between the reproduce markers in ``readme``.

    Figures are copied to ``<readme dir>/docs/figures/`` and linked relative to the README.

    Raises:
      ValueError: if the README lacks either marker (the file is left unchanged).
    """
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        raise ValueError(f"{readme} must contain the markers {README_BEGIN} and {README_END}")
    fig_dir = readme.parent / "docs" / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    links = []
    for p in _figure_paths(out, results):
        dest = fig_dir / p.name
        atomic.write_bytes(dest, p.read_bytes())
        links.append(f"![{p.stem}]({dest.relative_to(readme.parent).as_posix()})")
    scale = results[0]["scale"] if results else "quick"
    minutes = sum(float(r.get("wall_s", 0.0)) for r in results) / 60
    cpu = sum(float(r.get("cpu_s") or 0.0) for r in results) / 60
    block = "\n".join(
        [
            README_BEGIN,
            f"Latest `amemory reproduce` ({scale} scale, "
            f"{time.strftime('%Y-%m-%d', time.gmtime())}): {minutes:.1f} min of wall time, "
            f"{cpu:.1f} min of CPU time (so at least {cpu / 2:.1f} min on 2 cores); regenerate "
            f"with `amemory reproduce --update-readme {readme.name}`.",
            "",
            claims_table(results),
            "",
            *links,
            README_END,
        ]
    )
    start = text.index(README_BEGIN)
    end = text.index(README_END) + len(README_END)
    atomic.write_text(readme, text[:start] + block + text[end:])


def summary_lines(results: Sequence[dict[str, Any]], report: pathlib.Path) -> list[str]:
    """The short summary printed at the end."""
    lines = ["", f"report: {report}"]
    for c in _claims(results):
        lines.append(f"  {common.verdict(c['held']):10s} {c['key']}: {c['ours']}")
    return lines


# ----------------------------------------------------------------------------- main


def reproduce(
    stages: Sequence[str],
    scale: str,
    out: pathlib.Path,
    *,
    reduced: bool = True,
    progress: bool = True,
    stage_runner: Callable[..., dict[str, Any]] | None = None,
    sets: Sequence[str] = (),
) -> tuple[list[dict[str, Any]], pathlib.Path]:
    """Run ``stages`` at ``scale`` into ``out``; returns (results, report path).

    A stage that raises is recorded as failed (its claims undecided) and the others
    still run. ``stage_runner`` replaces :func:`run_experiment` (tests).
    """
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "train_runs"
    results = []
    chosen_lr: dict[str, float] = {}
    t0 = time.perf_counter()
    for name in stages:
        stage_dir = out / name
        s0, c0 = time.perf_counter(), cpu_seconds()
        try:
            if name == "check":
                res = run_check(scale, stage_dir, progress)
            else:
                runner = stage_runner or run_experiment
                overrides = dict(REDUCED.get(name, {})) if reduced else {}
                if reduced and name in TAIL_LM_LR and chosen_lr:
                    overrides.update({f"lr.{k}": v for k, v in chosen_lr.items()})
                    overrides["lr_source"] = TAIL_LM_LR[name]
                extra = {"sets": tuple(sets)} if sets else {}
                res = runner(
                    name, scale, stage_dir, progress, overrides=overrides, cache_dir=cache, **extra
                )
                chosen_lr.update(
                    {
                        k: v
                        for k, v in res.get("metrics", {}).get("chosen_lr", {}).items()
                        if name == "tail_lm" and k in ("adam", "muon")
                    }
                )
        except Exception as e:  # noqa: BLE001 - a failed stage must not stop the others
            stage_dir.mkdir(parents=True, exist_ok=True)
            atomic.write_text(stage_dir / "error.txt", traceback.format_exc())
            sys.stderr.write(f"stage {name} failed: {type(e).__name__}: {e}\n")
            res = _failed(name, scale, e, time.perf_counter() - s0)
        res["cpu_s"] = cpu_seconds() - c0
        results.append(res)
        common.save_json(out / "summary.json", {"scale": scale, "results": results})
    wall = time.perf_counter() - t0
    cpu = sum(r["cpu_s"] for r in results)
    common.save_json(
        out / "summary.json", {"scale": scale, "wall_s": wall, "cpu_s": cpu, "results": results}
    )
    report = write_report(out, results, scale, wall)
    return results, report


def _enable_compilation_cache() -> None:
    """Persistent XLA compilation cache (set before jax is imported; the user's setting wins).

    Repeated ``amemory reproduce`` runs then skip most compiles (about 1 s instead of
    2-3.5 s per program, measured on this project's machine). Also inherited by the check
    subprocess.
    """
    default = (
        pathlib.Path(os.environ.get("AMEMORY_DATA", pathlib.Path.home() / ".cache" / "amemory"))
        / "jax-cache"
    )
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(default))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
    if "jax" in sys.modules:  # already imported (e.g. called from Python): set it directly
        import jax

        jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``amemory reproduce`` (see module docstring)."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    out = (
        pathlib.Path(args.out)
        if args.out
        else pathlib.Path("runs") / (f"reproduce-{common.timestamp()}")
    )
    if args.update_readme and not pathlib.Path(args.update_readme).is_file():
        sys.stderr.write(
            f"amemory reproduce: error: --update-readme {args.update_readme}: no such file\n"
        )
        return 2
    stages = tuple(dict.fromkeys(args.only)) if args.only else DEFAULT_STAGES
    _enable_compilation_cache()
    results, report = reproduce(
        stages,
        args.scale,
        out,
        reduced=not args.only,
        progress=not args.no_progress,
        sets=args.set,
    )
    if args.update_readme:
        try:
            update_readme(pathlib.Path(args.update_readme), out, results)
        except ValueError as e:
            sys.stderr.write(f"amemory reproduce: error: {e}\n")
            return 2
    print("\n".join(summary_lines(results, report)))
    failed = [r["name"] for r in results if "error" in r.get("metrics", {})]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
