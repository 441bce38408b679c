"""Sharded training with NorMuon in the owner layout (8 fake CPU devices, fsdp=2).

Checks what tests/test_optim_distributed.py cannot see from the optimizer alone: the
engine gives NorMuon's second moment the owners' sharding, the start event names each
stack's layout, and a run resumed from a checkpoint of that state continues exactly.
"""

import json
import shutil

import jax
from train_helpers import lm_config, max_rel_diff

from amemory.optim import OwnerStacks
from amemory.train import run


def test_sharded_normuon_owner_state_resumes_exactly(corpus, tmp_path):
    kw = {
        "optimizer.name": "normuon",
        "parallel.mode": "sharded",
        "parallel.fsdp": 2,
        "steps": 2,
        "checkpoint_every": 1,
        "eval_every": 2,
        "spectrum_every": 0,
    }
    _, straight = run(lm_config(corpus, **kw), tmp_path)
    start = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    rows = {r["group"]: (r["layout"], r["matrices"], r["padded"]) for r in start["layout"]}
    # tiny preset: d_model 24, d_ff 56, 2 layers; 8 devices own 8 padded matrices per stack
    assert rows == {
        "24x24_w": ("owner/all_to_all", 8, 8),  # q, k, v, o of both layers
        "24x56_w": ("owner/all_to_all", 2, 8),  # w_in
        "24x56_t": ("owner/all_to_all", 2, 8),  # w_out, transposed
    }
    stacks = [
        x for x in jax.tree.leaves(straight.opt_state, is_leaf=lambda x: isinstance(x, OwnerStacks))
        if isinstance(x, OwnerStacks)
    ]  # fmt: skip
    (nu,) = stacks  # [padded matrices, fan_out] per stack
    assert {k: v.shape for k, v in nu.stacks.items()} == {
        "24x24_w": (8, 24),
        "24x56_w": (8, 56),
        "24x56_t": (8, 24),
    }
    shutil.rmtree(tmp_path / "checkpoints" / "2")
    _, resumed = run(lm_config(corpus, **kw), tmp_path, resume=True)
    assert max_rel_diff(resumed.params, straight.params) == 0.0
    assert max_rel_diff(resumed.opt_state, straight.opt_state) == 0.0
