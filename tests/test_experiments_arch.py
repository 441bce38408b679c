"""experiments/arch.py without training: cell configs, cost formulas in closed form, the
verdict rules on hand-made measurements, and its place in `amemory reproduce`."""

import jax
import pytest

from amemory.models import transformer as T
from experiments import arch, common, reproduce, train_runs


def test_cells_share_the_dense_runs_of_tail_lm():
    cfg = common.experiments()["arch"].config("quick")
    tl = common.experiments()["tail_lm"].config("quick")
    for opt, lr in (("adam", 3e-3), ("muon", 0.02)):
        ours = arch.run_config(cfg, "dense", opt)
        theirs = train_runs.run_config(tl.base, opt, lr, 3e-3, "hidden")
        assert common.config_hash(ours) == common.config_hash(theirs)  # trained once
    c = arch.run_config(cfg, "mla_moe", "muon", "ffn")
    assert (c.model.attention, c.model.mla.kv_rank, c.model.moe.experts) == ("mla", 64, 8)
    assert c.optimizer.muon_roles == "ffn" and c.optimizer.adam_lr == 3e-3
    with pytest.raises(ValueError, match="architectures"):
        arch.run_config(cfg, "gqa", "adam")


def test_model_costs_closed_form():
    d, f, v, t, h, n_layers = 128, 128, 512, 64, 4, 2  # the quick MLA+MoE cell
    mc = T.preset(
        "small", vocab_size=v, d_model=d, n_layers=n_layers, n_heads=h, d_ff=512, max_len=t,
        attention="mla", mla=dict(kv_rank=64, rope_dim=16),
        moe=dict(experts=8, top_k=2, shared=2, d_expert=f),
    )  # fmt: skip
    params = jax.eval_shape(lambda: T.init_params(mc, jax.random.key(0)))
    c = arch.model_costs(mc, params, ("expert_w_in", "expert_w_out"))
    attn = d * d + d * h * 16 + d * 64 + 2 * 64 * d + d * 16 + d * d  # q q_rope kv k/v_up k_r o
    experts, shared, router = 8 * 2 * d * f, 2 * d * 2 * f, d * 8
    layer = attn + experts + shared + router + 2 * d  # + 2 RMSNorm scales
    assert c["total_params"] == 2 * v * d + n_layers * layer + d
    assert c["active_params"] == c["total_params"] - n_layers * experts * (1 - 2 / 8)
    matmul = n_layers * (attn + experts / 4 + shared + router) + v * d  # + head
    assert c["flops_per_token"] == 6 * matmul + 6 * n_layers * h * t * (32 + 16 + 32)
    ns = 5 * (4 * d**2 * f + 2 * d**3)  # direct Newton-Schulz on a square 128 x 128
    assert c["ns_flops_per_step"] == n_layers * 2 * 8 * ns


def _metrics(ratio_steps, mem, speed, ppl, shares):
    cells = {}
    for a in ("dense", "mla", "moe", "mla_moe"):
        for o in ("adam", "muon"):
            cells[f"{a}/{o}"] = {
                "total_steps": 100.0, "flops_per_step": 1.0, "perplexity": 100.0,
                "steps_to_own_adam": 100.0 * ratio_steps, "final_val_loss": 4.0,
            }  # fmt: skip
            cells[f"{a}/{o}"]["flops_to_own_adam"] = 100.0 * ratio_steps
    cells["mla_moe/muon"]["perplexity"] = 100.0 * (1 - ppl)
    cells["mla_moe/adam"]["final_val_loss"] = 4.0
    cells["mla_moe/muon"]["final_val_loss"] = 3.0
    cells["mla_moe/muon_ffn"] = {"final_val_loss": 4.0 - shares[0]}
    cells["mla_moe/muon_qk+vo"] = {"final_val_loss": 4.0 - shares[1]}
    dec = {
        "dense": {"kv_bytes_per_token": 100, "tokens_per_s": {1: 10.0, 8: 10.0},
                  "memory": {64: {"total": 1.0}, 1024: {"total": 100.0}}},
        "mla_moe": {"kv_bytes_per_token": 30, "tokens_per_s": {1: 10.0, 8: 10.0 * speed},
                    "memory": {64: {"total": 2.0}, 1024: {"total": 100.0 * (1 - mem)}}},
    }  # fmt: skip
    return {"cells": cells, "decode": dec, "target_loss": 4.0}


