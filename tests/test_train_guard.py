"""Reliability of training runs: stop signals, damaged checkpoints, non-finite and divergent
runs, the workdir lock, the resume contract, atomic writes and input validation."""

import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from train_helpers import (
    LM_CONFIG,
    MEMORY_CONFIG,
    lm_config,
    lm_overrides,
    memory_config,
    write_corpus,
)

from amemory import atomic
from amemory.train import checkpoint as ckpt_lib
from amemory.train import guard, run, train
from amemory.train.checkpoint import leaf_names, load_params
from amemory.train.lock import WorkdirLock
from amemory.train.state import TrainState


def _records(workdir):
    return [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]


def _events(workdir, name):
    return [r for r in _records(workdir) if r["kind"] == "event" and r["event"] == name]


def _assert_same_params(got, want):
    got, want = leaf_names(got), leaf_names(want)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], np.asarray(want[k]), rtol=1e-6, atol=1e-7, err_msg=k)


# ----------------------------------------------------------------------------- 1. stop signals


@pytest.fixture
def tiny_corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("AMEMORY_DATA", str(tmp_path / "cache"))
    return write_corpus(tmp_path)


# constant learning rate: the trajectory does not depend on `steps`, so a run stopped at k and
# resumed with steps=k+3 must equal an uninterrupted run of k+3 steps
_STOP_RUN = {"schedule.name": "constant", "eval_every": 100000, "spectrum_every": 0}
_STOP_RUN |= {"checkpoint_every": 0, "optimizer.name": "muon"}


@pytest.mark.parametrize("sig, code", [("SIGTERM", 75), ("SIGINT", 130)])
def test_stop_signal_saves_the_step_and_resume_is_exact(tmp_path, tiny_corpus, sig, code):
    wd = tmp_path / "stopped"
    args = lm_overrides(tiny_corpus, **{**_STOP_RUN, "steps": 100000})
    cmd = [sys.executable, "-m", "amemory.cli", "train", "--config", LM_CONFIG + ":full"]
    cmd += ["--workdir", str(wd)] + [f"--config.{a}" for a in args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics, deadline = wd / "metrics.jsonl", time.time() + 120
    try:
        while time.time() < deadline and proc.poll() is None:  # wait for the loop to run
            lines = metrics.read_text().splitlines()[:-1] if metrics.exists() else []
            if any(json.loads(x)["step"] >= 3 for x in lines):
                break
            time.sleep(0.02)
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [x for x in err.splitlines() if x.strip()]
    assert proc.returncode == code, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"amemory train: stopped by {sig} after step")
    stopped = _events(wd, "stopped")[-1]
    k = stopped["step"]
    assert stopped["reason"] == sig and stopped["checkpoint"] == str(wd / "checkpoints" / str(k))
    train_steps = [r["step"] for r in _records(wd) if r["kind"] == "train"]
    assert train_steps == list(range(1, k + 1))  # the stopped step finished and was logged
    assert ckpt_lib.Checkpointer(wd / "checkpoints").all_steps() == [k]
    assert not (wd / "summary.json").exists()  # not a finished run
    summary, resumed = run(lm_config(tiny_corpus, **_STOP_RUN, steps=k + 3), wd, resume=True)
    _, ref = run(lm_config(tiny_corpus, **_STOP_RUN, steps=k + 3), tmp_path / "ref")
    assert summary["resumed_from"] == k and summary["steps"] == k + 3
    _assert_same_params(resumed.params, ref.params)
    _assert_same_params(resumed.opt_state, ref.opt_state)


def test_exit_codes_are_distinct():
    codes = [
        guard.exit_code(e)
        for e in (
            guard.NonFiniteLossError("x"),
            ValueError("x"),
            guard.DivergenceError("x"),
            guard.WorkdirBusyError("x"),
            guard.RunInterrupted("SIGTERM", 3, "c"),
            guard.RunInterrupted("SIGINT", 3, "c"),
        )
    ]
    assert codes == [1, 2, 3, 4, 75, 130]


