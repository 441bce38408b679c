"""SignGD / Signum against a numpy loop."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from amemory.optim import signgd, signum


def test_signgd_is_lr_times_sign():
    g = {"w": jnp.array([[2.0, -3.0], [0.0, 1e-9]])}
    tx = signgd(0.1)
    u, _ = tx.update(g, tx.init(g))
    np.testing.assert_array_equal(u["w"], -0.1 * np.sign(np.asarray(g["w"])))


def test_signum_matches_numpy_loop_with_schedule():
    rng = np.random.default_rng(0)
    grads = rng.standard_normal((6, 5)).astype(np.float32)
    sched = optax.linear_schedule(0.1, 0.05, 6)
    tx = signum(sched, beta=0.8)
    state = tx.init(jnp.zeros(5))
    update = jax.jit(tx.update)
    m = np.zeros(5)
    for t, g in enumerate(grads):
        u, state = update(jnp.asarray(g), state)
        m = 0.8 * m + 0.2 * g
        np.testing.assert_allclose(u, -float(sched(t)) * np.sign(m), rtol=1e-6)


def test_signum_bad_beta():
    with pytest.raises(ValueError, match="beta"):
        signum(0.1, beta=1.0)


def test_signum_beta_is_injectable_under_jit():
    """optax.inject_hyperparams passes beta as a traced array (float(beta) used to fail)."""
    rng = np.random.default_rng(1)
    grads = rng.standard_normal((4, 3)).astype(np.float32)
    tx = optax.inject_hyperparams(signum)(learning_rate=0.1, beta=0.8)
    state = tx.init(jnp.zeros(3))
    update = jax.jit(tx.update)
    m = np.zeros(3)
    for t, g in enumerate(grads):
        if t == 2:
            state.hyperparams["beta"] = jnp.asarray(0.5)
        u, state = update(jnp.asarray(g), state, jnp.zeros(3))
        beta = 0.8 if t < 2 else 0.5
        m = beta * m + (1 - beta) * g
        np.testing.assert_allclose(u, -0.1 * np.sign(m), rtol=1e-6)
