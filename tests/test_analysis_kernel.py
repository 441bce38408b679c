"""The science kernel (amemory.analysis.one_step, signgd_blocks, group_symmetric) against
independent slow references: dense numpy computations, closed forms, brute-force searches."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from amemory.analysis import group_symmetric as gs
from amemory.analysis import one_step, scaling, signgd_blocks

# Paper A's SignGD counter-example rotations (Wang et al. 2025, arXiv 2509.26030), written
# out here in numpy so the reference does not depend on amemory.models.
KEY_ANGLES, VALUE_ANGLES = (1.715, 0.876, 3.098), (3.638, 2.949, 5.218)


def _zyz(a, b, c):
    rz = lambda t: np.array([[np.cos(t), -np.sin(t), 0], [np.sin(t), np.cos(t), 0], [0, 0, 1]])
    ry = np.array([[np.cos(b), 0, np.sin(b)], [0, 1, 0], [-np.sin(b), 0, np.cos(b)]])
    return rz(a) @ ry @ rz(c)


RK, RV = _zyz(*KEY_ANGLES), _zyz(*VALUE_ANGLES)


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def _softmax_rows(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def _two_level(K, L, alpha=0.8):
    return np.r_[np.full(L, alpha / L), np.full(K - L, (1 - alpha) / (K - L))]


def _dense_signgd_q(K, L, etas):
    """Dense reference: q_k(η) after one SignGD step, all K classes (numpy, O(K³))."""
    p = _two_level(K, L)
    E, Et = np.kron(np.eye(K // 3), RK), np.kron(np.eye(K // 3), RV)
    neg_grad = Et @ (np.diag(p) - np.outer(np.ones(K), p) / K) @ E.T  # -∇L(0) = Ẽ X Eᵀ
    dhat = Et.T @ np.sign(neg_grad) @ E  # [answer, query]
    return np.stack([np.diag(_softmax_rows(e * dhat.T)) for e in etas])


# ----------------------------------------------------------------------------- signgd_blocks


@pytest.mark.parametrize(("K", "L"), [(60, 12), (60, 13), (63, 14), (99, 19)])
def test_signgd_reduction_equals_dense(K, L):
    etas = np.array([0.3, 2.0, 9.0])
    m = signgd_blocks.block_margins(K, L, 0.8, RK, RV)
    red = signgd_blocks.per_class(m, signgd_blocks.correct_probabilities(m, etas))
    np.testing.assert_allclose(red, _dense_signgd_q(K, L, etas), atol=1e-13)
    assert sum(m.counts) == K and len(m.names) == 3 * (2 + (L % 3 > 0))


def test_signgd_first_crossing_matches_dense_bisection():
    K, L, eps = 60, 13, 0.01
    lo, hi = 0.0, 50.0  # independent bisection on the dense computation
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if _dense_signgd_q(K, L, [mid])[0].max() >= 1 - eps else (mid, hi)
    want = _dense_signgd_q(K, L, [hi])[0].min()
    got = signgd_blocks.first_crossing(signgd_blocks.block_margins(K, L, 0.8, RK, RV), eps)
    np.testing.assert_allclose(got.eta_boundary, hi, rtol=1e-10)
    np.testing.assert_allclose(got.rho_boundary, want, rtol=1e-8)


def test_signgd_mass_split_and_asymptotics():
    m = signgd_blocks.block_margins(15 * 10**6, 3 * 10**6, 0.8, RK, RV)
    q = signgd_blocks.correct_probabilities(m, [4.0])[0]
    lost_in, lost_off = signgd_blocks.mass_split(m, 4.0)
    np.testing.assert_allclose(q + lost_in + lost_off, 1.0, rtol=1e-12)
    # the asymptotic K-exponent against the measured slope between K = 1.5e80 and 1.5e81
    # (in the far limit the sub-leading terms weigh < 1e-3)
    big = [signgd_blocks.block_margins(15 * 10**e, 3 * 10**e, 0.8, RK, RV) for e in (80, 81)]
    a = signgd_blocks.asymptotics(big[0])
    rhos = [signgd_blocks.first_crossing(b, 0.01).rho_boundary for b in big]
    slope = math.log(rhos[1] / rhos[0]) / math.log(10)
    assert a.worst == "head0" and a.best == "head2"
    np.testing.assert_allclose(slope, a.k_exponent, atol=2e-3)
    np.testing.assert_allclose(a.k_exponent + a.eps_exponent, -1.0, atol=1e-12)


def test_signgd_blocks_errors():
    with pytest.raises(ValueError, match="multiple of the block size"):
        signgd_blocks.block_margins(61, 12, 0.8, RK, RV)
    with pytest.raises(ValueError, match="L must be"):
        signgd_blocks.block_margins(60, 60, 0.8, RK, RV)
    with pytest.raises(ValueError, match="orthogonal"):
        signgd_blocks.block_margins(60, 12, 0.8, 2 * RK, RV)
    with pytest.raises(ValueError, match="etas"):
        signgd_blocks.correct_probabilities(signgd_blocks.block_margins(60, 12, 0.8, RK, RV), [-1])


# ----------------------------------------------------------------------------- group_symmetric


def _np_task_step(name, W, p_class, noise):
    """One task-space step direction (numpy): -G, -sign(G) or -msgn(G) (K·eps zero rule)."""
    K = W.shape[0]
    probs = _softmax_rows(W.T).T  # [i, j] = p̂(i|j)
    target = (1 - noise) * np.eye(K) + noise / K
    G = (probs - target) * p_class[None, :]
    if name == "gd":
        return -G
    if name == "signgd":
        return -np.sign(G)
    u, s, vt = np.linalg.svd(G)
    keep = s > K * np.finfo(float).eps * s[0]
    return -(u[:, keep] @ vt[keep])


def _np_loss(W, p_class, noise):
    K = W.shape[0]
    logp = np.log(_softmax_rows(W.T).T)
    target = (1 - noise) * np.eye(K) + noise / K
    return float(-np.sum(p_class[None, :] * target * logp))


@pytest.mark.parametrize(("name", "lr"), [("gd", 30.0), ("signgd", 0.1), ("muon", 0.3)])
def test_group_reduction_equals_dense_numpy(x64, name, lr):
    M, C, noise, steps = 3, 5, 0.1, 12
    pg = np.array([0.6, 0.3, 0.1])
    p_class = np.repeat(pg / C, C)
    W, want = np.zeros((M * C, M * C)), []
    for _ in range(steps + 1):
        want.append(_np_loss(W, p_class, noise))
        W = W + lr * _np_task_step(name, W, p_class, noise)
    losses, state = gs.run(name, pg, C, noise, lr, steps)
    np.testing.assert_allclose(losses, want, rtol=1e-11, atol=1e-13)
    _, resid = gs.project(jax.numpy.asarray(gs.expand(state, C)), M, C)
    assert float(resid) < 1e-12
    np.testing.assert_allclose(gs.final_loss(name, pg, C, noise, lr, steps), losses[-1], rtol=1e-12)


def test_group_project_detects_asymmetry(x64):
    rng = np.random.default_rng(0)
    W = jax.numpy.asarray(rng.standard_normal((6, 6)))
    state, resid = gs.project(W, 3, 2)
    # the residual is the distance to the least-squares projection, recomputed in numpy
    w = np.asarray(W)
    B = np.array([[w[2 * g : 2 * g + 2, 2 * h : 2 * h + 2][~np.eye(2, dtype=bool)].mean()
                   for h in range(3)] for g in range(3)])  # fmt: skip
    np.testing.assert_allclose(np.asarray(state.B), B, rtol=1e-12)
    assert float(resid) > 0.1
    with pytest.raises(ValueError, match="optimizer"):
        gs.run("adam", [1.0], 2, 0.0, 0.1, 3)


# ----------------------------------------------------------------------------- one_step


def test_unit_update_matches_numpy(x64):
    rng = np.random.default_rng(1)
    g = rng.standard_normal((5, 7))  # rectangular, distinct dims
    u, _, vt = np.linalg.svd(g, full_matrices=False)
    want = {"gd": -g, "signgd": -np.sign(g), "muon": -(u @ vt)}
    for name, ref in want.items():
        np.testing.assert_allclose(
            one_step.unit_update(name, jax.numpy.asarray(g)), ref, atol=1e-12
        )
    with pytest.raises(ValueError, match="optimizer must be one of"):
        one_step.unit_update("adam", g)


def test_gd_closed_form_and_first_crossing(x64):
    K, eps = 40, 0.02
    p = _two_level(K, 8)
    # brute force: one GD step from 0 gives q_k = 1/(1 + (K-1) e^{-η p_k}); bisect the
    # crossing of max q and read min q there
    q = lambda eta: 1 / (1 + (K - 1) * np.exp(-eta * p))
    lo, hi = 0.0, 1e4
    for _ in range(300):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if q(mid).max() >= 1 - eps else (mid, hi)
    brute = q(hi).min()
    np.testing.assert_allclose(one_step.gd_one_step_rho(p, eps), brute, rtol=1e-10)
    # the kernel's search on the task-space GD update X = diag(p) - (1/K) 1 pᵀ
    dhat = np.diag(p) - np.outer(np.ones(K), p) / K
    r = one_step.first_crossing_rho(dhat, eps)
    np.testing.assert_allclose(r.rho_boundary, brute, rtol=1e-9)
    with pytest.raises(ValueError, match="margins"):
        one_step.first_crossing_rho(-np.eye(3), eps)


# ----------------------------------------------------------------------------- scaling.fit_line


def test_fit_line_matches_scipy():
    from scipy import stats

    rng = np.random.default_rng(2)
    x = np.linspace(0, 10, 11)
    y = 2.0 + 0.5 * x + 0.3 * rng.standard_normal(x.size)
    fit = scaling.fit_line(x, y)
    ref = stats.linregress(x, y)
    np.testing.assert_allclose([fit.slope, fit.intercept], [ref.slope, ref.intercept], rtol=1e-12)
    t = stats.t.ppf(0.975, x.size - 2)
    np.testing.assert_allclose(
        fit.slope_ci, (ref.slope - t * ref.stderr, ref.slope + t * ref.stderr)
    )
    with pytest.raises(ValueError, match="finite"):
        scaling.fit_line([1, 2, np.inf], [1, 2, 3])
