"""`amemory report`: the claims table and figures from the committed results, no training.

Usage::

    amemory report                          # report.md + figures into runs/report-<ts>
    amemory report --out DIR --scale full   # the full-scale results
    amemory report --update-readme README.md   # README's headline claims from the results
    amemory report --docs docs/results.md      # the results page, every stage
    amemory report --mark-stale                # date-mark results whose stage code changed
    amemory report --add runs/x/steps_ratio/result.json   # file a stage's result.json first

Every stage of ``amemory reproduce`` writes a compact, committed JSON,
``experiments/results/<scale>/<stage>.json`` (:func:`save_result`); this command renders
the report, docs/results.md and README's headline table from them (a test fails when they
disagree, or when a stage's code changed without a dated stale mark, :func:`mark_stale`).
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import math
import os
import pathlib
import platform
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from amemory import atomic
from amemory.analysis import stats
from amemory.cli import Parser
from experiments import common

RESULTS = common.REPO / "experiments" / "results"
DOCS = common.REPO / "docs" / "results.md"
README_BEGIN = "<!-- BEGIN reproduce -->"
README_END = "<!-- END reproduce -->"
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml-collections")
# A list of more numbers than this is a curve (per step or per grid point): not kept.
MAX_NUMBERS = 32


def _curve(x: Any) -> bool:
    """Whether ``x`` is a (nested) list of more than :data:`MAX_NUMBERS` numbers only."""
    flat, todo = 0, [x]
    while todo:
        v = todo.pop()
        if isinstance(v, list):
            todo += v
        elif isinstance(v, int | float) or v is None:
            flat += 1
        else:
            return False
    return isinstance(x, list) and flat > MAX_NUMBERS


def _compact(x: Any, path: str, omitted: list[str]) -> Any:
    """``x`` without its curves (:func:`_curve`; their paths go to ``omitted``)."""
    if isinstance(x, dict):
        return {k: _compact(v, f"{path}.{k}", omitted) for k, v in x.items()}
    if _curve(x):
        omitted.append(path)
        return None
    if isinstance(x, list):
        return [_compact(v, f"{path}[{i}]", omitted) for i, v in enumerate(x)]
    return x


def provenance(
    result: dict[str, Any], code_version: str | None = None, commit: str | None = None
) -> dict[str, Any]:
    """Where a stage's numbers come from: config, code, packages, machine, time and load.
    ``code_version`` and ``commit`` default to this checkout's (pass both for another's)."""
    if code_version is None and result["name"] in common.experiments():
        code_version = common.experiments()[result["name"]].code_version()
    if commit is None:
        git = ["git", "-C", str(common.REPO), "rev-parse", "HEAD"]
        done = subprocess.run(git, capture_output=True, text=True, check=False)
        commit = done.stdout.strip() or None
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    try:
        cpuinfo = pathlib.Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        cpuinfo = []
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo
                if line.startswith("model name")), platform.processor())  # fmt: skip
    return {
        "config_hash": common.config_hash(result.get("config") or {}),
        "code_version": code_version,
        "commit": commit,
        "versions": versions,
        "machine": {"cpu": cpu, "cores": os.cpu_count(), "system": platform.platform()},
        "wall_s": result.get("wall_s"),
        "cpu_s": result.get("cpu_s"),
        "load_1min": result.get("load"),
        "written": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def save_result(
    result: dict[str, Any],
    root: os.PathLike | str = RESULTS,
    *,
    code_version: str | None = None,
    commit: str | None = None,
) -> tuple[pathlib.Path, list[str]]:
    """Write ``result`` (a :func:`common.result_dict`) as ``root/<scale>/<name>.json``.

    Drops lists of more than :data:`MAX_NUMBERS` numbers (per-step curves; their paths go
    under ``omitted``) and adds :func:`provenance`.

    Returns:
      (the path written, :func:`differences` from the file it replaced, else from the
      committed one).
    """
    path = pathlib.Path(root) / result["scale"] / f"{result['name']}.json"
    omitted: list[str] = []
    metrics = _compact(common.to_jsonable(result.get("metrics", {})), "metrics", omitted)
    keep = ("name", "scale", "wall_s", "cpu_s", "figures", "claims", "notes", "config")
    new = {k: common.to_jsonable(result.get(k)) for k in keep}
    new |= {
        "metrics": metrics,
        "omitted": omitted,
        "provenance": provenance(result, code_version, commit),
    }
    committed = RESULTS / result["scale"] / path.name
    before = path if path.is_file() else committed
    old = common.load_json(before) if before.is_file() else None
    common.save_json(path, new)
    return path, differences(old, new) if old else []


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """One line per claim whose verdict changed or whose 95% intervals do not overlap."""
    before = {c["key"]: c for c in old.get("claims", [])}
    lines = []
    for c in new.get("claims", []):
        b = before.get(c["key"])
        if b is None:
            continue
        iv, ib = c.get("interval"), b.get("interval")
        apart = iv and ib and (iv["lo"] > ib["hi"] or iv["hi"] < ib["lo"])
        if b["held"] != c["held"] or apart:
            lines.append(
                f"{c['key']}: was {common.verdict(b['held'])} ({b['ours']}), now "
                f"{common.verdict(c['held'])} ({c['ours']})"
                + ("; the 95% intervals do not overlap" if apart else "")
            )
    return lines


def load_results(scale: str = "quick", root: os.PathLike | str = RESULTS) -> list[dict[str, Any]]:
    """The stage JSONs of ``root/<scale>/``, in the registry's order (others after, by name)."""
    order = {name: i for i, name in enumerate(common.experiments())}
    paths = sorted(pathlib.Path(root, scale).glob("*.json"))
    results = [common.load_json(p) for p in paths]
    return sorted(results, key=lambda r: (order.get(r["name"], len(order)), r["name"]))