@pytest.mark.parametrize(
    "values, verdicts",
    [
        ((0.59, 0.55, 2.6, 0.065, (0.7, 0.2)), (True, True, True, True, True)),
        ((0.61, 0.54, 2.5, 0.063, (0.2, 0.7)), (False, False, False, False, False)),
    ],
)
def test_verdicts_follow_the_stated_thresholds(values, verdicts):
    cfg = common.experiments()["arch"].config("quick")
    claims = arch.make_claims(cfg, _metrics(*values))
    assert [c.key for c in claims] == [
        "arch/muon_compute", "arch/mla_moe_memory", "arch/mla_moe_speed",
        "arch/mla_moe_muon_perplexity", "arch/experts_vs_attention",
    ]  # fmt: skip
    assert tuple(c.held for c in claims) == verdicts
    assert "KV cache 70% less per token" in claims[1].ours
    assert "100% more at 64" in claims[1].ours  # the short context costs more here


def test_reproduce_runs_arch_at_tail_lm_lrs(tmp_path):
    # arch left the default stages to pay for the seeds of the others (README, section 4)
    assert "arch" in common.experiments() and not common.experiments()["arch"].default
    seen = {}

    def runner(name, scale, stage_dir, progress, *, overrides=None, cache_dir=None):
        seen[name] = overrides
        lrs = {"chosen_lr": {"adam": 0.01, "muon": 0.05}} if name == "tail_lm" else {}
        return common.result_dict(name, scale, metrics=lrs, figures=[], claims=[], wall_s=0.0)

    reproduce.reproduce(("tail_lm", "arch"), "quick", tmp_path, progress=False,
                        stage_runner=runner)  # fmt: skip
    assert seen["arch"]["lr.adam"] == 0.01 and seen["arch"]["lr.muon"] == 0.05
    assert "tail_lm" in seen["arch"]["lr_source"]


def _frontier(mla_gap, per_head_gap, per_head_cost, muonh_gain, clip_cost, late):
    """Hand-made per-seed final losses of the frontier arms (3 seeds, small noise)."""
    noise = [0.0, 0.002, -0.002]
    base = {"dense/muon": 4.0, "mla/muon": 4.0 + mla_gap, "dense/muon_wd": 4.0,
            "dense/per_head": 4.0 + per_head_cost, "dense/muonh": 4.0 - muonh_gain,
            "dense/qk_clip": 4.0 + clip_cost}  # fmt: skip
    base["mla/per_head"] = base["dense/per_head"] + per_head_gap
    cells = {k: {"val_loss": [v + e for e in noise]} for k, v in base.items()}
    cells["dense/qk_clip"]["late_max_logit"] = late
    return {"cells": cells, "tau": 5.0, "seeds": [1, 2, 3]}


@pytest.mark.parametrize(
    "values, verdicts",
    [
        ((0.1, 0.02, -0.05, 0.05, 0.0, 5.1), (True, True, True, True, True)),
        ((-0.1, 0.2, 0.1, -0.05, 0.1, 5.1), (False, False, False, False, False)),
        ((0.1, 0.02, -0.05, 0.05, 0.0, 9.0), (True, True, True, True, False)),  # logits above tau
    ],
)
def test_frontier_verdicts_follow_the_stated_rules(values, verdicts):
    cfg = common.experiments()["arch"].config("quick")
    claims = arch.frontier_claims(cfg, _frontier(*values))
    assert [c.key for c in claims] == [
        "arch/mla_gap_whole_muon", "arch/per_head_closes_mla_gap", "arch/per_head_vs_whole",
        "arch/muonh_vs_muon_wd", "arch/qk_clip_no_cost",
    ]  # fmt: skip
    assert tuple(c.held for c in claims) == verdicts
    assert all(c.interval["n"] == 3 for c in claims)


def test_frontier_arm_configs():
    cfg = common.experiments()["arch"].config("quick")
    arms = {a: arch.frontier_config(cfg, "dense", a, tau=8.0) for a in arch.ARMS}
    assert all(tuple(c.seeds) == (1, 2, 3) for c in arms.values())
    assert arms["per_head"].optimizer.per_head and not arms["muon"].optimizer.per_head
    assert arms["muon_wd"].optimizer.weight_decay == 0.1 == cfg.frontier.weight_decay
    assert arms["muonh"].optimizer.name == "muonh"
    assert arms["muonh"].optimizer.lr == pytest.approx(0.02 / (0.02 * 128**0.5))
    assert arms["qk_clip"].optimizer.qk_clip == 8.0 and arms["muon"].optimizer.qk_clip == 0.0
    assert arch.frontier_config(cfg, "mla", "per_head").model.attention == "mla"
