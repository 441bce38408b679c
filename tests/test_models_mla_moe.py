"""MLA, MoE and KV-cache decoding against independent references.

References: a float64 numpy forward written from the DeepSeek-V2 equations (MLA, arXiv
2405.04434 eqs. 9-19) with a per-token Python loop for the mixture of experts (capacity
claimed in position order); the Switch load-balancing loss on a hand-made routing;
numpy SVD polar factors of each expert for Muon; the full forward pass for the cache.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from test_models_transformer import _np_gelu, _np_norm, _np_rope, _randomise, _tokens

from amemory import optim
from amemory.models import decode as D
from amemory.models import transformer as T
from amemory.models.moe import MoE

# Distinct small sizes: V=37, D=24, H=3 (d_h=8), F=56, T<=19; d_c=10, d_c'=12, d_R=4.
MLA = T.preset("tiny", attention="mla", mla=dict(kv_rank=10, rope_dim=4, q_rank=12))
MLA_MOE = MLA.replace(
    ffn="swiglu",
    moe=dict(experts=4, top_k=2, shared=1, d_expert=14, capacity_factor=0.75),
)
MHA_MOE = T.preset("tiny", moe=dict(experts=5, top_k=1, d_expert=11))

_apply = jax.jit(T.apply, static_argnums=0, static_argnames=("deterministic", "with_aux"))
_extend = jax.jit(D.extend, static_argnums=0)


# ----------------------------------------------------------------------------- reference


def _np_softmax(z, axis=-1):
    z = np.exp(z - z.max(axis, keepdims=True))
    return z / z.sum(axis, keepdims=True)


def _np_mla(a, p, c):
    """MLA from the DeepSeek-V2 equations (no absorption), float64; a [B, T, D]."""
    b, t, _ = a.shape
    h, dh, dr, dq = c.n_heads, c.head_dim, c.mla.rope_dim, c.mla.q_rank
    cq = a @ p["q_down"]["kernel"] if dq else a
    qc = (cq @ p["q_up" if dq else "q"]["kernel"]).reshape(b, t, h, dh)
    qr = _np_rope((cq @ p["q_rope"]["kernel"]).reshape(b, t, h, dr), c.rope_base)
    ckv = a @ p["kv_down"]["kernel"]  # [B, T, d_c]
    kc = (ckv @ p["k_up"]["kernel"]).reshape(b, t, h, dh)
    v = (ckv @ p["v_up"]["kernel"]).reshape(b, t, h, dh)
    kr = _np_rope((a @ p["k_rope"]["kernel"])[:, :, None, :], c.rope_base)[:, :, 0]
    s = np.einsum("bqhd,bkhd->bhqk", qc, kc) + np.einsum("bqhr,bkr->bhqk", qr, kr)
    s = np.where(np.tril(np.ones((t, t), bool)), s / math.sqrt(dh + dr), -np.inf)
    y = np.einsum("bhqk,bkhd->bqhd", _np_softmax(s), v).reshape(b, t, h * dh)
    return y @ p["o"]["kernel"], s.max(axis=(0, 2, 3))  # and each head's max logit


def _np_ffn(x, w_in, w_gate, w_out):
    if w_gate is None:
        return _np_gelu(x @ w_in) @ w_out
    g = x @ w_gate
    return (g / (1 + np.exp(-g)) * (x @ w_in)) @ w_out


def _np_moe(x, p, c, cap):
    """Per-token loop: top-k of the router softmax, slots claimed in position order."""
    m = c.moe
    ex, sh = p["experts"], p.get("shared")
    b, t, _ = x.shape
    out, dropped = np.zeros_like(x), 0
    for i in range(b):
        used = np.zeros(m.experts, int)
        for j in range(t):
            probs = _np_softmax(x[i, j] @ p["router"]["kernel"])
            y = 0.0
            if sh is not None:
                gate = sh.get("w_gate", {}).get("kernel")
                y = _np_ffn(x[i, j], sh["w_in"]["kernel"], gate, sh["w_out"]["kernel"])
            for e in np.argsort(-probs)[: m.top_k]:
                if used[e] < cap:
                    gate = ex["w_gate"][e] if "w_gate" in ex else None
                    y = y + probs[e] * _np_ffn(x[i, j], ex["w_in"][e], gate, ex["w_out"][e])
                else:
                    dropped += 1
                used[e] += 1
            out[i, j] = y
    return out, dropped / (b * t * m.top_k)


def _np_model(params, c, tokens, cap):
    """Float64 forward of an MLA and/or MoE decoder (RMSNorm, RoPE, untied head)."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    x = p["embed"]["embedding"][np.asarray(tokens)]
    drops, tops = [], []
    for i in range(c.n_layers):
        lp = p["layers"][i]
        y, top = _np_mla(_np_norm(x, lp["attn_norm"], c.norm, c.norm_eps), lp["attn"], c)
        x, tops = x + y, tops + [top]
        y, dropped = _np_moe(_np_norm(x, lp["mlp_norm"], c.norm, c.norm_eps), lp["mlp"], c, cap)
        x, drops = x + y, drops + [dropped]
    logits = _np_norm(x, p["final_norm"], c.norm, c.norm_eps) @ p["head"]["kernel"]
    return logits, np.mean(drops), np.stack(tops)