def code_changed(result: dict[str, Any]) -> bool:
    """Whether ``result``'s registered stage has a code version other than the recorded one."""
    exp = common.experiments().get(result["name"])
    return exp is not None and (result.get("provenance") or {}).get("code_version") != (
        exp.code_version()
    )


def refresh_command(result: dict[str, Any]) -> str:
    """The command that recomputes ``result`` over the committed file: a default stage at the
    quick scale with the others (the reduced configs and shared rates of the default run),
    any other alone in its full config (add the ``--set`` its committed config needs)."""
    exp = common.experiments().get(result["name"])
    default = exp is not None and exp.default and result["scale"] == "quick"
    alone = "" if default else f" --only {result['name']}"
    return f"amemory reproduce --scale {result['scale']}{alone} --refresh-results"


def mark_stale(root: os.PathLike | str = RESULTS) -> list[pathlib.Path]:
    """Give every result under ``root`` whose stage code changed (:func:`code_changed`) and
    that has no mark a dated ``stale`` mark (``since``, ``reason``, ``code_version``: the
    stage's version when marked); returns the files marked. The report prints the mark
    until the stage is re-run (:func:`save_result` writes no mark)."""
    marked = []
    for path in sorted(pathlib.Path(root).glob("*/*.json")):
        result = common.load_json(path)
        if "stale" in result or not code_changed(result):
            continue
        now = common.experiments()[result["name"]].code_version()
        was = (result.get("provenance") or {}).get("code_version")
        result["stale"] = {
            "since": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d"), "code_version": now,
            "reason": f"the stage's code changed after it was computed (code version {was} "
            f"when computed, {now} when marked); its numbers were not recomputed",
        }  # fmt: skip
        common.save_json(path, result)
        marked.append(path)
    return marked


def headline() -> list[str]:
    """The claims shown first, in the registry's order (:attr:`common.Experiment.headline`)."""
    return [k for exp in common.experiments().values() for k in exp.headline]


