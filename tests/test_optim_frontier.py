"""The 2026 frontier features of amemory.optim: Hyperball (MuonH / AdamH), QK-Clip,
per-head Muon. Each is checked against a slow numpy reference (a loop over matrices)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from amemory import optim
from amemory.optim import hyperball
from amemory.optim.qk_clip import qk_clip


def _hyperball_reference(w, u, radius, lr):
    """One Hyperball step on one matrix (arXiv 2606.16899), in float64 numpy."""
    moved = w - lr * radius * u / np.linalg.norm(u)
    return radius * moved / np.linalg.norm(moved)


def test_hyperball_keeps_each_expert_norm_of_a_stack_and_matches_the_loop():
    rng = np.random.default_rng(0)
    L, E, d, f = 2, 3, 5, 7  # distinct sizes: a norm over the wrong axes fails
    w = rng.standard_normal((L, E, d, f)) * rng.uniform(0.5, 3.0, (L, E, 1, 1))
    params = {"experts": jnp.asarray(w, jnp.float32)}
    tx = hyperball.scale_by_hyperball(0.1, matrix_axes=(-2, -1))
    state = tx.init(params)
    for _ in range(3):
        u = rng.standard_normal((L, E, d, f))
        upd, state = tx.update({"experts": jnp.asarray(u, jnp.float32)}, state, params)
        new = np.asarray(optax.apply_updates(params, upd)["experts"], np.float64)
        for i in range(L):
            for e in range(E):
                r = np.linalg.norm(w[i, e])  # the initial radius of this expert
                ref = _hyperball_reference(np.asarray(params["experts"][i, e]), u[i, e], r, 0.1)
                np.testing.assert_allclose(new[i, e], ref, rtol=2e-5, atol=2e-6)
                np.testing.assert_allclose(np.linalg.norm(new[i, e]), r, rtol=1e-5)
        params = {"experts": jnp.asarray(new, jnp.float32)}


def test_muonh_and_adamh_are_their_direction_then_the_projection():
    rng = np.random.default_rng(1)
    w = jnp.asarray(rng.standard_normal((6, 10)), jnp.float32)
    g = jnp.asarray(rng.standard_normal((6, 10)), jnp.float32)
    r = float(jnp.linalg.norm(w))
    for tx, direction in (
        (hyperball.muonh(0.05), hyperball.scale_by_muon()),
        (hyperball.adamh(0.05), optax.scale_by_adam(b1=0.9, b2=0.95)),
    ):
        u, _ = direction.update(g, direction.init(w), w)
        upd, _ = tx.update(g, tx.init(w), w)
        ref = _hyperball_reference(np.asarray(w, np.float64), np.asarray(u, np.float64), r, 0.05)
        np.testing.assert_allclose(np.asarray(w + upd), ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="zero Frobenius norm"):
        hyperball.adamh(0.1).init({"w": jnp.zeros((3, 4))})
    with pytest.raises(ValueError, match="not a matrix"):
        hyperball.adamh(0.1).init({"b": jnp.ones((3,))})


# ----------------------------------------------------------------------------- QK-Clip

MLA_DIMS = dict(kv_rank=10, rope_dim=4, q_rank=12)
#: attention variants: MHA, MLA, and fewer K/V heads than query heads (MQA, GQA)
VARIANTS = {
    "mha": dict(attention="mha"),
    "mla": dict(attention="mla", mla=MLA_DIMS),
    "mqa": dict(n_kv_heads=1),
    "gqa": dict(n_heads=6, n_kv_heads=2),
}


def _heads(config, role):
    return config.kv_heads if role in ("k", "v") else config.n_heads


@pytest.mark.parametrize("attention", list(VARIANTS))
def test_qk_clip_caps_logits_keeps_other_heads_and_decoding(attention):
    """The clip scales each clipped head's logit by exactly tau / max (layer 0, whose input
    it does not change, lands on min(max, tau)); un-clipped heads and every other weight
    stay bit-identical; per-layer and stacked layouts clip alike; KV-cache decoding of the
    clipped model equals its full forward (MLA: absorbed projections)."""
    from amemory.models import decode as D
    from amemory.models import transformer as T
    from amemory.models.matrices import HEADS, head_view

    config = T.preset("tiny", **VARIANTS[attention])
    graphdef, params = T.init(config, jax.random.key(0))
    params = jax.tree.map(lambda x: x * 8.0, params)  # logits of order 1
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, config.vocab_size)
    top = T.apply(graphdef, params, tokens, with_aux=True)[1]["max_logit"]  # (L, H)
    tau = float(np.median(np.asarray(top[0])))
    clipped = qk_clip(params, top, tau, head_view(config))
    top2 = T.apply(graphdef, clipped, tokens, with_aux=True)[1]["max_logit"]
    np.testing.assert_allclose(top2[0], np.minimum(top[0], tau), rtol=1e-5)
    gamma = np.minimum(1.0, tau / np.asarray(top, np.float64))
    grouped = config.kv_heads < config.n_heads  # a shared K head: all of gamma on q (MaxText)
    for i in range(config.n_layers):
        for role, new in clipped["layers"][i]["attn"].items():
            old, new = (
                np.asarray(params["layers"][i]["attn"][role]["kernel"]),
                np.asarray(new["kernel"]),
            )
            power = {"q": 1.0, "k": 0.0}.get(role) if grouped else None
            power = HEADS.get(role, (0, 0.0))[1] if power is None else power
            if power == 0:
                np.testing.assert_array_equal(new, old)
                continue
            w = old.shape[1] // config.n_heads
            for head in range(config.n_heads):
                cols = slice(head * w, (head + 1) * w)
                if gamma[i, head] == 1.0:
                    np.testing.assert_array_equal(new[:, cols], old[:, cols])
                else:
                    want = old[:, cols] * gamma[i, head] ** power
                    np.testing.assert_allclose(new[:, cols], want, rtol=1e-6)
    stacked = T.stack_layers(params)
    clipped_s = qk_clip(stacked, top, tau, head_view(config))
    chex.assert_trees_all_equal(clipped_s, T.stack_layers(clipped))
    logits = T.apply(graphdef, clipped, tokens)
    cache = D.init_cache(config, 2, 9)
    _, cache = D.extend(graphdef, clipped, tokens[:, :6], cache, 0)
    out = D.extend(graphdef, clipped, tokens[:, 6:], cache, 6)[0]
    np.testing.assert_allclose(out, logits[:, 6:], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="tau"):
        qk_clip(params, top, 0.0, head_view(config))


# ----------------------------------------------------------------------------- per-head Muon


def _polar_np(m):
    u, _, vh = np.linalg.svd(m, full_matrices=False)
    return u @ vh


@pytest.mark.parametrize("attention", list(VARIANTS))
def test_per_head_muon_equals_a_loop_over_heads_in_both_layouts(attention):
    """Exact-polar Muon on the per-head view equals numpy's polar factor of every head block
    (columns of q/k/v-like kernels, rows of o), times the Jordan scale of the block
    ``sqrt(max(1, fan_out / fan_in))`` (DeepSpeed #8384's per-head convention); other
    matrices stay whole; the stacked layout gives the same; bf16 and the owner layout on 8
    devices agree."""
    from amemory.models import transformer as T
    from amemory.models.matrices import HEADS, per_head_axes

    config = T.preset("tiny", **VARIANTS[attention])
    _, params = T.init(config, jax.random.key(0))
    attn = {"layers": {i: {"attn": params["layers"][i]["attn"]} for i in range(2)}}
    rng = np.random.default_rng(3)
    grads = jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), jnp.float32), attn)
    kw = dict(momentum=0.0, nesterov=False, orthogonalizer="polar", shape_scale="jordan")
    tx = optim.scale_by_muon(matrix_axes=per_head_axes(config), **kw)
    out = tx.update(grads, tx.init(attn), attn)[0]
    for i in range(2):
        for role, g in grads["layers"][i]["attn"].items():
            g, got = (
                np.asarray(g["kernel"], np.float64),
                np.asarray(out["layers"][i]["attn"][role]["kernel"]),
            )
            if role not in HEADS:
                want = _polar_np(g) * max(1.0, g.shape[1] / g.shape[0]) ** 0.5
                np.testing.assert_allclose(got, want, atol=2e-5)
                continue
            cols = HEADS[role][0] == -1
            blocks = np.split(g, _heads(config, role), axis=1 if cols else 0)
            want = [_polar_np(b) * max(1.0, b.shape[1] / b.shape[0]) ** 0.5 for b in blocks]
            np.testing.assert_allclose(got, np.concatenate(want, axis=1 if cols else 0), atol=2e-5)
    stacked = T.stack_layers(attn)
    out_s = tx.update(T.stack_layers(grads), tx.init(stacked), stacked)[0]
    chex.assert_trees_all_close(out_s, T.stack_layers(out), atol=1e-5)
    nskw = dict(kw, orthogonalizer="newton_schulz", ns_coeffs="polar_express", ns_steps=8)
    ref = optim.scale_by_muon(matrix_axes=per_head_axes(config), **nskw)
    u_ref = ref.update(grads, ref.init(attn), attn)[0]
    bf = jax.tree.map(lambda x: x.astype(jnp.bfloat16), (attn, grads))
    u_bf = ref.update(bf[1], ref.init(bf[0]), bf[0])[0]
    chex.assert_trees_all_close(
        jax.tree.map(lambda x: x.astype(jnp.float32), u_bf), u_ref, atol=0.05
    )
    mesh = jax.make_mesh((8,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,))
    owner = optim.scale_by_muon(matrix_axes=per_head_axes(config), ns_mesh=(mesh, "fsdp"), **nskw)
    u_own = jax.jit(owner.update)(grads, owner.init(attn), attn)[0]
    chex.assert_trees_all_close(u_own, u_ref, atol=1e-5)


def test_per_head_view_of_nnx_attention_and_contrib_equals_the_loop():
    """``nnx.MultiHeadAttention`` kernels ``[d, H, d_h]`` / ``[H, d_h, d]``: the per-head
    axes (amemory Muon) and optax-style dimension numbers (the contrib drop-in) both
    orthogonalise each head's ``[d, d_h]`` / ``[d_h, d]`` block on its own."""
    from amemory.optim import contrib
    from amemory.optim.nnx_roles import nnx_per_head_matrix_axes

    rng = np.random.default_rng(5)
    g = {
        "query": {"kernel": rng.standard_normal((20, 4, 6))},
        "out": {"kernel": rng.standard_normal((4, 6, 20))},
    }
    g = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), g)
    kw = dict(momentum=0.0, nesterov=False, orthogonalizer="polar", shape_scale="none")
    tx = optim.scale_by_muon(matrix_axes=nnx_per_head_matrix_axes, **kw)
    got = tx.update(g, tx.init(g), g)[0]
    want_q = np.stack(
        [_polar_np(np.asarray(g["query"]["kernel"][:, i], np.float64)) for i in range(4)], 1
    )
    want_o = np.stack([_polar_np(np.asarray(g["out"]["kernel"][i], np.float64)) for i in range(4)])
    np.testing.assert_allclose(got["query"]["kernel"], want_q, atol=2e-5)
    np.testing.assert_allclose(got["out"]["kernel"], want_o, atol=2e-5)
    dims = {
        "query": {"kernel": contrib.MuonDimensionNumbers(0, 2)},
        "out": {"kernel": contrib.MuonDimensionNumbers(1, 2)},
    }
    pe = np.asarray(optim.COEFFICIENT_SETS["polar_express"][0]) / [1.01, 1.01**3, 1.01**5]
    ctx = contrib.scale_by_muon(
        ns_coeffs=pe, ns_steps=8, nesterov=False, weight_dimension_numbers=dims
    )
    got_c = ctx.update(g, ctx.init(g), g)[0]
    np.testing.assert_allclose(got_c["query"]["kernel"], want_q, atol=0.02)
    np.testing.assert_allclose(got_c["out"]["kernel"], want_o, atol=0.02)  # (no shape scale)


