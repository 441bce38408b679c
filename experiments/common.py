"""Shared plumbing for the experiments: run directories, JSON, claims, configs, LR grids.

Every experiment module ``experiments/<name>.py`` exposes

* ``run(config, out_dir, *, progress=None) -> dict``: runs the experiment described by
  the ``ml_collections.ConfigDict`` ``config`` (from ``experiments/configs/<name>.py``),
  writes ``result.json`` and ``figures/*.png`` into ``out_dir`` and returns the result
  dict (see :func:`result_dict`);
* ``main(argv) -> int``: ``python -m experiments.<name> --scale quick --out DIR``.

The result dict always holds ``name``, ``scale``, ``wall_s``, ``figures`` (paths
relative to ``out_dir``), ``claims`` (list of :class:`Claim` as dicts) and an
experiment-specific ``metrics`` dict. ``amemory reproduce`` reads only these keys.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import hashlib
import importlib
import json
import math
import os
import pathlib
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from amemory import atomic

SCALES = ("quick", "full")


@dataclasses.dataclass
class Claim:
    """One statement of a paper set beside our measurement.

    Attributes:
      key: short stable identifier, e.g. ``"tail_lm/tail_bucket_loss"``.
      paper: where the claim comes from, e.g. ``"A, Fig. 5"``.
      statement: the claim in words (what the paper reports).
      paper_value: the paper's number(s) in words, e.g. ``"Muon 0.976 vs Adam 0.264"``.
      ours: our measurement in words, same units as ``paper_value``.
      held: ``True`` (held) / ``False`` (not held) when the test below decided it, ``None``
        (undecided) when it could not (the seed interval contains the threshold, or the
        run failed).
      test: the decision rule we applied, stated so a reader can re-check it.
      interval: the seed interval the verdict rests on, as :func:`interval_dict` makes it
        (estimate, lo, hi, n, confidence, direction, threshold), or None.
    """

    key: str
    paper: str
    statement: str
    paper_value: str
    ours: str
    held: bool | None
    test: str
    interval: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """Return a JSON-friendly dict of the fields."""
        return dataclasses.asdict(self)


def seed_verdict(
    a: Any, b: Any = None, *, direction: str, threshold: float = 0.0
) -> tuple[Any, bool | None]:
    """Seed interval of ``a`` (or of the paired difference ``a - b``) and its three-way verdict.

    Args:
      a: ``[seeds]`` per-seed values of one arm.
      b: ``[seeds]`` the other arm on the same seeds (paired), or None.
      direction: "greater" (the claim says the quantity exceeds ``threshold``) or "less".
      threshold: the value the claim compares against.

    Returns:
      ``(interval, held)``: :class:`amemory.analysis.stats.Interval` (95% Student-t) and
      True / False / None (:func:`amemory.analysis.stats.verdict`); ``(None, None)`` when
      fewer than 2 seeds or a non-finite value leave no interval.
    """
    from amemory.analysis import stats

    x = np.asarray(a, float).ravel()
    if b is not None:
        x = x - np.asarray(b, float).ravel()
    if x.size < 2 or not np.isfinite(x).all():
        return None, None
    iv = stats.mean_interval(x)
    return iv, stats.verdict(iv, direction, threshold)


def interval_dict(iv: Any, direction: str, threshold: float = 0.0) -> dict[str, Any] | None:
    """JSON form of a seed interval for :attr:`Claim.interval` (None stays None)."""
    if iv is None:
        return None
    return {
        "estimate": iv.estimate, "lo": iv.lo, "hi": iv.hi, "n": iv.n,
        "confidence": iv.confidence, "direction": direction, "threshold": threshold,
    }  # fmt: skip


def describe(iv: Any, digits: int = 3) -> str:
    """``0.087 ± 0.012 (95% CI, n=3)``, or ``no interval`` for None."""
    return "no interval (fewer than 2 seeds)" if iv is None else iv.describe(digits)


def seed_mean(values: Any, digits: int = 3) -> str:
    """``mean ± half-width`` of per-seed values (95% t interval), or the value for 1 seed."""
    x = np.asarray(values, float).ravel()
    iv, _ = seed_verdict(x, direction="greater")
    if iv is None:
        return fmt(np.nanmean(x) if np.isfinite(x).any() else np.nan, digits)
    return f"{fmt(iv.estimate, digits)} ± {fmt(iv.half_width, digits)}"


def verdict(held: bool | None) -> str:
    """Human verdict string for a claim's ``held`` field."""
    return {True: "held", False: "not held", None: "undecided"}[held]


