"""The 2026 frontier features of amemory.optim: Hyperball (MuonH / AdamH), QK-Clip,
per-head Muon. Each is checked against a slow numpy reference (a loop over matrices)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from amemory.optim import hyperball
from amemory.optim.qk_clip import QK_CLIP_EXPONENTS, qk_clip


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


@pytest.mark.parametrize("attention", ["mha", "mla"])
def test_qk_clip_caps_logits_keeps_other_heads_and_decoding(attention):
    """The clip scales each clipped head's logit by exactly tau / max (layer 0, whose input
    it does not change, lands on min(max, tau)); un-clipped heads and every other weight
    stay bit-identical; per-layer and stacked layouts clip alike; KV-cache decoding of the
    clipped model equals its full forward (MLA: absorbed projections)."""
    from amemory.models import decode as D
    from amemory.models import transformer as T
    from amemory.models.matrices import head_view

    config = T.preset("tiny", attention=attention, mla=MLA_DIMS)
    graphdef, params = T.init(config, jax.random.key(0))
    params = jax.tree.map(lambda x: x * 8.0, params)  # logits of order 1
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, config.vocab_size)
    top = T.apply(graphdef, params, tokens, with_aux=True)[1]["max_logit"]  # (L, H)
    tau = float(np.median(np.asarray(top[0])))
    clipped = qk_clip(params, top, tau, T.param_roles(params), head_view(config))
    top2 = T.apply(graphdef, clipped, tokens, with_aux=True)[1]["max_logit"]
    np.testing.assert_allclose(top2[0], np.minimum(top[0], tau), rtol=1e-5)
    gamma = np.minimum(1.0, tau / np.asarray(top, np.float64))
    h = config.n_heads
    for i in range(config.n_layers):
        for role, new in clipped["layers"][i]["attn"].items():
            old, new = (
                np.asarray(params["layers"][i]["attn"][role]["kernel"]),
                np.asarray(new["kernel"]),
            )
            if role not in QK_CLIP_EXPONENTS:
                np.testing.assert_array_equal(new, old)
                continue
            w = old.shape[1] // h
            for head in range(h):
                cols = slice(head * w, (head + 1) * w)
                if gamma[i, head] == 1.0:
                    np.testing.assert_array_equal(new[:, cols], old[:, cols])
                else:
                    want = old[:, cols] * gamma[i, head] ** QK_CLIP_EXPONENTS[role]
                    np.testing.assert_allclose(new[:, cols], want, rtol=1e-6)
    stacked = T.stack_layers(params)
    clipped_s = qk_clip(stacked, top, tau, T.param_roles(stacked), head_view(config))
    chex.assert_trees_all_equal(clipped_s, T.stack_layers(clipped))
    logits = T.apply(graphdef, clipped, tokens)
    cache = D.init_cache(config, 2, 9)
    _, cache = D.extend(graphdef, clipped, tokens[:, :6], cache, 0)
    out = D.extend(graphdef, clipped, tokens[:, 6:], cache, 6)[0]
    np.testing.assert_allclose(out, logits[:, 6:], rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="tau"):
        qk_clip(params, top, 0.0, T.param_roles(params), head_view(config))