# ----------------------------------------------------------------------------- amemory train


def test_train_per_head_mla_with_qk_clip_logs_and_caps_max_logits(corpus, tmp_path):
    """`amemory train` with optimizer.per_head and optimizer.qk_clip on MLA: the routing
    table shows the head blocks, max_logit/<layer> is logged every step, the first step
    (before any clip) is far above tau and the last steps stay within 10% of it."""
    import json

    from train_helpers import lm_config

    from amemory.train import run

    tau = 0.012
    over = {"model.attention": "mla", "optimizer.per_head": "true", "optimizer.lr": 0.002,
            "optimizer.qk_clip": tau, "steps": 8}  # fmt: skip
    run(lm_config(corpus, **over), tmp_path)
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    routing = {row[0]: row[4] for row in recs[0]["routing"]}
    assert routing["layers/0/attn/q/kernel"] == "3 x (24, 8)"  # 3 heads of [D, d_h]
    assert routing["layers/1/attn/o/kernel"] == "3 x (8, 24)"
    assert routing["layers/0/attn/kv_down/kernel"] == "1 x (24, 32)"  # whole
    top = [max(r["max_logit/0"], r["max_logit/1"]) for r in recs if r["kind"] == "train"]
    assert len(top) == 8 and top[0] > 1.5 * tau and max(top[-3:]) <= 1.1 * tau, top