# ----------------------------------------------------------------------------- forward


def test_mla_moe_forward_matches_float64_reference():
    graphdef, params = T.init(MLA_MOE, jax.random.key(1))
    params = _randomise(params, 2)
    tokens = _tokens(3, 2, 19, MLA_MOE.vocab_size)
    logits, aux = _apply(graphdef, params, tokens, with_aux=True)
    cap = math.ceil(0.75 * 19 * 2 / 4)  # capacity per sequence: ceil(cf T k / E) = 8
    ref, dropped, tops = _np_model(params, MLA_MOE, tokens, cap)
    assert dropped > 0.1  # 38 choices for 32 slots: capacity is exercised
    np.testing.assert_allclose(np.asarray(logits), ref, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(np.asarray(aux["max_logit"]), tops, rtol=2e-4, atol=2e-4)
    assert float(aux["moe_drop_fraction"]) == pytest.approx(dropped, abs=1e-6)


def test_load_balancing_loss_closed_form():
    # Router = identity and inputs = log-probabilities, so the router softmax is p exactly
    # (k = 1). Sequence 0 sends tokens 0, 1 to expert 0 and tokens 2, 3 to expert 1:
    # f = (1/2, 1/2, 0, 0), P = (0.4, 0.4, 0.1, 0.1), L = E sum f P = 4 x 0.4 = 1.6.
    # Sequence 1 sends all to expert 2 with p = 0.7: L = 4 x 0.7 = 2.8. Sequence 2 is
    # uniform (P_i = 1/4): L = 1 whatever f is. Per-sequence mean: (1.6 + 2.8 + 1) / 3.
    config = T.preset("tiny", d_model=4, n_heads=2, moe=dict(experts=4, top_k=1, d_expert=3))
    moe = MoE(config, rngs=nnx.Rngs(params=0))
    moe.router.kernel[...] = jnp.eye(4)
    a, b, c = [0.7, 0.1, 0.1, 0.1], [0.1, 0.7, 0.1, 0.1], [0.1, 0.1, 0.7, 0.1]
    x = np.log(np.array([[a, a, b, b], [c] * 4, [[0.25] * 4] * 4]))
    _, aux = nnx.jit(lambda m, x: m(x))(moe, jnp.asarray(x, jnp.float32))
    assert float(aux["moe_lb_loss"]) == pytest.approx((1.6 + 2.8 + 1.0) / 3, rel=1e-5)
    assert float(aux["moe_drop_fraction"]) == 0.0  # dropless (capacity_factor = 0)


# ----------------------------------------------------------------------------- decoding


def _dropless(config):
    """Decoding never drops tokens; the full forward matches it when it does not either."""
    return config.replace(moe=dataclasses.replace(config.moe, capacity_factor=0.0))


@pytest.fixture(scope="module")
def dropless_mla_moe():
    config = _dropless(MLA_MOE)
    graphdef, params = T.init(config, jax.random.key(8))
    return config, graphdef, _randomise(params, 9)


@pytest.mark.parametrize("kind", ["mha", "mha_learned", "mla_moe"])
def test_cached_decoding_equals_full_forward(kind, dropless_mla_moe):
    if kind == "mla_moe":  # MLA with compressed queries, SwiGLU experts, a shared expert
        config, graphdef, params = dropless_mla_moe
    else:  # RoPE, qk_norm, a top-1 GELU MoE; or learned positions, LayerNorm, tied head
        config = _dropless(MHA_MOE.replace(qk_norm=True))
        if kind == "mha_learned":
            config = T.preset("tiny", position="learned", norm="layernorm", tied_head=True)
        graphdef, params = T.init(config, jax.random.key(8))
        params = _randomise(params, 9)
    tokens = _tokens(10, 3, 19, config.vocab_size)
    full = np.asarray(_apply(graphdef, params, tokens))
    cache = D.init_cache(config, 3, 19)
    logits, cache = _extend(graphdef, params, tokens[:, :6], cache, 0)  # prefill 6
    rows = [np.asarray(logits)]
    for t in range(6, 19):  # then one token at a time
        logits, cache = _extend(graphdef, params, tokens[:, t : t + 1], cache, t)
        rows.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(rows, axis=1), full, rtol=1e-4, atol=1e-4)


