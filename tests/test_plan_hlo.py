# ruff: noqa: E501 (HLO text as the compilers print it, one instruction per line)
"""What `amemory plan` counts, held against hand counts, without the TPU compiler.

HLO texts written here in the forms the compilers print (GPU asynchronous start/done
pairs, TPU all-reduce-scatter fusions and continuation pieces, a windowed-einsum loop
whose counter steps by 2), each with its bytes or FLOPs counted by hand; the transformer
on an ``Explicit`` mesh (the forward pass runs on Auto axes); and the mixture of experts'
compiled FLOPs against the closed form (top-k routed experts plus the shared one), with
its gather dispatch equal to the dense one-hot dispatch it replaced.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from amemory.models import transformer as tfm
from amemory.models.moe import capacity
from amemory.train import parallel, planner

GROUP = "replica_groups=[1,8]<=[8]"
GPU_ASYNC = f"""HloModule m

ENTRY %main (p0: bf16[16,128], p1: bf16[128,128], p2: f32[2,4]) -> bf16[16,128] {{
  %p0 = bf16[16,128]{{1,0}} parameter(0)
  %p1 = bf16[128,128]{{1,0}} parameter(1)
  %p2 = f32[2,4]{{1,0}} parameter(2)
  %all-gather-start = ((bf16[16,128]{{1,0}}), bf16[128,128]{{1,0}}) all-gather-start(%p0), {GROUP}, dimensions={{0}}
  %all-gather-done = bf16[128,128]{{1,0}} all-gather-done(%all-gather-start)
  %reduce-scatter-start = ((bf16[128,128]{{1,0}}, bf16[128,128]{{1,0}}), (bf16[16,128]{{1,0}}, bf16[16,128]{{1,0}})) reduce-scatter-start(%p1, %p1), {GROUP}, dimensions={{0}}
  %reduce-scatter-done = (bf16[16,128]{{1,0}}, bf16[16,128]{{1,0}}) reduce-scatter-done(%reduce-scatter-start)
  %all-to-all-start = ((bf16[128,128]{{1,0}}), bf16[128,128]{{1,0}}) all-to-all-start(%p1), {GROUP}, dimensions={{0}}
  %all-to-all-done = bf16[128,128]{{1,0}} all-to-all-done(%all-to-all-start)
  %all-reduce-start = f32[2,4]{{1,0}} all-reduce-start(%p2), {GROUP}
  %all-reduce-done = f32[2,4]{{1,0}} all-reduce-done(%all-reduce-start)
  %collective-permute-start = (bf16[16,128]{{1,0:T(8,128)(2,1)}}, bf16[16,128]{{1,0:T(8,128)(2,1)}}, u32[], u32[]) collective-permute-start(%p0), source_target_pairs={{{{0,1}},{{1,0}}}}
  ROOT %collective-permute-done = bf16[16,128]{{1,0}} collective-permute-done(%collective-permute-start)
}}
"""

TPU_FUSED = """HloModule m

%all-reduce-scatter.1 (input: f32[256]) -> f32[64] {
  %input = f32[256]{0} parameter(0)
  %all-reduce.1 = f32[256]{0} all-reduce(%input), channel_id=3, replica_groups={{0,1,2,3}}
  %pid = u32[] partition-id()
  ROOT %dynamic-slice.1 = f32[64]{0} dynamic-slice(%all-reduce.1, %pid), dynamic_slice_sizes={64}
}

%start.1 (p: bf16[8,32]) -> (bf16[8,32], bf16[32,32]) {
  %p = bf16[8,32]{1,0} parameter(0)
  %all-gather.2 = bf16[32,32]{1,0} all-gather(%p), channel_id=4, replica_groups={{0,1,2,3}}, dimensions={0}
  ROOT %cc = (bf16[8,32]{1,0}, bf16[32,32]{1,0}) custom-call(%all-gather.2), custom_call_target="AsyncCollectiveStart"
}