def to_jsonable(obj: Any) -> Any:
    """Convert numpy / jax scalars and arrays (recursively) to plain Python for json.

    Non-finite floats become ``None`` so the JSON stays standard.
    """
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    if hasattr(obj, "to_dict") and callable(obj.to_dict):
        return to_jsonable(obj.to_dict())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if hasattr(obj, "shape") and hasattr(obj, "dtype"):  # numpy or jax array
        return to_jsonable(np.asarray(obj).tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, pathlib.Path):
        return str(obj)
    return obj


def save_json(path: str | os.PathLike, obj: Any) -> pathlib.Path:
    """Write ``obj`` as indented JSON (via :func:`to_jsonable`), atomically; returns the path."""
    return atomic.write_json(path, to_jsonable(obj), indent=1)


def load_json(path: str | os.PathLike) -> Any:
    """Read a JSON file."""
    return json.loads(pathlib.Path(path).read_text())


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a JSON-lines file (one dict per line; blank lines ignored)."""
    rows = []
    p = pathlib.Path(path)
    if not p.exists():
        return rows
    for line in p.read_text().splitlines():
        line = line.strip()
        if line:
            rows.append(json.loads(line))
    return rows


def timestamp() -> str:
    """UTC timestamp ``YYYYmmdd-HHMMSS`` for run directory names."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")


def make_run_dir(out: str | os.PathLike | None, name: str) -> pathlib.Path:
    """Create and return the run directory: ``out`` if given, else ``runs/<name>-<ts>``."""
    path = pathlib.Path(out) if out else pathlib.Path("runs") / f"{name}-{timestamp()}"
    path.mkdir(parents=True, exist_ok=True)
    (path / "figures").mkdir(exist_ok=True)
    return path


def load_config(name: str, scale: str = "quick"):
    """Load ``experiments/configs/<name>.py`` and return ``get_config(scale)``.

    Raises:
      ValueError: if ``scale`` is not one of :data:`SCALES` or the config module is missing.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    try:
        module = importlib.import_module(f"experiments.configs.{name}")
    except ModuleNotFoundError as e:
        raise ValueError(f"no config experiments/configs/{name}.py ({e})") from e
    return module.get_config(scale)


def config_hash(cfg: Any) -> str:
    """Stable 12-hex-digit hash of a (ConfigDict or dict) config, for run caching."""
    d = cfg.to_dict() if hasattr(cfg, "to_dict") else cfg
    text = json.dumps(to_jsonable(d), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def result_dict(
    name: str,
    scale: str,
    *,
    metrics: dict[str, Any],
    figures: Sequence[str],
    claims: Iterable[Claim],
    wall_s: float,
    config: Any = None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """Assemble the standard result dict of an experiment (see module docstring)."""
    return {
        "name": name,
        "scale": scale,
        "wall_s": float(wall_s),
        "figures": list(figures),
        "claims": [c.as_dict() for c in claims],
        "metrics": metrics,
        "notes": list(notes),
        "config": (config.to_dict() if hasattr(config, "to_dict") else config),
    }


def finish(
    name: str,
    config: Any,
    out_dir: str | os.PathLike,
    timer: Timer,
    *,
    metrics: dict[str, Any],
    figures: Sequence[str],
    claims: Iterable[Claim],
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """Build the result dict (:func:`result_dict`), write ``out_dir/result.json``, return it.

    ``config.scale`` gives the scale and ``timer.seconds`` the wall time.
    """
    result = result_dict(
        name, config.scale, metrics=metrics, figures=figures, claims=claims,
        wall_s=timer.seconds, config=config, notes=notes,
    )  # fmt: skip
    save_json(pathlib.Path(out_dir) / "result.json", result)
    return result


def experiment_main(
    name: str,
    run_fn: Callable[..., dict[str, Any]],
    argv: Sequence[str] | None,
    *,
    description: str,
) -> int:
    """Common ``main`` for ``python -m experiments.<name> [--scale] [--out] [--set k=v]``.

    ``--set a.b=value`` overrides a config field (value parsed as JSON when possible).
    Prints a one-line summary per claim and the run directory.
    """
    parser = argparse.ArgumentParser(prog=f"python -m experiments.{name}", description=description)
    parser.add_argument("--scale", default="quick", choices=SCALES, help="quick (CPU) or full")
    parser.add_argument("--out", default=None, help="run directory (default runs/<name>-<ts>)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field, e.g. --set steps=50 (repeatable)",
    )
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    cfg = load_config(name, args.scale)
    for item in args.set:
        apply_override(cfg, item)
    out = make_run_dir(args.out, name)
    result = run_fn(cfg, out)
    print(format_summary(result))
    print(f"run dir: {out}")
    return 0


def apply_override(cfg: Any, item: str) -> None:
    """Apply ``"a.b.c=value"`` to a ConfigDict (value parsed as JSON, else kept as str).

    Raises:
      ValueError: if ``item`` has no ``=`` or the field does not exist.
    """
    if "=" not in item:
        raise ValueError(f"--set expects FIELD=VALUE, got {item!r}")
    key, raw = item.split("=", 1)
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    parts = key.split(".")
    node = cfg
    for p in parts[:-1]:
        if p not in node:
            raise ValueError(f"unknown config field {key!r}")
        node = node[p]
    if parts[-1] not in node:
        raise ValueError(f"unknown config field {key!r}; fields here: {sorted(node.keys())}")
    old = node[parts[-1]]
    if isinstance(old, tuple | list) and isinstance(value, list):
        value = type(old)(value)
    node[parts[-1]] = value


def format_summary(result: dict[str, Any]) -> str:
    """One line per claim: verdict, key, ours vs paper."""
    lines = [f"[{result['name']} @ {result['scale']}] {result['wall_s']:.0f} s"]
    for c in result.get("claims", []):
        lines.append(
            f"  {verdict(c['held']):10s} {c['key']}: ours {c['ours']} | paper {c['paper_value']}"
        )
    return "\n".join(lines)


class Timer:
    """Context manager measuring wall seconds: ``with Timer() as t: ...; t.seconds``."""

    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


def nanmin(values: Iterable[float]) -> float:
    """Minimum ignoring NaN/None; NaN if nothing finite."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return min(finite) if finite else float("nan")


