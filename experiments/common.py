"""Shared plumbing for the experiments: the registry, run directories, JSON, claims, configs.

Every experiment module ``experiments/<name>.py`` declares ``EXPERIMENT =
Experiment(name, run, ...)`` (:class:`Experiment`), and its config module
``experiments/configs/<name>.py`` a ``get_config(scale)``. ``run(config, stage)`` runs
the experiment described by the ``ml_collections.ConfigDict`` ``config``, writes its
figures into ``stage.out_dir / "figures"``, trains through ``stage.cache_dir`` and
returns ``{"metrics", "figures", "claims"[, "notes"]}``; :meth:`Experiment.__call__`
times it and writes the standard result dict (:func:`result_dict`) as ``result.json``.
``amemory reproduce`` and ``python -m experiments <name>`` find experiments through
:func:`experiments` (nothing else lists them).

The result dict always holds ``name``, ``scale``, ``wall_s``, ``cpu_s``, ``load``,
``figures`` (paths relative to the stage directory), ``claims`` (list of :class:`Claim`
as dicts), ``notes``, ``config`` and an experiment-specific ``metrics`` dict.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime as _dt
import functools
import hashlib
import importlib
import json
import math
import os
import pathlib
import pkgutil
import resource
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from amemory import atomic
from experiments.configs import SCALES

REPO = pathlib.Path(__file__).resolve().parent.parent
CLAIMS_FILE = REPO / "experiments" / "claims.toml"  # every claim's text and rule (ClaimSpec)


@dataclasses.dataclass(frozen=True)
class Stage:
    """Where a running experiment writes, and whom it tells about progress.

    Attributes:
      out_dir: the stage directory (exists, with ``figures/``).
      cache_dir: where training runs live (:func:`train_cached`); ``amemory reproduce``
        shares it between stages, so identical runs are trained once.
      progress: called with a short label after each unit of work (:attr:`Experiment.units`).
    """

    out_dir: pathlib.Path
    cache_dir: pathlib.Path
    progress: Callable[[str], None] = lambda label: None

    def figure(self, path: os.PathLike | str) -> str:
        """``path`` (a figure under ``out_dir``) relative to ``out_dir``, for ``figures``."""
        return str(pathlib.Path(path).relative_to(self.out_dir))


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One experiment of ``amemory reproduce`` (declared as ``EXPERIMENT`` in its module).

    Attributes:
      name: the stage name; its config is ``experiments/configs/<name>.py``.
      run: ``run(config, stage: Stage) -> {"metrics", "figures", "claims"[, "notes"]}``.
      units: ``units(config) -> int``, the calls to ``stage.progress`` (the progress bar).
      default: whether ``amemory reproduce`` runs it without ``--only``.
      reduced: dotted-field overrides of the default run (not applied with ``--only``).
      lr_from: in the default run, take this stage's chosen learning rates
        (``metrics["chosen_lr"]`` into the fields ``lr.<optimizer>``) instead of a grid.
      headline: claim keys shown first in the report, in this order, and alone in README's
        table (:func:`experiments.report.readme_block`).
      get_config: ``get_config(scale)``; default ``experiments/configs/<name>.py``'s.
      sources: glob patterns (relative to the repository) of code the stage runs that no
        import reaches (a subprocess's package); the rest of its code version is derived
        (:meth:`code_version`).
    """

    name: str
    run: Callable[[Any, Stage], dict[str, Any]]
    units: Callable[[Any], int] = lambda cfg: 1
    default: bool = False
    reduced: dict[str, Any] = dataclasses.field(default_factory=dict)
    lr_from: str = ""
    headline: tuple[str, ...] = ()
    get_config: Callable[[str], Any] | None = None
    sources: tuple[str, ...] = ()

    def config(self, scale: str = "quick") -> Any:
        """The experiment's config at ``scale``; ``ValueError`` if not one of :data:`SCALES`."""
        if scale not in SCALES:
            raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
        if self.get_config is not None:
            return self.get_config(scale)
        return importlib.import_module(f"experiments.configs.{self.name}").get_config(scale)

    def code_version(self) -> str:
        """12-hex-digit hash of this stage's code: :func:`module_sources` of its module, its
        config module and the files of :attr:`sources`, and its claims in :data:`CLAIMS_FILE`."""
        config = (
            self.get_config.__module__ if self.get_config else f"experiments.configs.{self.name}"
        )
        more = [f for pattern in self.sources for f in sorted(REPO.glob(pattern))]
        files = module_sources(self.run.__module__, config, files=more)
        claims = {k: v for k, v in _claims_file().items() if k.startswith(f"{self.name}/")}
        names = [f.relative_to(REPO).as_posix() for f in files]
        return source_hash(files, *names, json.dumps(claims, sort_keys=True))

    def __call__(self, cfg: Any, out_dir: os.PathLike | str, *, progress=None, cache_dir=None):
        """Run the experiment into ``out_dir`` (``cache_dir`` defaults to ``out_dir/train_runs``);
        write and return the result dict, with wall and CPU seconds and the load average."""
        out = pathlib.Path(out_dir)
        (out / "figures").mkdir(parents=True, exist_ok=True)
        cache = pathlib.Path(cache_dir or out / "train_runs")
        stage = Stage(out, cache, progress or (lambda label: None))
        load0, cpu0, t0 = os.getloadavg()[0], cpu_seconds(), time.perf_counter()
        found = self.run(cfg, stage)
        result = result_dict(
            self.name, cfg.scale, wall_s=time.perf_counter() - t0, config=cfg,
            **{k: v for k, v in found.items() if k in ("metrics", "figures", "claims", "notes")},
        )  # fmt: skip
        result["cpu_s"] = cpu_seconds() - cpu0
        result["load"] = {"start": load0, "end": os.getloadavg()[0]}
        save_json(out / "result.json", result)
        return result