%piece.1 (p: bf16[8,32]) -> bf16[32,32] {
  %p = bf16[8,32]{1,0} parameter(0)
  ROOT %all-gather.3 = bf16[32,32]{1,0} all-gather(%p), channel_id=4, replica_groups={{0,1,2,3}}, dimensions={0}
}

%done.1 (p: bf16[8,32]) -> bf16[32,32] {
  %p = bf16[8,32]{1,0} parameter(0)
  %all-gather.4 = bf16[32,32]{1,0} all-gather(%p), channel_id=4, replica_groups={{0,1,2,3}}, dimensions={0}
  ROOT %cc = bf16[32,32]{1,0} custom-call(%all-gather.4), custom_call_target="AsyncCollectiveDone"
}

ENTRY %main (x: f32[256], y: bf16[8,32]) -> f32[64] {
  %x = f32[256]{0} parameter(0)
  %y = bf16[8,32]{1,0} parameter(1)
  %s = (bf16[8,32]{1,0}, bf16[32,32]{1,0}) fusion(%y), kind=kCustom, calls=%start.1
  %c = bf16[32,32]{1,0} fusion(%y), kind=kOutput, calls=%piece.1, backend_config={"continuation_config":{}}
  %d = bf16[32,32]{1,0} fusion(%y), kind=kCustom, calls=%done.1
  ROOT %f = f32[64]{0} fusion(%x), kind=kCustom, calls=%all-reduce-scatter.1, backend_config={"collective_algorithm_config":{"emitter":"AllReduceScatterFusion"}}
}
"""


def _loop(name: str, init: int, bound: int, step: int) -> str:
    """A while loop ``for i in range(init, bound, step)`` around one 8x8x8 dot."""
    return f"""
