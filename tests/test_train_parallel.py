"""Parallel modes on 8 fake CPU devices, multi-seed vmap, metrics, and a 2-process run.

Tolerance: the modes differ only in the order of floating-point reductions
(per-device partial sums, all-reduces), ~1e-7 relative in float32. Newton-Schulz
amplifies such differences along directions with small singular values (the Jordan
polynomial's slope at zero is 3.4445 per step, 3.4445^5 ~ 490 over five steps), and
Adam's leaves pick them up through the forward pass: measured max relative differences
(sharded vs vmapped seeds, `max_rel_diff`) 4e-5 after 1 step and 1.7e-4 to 2.0e-4 after
5 steps. TOL = 1e-3 leaves a 5x margin; a wrong sharding, a dropped pmean or a misrouted
leaf changes the parameters by 1e-2 or more.
"""

import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest
from train_helpers import LM_CONFIG, lm_config, lm_overrides, max_rel_diff

from amemory.train import parallel, run

TOL = 1e-3


@pytest.fixture(scope="module")
def single(corpus, tmp_path_factory):
    wd = tmp_path_factory.mktemp("single")
    summary, state = run(lm_config(corpus), wd)
    return wd, summary, state


def test_fsdp_spec_picks_largest_divisible_axis():
    P = jax.sharding.PartitionSpec
    assert parallel.fsdp_spec((24, 56), 2) == P(None, "fsdp")
    assert parallel.fsdp_spec((37, 24), 2) == P(None, "fsdp")
    assert parallel.fsdp_spec((37,), 2) == P()
    assert parallel.fsdp_spec((24, 24), 4) == P("fsdp", None)
    assert parallel.fsdp_spec((8, 8), 1) == P()


def test_single_run_writes_run_directory_and_metrics(single):
    wd, summary, state = single
    assert int(state.step) == 5 and summary["steps"] == 5
    for name in ("config.json", "metrics.jsonl", "summary.json"):
        assert (wd / name).is_file(), name
    assert (wd / "checkpoints" / "5").is_dir()
    recs = [json.loads(line) for line in (wd / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5]
    last = train[-1]
    for key in ("loss", "lr", "adam_lr", "grad_norm", "param_norm", "tokens_per_s"):
        assert np.isfinite(last[key]), key
    for role in ("q", "k", "v", "o", "w_in", "w_out", "embed", "head", "norm"):
        assert last[f"update_rms/{role}"] > 0, role
    ortho = [k for k in last if k.startswith("ortho_error/")]
    assert len(ortho) == 12  # 2 layers x (q, k, v, o, w_in, w_out) trained by Muon
    assert train[0]["loss"] > train[-1]["loss"]
    (ev,) = [r for r in recs if r["kind"] == "eval"]
    assert ev["step"] == 5 and np.isfinite(ev["loss"])
    buckets = [k for k in ev if k.startswith("loss/bucket_")]
    assert len(buckets) == len(ev["bucket_labels"]) >= 3
    # per-bucket losses weighted by token counts give the overall loss
    tot = sum(ev[f"tokens/bucket_{i}"] for i in range(len(buckets)))
    mix = sum(ev[f"loss/bucket_{i}"] * ev[f"tokens/bucket_{i}"] for i in range(len(buckets)))
    assert mix / tot == pytest.approx(ev["loss"], rel=1e-9)
    (sp,) = [r for r in recs if r["kind"] == "spectrum"]
    for role in ("vo", "v", "o", "w_in", "w_out"):
        assert 0 < sp[f"spectrum/{role}/entropy"] <= 1, role
    start = recs[0]
    assert start["event"] == "start"
    routing = {row[0]: row[3] for row in start["routing"]}
    assert routing["layers/0/attn/q/kernel"] == "muon" and routing["embed/embedding"] == "adam"
    # TensorBoard: every scalar of every record, at its step (float32 in the event file).
    tb = _tensorboard_scalars(wd)
    want = {}
    for r in recs:
        prefix = f"event/{r['event']}" if r["kind"] == "event" else r["kind"]
        for k, v in r.items():
            if k not in ("kind", "step", "event") and isinstance(v, (int, float)):
                want[(f"{prefix}/{k}", r["step"])] = v
    assert len(want) > 100 and set(want) <= set(tb)
    for key, v in want.items():
        assert tb[key] == pytest.approx(v, rel=1e-6, abs=1e-30), key


def _tensorboard_scalars(workdir) -> dict:
    """(tag, step) -> value of every scalar in the run's TensorBoard event files, read with
    the TFRecord framing (u64 length, u32 crc, Event proto, u32 crc) by hand."""
    import struct

    from tensorboardX.proto import event_pb2

    out = {}
    files = sorted(workdir.glob("events.out.tfevents.*"))
    assert files, "no TensorBoard event file in the run directory"
    for f in files:
        data, i = f.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i : i + 8])
            event = event_pb2.Event.FromString(data[i + 12 : i + 12 + n])
            i += 12 + n + 4
            for v in event.summary.value:
                out[(v.tag, event.step)] = v.simple_value
    return out


