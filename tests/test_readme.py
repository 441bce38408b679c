"""README's and docs/*.md's examples run as written, their links resolve, the quick start
is what CI runs, and the site with the API reference builds with warnings as errors.

The convention of every page: a ```bash block is run (in a fresh directory holding the
repository's top-level entries, with `amemory` and `python` on PATH) and must finish in
seconds; a ```console block (installs, long runs, accelerators) is shown only; the
```python blocks of a page run in order, in one namespace, as one script.
"""

import contextlib
import io
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").rglob("*.md"))]


# Pages other branches of this round add; links to them resolve once they are merged.
def _name(page: pathlib.Path) -> str:
    return page.relative_to(REPO).as_posix()


def _blocks(page: pathlib.Path, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", page.read_text(), re.S | re.M)


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


@pytest.fixture
def scratch(tmp_path):
    """A fresh directory with the repository's top-level entries (files and docs/ copied,
    so a block that rewrites a page rewrites a copy; the packages linked) and a bin/ with
    `amemory` and `python` running this interpreter on this checkout."""
    for entry in REPO.iterdir():
        if entry.name.startswith(".") or entry.name in ("runs", "site"):
            continue
        if entry.is_file() or entry.name == "docs":
            (shutil.copytree if entry.is_dir() else shutil.copy)(entry, tmp_path / entry.name)
        else:
            (tmp_path / entry.name).symlink_to(entry)
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    for name, args in (("amemory", "-m amemory "), ("python", "")):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" {args}"$@"\n')
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return tmp_path, env


BASH = [(p, i) for p in PAGES for i in range(len(_blocks(p, "bash")))]


@pytest.mark.parametrize("page, index", BASH, ids=[f"{_name(p)}-{i}" for p, i in BASH])
def test_bash_blocks_run(page, index, scratch):
    root, env = scratch
    block = _blocks(page, "bash")[index]
    done = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{block}"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, f"{_name(page)} block {index}:\n{block}\n{done.stderr[-3000:]}"


def _readme_checks(namespace, out):
    assert "mlp loss" in out and "hidden" in out and "rest" in out
    optim, nnx = namespace["optim"], namespace["nnx"]
    mlp_params = nnx.to_pure_dict(nnx.state(namespace["mlp"], nnx.Param))
    rows = {
        r.path: r
        for r in optim.routing_table(mlp_params, namespace["rules"], namespace["layers"].role)
    }
    assert rows["attn/value/kernel"].role == "v" and rows["up/kernel"].role == "dense"
    assert rows["down/kernel"].role == "head"  # the output layer goes to Adam


def _optim_checks(namespace, out):
    assert "layers/0/attn/v/kernel" in out and "hidden" in out and "rest" in out
    loss = float(re.search(r"transformer loss ([0-9.]+) nats/token", out).group(1))
    assert 0.0 < loss < 10.0  # cross-entropy of a 37-token vocabulary at init: ~log 37
    assert "muon" in out and "adamuon" in out  # the optimizer table printed


CHECKS = {"README.md": _readme_checks, "docs/optim.md": _optim_checks}
PYTHON = [p for p in PAGES if _blocks(p, "python")]


@pytest.mark.parametrize("page", PYTHON, ids=[_name(p) for p in PYTHON])
def test_python_blocks_run(page):
    """Each page's ```python blocks in order, in one namespace; README's and optim.md's
    printed routing tables and losses are then checked."""
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for code in _blocks(page, "python"):
            exec(compile(code, _name(page), "exec"), namespace)
    CHECKS.get(_name(page), lambda ns, text: None)(namespace, out.getvalue())


def _anchors(page: pathlib.Path) -> set[str]:
    """GitHub's heading anchors of ``page``, and its explicit ``<a id=...>`` ones."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    found = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#+ (.*)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.parametrize("page", PAGES, ids=[_name(p) for p in PAGES])
def test_relative_links_resolve(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            bad.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            bad.append(f"{target}: no heading or anchor #{anchor}")
    assert not bad, f"{_name(page)}: {bad}"


def test_quick_start_has_exactly_two_lines():
    """The block `.ci/run` takes its test line from (a console block: shown, and run by CI)."""
    block = re.search(r"```console\n(.*?)```", _section("Quick start"), re.S).group(1)
    lines = [line for line in block.splitlines() if line.strip()]
    assert len(lines) == 2
    assert "amemory reproduce" in lines[0] and "pytest" in lines[1]


def test_results_table_is_the_headline_rows_of_the_full_table():
    """README's table: the headline claims, each row as the full claims table has it."""
    from experiments import report

    rows = [line for line in _section("Results").splitlines() if line.startswith("| **")]
    full = report.claims_table(report.load_results("quick")).splitlines()
    assert len(rows) == len(report.headline()) >= 4 and set(rows) <= set(full)
    assert {r["key"] for r in report.claims(report.load_results("quick"))} >= set(report.headline())


def test_readme_is_the_front_page_only():
    assert len(README.read_text().splitlines()) <= 250


def test_mkdocs_build_strict(tmp_path):
    """docs/ and the API reference build with warnings as errors (mkdocs.yml: strict)."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-5000:]
    assert (tmp_path / "api" / "optim" / "index.html").is_file()
    assert "newton_schulz" in (tmp_path / "api" / "optim" / "index.html").read_text()