%cond{name} (p: (s32[], f32[8,8])) -> pred[] {{
  %p = (s32[], f32[8,8]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant({bound})
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}}

%body{name} (p: (s32[], f32[8,8])) -> (s32[], f32[8,8]) {{
  %p = (s32[], f32[8,8]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8,8]{{1,0}} get-tuple-element(%p), index=1
  %step = s32[] constant({step})
  %next = s32[] add(%i, %step)
  %y = f32[8,8]{{1,0}} dot(%x, %x), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  ROOT %t = (s32[], f32[8,8]{{1,0}}) tuple(%next, %y)
}}
"""


LOOPS = f"""HloModule m
{_loop("2", 0, 4, 2)}
{_loop("1", 1, 5, 1)}
ENTRY %main (a: f32[8,8]) -> (s32[], f32[8,8]) {{
  %a = f32[8,8]{{1,0}} parameter(0)
  %zero = s32[] constant(0)
  %one = s32[] constant(1)
  %c1 = s32[] copy(%one)
  %init2 = (s32[], f32[8,8]{{1,0}}) tuple(%zero, %a)
  %init1 = (s32[], f32[8,8]{{1,0}}) tuple(%c1, %a)
  %w2 = (s32[], f32[8,8]{{1,0}}) while(%init2), condition=%cond2, body=%body2
  ROOT %w1 = (s32[], f32[8,8]{{1,0}}) while(%init1), condition=%cond1, body=%body1
}}
"""


def test_asynchronous_gpu_collectives_count_their_results_once():
    """Start ops print ``(operands, results)``: the ring model reads the results only
    (before: operands too, so reduce-scatters counted 9x and all-to-alls 2x on 8 GPUs)."""
    st = planner.hlo_stats(GPU_ASYNC, "none", 8)
    full = 128 * 128 * 2  # bf16[128, 128], bytes
    assert st["collectives"] == {
        "all-gather": 7 / 8 * full,  # (g - 1) / g of the gathered array
        "reduce-scatter": 2 * 7 / 8 * full,  # two arrays scattered
        "all-to-all": 7 / 8 * full,
        "all-reduce": 2 * 7 / 8 * 32,  # f32[2, 4]: 32 bytes, reduce then broadcast
        "collective-permute": 16 * 128 * 2,  # one bf16[16, 128] sent
    }
    assert st["collective_ops"] == dict.fromkeys(planner.COLLECTIVES, 1)


def test_tpu_fused_collectives_count_once_and_scatters_as_scatters():
    """An all-reduce-scatter fusion is a reduce-scatter of its all-reduce's array (before:
    not counted); an asynchronous all-gather counts at its start fusion, not in its
    continuation pieces or its done fusion."""
    st = planner.hlo_stats(TPU_FUSED, "none", 4)
    assert st["collectives"]["reduce-scatter"] == 3 / 4 * 256 * 4
    assert st["collectives"]["all-reduce"] == 0
    assert st["collectives"]["all-gather"] == 3 / 4 * 32 * 32 * 2
    assert st["collective_ops"]["all-gather"] == 1


def test_loop_trip_counts_follow_the_induction_step():
    """``range(0, 4, 2)`` runs twice and ``range(1, 5, 1)`` four times (before: the bound,
    4 and 5: XLA's windowed-einsum loops step by 2, so gpt2-small read 1.25x its FLOPs)."""
    dot = 2 * 8 * 8 * 8
    assert planner.hlo_stats(LOOPS, "none")["flops"] == (2 + 4) * dot


def _grads(mesh_kind, scan: bool):
    """The tiny transformer's loss gradient on a (1, 4) mesh of ``mesh_kind`` axes, FSDP
    parameters and batch-split tokens: (gradients, compiled HLO, parameter bytes)."""
    config = tfm.preset("tiny", scan_layers=scan, d_model=64, n_heads=4, d_ff=128, max_len=64)
    graphdef, params = tfm.init(config, jax.random.key(0))
    tokens = np.random.default_rng(0).integers(0, 37, (32, 64)).astype(np.int32)

    def loss(p, t):
        return jnp.mean(tfm.apply(graphdef, p, t) ** 2)

    if mesh_kind is None:
        return jax.jit(jax.grad(loss))(params, tokens), None, 4 * tfm.count_params(params)
    mesh = jax.make_mesh((1, 4), parallel.AXES, axis_types=(mesh_kind,) * 2,
                         devices=jax.devices()[:4])  # fmt: skip
    with jax.sharding.set_mesh(mesh):
        shardings = parallel.state_shardings(params, mesh)
        p = jax.device_put(params, shardings)
        t = jax.device_put(tokens, NamedSharding(mesh, P(parallel.AXES)))
        step = jax.jit(jax.grad(loss), out_shardings=shardings)
        return step(p, t), step.lower(p, t).compile().as_text(), 4 * tfm.count_params(params)


@pytest.mark.parametrize("scan", [True, False])
def test_transformer_runs_fsdp_on_explicit_and_auto_meshes(scan):
    """On Explicit axes the FSDP forward used to fail (the embedding gather cannot pick an
    output sharding); now it runs on Auto axes: the gradients equal the unsharded ones,
    and the compiled collectives equal the Auto mesh's, a few times the parameter bytes
    (before the activation constraint: ~24x the analytic FSDP figure on this CPU)."""
    ref, _, p_bytes = _grads(None, scan)
    out = {}
    for kind in (AxisType.Explicit, AxisType.Auto):
        grads, text, _ = _grads(kind, scan)
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-7)
        out[kind] = sum(planner.hlo_stats(text, "none", 4)["collectives"].values())
    assert out[AxisType.Explicit] == out[AxisType.Auto]
    # CPU reduces gradients by all-reduce (2 units), gathers weights forward and backward
    assert out[AxisType.Auto] <= 1.25 * 4 * p_bytes * 3 / 4


# ------------------------------------------------------------- mixture of experts