def claims(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every claim of ``results``, the headline claims first; a stale result's claims carry
    its mark's date as ``stale``."""
    order = {k: i for i, k in enumerate(headline())}
    all_claims = [c | ({"stale": r["stale"]["since"]} if r.get("stale") else {})
                  for r in results for c in r.get("claims", [])]  # fmt: skip
    return sorted(all_claims, key=lambda c: order.get(c["key"], len(order)))


def seeds_note(claim: dict[str, Any]) -> str:
    """``" (n=3; 7 needed)"``: the seeds a 95% t interval of the observed effect would need
    to exclude the claim's threshold (:func:`amemory.analysis.stats.seeds_needed`; "undecided"
    with few needed is a power problem, with ∞ no effect). Empty unless the verdict is the
    interval's own on a one-sided claim (not for equivalence claims, nor for a verdict that
    rests on another quantity)."""
    iv = claim.get("interval")
    if not iv or iv.get("direction") not in ("greater", "less"):
        return ""
    t = stats.Interval(iv["estimate"], iv["lo"], iv["hi"], iv["n"], iv["confidence"])
    threshold = iv.get("threshold") or 0.0
    if stats.verdict(t, iv["direction"], threshold) != claim["held"]:
        return ""
    need = stats.seeds_needed(t, threshold)
    return "" if math.isnan(need) else f" (n={iv['n']}; {need:.0f} needed)".replace("inf", "∞")


def claims_table(results: Sequence[dict[str, Any]], keys: Sequence[str] | None = None) -> str:
    """Markdown table: claim | source | paper | ours | verdict (headline claims in bold; only
    ``keys`` if given); beside the verdict, the seeds its interval has and would need
    (:func:`seeds_note`) and a stale result's mark."""
    first = set(headline())
    rows = []
    for c in claims(results):
        if keys is not None and c["key"] not in keys:
            continue
        verdict = common.verdict(c["held"]) + seeds_note(c)
        verdict += f"; stale since {c['stale']}" if c.get("stale") else ""
        cells = [c["statement"], c["paper"], c["paper_value"], c["ours"], verdict]
        cells = [str(x).replace("|", "/").replace("\n", " ") for x in cells]
        cells[0] = f"**{cells[0]}**" if c["key"] in first else cells[0]
        rows.append(cells)
    return "\n".join(common.table(("claim", "source", "paper", "ours", "verdict"), rows))


def _cost(results: Sequence[dict[str, Any]]) -> str:
    wall = sum(float(r.get("wall_s") or 0.0) for r in results) / 60
    cpu = sum(float(r.get("cpu_s") or 0.0) for r in results) / 60
    loads = [
        v for r in results for v in ((r.get("provenance") or {}).get("load_1min") or {}).values()
    ]
    load = f" at load average {min(loads):.1f}-{max(loads):.1f}" if loads else ""
    return f"{wall:.1f} min of wall time{load}, {cpu:.1f} min of CPU time"


def claims_figure(results: Sequence[dict[str, Any]], path: pathlib.Path) -> pathlib.Path | None:
    """Forest plot of every claim with a seed interval: estimate − threshold ± 95% CI, coloured
    by verdict; returns the path, or None when no claim has an interval."""
    rows = [c for c in claims(results) if c.get("interval")]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colour = {True: "tab:green", False: "tab:red", None: "tab:gray"}
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rows) + 1))
    for i, c in enumerate(rows):
        iv = c["interval"]
        t = iv.get("threshold") or 0.0
        ax.errorbar(
            iv["estimate"] - t, i, xerr=[[iv["estimate"] - iv["lo"]], [iv["hi"] - iv["estimate"]]],
            fmt="o", color=colour[c["held"]], capsize=3,
        )  # fmt: skip
    ax.axvline(0.0, color="k", lw=0.8)
    sides = {"greater": ">", "less": "<"}
    labels = [f"{c['key']} ({sides.get(c['interval']['direction'], '=')} threshold)" for c in rows]
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("estimate − threshold (95% seed interval)")
    ax.set_title("claims: green held, red not held, grey undecided")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