@pytest.mark.parametrize("name", ["muonh", "adamh"])
def test_train_config_accepts_hyperball_names(corpus, name):
    """The names come from amemory.optim.OPTIMIZERS; the built optimizer keeps every hidden
    matrix's norm after a step (Hyperball) and Adam trains the rest."""
    from train_helpers import lm_config

    from amemory.train import optimizers, tasks
    from amemory.train.parallel import placement

    cfg = lm_config(corpus, **{"optimizer.name": name})
    task = tasks.build(cfg, placement(cfg.parallel))
    params = task.init_params(jax.random.key(0))
    roles = task.roles(params)
    opt = optimizers.build(cfg, params, roles, matrix_axes=task.matrix_axes)
    grads = jax.tree.map(jnp.ones_like, params)
    new = optax.apply_updates(params, opt.tx.update(grads, opt.tx.init(params), params)[0])
    w0, w1 = params["layers"][0]["attn"]["v"]["kernel"], new["layers"][0]["attn"]["v"]["kernel"]
    assert float(jnp.linalg.norm(w1 - w0)) > 0
    np.testing.assert_allclose(jnp.linalg.norm(w1), jnp.linalg.norm(w0), rtol=1e-5)
    with pytest.raises(ValueError, match="weight_decay"):
        optimizers.build(
            lm_config(corpus, **{"optimizer.name": name, "optimizer.weight_decay": 0.1}),
            params, roles, matrix_axes=task.matrix_axes,
        )  # fmt: skip


