"""The `amemory` entry point: help lists the jobs, bad input exits non-zero in one line."""

import subprocess
import sys

import pytest

from amemory import cli


def _run(*args):
    return subprocess.run(
        [sys.executable, "-m", "amemory", *args], capture_output=True, text=True, timeout=120
    )


def test_help_lists_every_subcommand():
    out = _run("--help")
    assert out.returncode == 0
    for name in ("train", "check", "reproduce", "report", "sample", "data", "bench"):
        assert f"    {name}" in out.stdout, out.stdout


@pytest.mark.parametrize("args", [("frobnicate",), ("--no-such-flag",)])
def test_bad_input_is_one_line_and_nonzero(args):
    out = _run(*args)
    assert out.returncode != 0
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("amemory: error:")


def test_dispatch_passes_remaining_args(monkeypatch):
    seen = {}

    class Fake:
        @staticmethod
        def main(argv):
            seen["argv"] = argv
            return 3

    monkeypatch.setitem(cli.SUBCOMMANDS, "train", ("fake_train_module", "x"))
    monkeypatch.setitem(sys.modules, "fake_train_module", Fake)
    assert cli.main(["train", "--config", "c.py", "--config.steps=5"]) == 3
    assert seen["argv"] == ["--config", "c.py", "--config.steps=5"]


def test_report_without_results_is_one_line(tmp_path):
    out = _run("report", "--results", str(tmp_path), "--out", str(tmp_path / "r"))
    assert out.returncode == 2 and out.stderr.startswith("amemory report: error: no results in")
