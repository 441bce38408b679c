"""Property-based invariants of the one-layer memory theory (hypothesis, with shrinking).

Each property runs on generated priors, sizes, matrices and step counts against an
independent numpy reference (SVD polar factor, per-column softmax, a dense task-space
loop). ``derandomize=True`` fixes the examples (the seed is hypothesis' derived one, so a
failure reproduces); ``deadline=None`` because the first example compiles.
Sources: Wang et al. 2025 (arXiv 2509.26030) Thm 5.3; Li et al. 2026 (arXiv 2602.05725).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from amemory.analysis import group_symmetric, one_step
from amemory.models import memory

SETTINGS = settings(max_examples=200, deadline=None, derandomize=True, database=None)


def priors(min_k=3, max_k=9):
    """Positive priors [K] (normalised), mass ratios up to 1e3."""
    return st.lists(st.floats(1e-3, 1.0), min_size=min_k, max_size=max_k).map(
        lambda w: np.asarray(w) / np.sum(w)
    )


def polar(g: np.ndarray) -> np.ndarray:
    """Reference msign: U Vᵀ over the singular values above 1e-6 of the largest (numpy)."""
    u, s, vt = np.linalg.svd(g, full_matrices=False)
    keep = s > 1e-6 * s[0]
    return u[:, keep] @ vt[keep]


def grad0(p: np.ndarray) -> np.ndarray:
    """Task-space gradient at W = 0 (E = Ẽ = I): column k is p_k (1/K - e_k)."""
    K = p.size
    return (np.full((K, K), 1.0 / K) - np.eye(K)) * p[None, :]


def correct_after(update: np.ndarray, eta: float) -> np.ndarray:
    """Correct-class probabilities of W = eta * update (E = Ẽ = I), numpy softmax per column."""
    z = eta * update
    z = z - z.max(axis=0)
    return np.diagonal(np.exp(z) / np.exp(z).sum(axis=0))


@functools.partial(jax.jit, static_argnums=0)
def _update(name: str, p: jax.Array) -> jax.Array:
    E, Et = memory.decoupled(p.shape[0])
    g = jax.grad(memory.population_loss)(jnp.zeros((p.shape[0],) * 2), E, Et, p)
    return one_step.unit_update(name, g)


def amemory_update(name: str, p: np.ndarray) -> np.ndarray:
    """amemory's unit update of ``name`` at W = 0 with decoupled embeddings (float32)."""
    return np.asarray(_update(name, jnp.asarray(p, jnp.float32)), dtype=np.float64)


@jax.jit
def _signgd_task_step(E: jax.Array, Et: jax.Array, p: jax.Array) -> jax.Array:
    g = jax.grad(memory.population_loss)(jnp.zeros((p.shape[0],) * 2), E, Et, p)
    return memory.task_space(one_step.unit_update("signgd", g), E, Et)


_msign = jax.jit(lambda x: -one_step.unit_update("muon", x))


@SETTINGS
@given(priors(), st.randoms(use_true_random=False), st.floats(0.5, 8.0))
def test_muon_one_step_balanced_for_any_prior(p, rnd, eta):
    """(a) Thm 5.3: Muon's step (amemory = reference polar of -∇L) gives every class the same
    correct probability up to O(1/K), for any prior; permuting p permutes nothing else."""
    u = amemory_update("muon", p)
    np.testing.assert_allclose(u, -polar(grad0(p)), atol=2e-5)
    q = correct_after(u, eta)
    perm = np.array(rnd.sample(range(p.size), p.size))
    q_perm = correct_after(amemory_update("muon", p[perm]), eta)
    np.testing.assert_allclose(q_perm, q[perm], atol=1e-5)
    # the diagonal of msign(X) lies in [1 - 2/K, 1]: spread of logit margins <= 2 eta / K + off
    assert q.max() - q.min() <= 1 - np.exp(-4 * eta / p.size) + 1e-5


