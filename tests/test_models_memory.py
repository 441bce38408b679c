"""amemory.models.memory against numpy references and docs/science.md's closed forms."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from amemory.models import memory


def _np_rotation(a, b, c):
    """R_z(a) R_y(b) R_z(c), built independently of the module's row formula."""

    def rz(t):
        return np.array([[math.cos(t), -math.sin(t), 0], [math.sin(t), math.cos(t), 0], [0, 0, 1]])

    def ry(t):
        return np.array([[math.cos(t), 0, math.sin(t)], [0, 1, 0], [-math.sin(t), 0, math.cos(t)]])

    return rz(a) @ ry(b) @ rz(c)


def _two_level(K, L, alpha):
    p = np.full(K, (1 - alpha) / (K - L))
    p[:L] = alpha / L
    return p


def _np_population_loss(W, E, Et, prior, noise):
    z = (Et.T @ W @ E).T  # [K queries, K answers]
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    K = len(prior)
    target = (1 - noise) * np.eye(K) + noise / K
    return -np.sum(prior[:, None] * target * logp)


def test_coupled_rotation_matches_definition_and_is_orthonormal():
    K = 12
    with jax.enable_x64(True):
        E, Et = memory.coupled_rotation(K)
        assert E.dtype == jnp.float64
    ref_e = np.kron(np.eye(K // 3), _np_rotation(1.715, 0.876, 3.098))
    ref_et = np.kron(np.eye(K // 3), _np_rotation(3.638, 2.949, 5.218))
    np.testing.assert_allclose(np.asarray(E), ref_e, atol=1e-14)
    np.testing.assert_allclose(np.asarray(Et), ref_et, atol=1e-14)
    for m in (ref_e, ref_et, np.asarray(E), np.asarray(Et)):
        np.testing.assert_allclose(m.T @ m, np.eye(K), atol=1e-12)
    # Block structure: entries outside the 3x3 diagonal blocks are exactly zero.
    mask = np.kron(np.eye(K // 3), np.ones((3, 3)))
    assert np.all(np.asarray(E)[mask == 0] == 0)
    # zyz_rotation rows equal the ZYZ composition.
    np.testing.assert_allclose(
        memory.zyz_rotation(0.3, 1.1, -2.0), _np_rotation(0.3, 1.1, -2.0), atol=1e-14
    )


@pytest.mark.parametrize("bad", [0, 4, 10, -3, 3.0])
def test_coupled_rotation_rejects_bad_K(bad):
    with pytest.raises(ValueError, match="K"):
        memory.coupled_rotation(bad)


@pytest.mark.parametrize("builder", ["decoupled", "coupled_rotation", "random_orthonormal"])
def test_loss_and_gradient_at_zero_match_closed_form(builder):
    K, L, alpha = 9, 2, 0.8
    with jax.enable_x64(True):
        if builder == "decoupled":
            E, Et = memory.decoupled(K)
        elif builder == "coupled_rotation":
            E, Et = memory.coupled_rotation(K)
        else:
            E, Et = memory.random_orthonormal(K, K + 4, jax.random.key(0))
        prior = jnp.asarray(_two_level(K, L, alpha))
        W0 = jnp.zeros((Et.shape[0], E.shape[0]))
        loss, grad = jax.value_and_grad(memory.population_loss)(W0, E, Et, prior)
        assert loss.dtype == jnp.float64
        p = np.asarray(prior)
        X = np.diag(p) - np.outer(np.ones(K), p) / K
        expected = -np.asarray(Et) @ X @ np.asarray(E).T
        np.testing.assert_allclose(float(loss), math.log(K), rtol=1e-13)
        np.testing.assert_allclose(np.asarray(grad), expected, atol=1e-14)
        # With label noise the gradient at 0 is scaled by (1 - noise) and the loss is log K.
        noisy_loss, noisy_grad = jax.value_and_grad(memory.population_loss)(W0, E, Et, prior, 0.3)
        np.testing.assert_allclose(float(noisy_loss), math.log(K), rtol=1e-13)
        np.testing.assert_allclose(np.asarray(noisy_grad), 0.7 * expected, atol=1e-14)


def test_singular_values_of_X_match_prop_F3():
    """Prop. F.3 of arXiv 2509.26030 (docs/science.md): singular values of the gradient at 0."""
    K, L, alpha = 12, 3, 0.8
    with jax.enable_x64(True):
        E, Et = memory.coupled_rotation(K)
        prior = jnp.asarray(_two_level(K, L, alpha))
        g = jax.grad(memory.population_loss)(jnp.zeros((K, K)), E, Et, prior)
    s = np.sort(np.linalg.svd(np.asarray(g), compute_uv=False))
    a, b = alpha / L, (1 - alpha) / (K - L)
    ref = np.sort(
        [a] * (L - 1) + [b] * (K - L - 1) + [math.sqrt((a**2 * (K - L) + b**2 * L) / K), 0]
    )
    np.testing.assert_allclose(s, ref, atol=1e-13)


def test_population_loss_random_W_matches_numpy():
    K, d_in, d_out = 7, 11, 13
    rng = np.random.default_rng(1)
    W = rng.normal(size=(d_out, d_in))
    with jax.enable_x64(True):
        E, Et = memory.gaussian(K, d_in, jax.random.key(1))
        _, Et = memory.gaussian(K, d_out, jax.random.key(2))
        prior = rng.dirichlet(np.ones(K))
        for noise in (0.0, 0.25):
            got = memory.population_loss(jnp.asarray(W), E, Et, jnp.asarray(prior), noise)
            ref = _np_population_loss(W, np.asarray(E), np.asarray(Et), prior, noise)
            np.testing.assert_allclose(float(got), ref, rtol=1e-12)
        # logits / task_space / probabilities conventions.
        ts = np.asarray(Et).T @ W @ np.asarray(E)
        np.testing.assert_allclose(np.asarray(memory.task_space(W, E, Et)), ts, rtol=1e-12)
        np.testing.assert_allclose(np.asarray(memory.logits(W, E, Et)), ts.T, rtol=1e-12)
        probs = np.asarray(memory.probabilities(W, E, Et))
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-12)
        np.testing.assert_allclose(
            np.asarray(memory.correct_probabilities(W, E, Et)), np.diagonal(probs)
        )
        # Sampled loss: averaging over every (query, answer) pair weighted by counts
        # reproduces the population loss exactly.
        counts = np.array([3, 1, 2, 5, 1, 4, 2])
        queries = np.repeat(np.arange(K), counts)
        sampled = memory.sampled_loss(W, E, Et, jnp.asarray(queries), jnp.asarray(queries))
        ref = _np_population_loss(W, np.asarray(E), np.asarray(Et), counts / counts.sum(), 0.0)
        np.testing.assert_allclose(float(sampled), ref, rtol=1e-12)


def test_float32_default_and_jit():
    E, Et = memory.decoupled(5)
    assert E.dtype == jnp.float32
    prior = jnp.full((5,), 0.2)
    W = jnp.ones((5, 5)) * 0.1
    f = jax.jit(memory.population_loss)
    chex.assert_trees_all_close(
        f(W, E, Et, prior, 0.1), memory.population_loss(W, E, Et, prior, 0.1)
    )


def test_builders_properties_and_errors():
    with jax.enable_x64(True):
        E, Et = memory.random_orthonormal(6, 10, jax.random.key(3))
        chex.assert_shape((E, Et), (10, 6))
        np.testing.assert_allclose(np.asarray(E.T @ E), np.eye(6), atol=1e-12)
        np.testing.assert_allclose(np.asarray(Et.T @ Et), np.eye(6), atol=1e-12)
        assert float(jnp.max(jnp.abs(E - Et))) > 0.1  # independent
        for c in (0.0, 0.3, -0.1):
            E, Et = memory.coherent(8, 9, c, jax.random.key(4))
            gram = np.asarray(E.T @ E)
            np.testing.assert_allclose(gram, (1 - c) * np.eye(8) + c, atol=1e-12)
            off = np.abs(gram[~np.eye(8, dtype=bool)])  # mutual coherence (unit-norm keys)
            np.testing.assert_allclose(off.max(), abs(c), atol=1e-12)
            np.testing.assert_allclose(np.asarray(Et.T @ Et), np.eye(8), atol=1e-12)
        E, Et = memory.gaussian(50, 20, jax.random.key(5))  # d < K allowed
        chex.assert_shape((E, Et), (20, 50))
        norms = np.linalg.norm(np.asarray(E), axis=0)
        assert 0.5 < norms.mean() < 1.5
    with pytest.raises(ValueError, match="d >= K"):
        memory.random_orthonormal(6, 5, jax.random.key(0))
    with pytest.raises(ValueError, match="d >= K"):
        memory.coherent(6, 5, 0.1, jax.random.key(0))
    with pytest.raises(ValueError, match="coherence"):
        memory.coherent(6, 6, 1.0, jax.random.key(0))
    with pytest.raises(ValueError, match="coherence"):
        memory.coherent(6, 6, -0.5, jax.random.key(0))
    with pytest.raises(ValueError, match="K"):
        memory.decoupled(0)
    E, Et = memory.decoupled(4)
    with pytest.raises(ValueError, match="E must be"):
        memory.logits(jnp.zeros((4, 3)), E, Et)
    with pytest.raises(ValueError, match="prior"):
        memory.population_loss(jnp.zeros((4, 4)), E, Et, jnp.ones(3) / 3)
    with pytest.raises(ValueError, match="noise"):
        memory.population_loss(jnp.zeros((4, 4)), E, Et, jnp.ones(4) / 4, 1.5)
    with pytest.raises(ValueError, match="queries"):
        memory.sampled_loss(jnp.zeros((4, 4)), E, Et, jnp.zeros((2,), int), jnp.zeros((3,), int))