def test_deepseek_v4_preset_gives_update_rms_0_18():
    g = jnp.asarray(np.random.default_rng(2).standard_normal((48, 160)), jnp.float32)
    tx = optim.muon(1.0, preset="deepseek_v4", weight_decay=0.0)
    u = tx.update(g, tx.init(g), g)[0]
    np.testing.assert_allclose(float(jnp.sqrt(jnp.mean(u**2))), 0.18, rtol=0.01)
    assert optim.preset_options("deepseek_v4")["ns_coeffs"] == "deepseek_v4"


def test_per_head_roles_choose_which_kernels_split(corpus):
    from train_helpers import lm_config

    from amemory.train import tasks
    from amemory.train.parallel import placement

    over = {"optimizer.per_head": "true", "optimizer.per_head_roles": "qk"}
    cfg = lm_config(corpus, **over)
    task = tasks.build(cfg, placement(cfg.parallel))
    q, v = ("layers", 0, "attn", "q", "kernel"), ("layers", 0, "attn", "v", "kernel")
    assert task.matrix_axes(q, None) == (-3, -1, (-1, 3))  # 3 heads of [D, 8]
    assert task.matrix_axes(v, None) == (-2, -1)  # whole
    with pytest.raises(ValueError, match="per_head_roles"):
        tasks.build(lm_config(corpus, **{**over, "optimizer.per_head_roles": "qq"}),
                    placement(cfg.parallel))  # fmt: skip