RULES = (
    "Verdicts are decided by the rule in each claim's test. Transformer claims compare runs "
    "on the same initialisation seeds (held out from the learning-rate choice; every seed "
    "reads the same data order): a claim is held when the 95% Student-t interval of the "
    "per-seed difference excludes zero (or the stated threshold) on the claimed side, not "
    "held when it excludes it on the other side, and undecided otherwise. Quick-scale numbers "
    "come from models far smaller than the papers'; a claim that does not hold here is "
    "reported as such."
)


def stage_section(r: dict[str, Any], figure: Any, level: str = "##") -> list[str]:
    """Markdown of one stage: provenance, stale mark, claims, tables, notes, figures.

    ``figure(result, path)`` gives a figure's link, or None to leave it out.
    """
    prov = r.get("provenance") or {}
    load = prov.get("load_1min") or {}
    cpu = f", CPU {r['cpu_s']:.0f} s" if r.get("cpu_s") is not None else ""
    lines = [f"{level} {r['name']} ({r['scale']} scale)", "",
             f"Computed {str(prov.get('written', '?'))[:10]} at commit "
             f"{str(prov.get('commit') or '?')[:10]} (stage code version "
             f"{prov.get('code_version')}); wall {float(r.get('wall_s') or 0):.0f} s{cpu}"
             + (f", load average {load['start']:.1f} → {load['end']:.1f}" if load else "")
             + ".", ""]  # fmt: skip
    if mark := r.get("stale"):
        lines += [f"**Stale since {mark['since']}**: {mark['reason']}. Refresh: "
                  f"`{refresh_command(r)}`.", ""]  # fmt: skip
    for c in r.get("claims", []):
        lines.append(
            f"- **{common.verdict(c['held'])}**: {c['statement']}. Paper ({c['paper']}): "
            f"{c['paper_value']}. Ours: {c['ours']}. Test: {c['test']}."
        )
    extra = (r.get("metrics") or {}).get("report_md")
    lines += ["", extra] if extra else []
    lines += [f"- note: {note}" for note in r.get("notes") or []]
    links = [link for f in r.get("figures") or [] if (link := figure(r, f))]
    return lines + [""] + [f"![{pathlib.Path(f).stem}]({f})" for f in links] + [""]


def write_report(out: pathlib.Path, results: Sequence[dict[str, Any]], scale: str) -> pathlib.Path:
    """Write ``out/report.md`` (claims table, forest figure, per-stage sections)."""
    every = claims(results)
    counts = {v: sum(c["held"] is v for c in every) for v in (True, False, None)}
    lines = [
        f"# amemory reproduce ({scale} scale)", "",
        f"Run directory `{out}`; {_cost(results)}; {counts[True]} claims held, "
        f"{counts[False]} not held, {counts[None]} undecided.", "", RULES, "",
        "## Claims beside our measurements", "", claims_table(results), "",
    ]  # fmt: skip
    fig = claims_figure(results, out / "figures" / "claims.png")
    lines += [f"![claims]({fig.relative_to(out).as_posix()})", ""] if fig else []
    for r in results:
        lines += stage_section(
            r, lambda r, f: f"{r['name']}/{f}" if (out / r["name"] / f).exists() else None
        )
    path = out / "report.md"
    atomic.write_text(path, "\n".join(lines) + "\n")
    return path


def results_page(root: os.PathLike | str = RESULTS, docs: pathlib.Path = DOCS) -> str:
    """docs/results.md: every committed result, by scale (claims table, then per stage), the
    figures that ``docs/figures/`` holds."""
    lines = [
        "# Results", "",
        f"Generated by `amemory report --docs {_shown(docs)}` from the committed "
        f"`{_shown(root)}/<scale>/<stage>.json`; do not edit (a test compares). A result "
        "marked stale was computed by an older version of its stage's code; its section names "
        "the command that refreshes it.", "", RULES, "",
    ]  # fmt: skip

    def figure(r: dict[str, Any], f: str) -> str | None:
        name = pathlib.Path(f).name
        return f"figures/{name}" if (docs.parent / "figures" / name).is_file() else None

    for scale in common.SCALES:
        results = load_results(scale, root)
        if results:
            lines += [f"## {scale.capitalize()} scale", "",
                      f"{len(results)} stages; {_cost(results)}.", "",
                      claims_table(results), ""]  # fmt: skip
            for r in results:
                lines += stage_section(r, figure, "###")
    return "\n".join(lines).rstrip("\n") + "\n"