def test_cache_bytes_per_token():
    h, dh = 3, 8
    assert D.cache_bytes_per_token(T.preset("tiny"), per_layer=True) == 2 * h * dh * 4
    assert D.cache_bytes_per_token(MLA, per_layer=True) == (10 + 4) * 4
    assert D.cache_bytes_per_token(MLA.replace(dtype="bfloat16")) == 2 * (10 + 4) * 2
    for config in (T.preset("tiny"), MLA):  # the arrays themselves
        cache = D.init_cache(config, 2, 7)
        total = sum(a.nbytes for layer in cache for a in layer.values())
        assert total == 2 * 7 * D.cache_bytes_per_token(config)


def test_generate_greedy_is_argmax_of_full_forward(dropless_mla_moe):
    config, graphdef, params = dropless_mla_moe
    prompt = _tokens(13, 3, 4, config.vocab_size)
    out = D.generate(graphdef, params, prompt, 15, key=jax.random.key(0), temperature=0.0)
    assert out.shape == (3, 19)
    np.testing.assert_array_equal(np.asarray(out[:, :4]), np.asarray(prompt))
    # Reference: the full forward of the result; token t+1 is the argmax at position t.
    full = np.asarray(_apply(graphdef, params, out))
    np.testing.assert_array_equal(np.asarray(out[:, 4:]), full[:, 3:-1].argmax(-1))
    a = D.generate(graphdef, params, prompt, 15, key=jax.random.key(1), top_k=3)
    b = D.generate(graphdef, params, prompt, 15, key=jax.random.key(1), top_k=3)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(a), np.asarray(out))
    with pytest.raises(ValueError, match="max_new_tokens"):
        D.generate(graphdef, params, prompt, 0, key=jax.random.key(0))


def test_sample_logits_top_k_and_temperature():
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
    draws = jax.vmap(lambda k: D.sample_logits(logits, k, 1.0, 2))(
        jax.random.split(jax.random.key(0), 4000)
    )
    freq = np.bincount(np.asarray(draws).ravel(), minlength=4) / 4000
    np.testing.assert_allclose(freq, [0.625, 0.375, 0, 0], atol=0.03)  # renormalised top 2
    assert int(D.sample_logits(logits, jax.random.key(0), 0.0)[0]) == 0


# ----------------------------------------------------------------------------- roles, Muon


