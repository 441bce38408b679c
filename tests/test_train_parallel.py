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
from train_helpers import LM_CONFIG, lm_config, lm_overrides, max_rel_diff, write_corpus

from amemory.train import parallel, run

TOL = 1e-3


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A tiny corpus; its tokenizer cache lives in a temporary $AMEMORY_DATA (restored after)."""
    d = tmp_path_factory.mktemp("corpus")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AMEMORY_DATA", str(d / "cache"))
        yield write_corpus(d)


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


def test_two_processes_match_single_device(corpus, single, tmp_path):
    """jax.distributed on loopback: 2 processes x 2 CPU devices, sharded mode, fsdp=2."""
    _, _, ref = single
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
        cmd += ["--workdir", str(tmp_path)]
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
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["mode"] == "sharded" and summary["steps"] == 5
    from amemory.train.checkpoint import load_params

    params = load_params(tmp_path / "checkpoints")
    assert max_rel_diff(params, jax.tree.map(np.asarray, ref.params)) < TOL
