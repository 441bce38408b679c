"""`amemory reproduce`: run the papers' experiments at a chosen scale and write a report.

Usage::

    amemory reproduce                        # default stages, quick scale (CPU, < 20 min)
    amemory reproduce --scale full           # paper-sized configs (GPU/TPU hours)
    amemory reproduce --only tail_qa         # one experiment (its full quick config)
    amemory reproduce --out runs/final       # choose the run directory (rerun to resume)
    amemory reproduce --only tail_lm --refresh-results   # replace the committed results
    amemory reproduce --scale full --set base.parallel.mode=sharded   # many devices

The stages are the registered experiments (:func:`experiments.common.experiments`).
Without ``--only`` the default ones run (``Experiment.default``) in their reduced variants
(``Experiment.reduced``), and a stage with ``lr_from`` takes that stage's chosen learning
rates. Transformer claims rest on 3
held-out initialisation seeds (one vmapped program per run) and a 95% seed interval.

Output, all under ``runs/reproduce-<UTC timestamp>/`` (or ``--out``): per stage
``result.json`` and ``figures/``; ``train_runs/`` (every transformer run, shared between
stages and keyed by its config and the ``amemory`` sources); ``report.md``,
``summary.json``; and per stage the compact ``results/<scale>/<stage>.json``
(:mod:`experiments.report`), with a line for every claim whose verdict changed or whose
interval moved clear of the committed one. ``--refresh-results`` writes the compact JSONs
over the committed ``experiments/results/<scale>/`` instead (and the figures into
``docs/figures/``); then ``amemory report --docs docs/results.md`` regenerates the page.

Reliability: ``--out`` is locked (a second ``reproduce`` on it exits 4); SIGTERM saves the
training run in progress and exits 75 (SIGINT: 130); the same command resumes. On several
hosts the same command runs on every host with ``--set base.parallel.distributed=true``.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from amemory import atomic
from amemory.cli import Parser
from experiments import common, report


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``amemory reproduce``."""
    names = tuple(common.experiments())
    p = Parser(prog="amemory reproduce", description=__doc__.splitlines()[0])
    p.add_argument("--scale", default="quick", choices=common.SCALES, help="quick (CPU) or full")
    p.add_argument(
        "--only", action="append", default=None, choices=names, metavar="NAME",
        help=f"run only this stage (repeatable); one of {', '.join(names)}",
    )  # fmt: skip
    p.add_argument("--out", default=None, help="run directory (default runs/reproduce-<ts>)")
    p.add_argument(
        "--results", default=None, metavar="DIR",
        help="where the compact per-stage JSONs go (DIR/<scale>/<stage>.json; default OUT/results)",
    )  # fmt: skip
    p.add_argument(
        "--refresh-results", action="store_true",
        help="write them over the committed ones (experiments/results/<scale>/) "
        "and the figures into docs/figures/",
    )  # fmt: skip
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE",
        help="override a field in every stage config that has it, e.g. "
        "--set base.parallel.mode=sharded --set base.steps=2000 (repeatable)",
    )  # fmt: skip
    return p


def stage_config(name: str, scale: str, overrides: dict[str, Any], sets: Sequence[str]) -> Any:
    """Stage ``name``'s config at ``scale`` with ``overrides`` and the ``--set`` items it has.

    Raises:
      ValueError: an override or a ``--set`` value the config rejects (unknown field in
        ``overrides``, wrong type anywhere).
    """
    cfg = common.experiments()[name].config(scale)
    for key, value in overrides.items():
        common.apply_override(cfg, key, value)
    for key, value in map(common.parse_set, sets):
        if common.has_field(cfg, key):
            common.apply_override(cfg, key, value)
    return cfg


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
    """Run the registered stage ``name`` (:func:`stage_config`) with a progress bar."""
    from tqdm.auto import tqdm

    exp = common.experiments()[name]
    cfg = stage_config(name, scale, overrides or {}, sets)
    bar = tqdm(total=exp.units(cfg), desc=f"{name:10s}", unit="run", disable=not enabled)

    def progress(label: str) -> None:
        bar.set_postfix_str(label[-40:], refresh=False)
        bar.update(1)

    try:
        return exp(cfg, stage_dir, progress=progress, cache_dir=cache_dir)
    finally:
        bar.close()


def _failed(name: str, scale: str, err: BaseException, wall: float) -> dict[str, Any]:
    claim = common.Claim(
        f"{name}/run", "-", f"stage {name} ran", "-",
        f"FAILED: {type(err).__name__}: {str(err)[:200]}", None,
        "the stage raised; see its error.txt",
    )  # fmt: skip
    return common.result_dict(
        name, scale, metrics={"error": f"{type(err).__name__}: {err}"}, figures=[],
        claims=[claim], wall_s=wall, notes=[f"stage failed: {type(err).__name__}: {err}"],
    )  # fmt: skip