def _shown(path: os.PathLike | str) -> str:
    """``path`` relative to the repository when inside it."""
    p = pathlib.Path(path).resolve()
    return p.relative_to(common.REPO).as_posix() if p.is_relative_to(common.REPO) else str(p)


def readme_block(results: Sequence[dict[str, Any]], scale: str = "quick") -> str:
    """README's generated block (between the markers): the headline claims, from the results."""
    dates = sorted(str((r.get("provenance") or {}).get("written", ""))[:10] for r in results)
    when = f"{dates[0]} to {dates[-1]}" if dates and dates[0] != dates[-1] else dates[-1]
    return "\n".join([
        README_BEGIN,
        f"Generated from `experiments/results/{scale}/` ({len(results)} stages, {scale} scale, "
        f"run {when}) by `amemory report --update-readme README.md`; every claim, with its "
        "stage's numbers, in [docs/results.md](docs/results.md).", "",
        claims_table(results, headline()), README_END,
    ])  # fmt: skip


def update_readme(readme: pathlib.Path, results: Sequence[dict[str, Any]], scale: str) -> None:
    """Replace the text between the reproduce markers in ``readme`` with :func:`readme_block`;
    ``ValueError`` if the README lacks either marker (the file is left unchanged)."""
    text = readme.read_text()
    if README_BEGIN not in text or README_END not in text:
        raise ValueError(f"{readme} must contain the markers {README_BEGIN} and {README_END}")
    start, end = text.index(README_BEGIN), text.index(README_END) + len(README_END)
    atomic.write_text(readme, text[:start] + readme_block(results, scale) + text[end:])


def readme_table(readme: pathlib.Path) -> str:
    """The generated block of ``readme`` (markers included), for comparison."""
    text = readme.read_text()
    return text[text.index(README_BEGIN) : text.index(README_END) + len(README_END)]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``amemory report`` (see the module docstring)."""
    p = Parser(prog="amemory report", description=__doc__.splitlines()[0])
    p.add_argument("--scale", default="quick", choices=common.SCALES, help="which results")
    p.add_argument("--results", default=str(RESULTS), help="results directory (default: ours)")
    p.add_argument("--out", default=None, help="where report.md goes (default runs/report-<ts>)")
    p.add_argument("--update-readme", default=None, metavar="PATH", help="rewrite its table")
    p.add_argument("--docs", default=None, metavar="PATH",
                   help="write the results page (docs/results.md) from the results")  # fmt: skip
    p.add_argument("--mark-stale", action="store_true",
                   help="date-mark every result whose stage code changed")  # fmt: skip
    p.add_argument("--add", action="append", default=[], metavar="RESULT_JSON",
                   help="first file this result.json into the results (repeatable)")  # fmt: skip
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    for path in args.add:
        saved, moved = save_result(common.load_json(path), args.results)
        print(f"{saved}" + "".join(f"\n  moved: {line}" for line in moved))
    for path in mark_stale(args.results) if args.mark_stale else ():
        print(f"marked stale: {path}")
    results = load_results(args.scale, args.results)
    if not results:
        return p.fail(f"no results in {args.results}/{args.scale}")
    out = pathlib.Path(args.out or pathlib.Path("runs") / f"report-{common.timestamp()}")
    out.mkdir(parents=True, exist_ok=True)
    print(f"report: {write_report(out, results, args.scale)}")
    if args.update_readme:
        try:
            update_readme(pathlib.Path(args.update_readme), results, args.scale)
        except (OSError, ValueError) as e:
            return p.fail(e)
    if args.docs:
        atomic.write_text(args.docs, results_page(args.results, pathlib.Path(args.docs).resolve()))
        print(f"results page: {args.docs}")
    return 0
