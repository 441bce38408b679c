"""README's Python example runs as written, and its quick start is what CI runs."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_python_example_runs(capsys):
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
    table = capsys.readouterr().out
    assert "layers/0/attn/v/kernel" in table and "hidden" in table and "rest" in table


def test_quick_start_has_exactly_two_lines():
    text = README.read_text()
    block = re.search(r"## Quick start\n\n```bash\n(.*?)```", text, re.S).group(1)
    lines = [line for line in block.splitlines() if line.strip()]
    assert len(lines) == 2
    assert "amemory reproduce" in lines[0] and "pytest" in lines[1]