def reproduce(
    stages: Sequence[str],
    scale: str,
    out: pathlib.Path,
    *,
    reduced: bool = True,
    progress: bool = True,
    stage_runner: Callable[..., dict[str, Any]] | None = None,
    sets: Sequence[str] = (),
    results_dir: pathlib.Path | None = None,
) -> tuple[list[dict[str, Any]], pathlib.Path]:
    """Run ``stages`` at ``scale`` into ``out``; returns (results, report path).

    A stage that raises is recorded as failed (its claims undecided) and the others
    still run. With ``results_dir``, every stage that ran writes its compact JSON there
    (:func:`report.save_result`) and the claims that moved from the committed result are
    printed. ``stage_runner``
    replaces :func:`run_experiment` (tests).
    """
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    for name in stages:
        exp = common.experiments().get(name)
        overrides = dict(exp.reduced) if reduced and exp else {}
        lr_from = results.get(exp.lr_from, {}) if reduced and exp and exp.lr_from else {}
        chosen = lr_from.get("metrics", {}).get("chosen_lr", {})
        if chosen:  # the rates of the optimizers this stage trains (its ``lr`` fields)
            lr = exp.config(scale).lr
            overrides |= {f"lr.{k}": v for k, v in chosen.items() if k in lr}
            overrides["lr_source"] = f"not swept here: {exp.lr_from}'s grid choice, same model"
        t0, c0 = time.perf_counter(), common.cpu_seconds()
        try:
            runner = stage_runner or run_experiment
            extra = {"sets": tuple(sets)} if sets else {}
            res = runner(name, scale, out / name, progress, overrides=overrides,
                         cache_dir=out / "train_runs", **extra)  # fmt: skip
        except Exception as e:  # noqa: BLE001 - a failed stage must not stop the others
            (out / name).mkdir(parents=True, exist_ok=True)
            atomic.write_text(out / name / "error.txt", traceback.format_exc())
            sys.stderr.write(f"stage {name} failed: {type(e).__name__}: {e}\n")
            res = _failed(name, scale, e, time.perf_counter() - t0)
        res.setdefault("cpu_s", common.cpu_seconds() - c0)
        results[name] = res
        if results_dir is not None and "error" not in res.get("metrics", {}):
            path, moved = report.save_result(res, results_dir)
            print(f"{name}: {path}" + "".join(f"\n  moved: {line}" for line in moved))
        common.save_json(out / "summary.json", {"scale": scale, "results": list(results.values())})
    return list(results.values()), report.write_report(out, list(results.values()), scale)


def _enable_compilation_cache() -> None:
    """Persistent XLA compilation cache (set before jax is imported; the user's setting wins),
    so repeated runs skip most compiles; the check subprocess inherits it."""
    default = (
        pathlib.Path(os.environ.get("AMEMORY_DATA", pathlib.Path.home() / ".cache" / "amemory"))
        / "jax-cache"
    )
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(default))
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
    if "jax" in sys.modules:  # already imported (e.g. called from Python): set it directly
        import jax

        jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])


class _Stopped(KeyboardInterrupt):
    """SIGTERM outside a training run (inside one, the run saves and raises RunInterrupted)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Stopped("SIGTERM")


def _copy_figures(out: pathlib.Path, results: Sequence[dict]) -> None:
    fig_dir = common.REPO / "docs" / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    for r in results:
        for f in r.get("figures", []):
            if (out / r["name"] / f).is_file():
                shutil.copyfile(out / r["name"] / f, fig_dir / pathlib.Path(f).name)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``amemory reproduce`` (see module docstring).

    Exit status: 0 done; 1 a stage failed; 2 bad arguments; 4 ``--out`` is in use by
    another run; 75 stopped by SIGTERM, 130 by SIGINT (rerun the command to continue).
    """
    from amemory.train import guard, lock

    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    out = pathlib.Path(args.out or pathlib.Path("runs") / f"reproduce-{common.timestamp()}")
    results_dir = report.RESULTS if args.refresh_results else args.results or out / "results"
    chosen = set(args.only or ())
    stages = [
        n for n, e in common.experiments().items() if n in chosen or (not chosen and e.default)
    ]
    try:  # every --set must fit some stage, with a value its field accepts, before any work
        cfgs = [stage_config(name, args.scale, {}, args.set) for name in stages]
        for key, _ in map(common.parse_set, args.set):
            if not any(common.has_field(cfg, key) for cfg in cfgs):
                raise ValueError(f"--set {key}: no stage of this run has that field")
    except ValueError as e:
        return parser.fail(e)
    _enable_compilation_cache()
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        with lock.WorkdirLock(out):
            results, path = reproduce(
                stages, args.scale, out, reduced=not args.only, progress=not args.no_progress,
                sets=args.set, results_dir=pathlib.Path(results_dir),
            )  # fmt: skip
    except lock.WorkdirBusyError as e:
        parser.fail(e)
        return lock.EXIT_BUSY
    except KeyboardInterrupt as e:  # RunInterrupted (a training run saved), SIGTERM, Ctrl-C
        reason = "SIGINT" if type(e) is KeyboardInterrupt else getattr(e, "reason", "SIGTERM")
        sys.stderr.write(
            f"amemory reproduce: stopped by {reason}; the training runs are saved under "
            f"{out / 'train_runs'}: rerun with --out {out} to continue\n"
        )
        return guard.EXIT_INTERRUPTED if reason == "SIGINT" else guard.EXIT_PREEMPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
    if args.refresh_results:
        _copy_figures(out, results)
    print(f"\nreport: {path}")
    for c in report.claims(results):
        print(f"  {common.verdict(c['held']):10s} {c['key']}: {c['ours']}")
    return 1 if any("error" in r.get("metrics", {}) for r in results) else 0