def test_scanned_layers_train_like_per_layer(corpus, single, tmp_path):
    """5 Muon/Adam steps with model.scan_layers=True, from the per-layer run's initial
    parameters stacked, end at its parameters: Muon orthogonalises each layer's slice of
    the [2, 24, 24] kernels on its own (the routing table says "2 x (24, 24)"). Resuming a
    per-layer checkpoint with the stacked layout is a ValueError naming the field."""
    from amemory.models import transformer
    from amemory.train import tasks

    wd, _, ref = single
    cfg = lm_config(corpus, **{"model.scan_layers": True})
    task = tasks.LMTask(cfg, parallel.placement(cfg.parallel))
    per_layer = task.model_config.replace(scan_layers=False)
    task.init_params = lambda k: transformer.stack_layers(transformer.init_params(per_layer, k))
    _, state = run(cfg, tmp_path, task=task)
    assert max_rel_diff(state.params, transformer.stack_layers(ref.params)) < TOL
    start = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    rows = {row[0]: row for row in start["routing"]}
    assert rows["layers/attn/q/kernel"] == ["layers/attn/q/kernel", [2, 24, 24], "q", "muon",
                                            "2 x (24, 24)", 0.0]  # fmt: skip
    assert rows["layers/attn_norm/scale"][3:] == ["adam", "", 0.0]  # last: weight decay
    with pytest.raises(ValueError, match=r"config.model.scan_layers=False, this run has True"):
        run(cfg, wd, resume=True)


def test_bfloat16_compute_tracks_float32_over_50_steps(corpus, tmp_path):
    """model.dtype=bfloat16 (float32 master weights and optimizer state): every logged
    training loss (means over 5 steps) and the final validation loss stay within 2% of the
    float32 run's (bf16 keeps 8 significant bits, 0.4% per rounding)."""
    extra = {"steps": 50, "log_every": 5, "eval_every": 50, "spectrum_every": 0}
    s32, st32 = run(lm_config(corpus, **extra), tmp_path / "f32")
    s16, st16 = run(lm_config(corpus, **extra, **{"model.dtype": "bfloat16"}), tmp_path / "bf16")
    leaves = jax.tree.leaves((st16.params, st16.opt_state))
    floats = [x for x in leaves if np.issubdtype(x.dtype, np.floating)]
    assert floats and all(x.dtype == np.float32 for x in floats)

    def losses(wd):
        recs = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
        return np.array([r["loss"] for r in recs if r["kind"] == "train"])

    l32, l16 = losses(tmp_path / "f32"), losses(tmp_path / "bf16")
    assert len(l32) == len(l16) == 10 and l32[-1] < l32[0] - 0.5  # it learns
    rel = np.abs(l16 - l32) / l32
    assert rel.max() < 0.02, rel
    assert rel.max() > 1e-5  # the bf16 run did compute in bf16
    e32, e16 = s32["final_eval"]["loss"], s16["final_eval"]["loss"]
    assert abs(e16 - e32) / e32 < 0.02


