"""README's Python examples run as written, and its quick start is what CI runs."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_compose_optimizers_examples_run(capsys):
    """Every ```python block of section 1, in order, in one namespace (functional API,
    flax.nnx.Optimizer on amemory's transformer and on a plain nnx model, the family,
    scanned layers on an Explicit mesh)."""
    blocks = re.findall(r"```python\n(.*?)```", _section("1. Compose optimizers"), re.S)
    assert len(blocks) == 4
    namespace: dict = {}
    for code in blocks:
        exec(compile(code, "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "layers/0/attn/v/kernel" in out and "hidden" in out and "rest" in out
    assert "layer 1 = -polar(G[1]): True" in out
    loss = float(re.search(r"transformer loss ([0-9.]+) nats/token", out).group(1))
    assert 0.0 < loss < 10.0  # cross-entropy of a 37-token vocabulary at init: ~log 37
    optim, nnx = namespace["optim"], namespace["nnx"]
    mlp_params = nnx.to_pure_dict(nnx.state(namespace["mlp"], nnx.Param))
    rows = optim.routing_table(mlp_params, {"hidden": 0, "rest": 1}, optim.nnx_role)
    mlp_roles = {r.path: r.role for r in rows}
    assert mlp_roles["attn/value/kernel"] == "v" and mlp_roles["up/kernel"] == "dense"


def test_quick_start_has_exactly_two_lines():
    text = README.read_text()
    block = re.search(r"## Quick start\n\n```bash\n(.*?)```", text, re.S).group(1)
    lines = [line for line in block.splitlines() if line.strip()]
    assert len(lines) == 2
    assert "amemory reproduce" in lines[0] and "pytest" in lines[1]
