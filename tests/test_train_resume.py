"""A resume continues exactly or refuses in one line, touching nothing; damage is only what a
re-read proves; logs, locks and saves fail loudly (README, "Reliability"; issue 25)."""

import json
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from train_helpers import MEMORY_CONFIG, lm_config, memory_config

from amemory.train import checkpoint as ckpt_lib
from amemory.train import run, train
from amemory.train.checkpoint import leaf_names, load_params
from amemory.train.lock import WorkdirBusyError, WorkdirLock, probe_workdir
from amemory.train.state import TrainState


def _records(workdir):
    return [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]


def _events(workdir, name):
    return [r for r in _records(workdir) if r["kind"] == "event" and r["event"] == name]


def _tree(root):
    """Every file under ``root`` (but the lock's holder record) -> its bytes."""
    files = (p for p in sorted(root.rglob("*")) if p.is_file() and p.name != "run.lock")
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def _small_state(dtype=jnp.float32):
    params = {"w": jnp.sin(jnp.arange(24 * 40, dtype=jnp.float32)).reshape(24, 40).astype(dtype)}
    tx = optax.adam(1e-3)
    return TrainState(jnp.asarray(3, jnp.int32), params, tx.init(params), jax.random.PRNGKey(0))


@pytest.fixture
def saved(tmp_path):
    """A checkpoints/ root holding step 3 of ``_small_state()``."""
    c = ckpt_lib.Checkpointer(tmp_path / "checkpoints")
    c.save(3, _small_state(), {})
    c.close()
    return tmp_path


# ----------------------------------------------------------------------------- what is damage


def test_dtype_mismatch_is_a_refusal_not_damage(saved):
    before = _tree(saved)
    c = ckpt_lib.Checkpointer(saved / "checkpoints")
    with pytest.raises(
        ckpt_lib.IncompatibleCheckpointError,
        match=r"leaf 'params\.w' was saved as float32, the current model/optimizer has bfloat16",
    ):
        c.restore_intact(_small_state(jnp.bfloat16))
    c.close()
    assert _tree(saved) == before  # nothing moved to checkpoints-rejected/


def test_a_failure_a_plain_reread_does_not_confirm_moves_nothing(saved, monkeypatch):
    read = ckpt_lib._read_as_stored

    def fails(manager, step, sharding=None):  # fails into the run's layout, reads plainly
        if sharding is not None:
            raise RuntimeError("device busy")
        return read(manager, step)

    before = _tree(saved)
    monkeypatch.setattr(ckpt_lib, "_read_as_stored", fails)
    c = ckpt_lib.Checkpointer(saved / "checkpoints")
    with pytest.raises(
        ValueError, match=r"/3 reads back intact but cannot be restored into this run "
        r"\(RuntimeError: device busy\); nothing was moved"
    ):  # fmt: skip
        c.restore_intact(_small_state())
    c.close()
    assert _tree(saved) == before


def test_a_checkpoint_without_integrity_record_is_restored_with_a_warning(tmp_path):
    handlers = {"state": ocp.StandardCheckpointHandler(), "extra": ocp.JsonCheckpointHandler()}
    with ocp.CheckpointManager(tmp_path / "checkpoints", item_handlers=handlers) as m:
        m.save(3, args=ocp.args.Composite(
            state=ocp.args.StandardSave(_small_state()), extra=ocp.args.JsonSave({})))  # fmt: skip
        m.wait_until_finished()
    c = ckpt_lib.Checkpointer(tmp_path / "checkpoints")
    found = c.restore_intact(_small_state())
    c.close()
    assert found.step == 3 and found.notes == (
        "checkpoint 3 has no integrity record (written before digests): its arrays were "
        "checked for NaN/inf only",
    )


# ----------------------------------------------------------------------------- config changes


def test_changed_dtype_is_refused_before_reading_then_cast_on_request(tmp_path, corpus):
    """The issue's case: a bfloat16 resume of a float32 run moved every checkpoint aside as
    'checksum mismatch'. Now it is refused naming the field; allowed, it casts."""
    kw = {"steps": 4, "checkpoint_every": 2, "eval_every": 100, "spectrum_every": 0}
    wd = tmp_path / "run"
    train(lm_config(corpus, **kw), wd)
    before = _tree(wd)
    bf16 = {**kw, "model.param_dtype": "bfloat16"}
    with pytest.raises(
        ValueError, match=r"model\.param_dtype: 'float32' in the checkpoint, 'bfloat16' now"
    ):
        train(lm_config(corpus, **bf16), wd, resume=True)
    assert _tree(wd) == before  # no checkpoint moved, metrics.jsonl as it was
    summary, state = run(
        lm_config(corpus, **bf16), wd, resume=True, allow_changed=("model.param_dtype",)
    )
    assert summary["resumed_from"] == 4
    got, want = leaf_names(state.params), leaf_names(load_params(wd / "checkpoints", 4))
    assert set(got) == set(want) and any(v.dtype == jnp.bfloat16 for v in got.values())
    for k, v in want.items():
        np.testing.assert_array_equal(np.asarray(got[k]), jnp.asarray(v).astype(got[k].dtype))
    [note] = _events(wd, "restore_note")
    assert "cast to this run's dtypes" in note["note"]


