"""The 2026 frontier features of amemory.optim: Hyperball (MuonH / AdamH), QK-Clip,
per-head Muon. Each is checked against a slow numpy reference (a loop over matrices)."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from amemory.optim import hyperball


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
