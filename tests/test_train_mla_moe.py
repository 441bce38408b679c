"""An MLA + MoE decoder through the training engine: sharded mode on 8 fake devices,
resume from a checkpoint, the load-balancing loss in the records, and `amemory sample`.

Tolerance as in test_train_parallel.py: the modes differ only in the order of
floating-point reductions (relative 2e-4 of each leaf's scale after 4 steps).
"""

import json

import jax
import numpy as np
import pytest
from train_helpers import lm_config, max_rel_diff

from amemory import cli
from amemory.models import transformer
from amemory.train import run
from amemory.train.sample import load_run

TOL = 2e-4
# MLA (d_c=10, d_R=4, queries uncompressed) + 4 experts (top-2, 1 shared, width 14,
# capacity factor 1.25); Muon on the hidden matrices (experts included), Adam elsewhere;
# a constant learning rate, so a run cut at step 2 and resumed to 4 follows the same
# schedule as an uninterrupted run of 4 steps.
EXTRA = {
    "model.attention": "mla",
    "model.mla.kv_rank": 10,
    "model.mla.rope_dim": 4,
    "model.moe.experts": 4,
    "model.moe.shared": 1,
    "model.moe.d_expert": 14,
    "model.moe.capacity_factor": 1.25,
    "schedule.name": "constant",
    "spectrum_every": 4,
    "eval_every": 4,
    "optimizer.diagnostics": "false",
}


@pytest.fixture(scope="module")
def single(corpus, tmp_path_factory):
    wd = tmp_path_factory.mktemp("single")
    summary, state = run(lm_config(corpus, steps=4, **EXTRA), wd)
    return wd, summary, state


def test_records_routing_and_aux_loss(single):
    wd, summary, _ = single
    recs = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
    routing = {row[0]: row[3] for row in recs[0]["routing"]}
    assert routing["layers/0/mlp/router/kernel"] == "adam"
    assert routing["layers/0/mlp/experts/w_in"] == "muon"
    assert routing["layers/1/attn/kv_down/kernel"] == "muon"
    train = [r for r in recs if r["kind"] == "train"]
    for r in train:  # the objective is the cross-entropy plus 0.01 x the balance loss
        assert r["aux/moe_lb_coef"] == pytest.approx(0.01)
        assert r["loss"] == pytest.approx(r["aux/ce_loss"] + 0.01 * r["aux/moe_lb_loss"], 1e-6)
        assert r["aux/moe_lb_loss"] >= 1.0 - 1e-6  # E sum f P >= 1 when f = P; ~1 at init
    assert train[-1]["update_rms/expert_w_out"] > 0 and train[-1]["update_rms/router"] > 0
    assert {"max_logit/0", "max_logit/1"} <= set(train[-1]) and train[-1]["max_logit/1"] > 0
    assert 0 < summary["final_eval"]["loss"] < 10
    sp = [r for r in recs if r["kind"] == "spectrum"][-1]
    assert 0 < sp["spectrum/expert_w_in/entropy"] <= 1 and 0 < sp["spectrum/vo/entropy"] <= 1


def test_sharded_run_cut_and_resumed_matches_single(corpus, single, tmp_path):
    _, _, ref = single
    sharded = {"parallel.mode": "sharded", "parallel.fsdp": 2, **EXTRA}
    run(lm_config(corpus, steps=2, **sharded), tmp_path)
    summary, state = run(lm_config(corpus, steps=4, **sharded), tmp_path, resume=True)
    assert summary["resumed_from"] == 2 and summary["steps"] == 4
    assert max_rel_diff(state.params, ref.params) < TOL
    assert max_rel_diff(state.opt_state, ref.opt_state) < TOL


def test_sample_cli_greedy_is_deterministic_argmax(single, capsys):
    wd = single[0]
    argv = ["sample", "--workdir", str(wd), "--prompt", "w1 w0", "--max-new-tokens", "7"]
    argv += ["--temperature", "0"]
    assert cli.main(argv) == 0
    first = capsys.readouterr().out
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == first
    graphdef, params, tok, _ = load_run(wd)
    ids = tok.encode(first.strip(), add_special_tokens=False).ids
    assert len(ids) == 9 and tok.decode(ids[:2]) == "w1 w0"
    # Greedy: every generated token is the argmax of the full forward pass before it.
    logits = np.asarray(transformer.apply(graphdef, params, jax.numpy.asarray([ids])))
    np.testing.assert_array_equal(logits[0, 1:-1].argmax(-1), ids[2:])
    assert cli.main(["sample", "--workdir", str(wd / "nope"), "--prompt", "x"]) == 2
    assert "no config.json" in capsys.readouterr().err