def test_changed_optimizer_is_named_then_applied_with_a_fresh_optimizer_state(tmp_path):
    wd = tmp_path / "run"
    train(memory_config(**{"optimizer.name": "adam", "steps": 4, "checkpoint_every": 2}), wd)
    before = _tree(wd)
    muon = memory_config(**{"optimizer.name": "muon", "steps": 4})
    with pytest.raises(
        ValueError, match=r"optimizer\.name: 'adam' in the checkpoint, 'muon' now.*"
        r"--allow-changed optimizer\.name"
    ):  # fmt: skip
        train(muon, wd, resume=True)
    assert _tree(wd) == before
    summary, state = run(muon, wd, resume=True, allow_changed=("optimizer.name",))
    assert summary["resumed_from"] == 4
    saved = leaf_names(load_params(wd / "checkpoints", 4))
    np.testing.assert_array_equal(np.asarray(state.params["W"]), saved["W"])
    opt = leaf_names(state.opt_state)
    counts = {k: int(v) for k, v in opt.items() if k.endswith(".count")}
    assert counts and set(counts.values()) == {4}  # schedules continue from the step
    assert all(not np.any(np.asarray(v)) for k, v in opt.items() if k not in counts)
    more = memory_config(**{"optimizer.name": "muon", "steps": 6})
    summary = train(more, wd, resume=True, allow_changed=("optimizer.name",))
    assert summary["steps"] == 6 and np.isfinite(summary["final_train_loss"])


# ----------------------------------------------------------------------------- the run's log


def test_unreadable_metrics_lines_are_set_aside_not_fatal(tmp_path, capfd):
    wd = tmp_path / "run"
    train(memory_config(steps=4, checkpoint_every=2), wd)
    lines = (wd / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    bad = [b"\xff\xfe not utf-8\n", b"42\n", b'{"kind": "train", "step": "x"}\n']
    (wd / "metrics.jsonl").write_bytes(b"".join(lines[:3] + bad + lines[3:]))
    capfd.readouterr()
    summary = train(memory_config(steps=6, checkpoint_every=2), wd, resume=True)
    assert summary["resumed_from"] == 4
    err = capfd.readouterr().err
    assert re.search(
        r"metrics\.jsonl: 3 unreadable line\(s\) \(first: line 4\) moved to .*\.unreadable", err
    ), err
    assert (wd / "metrics.jsonl.unreadable").read_bytes() == b"".join(bad)
    assert [r["step"] for r in _records(wd) if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    assert _events(wd, "log_lines_unreadable")[0]["lines"] == [4, 5, 6]


def test_resume_without_a_checkpoint_starts_only_an_empty_workdir(tmp_path, capfd):
    wd = tmp_path / "run"
    capfd.readouterr()
    assert train(memory_config(steps=2), wd, resume=True)["resumed_from"] is None
    assert "--resume found no checkpoint in" in capfd.readouterr().err  # said, not silent
    shutil.rmtree(wd / "checkpoints")  # e.g. all moved aside by hand
    before = _tree(wd)
    with pytest.raises(ValueError, match=r"no checkpoint in .*, but .*metrics\.jsonl records"):
        train(memory_config(steps=2), wd, resume=True)
    assert _tree(wd) == before  # the log was not truncated


# ----------------------------------------------------------------------------- lock and saves


def test_deleting_run_lock_lets_no_second_run_in(tmp_path):
    wd = tmp_path / "run"
    with WorkdirLock(wd):
        (wd / "run.lock").unlink()
        with pytest.raises(WorkdirBusyError):
            WorkdirLock(wd).acquire()
        with pytest.raises(WorkdirBusyError):
            probe_workdir(wd)
    WorkdirLock(wd).acquire().release()  # released with its holder


def test_failed_async_save_is_reported_at_the_next_step(tmp_path, monkeypatch):
    from orbax.checkpoint._src.checkpointers import async_checkpointer

    def disk_full(*args, **kwargs):  # the background commit of every save fails
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(async_checkpointer, "_background_wait_for_commit_futures", disk_full)
    wd = tmp_path / "run"
    with pytest.raises(ckpt_lib.CheckpointWriteError, match="No space left on device"):
        train(memory_config(steps=200, checkpoint_every=100), wd)
    last = max(r["step"] for r in _records(wd) if r["kind"] == "train")
    assert 100 <= last < 200  # before the next save, not one checkpoint interval late


def test_full_disk_under_the_event_writer_is_one_line(tmp_path, capfd, monkeypatch):
    from tensorboardX import record_writer

    from amemory.train import cli

    real, calls = record_writer.RecordWriter.write, [0]

    def write(self, data):
        calls[0] += 1
        if calls[0] > 30:
            raise OSError(28, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(record_writer.RecordWriter, "write", write)
    wd = tmp_path / "run"
    args = ["--config", MEMORY_CONFIG, "--workdir", str(wd), "--config.steps=40"]
    rc = cli.main(args + ["--config.progress=false", "--config.memory.K=12"])
    err = [x for x in capfd.readouterr().err.splitlines() if x.strip()]
    assert rc == 2 and len(err) == 1, err
    assert f"cannot write TensorBoard events in {wd}" in err[0] and "No space left" in err[0]
