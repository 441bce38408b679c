"""Shared machinery of the theory checks: result record, registry, runner, tables.

A *check* is a function ``fn(ctx: Context) -> CheckResult`` registered with
:func:`register`. It simulates one statement of ``docs/science.md`` with amemory's own
optimizers, model and priors, compares the measurement with the prediction and says
whether it holds within a tolerance that its docstring justifies. ``kind`` is
``"paper"`` for a statement the paper makes, ``"derived"`` for a consequence
worked out in ``docs/science.md`` (marked ``[derived]`` there) and ``"conjecture"`` for a
statement a paper leaves open (marked ``[conjecture]``: a fail is a finding, not a bug).

The runner (:func:`run_checks`) never lets one check's exception stop the others: an
exception becomes a failed result whose ``measured`` field holds the error.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["CheckResult", "Context", "REGISTRY", "fmt", "markdown_table", "register",
           "run_checks", "select", "update_readme"]  # fmt: skip

KINDS = ("paper", "derived", "conjecture")
BEGIN_MARK = "<!-- BEGIN checks -->"
END_MARK = "<!-- END checks -->"


@dataclasses.dataclass
class CheckResult:
    """Outcome of one check.

    Attributes:
      statement: the statement checked, in words (source in docs/science.md).
      predicted: what theory says, as text (numbers with units where relevant).
      measured: what the simulation gave, as text.
      tolerance: the tolerance used, as text (justified in the check's docstring).
      passed: the verdict.
      kind: one of :data:`KINDS`.
      name: registry name, ``"<paper>.<statement>"`` (set by :func:`run_checks`).
      figure: path of a figure written by the check, or None.
      seconds: wall time of the check (filled in by the runner).
      details: extra numbers (JSON-serialisable) for ``--json`` output.
      certified: the range over which ball arithmetic proved the statement
        (:mod:`theory_checks.certified`), or "" for a floating-point check.
    """

    statement: str
    predicted: str
    measured: str
    tolerance: str
    passed: bool
    kind: str = "paper"
    name: str = ""
    figure: str | None = None
    seconds: float = 0.0
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    certified: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        self.passed = bool(self.passed)


@dataclasses.dataclass(frozen=True)
class Context:
    """What a check may depend on.

    Attributes:
      quick: smaller sizes for the test suite (whole quick run well under 60 s).
      out_dir: where figures go, or None to skip figures.
    """

    quick: bool = False
    out_dir: Path | None = None


@dataclasses.dataclass(frozen=True)
class _Entry:
    name: str
    fn: Callable[[Context], CheckResult]


REGISTRY: dict[str, _Entry] = {}


def register(name: str) -> Callable[[Callable[[Context], CheckResult]], Callable]:
    """Decorator adding ``fn(ctx) -> CheckResult`` to :data:`REGISTRY` under ``name``.

    Raises:
      ValueError: if the name is already registered.
    """

    def deco(fn: Callable[[Context], CheckResult]) -> Callable[[Context], CheckResult]:
        if name in REGISTRY:
            raise ValueError(f"check name {name!r} registered twice")
        REGISTRY[name] = _Entry(name, fn)
        return fn

    return deco


def select(only: str | None) -> list[str]:
    """Registered names matching ``only``: comma-separated substrings (None = all).

    Raises:
      ValueError: if a pattern matches nothing (the message lists the names).
    """
    names = list(REGISTRY)
    if not only:
        return names
    chosen: list[str] = []
    for pat in (p.strip() for p in only.split(",") if p.strip()):
        hits = [n for n in names if pat in n]
        if not hits:
            raise ValueError(f"--only {pat!r} matches no check; checks are: {', '.join(names)}")
        chosen += [h for h in hits if h not in chosen]
    return chosen


def run_checks(
    names: Iterable[str], ctx: Context, progress: Callable[[CheckResult], None] | None = None
) -> list[CheckResult]:
    """Runs the named checks in order; an exception becomes a failed result."""
    results = []
    for name in names:
        t0 = time.perf_counter()
        try:
            res = REGISTRY[name].fn(ctx)
        except Exception as e:  # noqa: BLE001 - a crashing check is a failed check
            tb = traceback.format_exc(limit=3).strip().splitlines()[-1]
            res = CheckResult(
                statement=(REGISTRY[name].fn.__doc__ or "").strip().splitlines()[0],
                predicted="-",
                measured=f"error: {type(e).__name__}: {e}"[:300],
                tolerance="-",
                passed=False,
                details={"traceback": tb},
            )
        res.name, res.seconds = name, time.perf_counter() - t0
        results.append(res)
        if progress is not None:
            progress(res)
    return results


def fmt(x: float, digits: int = 3) -> str:
    """Compact number formatting for tables (``0.0625``, ``1.2e-05``, ``-0.937``)."""
    if isinstance(x, (int,)) and not isinstance(x, bool):
        return str(x)
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        return str(x)
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def _cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def markdown_table(results: list[CheckResult], *, with_statement: bool = True) -> str:
    """Results as a markdown table: check, kind, (statement,) predicted, measured, tolerance,
    verdict, certified range, seconds."""
    head = ["check", "kind"] + (["statement"] if with_statement else [])
    head += ["predicted", "measured", "tolerance", "verdict", "certified over", "s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        row = [r.name, r.kind] + ([r.statement] if with_statement else [])
        row += [r.predicted, r.measured, r.tolerance, "PASS" if r.passed else "FAIL"]
        row += [r.certified or "-", f"{r.seconds:.1f}"]
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(lines)


def results_json(results: list[CheckResult], meta: dict[str, Any]) -> str:
    """Results and run metadata as a JSON document."""
    return json.dumps(
        {"meta": meta, "results": [dataclasses.asdict(r) for r in results]}, indent=1, default=str
    )


def _marker_lines(text: str, path: Path) -> tuple[int, int]:
    lines = text.splitlines()
    try:
        b = next(i for i, ln in enumerate(lines) if ln.strip() == BEGIN_MARK)
        e = next(i for i, ln in enumerate(lines) if ln.strip() == END_MARK)
    except StopIteration:
        raise ValueError(f"{path} must contain the lines {BEGIN_MARK!r} and {END_MARK!r}") from None
    if e < b:
        raise ValueError(f"{path}: {END_MARK!r} comes before {BEGIN_MARK!r}")
    return b, e


def check_readme(path: Path) -> None:
    """Raises ValueError unless ``path`` is a file with both marker lines in order."""
    if not Path(path).is_file():
        raise ValueError(f"{path}: no such file")
    _marker_lines(Path(path).read_text(), path)


def update_readme(path: Path, table: str) -> None:
    """Replaces the text between the marker lines ``<!-- BEGIN checks -->`` and
    ``<!-- END checks -->`` in ``path`` with ``table``.

    Raises:
      ValueError: if the file lacks either marker line (or has them in the wrong order).
    """
    text = Path(path).read_text()
    b, e = _marker_lines(text, path)
    lines = text.splitlines(keepends=True)
    new = lines[: b + 1] + [table.rstrip("\n") + "\n"] + lines[e:]
    Path(path).write_text("".join(new))


# The helpers below import jax/optax lazily so that `amemory check --help` stays cheap.
# They assume float64 (the runner turns on jax_enable_x64 before any check runs).


def trajectory(
    name: str,
    learning_rate: float,
    loss_fn: Callable[[Any], Any],
    w0: Any,
    steps: int,
    record: Callable[[Any], Any],
) -> Any:
    """Runs ``steps`` steps of optimizer ``name`` on ``loss_fn`` from ``w0`` (jit + scan).

    ``name`` is one of :data:`amemory.analysis.one_step.OPTIMIZERS` (paper A/B's GD, SignGD,
    Muon). ``learning_rate`` is a float, an optax schedule, or a numpy array
    ``[S, steps]`` of per-step rates η_t for S schedules run side by side in one compiled
    program (vmapped; exact for these momentum-free optimizers, whose update is
    ``η_t`` times the update at rate 1).

    Returns:
      ``record`` applied to ``W_0, W_1, ..., W_steps``, stacked along a new leading axis
      (length ``steps + 1``; with an ``[S, steps]`` array, a further leading axis S), as a
      pytree of numpy arrays.
    """
    import jax
    import numpy as np
    import optax

    from amemory.analysis.one_step import optimizer

    per_step = isinstance(learning_rate, np.ndarray)
    if per_step and (learning_rate.ndim != 2 or learning_rate.shape[1] != steps):
        raise ValueError(
            f"learning_rate array must be [S, steps={steps}], got {learning_rate.shape}"
        )
    tx = optimizer(name, 1.0 if per_step else learning_rate)

    def run(w, lrs):
        def body(carry, lr):
            w, s = carry
            g = jax.grad(loss_fn)(w)
            u, s = tx.update(g, s, w)
            w = optax.apply_updates(w, u if lrs is None else jax.tree.map(lambda x: lr * x, u))
            return (w, s), record(w)

        _, recs = jax.lax.scan(body, (w, tx.init(w)), lrs, length=steps)
        first = record(w)
        return jax.tree.map(lambda a, b: jax.numpy.concatenate([a[None], b]), first, recs)

    if per_step:
        out = jax.jit(jax.vmap(run, in_axes=(None, 0)))(w0, jax.numpy.asarray(learning_rate))
    else:
        out = jax.jit(lambda w: run(w, None))(w0)
    return jax.tree.map(np.asarray, out)


def fit(x: Any, y: Any) -> Any:
    """Least-squares power law ``y ≈ c x^s`` with its 95% interval (``fit_power_law``)."""
    from amemory.analysis import scaling

    return scaling.fit_power_law(x, y)


def half(f: Any) -> float:
    """Half-width of a fit's 95% slope interval."""
    return 0.5 * (f.slope_ci[1] - f.slope_ci[0])


def savefig(fig: Any, ctx: Context, name: str) -> str | None:
    """Saves a matplotlib figure under ``ctx.out_dir`` (None: closes it, returns None)."""
    import matplotlib.pyplot as plt

    if ctx.out_dir is None:
        plt.close(fig)
        return None
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    path = ctx.out_dir / f"{name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return str(path)