def _dense_moe(moe, x, cap):
    """The one-hot dispatch the gather replaced: ``dispatch [B, T, E, C]`` einsums."""
    m = moe.moe
    b, t, _ = x.shape
    e, k = m.experts, m.top_k
    _, gates, idx = moe.route(x)
    choice = jax.nn.one_hot(idx, e, dtype=jnp.float32).reshape(b, t * k, e)
    slot = jnp.sum((jnp.cumsum(choice, axis=1) - choice) * choice, axis=-1)
    kept = choice * (slot < cap)[..., None]
    slot_1h = jax.nn.one_hot(slot.astype(jnp.int32), cap, dtype=jnp.float32)
    dispatch = (kept[..., None] * slot_1h[:, :, None, :]).reshape(b, t, k, e, cap)
    combine = jnp.einsum("btkec,btk->btec", dispatch, gates)
    xe = jnp.einsum("btec,btd->becd", dispatch.sum(axis=2), x)
    y = jnp.einsum("btec,becd->btd", combine, moe.experts(xe))
    return y + (moe.shared(x) if m.shared else 0), jnp.sum(choice - kept) / (b * t * k)


@pytest.mark.parametrize("cf", [0.0, 2.0, 0.5])
def test_gather_dispatch_equals_the_dense_dispatch(cf):
    """Dropless, a capacity never exceeded (cf 2 at 4 experts, top 2), and one that
    drops: equal outputs and dropped fractions."""
    from flax import nnx

    from amemory.models.moe import MoE

    config = tfm.preset("tiny", moe=dict(experts=4, top_k=2, shared=1, capacity_factor=cf))
    moe = MoE(config, rngs=nnx.Rngs(params=3))
    x = jax.random.normal(jax.random.key(1), (3, 17, config.d_model))
    y, aux = moe(x)
    ref, dropped = _dense_moe(moe, x, capacity(config.moe_dims, 17))
    np.testing.assert_allclose(np.asarray(y), np.asarray(ref), rtol=1e-5, atol=1e-6)
    assert float(aux["moe_drop_fraction"]) == pytest.approx(float(dropped))
    assert (float(dropped) > 0) == (cf == 0.5)


def test_mla_moe_compiles_to_its_model_flops():
    """Gradient of an MLA + MoE model (8 experts, top 2, one shared; capacity factor 1):
    compiled matmul FLOPs within 1.15x of 6 N + 12 L T d with the routed experts counted
    k/E (before: 1.23x, the one-hot dispatch's matmuls growing with T; a dropless MoE
    computes E/k x the routed experts' FLOPs, 2.6x the model's here)."""
    moe = dict(experts=8, top_k=2, shared=1, capacity_factor=1.0)
    config = tfm.preset("small", vocab_size=512, max_len=512, n_layers=2, attention="mla", moe=moe)
    graphdef, params = tfm.init(config, jax.random.key(0))
    tokens = np.zeros((2, 512), np.int32)

    def loss(p, t):
        return jnp.mean(tfm.apply(graphdef, p, t) ** 2)

    text = jax.jit(jax.grad(loss)).lower(params, tokens).compile().as_text()
    model = planner.model_flops_per_token(config, params, tfm.param_roles(params), 512)
    ratio = planner.hlo_stats(text, "none")["flops"] / (model * tokens.size)
    assert 1.0 <= ratio <= 1.15, ratio
    assert 8 * capacity(config.moe_dims, 512) == 512 * 2  # E C = T k slots


def test_model_vocabulary_can_exceed_the_tokenizers():
    """``model.vocab_size`` plans gpt2-small at GPT-2's 50,257 tokens on an 8192-token
    corpus; one below the data's vocabulary fails naming the field."""
    from train_helpers import LM_CONFIG

    from amemory.train import tasks
    from amemory.train.config import load_config

    over = ["model.preset=gpt2-small", "model.vocab_size=50257"]
    config = load_config(LM_CONFIG + ":full", over)
    model = tasks.model_config(config, 8192)
    assert model.vocab_size == 50257 and tfm.preset("gpt2-small").vocab_size == 50257
    with pytest.raises(ValueError, match="config.model.vocab_size=50257 must be None or >= 60000"):
        tasks.model_config(config, 60000)
