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


CLAIM = common.ClaimSpec(  # the recipe's experiments/<name>.py
    "toy/lower", "-", "training lowers the loss", "lower", "last evaluation below the first"
)


def run(cfg: ConfigDict, stage: common.Stage) -> dict:
    r = train_runs.train_cached(cfg.run, stage.cache_dir, "toy")
    stage.progress("toy")
    _, loss = train_runs.eval_series(r["records"], "loss")
    claim = CLAIM.claim(ours=f"{loss[-1]:.3f}", held=bool(loss[-1] < loss[0]))
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


def test_reproduce_writes_only_under_out_unless_asked_to_refresh(toy, tmp_path, monkeypatch):
    committed = tmp_path / "committed"
    monkeypatch.setattr(report, "RESULTS", committed)  # the committed results, for this test
    out = tmp_path / "out"
    assert reproduce.main(["--only", "toy", "--out", str(out), "--no-progress"]) == 0
    assert (out / "results" / "quick" / "toy.json").is_file() and not committed.exists()
    assert reproduce.main(["--only", "toy", "--out", str(out), "--no-progress",
                           "--refresh-results"]) == 0  # fmt: skip
    assert (committed / "quick" / "toy.json").is_file()


def test_results_page_is_generated_from_the_committed_results():
    results = report.load_results("quick")
    assert {"check", "one_layer", "tail_lm"} <= {r["name"] for r in results}
    assert all(r["provenance"]["code_version"] and r["claims"] for r in results)
    assert (REPO / "docs" / "results.md").read_text() == report.results_page()


def test_every_committed_result_matches_its_stage_code_or_is_marked_stale():
    """A stage whose code (its module, config and the first-party modules they import)
    changed after its committed result was computed must be re-run, or the result marked
    stale (dated; `amemory report --mark-stale`), which the results page prints."""
    page = (REPO / "docs" / "results.md").read_text()
    for path in sorted(report.RESULTS.glob("*/*.json")):
        result = json.loads(path.read_text())
        if report.code_changed(result):
            mark = result.get("stale")
            assert mark and mark["since"] and mark["reason"], f"{path}: re-run, or mark stale"
            assert (
                f"**Stale since {mark['since']}**" in page
                and report.refresh_command(result) in page
            )


def test_code_version_follows_the_imports_of_the_stage(monkeypatch):
    """The code version hashes the modules a stage imports, transitively (lazy exports of a
    package included), its config, and no other stage's modules."""
    files = {f.relative_to(REPO).as_posix() for f in common.module_sources("experiments.tail_dose")}
    assert {"experiments/tail_qa.py", "experiments/train_runs.py", "amemory/train/loop.py",
            "amemory/train/engine.py", "amemory/optim/muon.py"} <= files  # fmt: skip
    assert not {"experiments/arch.py", "theory_checks/cli.py", "experiments/report.py"} & files
    hashed = {}
    monkeypatch.setattr(common, "source_hash", lambda fs, *names: hashed.setdefault("", names))
    common.experiments()["tail_dose"].code_version()
    assert (
        "experiments/configs/tail_dose.py" in hashed[""] and "experiments/tail_qa.py" in hashed[""]
    )
    hashed.clear()
    common.experiments()["check"].code_version()  # a subprocess's package: named in sources
    assert {"theory_checks/wang2025.py", "amemory/analysis/stats.py"} <= set(hashed[""])


def test_every_claim_of_claims_toml_belongs_to_a_stage_and_renders():
    """claims.toml's tables are ClaimSpecs of registered stages, with a known direction,
    arms only where a seed interval decides, and text whose {fields} a stage can fill."""
    stages = {key.split("/")[0] for key in common._claims_file()}
    assert stages <= set(common.experiments()), stages - set(common.experiments())
    for stage in stages:
        for spec in common.claim_specs(stage).values():
            assert spec.direction in ("greater", "less", "within"), spec.key
            if spec.arms:  # the interval of one arm, or of the difference of two
                values = ([5.0, 5.2, 5.1], [1.0, 1.2, 1.0])[: len(spec.arms)]
                c = spec.claim(*values, **_FIELDS)
                assert c.interval and c.interval["n"] == 3 and c.held is not None, spec.key


_FIELDS = {
    "tail": "t",
    "size": "d1",
    "tau": 1.0,
    "leg": "qa",
    "dose": "x",
    "heaviest": 1,
    "paper": "p",
}