@functools.cache
def experiments() -> dict[str, Experiment]:
    """Every ``EXPERIMENT`` declared by a module of the ``experiments`` package, by name; those
    with ``lr_from`` after the others. ``ValueError`` if two modules declare the same name."""
    import experiments as package

    found: dict[str, Experiment] = {}
    for info in pkgutil.iter_modules(package.__path__):
        if info.ispkg or info.name.startswith("_"):
            continue
        exp = getattr(importlib.import_module(f"experiments.{info.name}"), "EXPERIMENT", None)
        if exp is not None:
            if exp.name in found:
                raise ValueError(f"experiment name {exp.name!r} declared twice")
            found[exp.name] = exp
    return dict(sorted(found.items(), key=lambda kv: (bool(kv[1].lr_from), kv[0])))


def source_hash(files: Iterable[os.PathLike | str], *extra: str) -> str:
    """12-hex-digit SHA-256 of the files' bytes (in the given order) and ``extra`` strings."""
    h = hashlib.sha256()
    for f in files:
        h.update(pathlib.Path(f).read_bytes())
    for e in extra:
        h.update(e.encode())
    return h.hexdigest()[:12]


@functools.cache
def amemory_version() -> str:
    """12-hex-digit hash of the ``amemory`` package's source files (the code that trains)."""
    files = sorted((REPO / "amemory").rglob("*.py"))
    return source_hash(files, *(f.relative_to(REPO).as_posix() for f in files))


FIRST_PARTY = ("amemory", "experiments", "theory_checks")


def _module_file(name: str) -> pathlib.Path | None:
    """The source file of the first-party module ``name`` (a package's ``__init__.py``)."""
    if name.split(".")[0] not in FIRST_PARTY:
        return None
    base = REPO.joinpath(*name.split("."))
    return next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()), None)


@functools.cache
def _imported(path: pathlib.Path) -> tuple[pathlib.Path, ...]:
    """First-party files that ``path`` imports anywhere (functions included), with the
    ``__init__.py`` of every package on the way. In a package's ``__init__.py``, a string
    naming a first-party module counts as an import of it (lazy exports such as
    ``amemory.train``'s ``import_module("amemory.train.loop")``)."""
    names, init = [], path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if init and isinstance(node, ast.Constant) and isinstance(node.value, str):
            names += [node.value] if "." in node.value and _module_file(node.value) else []
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    parts = {".".join(n.split(".")[:i]) for n in names for i in range(1, n.count(".") + 2)}
    return tuple(f for f in map(_module_file, sorted(parts)) if f is not None)


def module_sources(*modules: str, files: Iterable[pathlib.Path] = ()) -> list[pathlib.Path]:
    """The files of the first-party ``modules`` (and ``files``) and of every first-party module
    they import, transitively (:func:`_imported`, read with :mod:`ast`: a module imported by
    a computed name is not followed), sorted."""
    seen: set[pathlib.Path] = set()
    todo = [f for f in map(_module_file, modules) if f is not None] + list(files)
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo += _imported(f)
    return sorted(seen)


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and its finished children so far: divided
    by the core count, a stage's wall time on an idle machine even when the cores are shared."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


_DECIDE = object()  # ClaimSpec.claim: the seed interval decides


