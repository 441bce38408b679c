"""The experiment registry through CONTRIBUTING.md's recipe, and `amemory reproduce`'s guarantees.

A toy experiment (one associative-memory run, one claim) is declared the way the recipe
says and run through `amemory reproduce --only toy`: the registry, the results file,
`amemory report`, the lock on --out, SIGTERM and the resume of the interrupted run.
"""

from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from ml_collections import ConfigDict
from train_helpers import memory_config

from amemory.train import lock
from experiments import common, report, reproduce, train_runs

TESTS = pathlib.Path(__file__).parent
REPO = TESTS.parent


def get_config(scale: str) -> ConfigDict:  # the recipe's experiments/configs/<name>.py
    c = ConfigDict()
    c.scale = scale
    c.run = memory_config(steps=6, **{"optimizer.name": "signgd", "optimizer.lr": 0.3})
    return c


def run(cfg: ConfigDict, stage: common.Stage) -> dict:  # the recipe's experiments/<name>.py
    r = train_runs.train_cached(cfg.run, stage.cache_dir, "toy")
    stage.progress("toy")
    _, loss = train_runs.eval_series(r["records"], "loss")
    held = bool(loss[-1] < loss[0])
    claim = common.Claim("toy/lower", "-", "training lowers the loss", "lower", f"{loss[-1]:.3f}",
                         held, "last evaluation below the first")  # fmt: skip
    return {"metrics": {"loss": loss, "resumed_from": r["summary"].get("resumed_from")},
            "figures": [], "claims": [claim]}  # fmt: skip


TOY = common.Experiment("toy", run, get_config=get_config, headline=("toy/lower",))


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(common.experiments(), "toy", TOY)
    return TOY


def test_a_toy_experiment_added_by_the_recipe_runs_through_reproduce(toy, tmp_path, capsys):
    out, res = tmp_path / "out", tmp_path / "results"
    argv = ["--only", "toy", "--out", str(out), "--results", str(res), "--no-progress"]
    assert reproduce.main(argv) == 0
    assert "held       toy/lower" in capsys.readouterr().out
    saved = json.loads((res / "quick" / "toy.json").read_text())
    assert [c["key"] for c in saved["claims"]] == ["toy/lower"] and saved["claims"][0]["held"]
    assert saved["provenance"]["code_version"] == TOY.code_version()
    assert saved["provenance"]["cpu_s"] > 0 and len(saved["provenance"]["load_1min"]) == 2
    assert json.loads((out / "toy" / "result.json").read_text())["name"] == "toy"
    (res / "quick" / "toy.json").unlink()  # filed again from the run's result.json:
    add = ["--add", str(out / "toy" / "result.json")]
    assert report.main(["--results", str(res), "--out", str(tmp_path / "rep"), *add]) == 0
    assert json.loads((res / "quick" / "toy.json").read_text())["claims"] == saved["claims"]
    assert "**training lowers the loss**" in (tmp_path / "rep" / "report.md").read_text()
    # python -m experiments <name> runs the same registered experiment
    from experiments import __main__ as cli

    assert cli.main(["toy", "--out", str(tmp_path / "one"), "--set", "run.steps=4"]) == 0
    assert json.loads((tmp_path / "one" / "result.json").read_text())["config"]["run"]["steps"] == 4


def test_reproduce_refuses_an_out_in_use_and_touches_nothing(toy, tmp_path, capsys):
    out = tmp_path / "out"
    with lock.WorkdirLock(out):
        code = reproduce.main(["--only", "toy", "--out", str(out), "--results", str(tmp_path)])
    assert code == lock.EXIT_BUSY
    assert "is in use by another run" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == [lock.LOCK_NAME]


def test_the_run_cache_is_keyed_by_config_and_code_version(tmp_path, monkeypatch):
    cfg = get_config("quick").run
    first = train_runs.train_cached(cfg, tmp_path, "mem")
    assert train_runs.train_cached(cfg, tmp_path, "mem")["cached"] is True
    monkeypatch.setattr(common, "amemory_version", lambda: "changed")  # the code changed
    again = train_runs.train_cached(cfg, tmp_path, "mem")
    assert again["cached"] is False and again["workdir"] != first["workdir"]


_SCRIPT = (
    "import sys; sys.path[:0] = [{tests!r}, {repo!r}]\n"
    "import test_experiments_registry as t\n"
    "from experiments import common, reproduce\n"
    "common.experiments()['toy'] = t.TOY\n"
    "sys.exit(reproduce.main(sys.argv[1:]))\n"
)


def test_sigterm_saves_exits_75_in_one_line_and_the_rerun_resumes(tmp_path):
    out = tmp_path / "out"
    script = _SCRIPT.format(tests=str(TESTS), repo=str(REPO))
    cmd = [sys.executable, "-c", script, "--only", "toy", "--out", str(out), "--no-progress"]
    cmd += ["--results", str(tmp_path / "res"), "--set", "run.steps=4000"]
    cmd += ["--set", "run.eval_every=2000", "--set", "run.spectrum_every=0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    try:
        while time.time() < deadline and proc.poll() is None:  # wait for the loop to run
            logs = list((out / "train_runs").glob("toy-*/metrics.jsonl"))
            lines = logs[0].read_text().splitlines()[:-1] if logs else []
            if any(json.loads(x).get("step", 0) >= 3 for x in lines):
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [x for x in err.splitlines() if x.strip()]
    assert proc.returncode == 75, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("amemory reproduce: stopped by SIGTERM"), err
    (workdir,) = (out / "train_runs").glob("toy-*")
    assert (workdir / "checkpoints").is_dir() and not (workdir / "summary.json").exists()
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    result = json.loads((out / "toy" / "result.json").read_text())
    assert result["metrics"]["resumed_from"] >= 3  # continued, not retrained from step 0
    events = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if e.get("kind") == "event"].count("resume") == 1


def test_readme_claims_table_is_the_one_generated_from_the_results():
    results = report.load_results("quick")
    assert {"check", "one_layer", "tail_lm"} <= {r["name"] for r in results}
    assert all(r["provenance"]["code_version"] and r["claims"] for r in results)
    assert report.readme_table(REPO / "README.md") == report.readme_block(results, "quick")