# ----------------------------------------------------------------------------- 2. integrity


def _small_state(scale=1.0):
    params = {"w": jnp.sin(jnp.arange(64 * 96, dtype=jnp.float32)).reshape(64, 96) * scale}
    params["b"] = jnp.linspace(-1.0, 1.0, 7) * scale
    tx = optax.adam(1e-3)
    return TrainState(jnp.asarray(3, jnp.int32), params, tx.init(params), jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
    """A checkpoints/ root with steps 1 and 2 (written once; tests damage copies)."""
    directory = tmp_path_factory.mktemp("base") / "checkpoints"
    c = ckpt_lib.Checkpointer(directory)
    c.save(1, _small_state(1.0), {"data_position": [1]})
    c.save(2, _small_state(2.0), {"data_position": [2]})
    c.close()
    return directory


def _data_files(step_dir):
    return sorted(
        (f for f in (step_dir / "state").rglob("*") if f.is_file() and f.parent.name == "d"),
        key=lambda f: -f.stat().st_size,
    )


def _truncate(step_dir):  # every array data file cut to half its length
    for f in _data_files(step_dir):
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _tamper_digest(step_dir):  # the arrays read fine, but differ from what was saved
    meta = step_dir / "extra" / "metadata"
    extra = json.loads(meta.read_text())
    extra["integrity"]["leaves"]["params.w"][0] += 1
    meta.write_text(json.dumps(extra))


def _nonfinite(step_dir):  # a NaN checkpoint written without amemory's save (old or foreign)
    directory = step_dir.parent
    shutil.rmtree(step_dir)
    state = _small_state(2.0)
    state = state._replace(params={**state.params, "b": state.params["b"].at[3].set(jnp.nan)})
    handlers = {"state": ocp.StandardCheckpointHandler(), "extra": ocp.JsonCheckpointHandler()}
    with ocp.CheckpointManager(directory, item_handlers=handlers) as m:
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state), extra=ocp.args.JsonSave({"data_position": [2]})
        )
        m.save(2, args=args)
        m.wait_until_finished()