def test_roles_of_new_parameters_and_scanned_paths():
    params = jax.eval_shape(lambda: T.init_params(MLA_MOE, jax.random.key(0)))
    roles = T.param_roles(params)
    layer = roles["layers"][0]
    assert {k: v["kernel"] for k, v in layer["attn"].items()} == {
        r: r for r in ("q_down", "q_up", "q_rope", "kv_down", "k_up", "v_up", "k_rope", "o")
    }
    assert layer["mlp"]["router"]["kernel"] == "router"
    assert layer["mlp"]["experts"] == {
        "w_in": "expert_w_in", "w_gate": "expert_w_gate", "w_out": "expert_w_out"
    }  # fmt: skip
    assert layer["mlp"]["shared"]["w_gate"]["kernel"] == "shared_w_gate"
    assert params["layers"][0]["mlp"]["experts"]["w_in"].shape == (4, 24, 14)
    # scanned layout (no layer index, a leading [L] axis on the leaves) reads the same
    assert T.role_of("layers/attn/kv_down/kernel") == "kv_down"
    assert T.role_of("layers/mlp/experts/w_out") == "expert_w_out"
    for bad in (
        "layers/0/mlp/experts/q",
        "layers/0/mlp/router/bias",
        "layers/0/attn/router/kernel",
    ):
        with pytest.raises(ValueError, match="cannot classify"):
            T.role_of(bad)
    table = optim.routing_table(params, {"hidden": "muon", "rest": "adam"}, T.role_of)
    by_role = {r.role: r.transform for r in table}
    assert by_role["router"] == "rest" and by_role["expert_w_in"] == "hidden"
    assert by_role["kv_down"] == by_role["v_up"] == "hidden"
    qk, vo, ffn = (set(optim.parse_spec(g, T.role_of)) for g in ("qk", "vo", "ffn"))
    assert {"q_down", "kv_down", "k_up", "k_rope"} <= qk and {"v_up", "o"} <= vo
    assert {"expert_w_out", "shared_w_in"} <= ffn and "router" not in qk | vo | ffn


def _np_polar(g):
    u, _, vt = np.linalg.svd(g, full_matrices=False)
    return u @ vt


def test_muon_orthogonalises_each_expert_separately():
    rng = np.random.default_rng(0)
    g = rng.normal(size=(4, 24, 14))  # [E, D, F]
    grads = {"experts": jnp.asarray(g, jnp.float32)}
    tx = optim.muon(0.1, momentum=0.0, orthogonalizer="polar", shape_scale="none",
                    matrix_axes=(-2, -1))  # fmt: skip
    upd, _ = tx.update(grads, tx.init(grads))
    ref = np.stack([-0.1 * _np_polar(g[e]) for e in range(4)])  # loop over experts
    np.testing.assert_allclose(np.asarray(upd["experts"]), ref, atol=1e-5)
    # Newton-Schulz with momentum and the jordan scale: the stacked leaf equals a loop of
    # the same optimizer over the experts as separate 2-D leaves, over two steps.
    kw = dict(momentum=0.9, shape_scale="jordan")
    stacked = optim.muon(0.1, matrix_axes=(-2, -1), **kw)
    looped = optim.muon(0.1, **kw)
    per = {str(e): jnp.asarray(g[e], jnp.float32) for e in range(4)}
    s1, s2 = stacked.init(grads), looped.init(per)
    for scale in (1.0, -0.5):
        u1, s1 = stacked.update(jax.tree.map(lambda x, c=scale: c * x, grads), s1)
        u2, s2 = looped.update(jax.tree.map(lambda x, c=scale: c * x, per), s2)
        np.testing.assert_allclose(
            np.asarray(u1["experts"]), np.stack([u2[str(e)] for e in range(4)]), atol=1e-5
        )
    assert optax.tree.norm(u1) > 0


# ----------------------------------------------------------------------------- validation


def test_config_validation():
    with pytest.raises(ValueError, match="attention"):
        T.preset("tiny", attention="gqa")
    with pytest.raises(ValueError, match="position='rope'"):
        T.preset("tiny", attention="mla", position="learned")
    with pytest.raises(ValueError, match="mla.rope_dim must be even"):
        T.preset("tiny", attention="mla", mla=dict(rope_dim=3))
    with pytest.raises(ValueError, match="moe.top_k=3 must be <= moe.experts=2"):
        T.preset("tiny", moe=dict(experts=2, top_k=3))
    with pytest.raises(ValueError, match="capacity_factor"):
        T.preset("tiny", moe=dict(experts=2, capacity_factor=-1.0))
    assert (T.preset("tiny", attention="mla").mla_dims.kv_rank, MLA.mla_dims.q_rank) == (32, 12)
    with pytest.raises(ValueError, match="vo_maps needs attention='mha'"):
        T.vo_maps(jax.eval_shape(lambda: T.init_params(MLA, jax.random.key(0))), MLA)