@SETTINGS
@given(st.integers(2, 5), st.integers(2, 5), st.integers(0, 2**31 - 1), st.floats(1e-3, 1e3))
def test_msign_equivariant_and_scale_invariant(m, n, seed, s):
    """(b) msign(U G Vᵀ) = U msign(G) Vᵀ and msign(sG) = msign(G), exact polar (1e-5, f32)."""
    rng = np.random.default_rng(seed)
    g = rng.normal(size=(m, n))
    U, _ = np.linalg.qr(rng.normal(size=(m, m)))
    V, _ = np.linalg.qr(rng.normal(size=(n, n)))
    ms = lambda x: np.asarray(_msign(jnp.asarray(x, jnp.float32)))  # noqa: E731
    base = ms(g)
    np.testing.assert_allclose(base, polar(g), atol=1e-4)
    np.testing.assert_allclose(ms(U @ g @ V.T), U @ base @ V.T, atol=1e-4)
    np.testing.assert_allclose(ms(s * g), base, atol=1e-4)


@SETTINGS
@given(priors(6, 6).filter(lambda p: np.ptp(p) > 1e-2), st.integers(0, 2**31 - 1))
def test_signgd_basis_dependence_dichotomy(p, seed):
    """(c) SignGD's task-space step is the same for every signed-permutation (decoupled)
    basis, and differs in the coupled rotation basis (Thm 5.3's dichotomy)."""
    K = p.size
    rng = np.random.default_rng(seed)
    P = np.eye(K)[rng.permutation(K)] * rng.choice([-1.0, 1.0], K)

    def task_step(E, Et):
        args = (jnp.asarray(x, jnp.float32) for x in (E, Et, p))
        return np.asarray(_signgd_task_step(*args))

    ref = -np.sign(grad0(p))
    np.testing.assert_allclose(task_step(np.eye(K), np.eye(K)), ref, atol=1e-5)
    np.testing.assert_allclose(task_step(P, P), ref, atol=1e-5)
    E, Et = memory.coupled_rotation(K)
    assert np.abs(task_step(E, Et) - ref).max() > 1e-2


@SETTINGS
@given(priors(), st.floats(0.1, 50.0))
def test_gd_rates_order_by_frequency(p, eta):
    """(d) Li et al.: after a GD step the correct probability orders as the prior (head
    before tail): q_k = 1/(1 + (K-1) e^{-η p_k}), increasing in p_k."""
    q = correct_after(amemory_update("gd", p), eta)
    np.testing.assert_allclose(q, 1 / (1 + (p.size - 1) * np.exp(-eta * p)), rtol=1e-4)
    order = np.argsort(p, kind="stable")
    assert np.all(np.diff(q[order]) >= -1e-6)


def dense_losses(name, p, lr, steps):
    """Reference: task-space W (E = Ẽ = I) stepped in numpy; population loss per step."""
    K = p.size
    W, out = np.zeros((K, K)), []
    for t in range(steps + 1):
        z = W - W.max(axis=0)
        logq = z - np.log(np.exp(z).sum(axis=0))
        out.append(-np.sum(p * np.diagonal(logq)))
        if t < steps:
            G = (np.exp(logq) - np.eye(K)) * p[None, :]
            W = W - lr * {"gd": G, "signgd": np.sign(G), "muon": polar(G)}[name]
    return np.asarray(out)


@SETTINGS
@given(st.sampled_from(["gd", "muon"]), st.lists(st.floats(0.05, 1.0), min_size=2, max_size=3),
       st.integers(1, 3), st.integers(1, 6), st.floats(0.05, 1.0))  # fmt: skip
def test_group_symmetric_equals_dense(name, masses, C, steps, lr):
    """(e) The group-symmetric reduction's losses equal the dense computation."""
    gp = np.asarray(masses) / np.sum(masses)
    p = np.repeat(gp / C, C)
    red = group_symmetric.final_loss(name, gp, C, 0.0, lr, steps)  # T traced: few compiles
    np.testing.assert_allclose(red, dense_losses(name, p, lr, steps)[-1], rtol=2e-4, atol=2e-5)