DAMAGE = {
    "truncated data": (_truncate, r""),
    "deleted _METADATA": (lambda d: (d / "state" / "_METADATA").unlink(), r"metadata"),
    "flipped bytes (digest)": (_tamper_digest, r"checksum mismatch in params\.w"),
    "unreadable extra": (lambda d: (d / "extra" / "metadata").write_text("{trunc"), r"JSON"),
    "non-finite arrays": (_nonfinite, r"non-finite values restored in params\.b \(1\)"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_restore_skips_damaged_newest_checkpoint(tmp_path, two_checkpoints, damage):
    directory = tmp_path / "checkpoints"
    shutil.copytree(two_checkpoints, directory)
    fn, reason = DAMAGE[damage]
    fn(directory / "2")
    c = ckpt_lib.Checkpointer(directory)
    found = c.restore_intact(_small_state())
    c.close()
    assert found.step == 1 and found.extra["data_position"] == [1]
    _assert_same_params(found.state.params, _small_state(1.0).params)
    [(moved, why)] = found.skipped
    assert moved == tmp_path / "checkpoints-rejected" / "2" and (moved / "REASON.txt").exists()
    assert re.search(reason, why), why
    assert ckpt_lib.Checkpointer(directory).all_steps() == [1]


def test_byte_flips_never_restore_wrong_values(tmp_path, two_checkpoints):
    """Flip one byte at 4 places of the biggest data file. Orbax alone (``load_params``)
    returns altered values without an error; restore_intact must reject every such step."""
    saved = leaf_names(_small_state(2.0).params)
    silent = 0
    for i in range(4):
        directory = tmp_path / f"c{i}" / "checkpoints"
        shutil.copytree(two_checkpoints, directory)
        f = _data_files(directory / "2")[0]
        data = bytearray(f.read_bytes())
        data[int(len(data) * (i + 0.5) / 4)] ^= 0x5A
        f.write_bytes(bytes(data))
        try:
            plain = leaf_names(load_params(directory, 2))
            altered = any(not np.array_equal(plain[k], np.asarray(v)) for k, v in saved.items())
            silent += altered
        except Exception:  # noqa: BLE001 - Orbax noticed this one itself
            altered = True
        c = ckpt_lib.Checkpointer(directory)
        found = c.restore_intact(_small_state())
        c.close()
        if found.step == 2:  # accepted: then it must be exactly what was saved
            assert not altered
            _assert_same_params(found.state.params, _small_state(2.0).params)
    assert silent > 0  # the flips did alter what plain Orbax reads


def test_save_refuses_nonfinite_state(tmp_path):
    state = _small_state()
    bad = state._replace(params={**state.params, "w": state.params["w"].at[0, :5].set(jnp.inf)})
    c = ckpt_lib.Checkpointer(tmp_path / "checkpoints")
    with pytest.raises(ckpt_lib.NonFiniteStateError, match=r"params\.w \(5\); not saved"):
        c.save(4, bad, {})
    c.close()
    assert ckpt_lib.Checkpointer(tmp_path / "checkpoints").all_steps() == []


def test_resume_falls_back_to_the_intact_checkpoint(tmp_path, capfd):
    cfg = {"optimizer.name": "signgd", "optimizer.lr": 0.3, "batch_size": 24}
    train(memory_config(**cfg, steps=4, checkpoint_every=2, keep_checkpoints=3), tmp_path / "r")
    _truncate(tmp_path / "r" / "checkpoints" / "4")
    capfd.readouterr()
    summary, state = run(
        memory_config(**cfg, steps=6, checkpoint_every=2), tmp_path / "r", resume=True
    )
    err = [x for x in capfd.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and "warning: checkpoint 4 was damaged" in err[0], err
    assert summary["resumed_from"] == 2
    [ev] = _events(tmp_path / "r", "checkpoint_rejected")
    assert ev["checkpoint"] == str(tmp_path / "r" / "checkpoints-rejected" / "4")
    _, ref = run(memory_config(**cfg, steps=6, checkpoint_every=2), tmp_path / "ref")
    np.testing.assert_array_equal(np.asarray(state.params["W"]), np.asarray(ref.params["W"]))


# ----------------------------------------------------------------------------- non-finite stop


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_nonfinite_stop_names_newest_healthy_checkpoint(tmp_path, tiny_corpus):
    """SGD with a learning rate of 1e8 warmed up over 10 steps: finite but blown-up states,
    then NaN. The stop names the newest checkpoint that a healthy train record followed."""
    blow = {"optimizer.name": "sgd", "optimizer.lr": 1e8, "optimizer.muon_roles": "all"}
    blow |= {"schedule.name": "linear", "schedule.warmup_steps": 10, "checkpoint_every": 1}
    blow |= {"eval_every": 100, "spectrum_every": 0, "steps": 12}
    wd = tmp_path / "run"
    with pytest.raises(guard.NonFiniteLossError) as info:
        train(lm_config(tiny_corpus, **blow), wd)
    recs = {r["step"]: r for r in _records(wd) if r["kind"] == "train"}
    first, bad = recs[1]["loss"], max(recs) + 1  # the step whose loss was NaN
    # independent reading of the log: checkpoint c is healthy iff the record c + 1 (the loss
    # of c's parameters) exists with a finite loss <= 10 x the smallest earlier loss
    best = np.minimum.accumulate([recs[s]["loss"] for s in sorted(recs)])
    healthy = [c for c in sorted(recs) if c + 1 in recs and recs[c + 1]["loss"] <= 10 * best[c - 1]]
    good = max(healthy)
    assert 0 < good < bad - 1 and first is not None
    assert f"at step {bad}" in str(info.value)
    assert f"newest healthy checkpoint: {wd / 'checkpoints' / str(good)}" in str(info.value)
    assert ckpt_lib.Checkpointer(wd / "checkpoints").all_steps()[-1] == good
    rejected = sorted(int(p.name) for p in (wd / "checkpoints-rejected").iterdir())
    assert rejected == list(range(good + 1, bad))
    for d in [wd / "checkpoints", wd / "checkpoints-rejected"]:  # no NaN/inf ever written
        for step_dir in d.iterdir():
            params = leaf_names(load_params(d, int(step_dir.name)))
            assert all(np.all(np.isfinite(v)) for v in params.values()), step_dir
    [ev] = _events(wd, "nonfinite")
    assert ev["healthy_checkpoint"] == str(wd / "checkpoints" / str(good))
    # resuming with a sane learning rate continues from the healthy checkpoint
    calm = {**blow, "optimizer.lr": 1e-2}
    summary = train(
        lm_config(tiny_corpus, **calm), wd, resume=True, allow_changed=("optimizer.lr",)
    )
    assert summary["resumed_from"] == good and np.isfinite(summary["final_train_loss"])


# ----------------------------------------------------------------------------- 3. divergence


def test_divergence_monitor_rules():
    m = guard.DivergenceMonitor(loss_factor=10.0, patience=3)
    seq = [5.0, 2.0, 25.0, 30.0, 3.0, 21.0, 22.0, 23.0]  # 20 = 10 x min: 21..23 are high
    out = [m.observe(i + 1, x, 1.0) for i, x in enumerate(seq)]
    assert [h for h, _ in out] == [True, True, False, False, True, False, False, False]
    assert [msg is not None for _, msg in out] == [False] * 7 + [True]
    assert "step 8" in out[-1][1] and "since step 6" in out[-1][1]
    # a noisy near-zero loss below its first value is not divergence
    m = guard.DivergenceMonitor(loss_factor=10.0, patience=2)
    assert all(m.observe(s, x, 0.1) == (True, None) for s, x in enumerate([4.6, 0.002, 0.1, 0.3]))
    # an exactly zero gradient with a positive loss: stuck; with a zero loss: converged
    m = guard.DivergenceMonitor(patience=2)
    assert m.observe(1, 7.6, 0.5)[1] is None and m.observe(2, 7.6, 0.0)[1] is None
    assert "gradient norm is exactly 0" in m.observe(3, 7.6, 0.0)[1]
    m = guard.DivergenceMonitor(patience=1)
    assert m.observe(1, 1.0, 0.5) == (True, None) and m.observe(2, 0.0, 0.0) == (True, None)
    # per seed; disabled reports health only
    m = guard.DivergenceMonitor(patience=1)
    m.observe(1, [1.0, 1.0], [1.0, 1.0])
    assert "seed index 1" in m.observe(2, [1.0, 50.0], [1.0, 1.0])[1]
    m = guard.DivergenceMonitor(patience=1, enabled=False)
    m.observe(1, 1.0, 1.0)
    assert m.observe(2, 50.0, 1.0) == (False, None)
    assert m.observe(3, 1.0, float("inf")) == (False, None)  # an inf gradient is not healthy


def test_finite_divergence_stops_the_run(tmp_path, tiny_corpus):
    """SignGD with lr=10 on every parameter: the loss jumps from 3.9 to ~1e3 and stays finite."""
    cfg = {"optimizer.name": "signgd", "optimizer.lr": 10.0, "optimizer.muon_roles": "all"}
    cfg |= {"schedule.name": "constant", "steps": 30, "eval_every": 100, "spectrum_every": 0}
    with pytest.raises(guard.DivergenceError, match=r"exceeds 10 x its running minimum"):
        train(lm_config(tiny_corpus, **cfg), tmp_path / "a")
    [ev] = _events(tmp_path / "a", "diverged")
    losses = [r["loss"] for r in _records(tmp_path / "a") if r["kind"] == "train"]
    assert all(np.isfinite(losses)) and losses[-1] > 10 * min(losses[:-1])
    assert len(losses) < 30 and not (tmp_path / "a" / "summary.json").exists()
    summary = train(
        lm_config(tiny_corpus, **cfg, **{"divergence.enabled": "false"}), tmp_path / "b"
    )
    assert summary["steps"] == 30  # the guard is what stopped it


# ----------------------------------------------------------------------------- 4. workdir lock


def test_locked_workdir_fails_fast_and_lock_dies_with_its_holder(tmp_path):
    wd = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from amemory.train.lock import WorkdirLock; "
         f"WorkdirLock({str(wd)!r}).acquire(); print('held', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        # a config file that does not exist: the lock is checked before the config is loaded
        cmd = [sys.executable, "-m", "amemory", "train", "--config", "/no/such.py"]
        out = subprocess.run(
            cmd + ["--workdir", str(wd)], capture_output=True, text=True, timeout=60
        )
        lines = [x for x in out.stderr.splitlines() if x.strip()]
        assert out.returncode == 4 and len(lines) == 1, out.stderr
        assert f"pid {holder.pid} on host {socket.gethostname()}" in lines[0]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    with WorkdirLock(wd):  # the kernel released the killed holder's lock
        pass


def test_train_on_a_locked_workdir_raises_and_leaves_it_untouched(tmp_path):
    wd = tmp_path / "run"
    train(memory_config(steps=2), wd)
    before = {p.name: p.read_bytes() for p in wd.iterdir() if p.is_file() and p.name != "run.lock"}
    with WorkdirLock(wd):
        with pytest.raises(guard.WorkdirBusyError, match=rf"pid {os.getpid()} on host"):
            train(memory_config(steps=4), wd, resume=True)
    after = {p.name: p.read_bytes() for p in wd.iterdir() if p.is_file() and p.name != "run.lock"}
    assert after == before
    assert train(memory_config(steps=4), wd, resume=True)["steps"] == 4  # released


# ----------------------------------------------------------------------------- 5. resume contract


def test_check_resume_contract():
    saved = {"steps": 10, "optimizer": {"lr": 0.02, "b1": 0.9}, "data": {"batch_size": 16,
             "eval_batches": 4}, "log_every": 10}  # fmt: skip
    same = json.loads(json.dumps(saved))
    assert guard.check_resume(saved, same, step=10, checkpoint="c") == ({}, {})
    now = {**same, "steps": 20, "log_every": 5, "optimizer": {"lr": 0.05, "b1": 0.9}}
    now["data"] = {"batch_size": 32, "eval_batches": 2}
    with pytest.raises(ValueError, match=r"data\.batch_size: 16 in the checkpoint, 32 now; "
                       r"optimizer\.lr: 0\.02 in the checkpoint, 0\.05 now.*--allow-changed "
                       r"data\.batch_size,optimizer\.lr"):  # fmt: skip
        guard.check_resume(saved, now, step=10, checkpoint="c")
    allowed, free = guard.check_resume(
        saved, now, step=10, checkpoint="c", allow_changed=("optimizer", "data.batch_size")
    )
    assert allowed == {"data.batch_size": [16, 32], "optimizer.lr": [0.02, 0.05]}
    assert free == {"steps": [10, 20], "log_every": [10, 5], "data.eval_batches": [4, 2]}
    with pytest.raises(ValueError, match=r"config\.steps=5 is smaller than .* \(10, c\)"):
        guard.check_resume(saved, {**same, "steps": 5}, step=10, checkpoint="c")
    with pytest.raises(ValueError, match=r"--allow-changed optimizer\.lrr: no such config field"):
        guard.check_resume(saved, same, step=10, checkpoint="c", allow_changed=("optimizer.lrr",))


def test_resume_with_a_changed_config(tmp_path):
    wd = tmp_path / "run"
    train(memory_config(steps=3), wd)
    log = (wd / "metrics.jsonl").read_bytes()
    with pytest.raises(ValueError, match=r"optimizer\.lr: 0\.1 in the checkpoint, 0\.2 now"):
        train(memory_config(steps=5, **{"optimizer.lr": 0.2}), wd, resume=True)
    assert (wd / "metrics.jsonl").read_bytes() == log  # refused before touching the run
    summary = train(
        memory_config(steps=5, **{"optimizer.lr": 0.2}),
        wd,
        resume=True,
        allow_changed=("optimizer.lr",),
    )
    assert summary["resumed_from"] == 3 and summary["steps"] == 5
    [ev] = _events(wd, "config_changed")
    assert ev["allowed"] == {"optimizer.lr": [0.1, 0.2]} and ev["bookkeeping"] == {"steps": [3, 5]}
    with pytest.raises(ValueError, match=r"config\.steps=4 is smaller than the step .* \(5,"):
        train(memory_config(steps=4, **{"optimizer.lr": 0.2}), wd, resume=True)


# ----------------------------------------------------------------------------- 6. atomic writes


def test_atomic_write_keeps_the_old_file_when_interrupted(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    atomic.write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="No space left"):
        atomic.write_text(path, "x" * 100000)
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"a": 1}  # the old content, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # no temp file left


def test_train_cached_retrains_an_unreadable_cache_entry(tmp_path, capfd):
    from experiments import train_runs

    cfg = memory_config(steps=3, **{"optimizer.name": "signgd", "optimizer.lr": 0.3})
    first = train_runs.train_cached(cfg, tmp_path, "mem")
    summary = pathlib.Path(first["workdir"]) / "summary.json"
    summary.write_text(summary.read_text()[:40])  # a summary.json cut short
    capfd.readouterr()
    again = train_runs.train_cached(cfg, tmp_path, "mem")
    assert "unreadable" in capfd.readouterr().err
    assert again["cached"] is False and again["workdir"] == first["workdir"]
    assert again["summary"]["final_eval"] == first["summary"]["final_eval"]
    assert train_runs.train_cached(cfg, tmp_path, "mem")["cached"] is True


# ----------------------------------------------------------------------------- 7. validation


def test_an_option_the_preset_sets_cannot_be_overridden():
    from amemory.train.config import load_config

    preset = "optimizer.preset=jordan"
    for field in ["optimizer.ns_dtype=bfloat16", "optimizer.ns_steps=3", "optimizer.momentum=0.9"]:
        name = field.split("=")[0]
        with pytest.raises(ValueError, match=rf"config\.{name} has no effect with .*'jordan'"):
            load_config(LM_CONFIG, [preset, field])
    config = load_config(LM_CONFIG, [preset, "optimizer.weight_decay=0.1"])  # applies
    assert config.optimizer.weight_decay == 0.1


@pytest.mark.parametrize(
    "override, match",
    [
        ("optimizer.lr=inf", r"optimizer\.lr=inf; must be a finite float32 number > 0"),
        ("optimizer.lr=nan", r"optimizer\.lr=nan"),
        ("optimizer.lr=0", r"optimizer\.lr=0\.0; must be a finite float32 number > 0"),
        ("optimizer.lr=1e39", r"optimizer\.lr=1e\+39"),
        ("optimizer.adam_lr=-0.1", r"optimizer\.adam_lr=-0\.1"),
        ("optimizer.b1=1.5", r"optimizer\.b1=1\.5; must be a finite float32 number in \[0, 1\)"),
        ("optimizer.b2=1.0", r"optimizer\.b2=1\.0"),
        (
            "optimizer.momentum=-0.5",
            r"optimizer\.momentum: momentum must be in \[0, 1\), got -0\.5",
        ),
        ("schedule.warmup_steps=501", r"warmup_steps=501 exceeds config\.steps=500"),
        ("optimizer.lr=1e-46", r"optimizer\.lr=1e-46 is 0 or subnormal in float32"),
        ("optimizer.adam_lr=1e-40", r"optimizer\.adam_lr=1e-40 is 0 or subnormal in float32"),
        ("optimizer.eps=0", r"optimizer\.eps=0\.0; must be a finite float32 number > 0"),
        ("task=lm", r"config\.task='lm' reads config groups \['model', 'data'\]"),
    ],
)
def test_bad_numbers_fail_before_compiling(override, match):
    from amemory.train.config import load_config, validate

    config = MEMORY_CONFIG if override == "task=lm" else LM_CONFIG
    with pytest.raises(ValueError, match=match):
        validate(load_config(config, [override]))


def test_mostly_binary_corpus_is_rejected_before_tokenizing(tmp_path, monkeypatch):
    from amemory.data import corpus

    def no_tokenizing(*a, **k):
        raise AssertionError("tokenized a binary file")

    monkeypatch.setattr(corpus, "get_tokenizer", no_tokenizing)
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"\0" * 200_000)
    with pytest.raises(
        ValueError, match=r"nul\.txt does not look like text: 100% of its first 65536"
    ):
        corpus.prepare_corpus([str(nul)], "bpe", 512)
    utf16 = tmp_path / "utf16.txt"
    utf16.write_bytes("to be or not to be\n".encode("utf-16-le") * 100)
    with pytest.raises(ValueError, match=r"utf16\.txt does not look like text: 50%"):
        corpus.prepare_corpus([str(utf16)], "bpe", 512)
    text = tmp_path / "ok.txt"
    text.write_text("a\tb\r\nc\x0cd\n" * 1000)  # tabs, CR, form feeds are text
    from amemory.data.sources import check_text_head

    check_text_head(text)


def test_unwritable_workdir_is_a_one_line_error(tmp_path, capsys):
    from amemory.train import cli

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code = cli.main(["--config", LM_CONFIG, "--workdir", str(blocker / "run")])
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("amemory train: error: cannot write the run directory:")
    assert str(blocker) in err[0]


def test_print_config_shows_each_field_comment(capsys):
    """Every single-line ``c.a.b = value  # comment`` of lm.py is printed with its comment."""
    from amemory.train import cli

    assert cli.main(["--config", LM_CONFIG, "--print-config", "--config.steps=70"]) == 0
    out = capsys.readouterr().out.splitlines()
    expected = []
    for line in open(LM_CONFIG, encoding="utf-8"):
        m = re.match(r"^\s*c\.([\w.]+) = [^#]*?  # (.*)$", line.rstrip("\n"))
        if m and not line.rstrip().endswith(("(", ",")):
            expected.append((m.group(1).split(".")[-1], m.group(2)))
    assert len(expected) > 50
    for leaf, comment in expected:
        assert any(
            x.lstrip().startswith(f"{leaf}: ") and x.endswith(f"# {comment}") for x in out
        ), (leaf, comment)
    assert "steps: 70  # optimizer steps" in out
    # engine fields the file does not assign carry amemory.train.config.ENGINE_DEFAULTS' comment
    from amemory.train.config import ENGINE_DEFAULTS

    for dotted, (_, comment) in ENGINE_DEFAULTS.items():
        leaf = dotted.split(".")[-1]
        assert any(x.lstrip().startswith(f"{leaf}: ") and x.endswith(f"# {comment}") for x in out)


def test_stop_right_after_an_eval_point_saves_cleanly(tmp_path, tiny_corpus, monkeypatch):
    # A stop at a step that was a sync point (eval) but not a log point: no step ran since
    # the throughput mark, so the stop's train record must not divide by zero.
    monkeypatch.setattr(guard.RunGuard, "stop_requested", lambda self, step: step == 2)
    cfg = lm_config(tiny_corpus, **{**_STOP_RUN, "eval_every": 2, "log_every": 100, "steps": 6})
    with pytest.raises(guard.RunInterrupted):
        run(cfg, tmp_path / "wd")
    assert ckpt_lib.Checkpointer(tmp_path / "wd" / "checkpoints").all_steps() == [2]
    assert [r["step"] for r in _records(tmp_path / "wd") if r["kind"] == "train"] == [2]