def fmt(x: Any, digits: int = 3) -> str:
    """Format a number for tables (``nan`` for missing)."""
    if x is None:
        return "nan"
    try:
        xf = float(x)
    except (TypeError, ValueError):
        return str(x)
    if not math.isfinite(xf):
        return "nan"
    if xf != 0 and (abs(xf) < 1e-3 or abs(xf) >= 1e4):
        return f"{xf:.{digits - 1}e}"
    return f"{xf:.{digits}f}"


# ----------------------------------------------------------------------------- training runs

# Config fields that do not change what a run computes (excluded from the cache key).
_NON_SEMANTIC = ("progress",)


def _semantic_hash(cfg: Any) -> str:
    d = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    d = {k: v for k, v in d.items() if k not in _NON_SEMANTIC}
    return config_hash(d)


def _read_cached(workdir: pathlib.Path) -> tuple[dict[str, Any], list] | None:
    """A cached run's (summary, metrics records), or None when absent or unreadable.

    An unreadable entry (a summary.json or metrics.jsonl cut short by an older,
    non-atomic writer, or damaged on disk) is treated as missing: the run is trained
    again, and a line on stderr says so.
    """
    path = workdir / "summary.json"
    if not path.exists():
        return None
    try:
        summary = load_json(path)
        if not isinstance(summary, dict):
            raise ValueError("summary.json holds no JSON object")
        return summary, read_jsonl(workdir / "metrics.jsonl")
    except (OSError, ValueError) as e:  # json.JSONDecodeError and UnicodeDecodeError included
        sys.stderr.write(f"amemory: cached run {workdir} is unreadable ({e}); training it again\n")
        return None


def train_cached(cfg: Any, cache_dir: str | os.PathLike, label: str) -> dict[str, Any]:
    """Train ``cfg`` with :func:`amemory.train.train`, reusing an identical earlier run.

    The run directory is ``cache_dir/<label>-<hash of cfg>``; when it already holds a
    readable ``summary.json`` (same config, same machine) the run is not repeated (an
    unreadable one is retrained, with a line on stderr). This lets
    stages share runs (the ablation's "none" and "all" are tail_lm's Adam and Muon).

    Returns:
      {"summary": train's summary dict, "records": metrics.jsonl rows, "workdir": path,
       "cached": bool, "label": label}.

    Raises:
      ValueError: from :func:`amemory.train.train` on a bad config.
    """
    from amemory.train import train

    h = _semantic_hash(cfg)
    workdir = pathlib.Path(cache_dir) / f"{label}-{h}"
    if not (workdir / "summary.json").exists():  # same config under another label?
        same = sorted(pathlib.Path(cache_dir).glob(f"*-{h}/summary.json"))
        if same:
            workdir = same[0].parent
    found = _read_cached(workdir)
    cached = found is not None
    if cached:
        summary, records = found
    else:
        if workdir.exists():  # an interrupted earlier attempt, or an unreadable one: start clean
            import shutil

            shutil.rmtree(workdir)
        summary = train(cfg, workdir)
        records = read_jsonl(workdir / "metrics.jsonl")
    return {
        "summary": summary,
        "records": records,
        "workdir": str(workdir),
        "cached": cached,
        "label": label,
    }


