"""The layering docs/architecture.md states holds on the import graph of every module.

The table of layers is read from the page itself (its "## Layering" text block), so the
page and this test cannot drift apart. Every import counts, those inside functions too;
an import of a module by name through ``importlib`` (the CLI's dispatch) does not.
"""

import ast
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "architecture.md"
ROOTS = ("amemory", "experiments", "theory_checks")


def stated_layers() -> dict[str, int]:
    """Unit -> layer, from the page's table (``layer  unit unit ...`` rows)."""
    text = PAGE.read_text()
    table = re.search(r"## Layering\n.*?```text\nlayer\s+units\n(.*?)```", text, re.S).group(1)
    return {u: int(row.split()[0]) for row in table.splitlines() for u in row.split()[1:]}


def unit_of(module: str, layers: dict[str, int]) -> str | None:
    """The unit of ``layers`` that is ``module`` or contains it; a unit with units inside
    (``amemory``) holds only its own ``__init__``, so a new subpackage is in no unit."""
    for unit in layers:
        inner = any(u.startswith(f"{unit}.") for u in layers)
        if module == unit or (module.startswith(f"{unit}.") and not inner):
            return unit
    return None


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str, module: str, is_package: bool) -> set[str]:
    """Every first-party module ``source`` imports (``from a import b`` gives ``a.b`` when
    ``b`` is a module of ours, else ``a``; relative imports resolved against ``module``)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join(package + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                path = REPO / full.replace(".", "/")
                names.add(full if path.with_suffix(".py").is_file() or path.is_dir() else base)
    return {n for n in names if n.split(".")[0] in ROOTS}


def violations(sources: dict[pathlib.Path, str], layers: dict[str, int]) -> list[str]:
    """One line per import that goes up or sideways, and per module in no unit."""
    bad = []
    for path, source in sources.items():
        module = module_name(path)
        unit = unit_of(module, layers)
        if unit is None:
            bad.append(f"{module}: in no unit of the layering")
            continue
        for target in sorted(imported(source, module, path.name == "__init__.py")):
            other = unit_of(target, layers)
            if other is None or other == unit:
                continue
            if layers[other] > layers[unit] or (layers[other] == layers[unit] > 0):
                where = f"({other}, layer {layers[other]}) from layer {layers[unit]}"
                bad.append(f"{module} imports {target} {where}")
    return bad


def repository_sources() -> dict[pathlib.Path, str]:
    files = [f for root in ROOTS for f in sorted((REPO / root).rglob("*.py"))]
    return {f: f.read_text() for f in files}


def test_no_module_imports_upward_or_sideways():
    assert violations(repository_sources(), stated_layers()) == []


def _names(nodes) -> set[str]:
    found = {a.name for n in nodes if isinstance(n, ast.Import) for a in n.names}
    return found | {n.module for n in nodes if isinstance(n, ast.ImportFrom) and n.module}


def test_optim_imports_nothing_else_of_amemory_and_no_flax_at_import():
    """``optim.nnx_layers`` imports Flax when called; nothing of optim does on import."""
    for path, source in repository_sources().items():
        if module_name(path).startswith("amemory.optim"):
            tree = ast.parse(source)
            everywhere, top = _names(ast.walk(tree)), _names(tree.body)
            outside = {m for m in everywhere if m.split(".")[0] == "amemory"}
            outside -= {m for m in outside if m.startswith("amemory.optim")}
            outside |= {m for m in top if m.split(".")[0] == "flax"}
            assert not outside, f"{path.name} imports {outside}"


def test_the_check_catches_an_upward_and_a_sideways_import():
    """The checker itself, on sources with violations planted (a lazy one included)."""
    layers = stated_layers()
    planted = {
        REPO / "amemory/optim/planted.py": "def f():\n    from amemory.train import loop\n",
        REPO / "amemory/data/planted.py": "from amemory.models import transformer\n",
        REPO / "amemory/models/planted.py": "import amemory.optim\nfrom amemory import atomic\n",
        REPO / "amemory/newpkg/planted.py": "import os\n",
    }
    assert violations(planted, layers) == [
        "amemory.optim.planted imports amemory.train.loop (amemory.train, layer 3) from layer 1",
        "amemory.data.planted imports amemory.models.transformer (amemory.models, layer 2) "
        "from layer 2",
        "amemory.newpkg.planted: in no unit of the layering",
    ]


def test_the_page_states_every_package():
    layers = stated_layers()
    assert {"amemory.optim", "amemory.train", "experiments", "theory_checks"} <= set(layers)
    assert layers["amemory.optim"] < layers["amemory.models"] < layers["amemory.train"]