@pytest.mark.parametrize("mode, extra", [("pmap", {}), ("sharded", {"parallel.fsdp": 2})])
def test_modes_match_single_after_5_steps(corpus, single, tmp_path, mode, extra):
    _, _, ref = single
    summary, state = run(lm_config(corpus, **{"parallel.mode": mode, **extra}), tmp_path)
    assert summary["mode"] == mode and int(np.asarray(state.step).ravel()[0]) == 5
    assert max_rel_diff(state.params, ref.params) < TOL
    assert max_rel_diff(state.opt_state, ref.opt_state) < TOL


def test_multi_seed_vmap_matches_single_seed_runs(corpus, single, tmp_path):
    _, _, ref = single  # seed 0
    summary, state = run(lm_config(corpus, seeds="0,1", **{"parallel.mode": "single"}), tmp_path)
    assert summary["seeds"] == [0, 1] and len(summary["final_train_loss"]) == 2
    seed0 = jax.tree.map(lambda x: np.asarray(x)[0], state.params)
    seed1 = jax.tree.map(lambda x: np.asarray(x)[1], state.params)
    assert max_rel_diff(seed0, ref.params) < TOL
    assert max_rel_diff(seed1, ref.params) > 1e-2  # a different initialisation
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    sp = [r for r in recs if r["kind"] == "spectrum"][0]
    assert len(sp["spectrum/w_in/entropy"]) == 2
    # the same two seeds, sharded over a (4, 2) mesh with the seed axis kept whole
    extra = {"parallel.mode": "sharded", "parallel.fsdp": 2}
    _, sharded = run(lm_config(corpus, seeds="0,1", **extra), tmp_path / "sharded")
    assert max_rel_diff(sharded.params, state.params) < TOL


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _TwoShards:
    """The global batches of a 2-process run: Grain shard 0's rows, then shard 1's."""

    def __init__(self, tokens, batch_size, seq_len, seed):
        import grain

        from amemory.data import batching

        self.its = [
            iter(
                batching.token_loader(
                    tokens, batch_size, seq_len, seed,
                    shard_options=grain.sharding.ShardOptions(p, 2, drop_remainder=True),
                )
            )
            for p in range(2)
        ]  # fmt: skip

    def __iter__(self):
        return self

    def __next__(self):
        return np.concatenate([next(it) for it in self.its])  # (B, T + 1)

    def get_state(self):
        return b"{}"


def test_two_processes_match_single_device(corpus, tmp_path):
    """jax.distributed on loopback: 2 processes x 2 CPU devices, sharded mode, fsdp=2.

    Each process reads its own Grain shard (ShardByJaxProcess), so the reference is a
    one-device run fed the concatenation of the two shards' batches.
    """
    from amemory.train import tasks

    cfg = lm_config(corpus)
    task = tasks.LMTask(cfg, parallel.placement(cfg.parallel))
    two = _TwoShards(task.data.train_tokens, task.batch_size, task.seq_len, int(cfg.seed))
    task.train_input = lambda: two
    _, ref = run(cfg, tmp_path / "ref", task=task)
    port = _free_port()
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    env["JAX_PLATFORMS"] = "cpu"
    procs = []
    for pid in range(2):
        args = lm_overrides(
            corpus,
            **{
                "parallel.mode": "sharded",
                "parallel.fsdp": 2,
                "parallel.distributed": "true",
                "parallel.coordinator_address": f"127.0.0.1:{port}",
                "parallel.num_processes": 2,
                "parallel.process_id": pid,
            },
        )
        cmd = [sys.executable, "-m", "amemory.cli", "train", "--config", LM_CONFIG + ":full"]
        cmd += ["--workdir", str(tmp_path / "run")]
        cmd += [f"--config.{a}" for a in args]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=150))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["mode"] == "sharded" and summary["steps"] == 5
    from amemory.train.checkpoint import load_params

    params = load_params(tmp_path / "run" / "checkpoints")
    for pid in range(2):  # each process saved its own input position
        data = tmp_path / "run" / "checkpoints" / "5" / "data"
        assert (data / f"process_{pid}-of-2.json").is_file()
    assert max_rel_diff(params, jax.tree.map(np.asarray, ref.params)) < TOL