@dataclasses.dataclass
class Claim:
    """A claim decided (:meth:`ClaimSpec.claim`): the spec's text (``paper`` is its source)
    beside ``ours``, our measurement in words; ``held`` True / False / None (undecided: the
    interval contains the threshold, or the run failed); ``interval`` the seed interval
    (:func:`interval_dict`) or None."""

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
    """Seed interval of ``a`` ``[seeds]`` (or of the paired difference ``a - b``, ``b``
    ``[seeds]`` on the same seeds) and its verdict against ``threshold`` in ``direction``
    ("greater" or "less").

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


@dataclasses.dataclass(frozen=True)
class ClaimSpec:
    """One claim of a paper as data (a table of :data:`CLAIMS_FILE`, :func:`claim_specs`);
    :meth:`claim` decides it on measured values.

    The text fields may hold ``{name}`` fields, filled by :meth:`claim`'s keywords (a
    bucket's label, a threshold set by the config).

    Attributes:
      key: stable identifier ``"<stage>/<claim>"``.
      source: where the claim comes from (paper and section, or a peer), e.g. ``"A, Sec. 4"``.
      statement: the claim in words.
      paper_value: the paper's number(s) in words.
      test: the decision rule in words, so a reader can re-check it.
      arms: names of the per-seed values :meth:`claim` takes: ``(a, b)`` decides on the
        paired difference ``a - b``, ``(a,)`` on ``a``; ``()``: the stage decides.
      direction: "greater" / "less" (the quantity lies above / below ``threshold``,
        :func:`amemory.analysis.stats.verdict`), or "within" (equivalence: held when the
        interval lies inside ``(-threshold, threshold)``, not held when wholly outside).
      threshold: the value the quantity is compared with.
      unit: the unit of the arms' values, for the text.
    """

    key: str
    source: str
    statement: str
    paper_value: str
    test: str
    arms: tuple[str, ...] = ()
    direction: str = "greater"
    threshold: float = 0.0
    unit: str = ""

    def claim(self, *values: Any, ours: str = "", held: Any = _DECIDE, interval: Any = None,
              threshold: float | None = None, digits: int = 3, **fields: Any) -> Claim:  # fmt: skip
        """The rendered :class:`Claim`, decided by the 95% seed interval of ``values``.

        Args:
          *values: ``[seeds]`` per-seed values, one per arm (:attr:`arms`), or none.
          ours: our measurement in words; with values, followed by (two arms) ``"a <mean>
            vs b <mean> <unit>; a − b "`` and the interval's description.
          held: the verdict when the stage decides (a combined rule); the interval is then
            kept for the report but the verdict is not its own.
          interval: an interval the stage computed instead of the seed interval of
            ``values`` (a slope's, :func:`amemory.analysis.stats.slope_interval`); it decides
            unless ``held`` is given, and ``ours`` is taken as it is.
          threshold: replaces :attr:`threshold` (a threshold measured by the stage).
          digits: digits of the numbers in the text.
          **fields: values for the ``{name}`` fields of key, statement, paper_value and
            test (``{threshold}`` is the threshold).

        Raises:
          ValueError: if ``values`` and :attr:`arms` differ in number.
        """
        if values and len(values) != len(self.arms):
            raise ValueError(f"claim {self.key}: {len(values)} values for arms {self.arms}")
        t = self.threshold if threshold is None else threshold
        iv = interval
        if iv is not None and held is _DECIDE:
            held = _decide(iv, self.direction, t)
        if values:
            iv, _ = seed_verdict(*values, direction="greater")
            if held is _DECIDE:
                held = None if iv is None else _decide(iv, self.direction, t)
            if len(values) == 2:
                a, b = self.arms
                ours += f"{a} {seed_mean(values[0], digits)} vs {b} "
                ours += f"{seed_mean(values[1], digits)}{' ' * bool(self.unit)}{self.unit}; "
                ours += f"{a} − {b} "
            ours += describe(iv, digits)
        key, statement, paper_value, test = (
            getattr(self, k).format(threshold=t, **fields)
            for k in ("key", "statement", "paper_value", "test")
        )
        held = None if held is _DECIDE else held
        return Claim(key, self.source, statement, paper_value, ours, held, test,
                     interval_dict(iv, self.direction, t))  # fmt: skip


def seed_claim(
    key: str, paper: str, statement: str, paper_value: str, ours: str, test: str,
    a: Any, b: Any = None, *, direction: str = "greater", threshold: float = 0.0,
) -> Claim:  # fmt: skip
    """A claim written in the stage rather than in :data:`CLAIMS_FILE`: :meth:`ClaimSpec.claim`
    of ``a`` (or ``a - b``, paired per seed), ``ours`` followed by the interval."""
    spec = ClaimSpec(key, paper, statement, paper_value, test, ("x",), direction, threshold)
    return spec.claim(a if b is None else np.subtract(a, b), ours=ours)


@functools.cache
def _claims_file() -> dict[str, dict[str, Any]]:
    return tomllib.loads(CLAIMS_FILE.read_text())


def claim_specs(stage: str) -> dict[str, ClaimSpec]:
    """The claims of ``stage`` in :data:`CLAIMS_FILE`, by their key less ``"<stage>/"``;
    ``ValueError`` if the file holds none."""
    specs = {key.split("/", 1)[1]: ClaimSpec(key, **v | {"arms": tuple(v.get("arms", ()))})
             for key, v in _claims_file().items() if key.startswith(f"{stage}/")}  # fmt: skip
    if not specs:
        raise ValueError(f"{CLAIMS_FILE} has no claim of stage {stage!r}")
    return specs


def _decide(iv: Any, direction: str, threshold: float) -> bool | None:
    """Three-way verdict of a seed interval (see :attr:`ClaimSpec.direction`)."""
    from amemory.analysis import stats

    if direction != "within":
        return stats.verdict(iv, direction, threshold)
    if -threshold < iv.lo and iv.hi < threshold:
        return True
    return False if iv.lo > threshold or iv.hi < -threshold else None


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
    """Numpy / jax scalars and arrays (recursively) as plain Python for json (non-finite
    floats become ``None``, so the JSON stays standard)."""
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
    """Read a JSON-lines file (one dict per line; blank lines ignored; ``[]`` if absent)."""
    p = pathlib.Path(path)
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def timestamp() -> str:
    """UTC timestamp ``YYYYmmdd-HHMMSS`` for run directory names."""
    return _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")


def config_hash(cfg: Any) -> str:
    """Stable 12-hex-digit hash of a (ConfigDict or dict) config, for run caching."""
    d = cfg.to_dict() if hasattr(cfg, "to_dict") else cfg
    text = json.dumps(to_jsonable(d), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def result_dict(
    name: str, scale: str, *, metrics: dict[str, Any], figures: Sequence[str],
    claims: Iterable[Claim], wall_s: float, config: Any = None, notes: Sequence[str] = (),
) -> dict[str, Any]:  # fmt: skip
    """Assemble the standard result dict of an experiment (see module docstring)."""
    return {
        "name": name, "scale": scale, "wall_s": float(wall_s), "figures": list(figures),
        "claims": [c.as_dict() if isinstance(c, Claim) else dict(c) for c in claims],
        "metrics": metrics, "notes": list(notes),
        "config": (config.to_dict() if hasattr(config, "to_dict") else config),
    }  # fmt: skip


def parse_set(item: str) -> tuple[str, Any]:
    """``"a.b=value"`` (a ``--set`` argument) as ``("a.b", value)``, the value parsed as JSON;
    ``ValueError`` if ``item`` has no ``=``."""
    if "=" not in item:
        raise ValueError(f"--set expects FIELD=VALUE, got {item!r}")
    key, raw = item.split("=", 1)
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def check_values(stage: str, cfg: Any, **allowed: Sequence[Any]) -> None:
    """Check that every entry of the list field ``cfg.<field>`` is in ``allowed[field]``;
    else ``ValueError`` naming the stage, the field, the unknown entries and the allowed ones."""
    for field, ok in allowed.items():
        bad = [v for v in cfg[field] if v not in ok]
        if bad:
            raise ValueError(f"{stage} config field {field!r}: unknown {bad}; allowed {list(ok)}")


def has_field(cfg: Any, key: str) -> bool:
    """Whether the ConfigDict ``cfg`` has the dotted field ``key``."""
    node = cfg
    for part in key.split("."):
        if not hasattr(node, "keys") or part not in node:
            return False
        node = node[part]
    return True


def apply_override(cfg: Any, key: str, value: Any) -> None:
    """Set the dotted field ``key`` of the ConfigDict ``cfg`` to ``value`` (a list given for a
    tuple field becomes a tuple); ``ValueError`` if the field does not exist (naming the
    fields there) or does not accept ``value``'s type."""
    *parents, leaf = key.split(".")
    node = cfg
    for i, part in enumerate(parents):
        if not hasattr(node, "keys") or part not in node:
            raise ValueError(f"unknown config field {'.'.join(parents[: i + 1])!r}")
        node = node[part]
    if not hasattr(node, "keys") or leaf not in node:
        fields = sorted(node.keys()) if hasattr(node, "keys") else []
        raise ValueError(f"unknown config field {key!r}; fields here: {fields}")
    old = node[leaf]
    if isinstance(old, tuple | list) and isinstance(value, list):
        value = type(old)(value)
    try:
        node[leaf] = value
    except TypeError as e:
        raise ValueError(f"config field {key!r}: {e}") from None


def format_summary(result: dict[str, Any]) -> str:
    """One line per claim: verdict, key, ours vs paper."""
    lines = [f"[{result['name']} @ {result['scale']}] {result['wall_s']:.0f} s"]
    for c in result.get("claims", []):
        lines.append(
            f"  {verdict(c['held']):10s} {c['key']}: ours {c['ours']} | paper {c['paper_value']}"
        )
    return "\n".join(lines)


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """Markdown table lines: the header, its rule, then one line per row of cells."""
    line = lambda cells: "| " + " | ".join(map(str, cells)) + " |"
    return [line(header), "|---" * len(header) + "|", *map(line, rows)]


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