def seeded(run_cfg: Any, seeds: Sequence[int]) -> Any:
    """A copy of the run config ``run_cfg`` training ``seeds`` at once (``config.seeds``).

    The engine vmaps the seeds in one program: seed s initialises with ``PRNGKey(s)``;
    the data order is ``run_cfg.seed``'s for every seed (seeds differ in initialisation).
    An empty ``seeds`` keeps the single-seed run.
    """
    from ml_collections import ConfigDict

    c = ConfigDict(run_cfg.to_dict())
    c.seeds = tuple(int(s) for s in seeds)
    return c


def eval_series(records: Sequence[dict[str, Any]], key: str, kind: str = "eval"):
    """(steps [n], values [n]) of ``key`` over the ``kind`` records (None -> NaN).

    Multi-seed records (lists) are returned as ``[n, seeds]``.
    """
    steps, vals = [], []
    for r in records:
        if r.get("kind") == kind and key in r:
            steps.append(r["step"])
            v = r[key]
            if isinstance(v, list):
                vals.append([np.nan if x is None else float(x) for x in v])
            else:
                vals.append(np.nan if v is None else float(v))
    return np.asarray(steps, dtype=float), np.asarray(vals, dtype=float)


def final_eval(run: dict[str, Any], key: str = "loss") -> float:
    """The last evaluation's ``key`` of a :func:`train_cached` result (NaN if absent).

    A multi-seed run gives the mean over seeds (:func:`final_eval_seeds` keeps them apart).
    """
    return float(np.mean(final_eval_seeds(run, key)))


def final_eval_seeds(run: dict[str, Any], key: str = "loss") -> np.ndarray:
    """``[seeds]`` last evaluation's ``key`` per seed (``[1]`` for one seed; NaN if absent)."""
    _, vals = eval_series(run["records"], key)
    if vals.size == 0:
        v = run["summary"].get("final_eval", {}).get(key)
        v = [np.nan if x is None else x for x in v] if isinstance(v, list) else v
        return np.atleast_1d(np.asarray(np.nan if v is None else v, float))
    return np.atleast_1d(np.asarray(vals[-1], float))


def final_train_loss(run: dict[str, Any], last: int = 5) -> float:
    """Mean training loss of the last ``last`` train records (mean over seeds; NaN if none)."""
    return float(np.mean(final_train_loss_seeds(run, last)))


def final_train_loss_seeds(run: dict[str, Any], last: int = 5) -> np.ndarray:
    """``[seeds]`` mean training loss of the last ``last`` train records per seed."""
    _, vals = eval_series(run["records"], "loss", kind="train")
    if vals.size == 0:
        return np.array([np.nan])
    return np.atleast_1d(np.mean(vals[-last:], axis=0))


def steps_to_reach(steps: np.ndarray, values: np.ndarray, target: float) -> float:
    """First step at which ``values <= target``, linearly interpolated between evals.

    Returns NaN if the target is never reached.
    """
    for i, (s, v) in enumerate(zip(steps, values, strict=True)):
        if v <= target:
            if i == 0:
                return float(s)
            s0, v0 = steps[i - 1], values[i - 1]
            if v0 == v:
                return float(s)
            return float(s0 + (s - s0) * (v0 - target) / (v0 - v))
    return float("nan")


def lr_sweep(
    make_cfg: Callable[[float], Any],
    grid: Sequence[float],
    cache_dir: str | os.PathLike,
    label: str,
    *,
    progress: Callable[[str], None] | None = None,
    key: str = "loss",
    score: Callable[[dict[str, Any]], float] | None = None,
) -> tuple[float, dict[str, Any], list[dict[str, Any]]]:
    """Train ``make_cfg(lr)`` for every lr in ``grid``; pick the lowest score.

    The score of a run is its final evaluation ``key`` (validation loss by default), or
    ``score(run)`` when given (e.g. :func:`final_train_loss` where the evaluation has no
    loss). Lower is better.

    Returns:
      (chosen lr, the chosen run (train_cached result), table rows
      [{"lr", "final_<key>", "chosen", "at_edge"}]).
    """
    runs = []
    for lr in grid:
        runs.append(train_cached(make_cfg(lr), cache_dir, f"{label}-lr{lr:g}"))
        if progress:
            progress(f"{label} lr={lr:g}")
    finals = [score(r) if score else final_eval(r, key) for r in runs]
    finite = [i for i, v in enumerate(finals) if math.isfinite(v)]
    best = min(finite, key=lambda i: finals[i]) if finite else 0
    rows = [
        {
            "lr": float(lr),
            f"final_{key}": finals[i],
            "chosen": i == best,
            "at_edge": i == best and best in (0, len(grid) - 1) and len(grid) > 1,
        }
        for i, lr in enumerate(grid)
    ]
    return float(grid[best]), runs[best], rows
