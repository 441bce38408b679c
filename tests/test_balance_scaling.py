"""amemory.analysis.balance and .scaling against closed forms and independent references."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from amemory.analysis import balance, scaling

# ----------------------------------------------------------------------------- scaling


def test_exact_power_law_recovered():
    x = np.array([3.0, 7.0, 11.0, 29.0, 101.0])
    y = 2.5 * x**-0.75
    fit = scaling.fit_power_law(x, y)
    np.testing.assert_allclose(fit.slope, -0.75, atol=1e-12)
    np.testing.assert_allclose(fit.intercept, np.log(2.5), atol=1e-12)
    np.testing.assert_allclose(fit.slope_ci, (-0.75, -0.75), atol=1e-10)
    np.testing.assert_allclose(fit.r2, 1.0, atol=1e-12)
    assert fit.n == 5 and "95% CI" in fit.describe()


def test_fit_matches_scipy_linregress():
    rng = np.random.default_rng(0)
    x = np.geomspace(1, 1e4, 13)
    y = 0.3 * x**1.7 * np.exp(0.2 * rng.standard_normal(x.size))
    fit = scaling.fit_power_law(x, y, confidence=0.9)
    ref = stats.linregress(np.log(x), np.log(y))  # independent implementation
    np.testing.assert_allclose(fit.slope, ref.slope, rtol=1e-12)
    np.testing.assert_allclose(fit.intercept, ref.intercept, rtol=1e-12)
    np.testing.assert_allclose(fit.slope_stderr, ref.stderr, rtol=1e-10)
    t = stats.t.ppf(0.95, x.size - 2)
    np.testing.assert_allclose(
        fit.slope_ci, (ref.slope - t * ref.stderr, ref.slope + t * ref.stderr)
    )
    np.testing.assert_allclose(
        fit.intercept_ci,
        (ref.intercept - t * ref.intercept_stderr, ref.intercept + t * ref.intercept_stderr),
        rtol=1e-10,
    )
    np.testing.assert_allclose(fit.r2, ref.rvalue**2, rtol=1e-12)


def test_confidence_interval_coverage():
    """With i.i.d. Gaussian log-noise the 95% interval covers the true slope ~95% of the time."""
    rng = np.random.default_rng(1)
    x = np.geomspace(1, 100, 6)
    hits = 0
    n = 3000
    for _ in range(n):
        y = np.exp(1.0 - 0.5 * np.log(x) + 0.3 * rng.standard_normal(x.size))
        lo, hi = scaling.fit_power_law(x, y).slope_ci
        hits += lo <= -0.5 <= hi
    # binomial sd at p = 0.95, n = 3000 is 0.004: allow 3.5 sd
    assert abs(hits / n - 0.95) < 0.014


@pytest.mark.parametrize(
    ("x", "y", "kw", "match"),
    [
        ([1, 2], [1, 2], {}, "at least 3"),
        ([1, 2, 3], [1, 2], {}, "same length"),
        ([1, 2, -3], [1, 2, 3], {}, "x must be > 0"),
        ([1, 2, 3], [1, 0, 3], {}, "y must be > 0"),
        ([1, 2, np.nan], [1, 2, 3], {}, "finite"),
        ([2, 2, 2], [1, 2, 3], {}, "distinct"),
        ([[1, 2, 3]], [1, 2, 3], {}, "1-D"),
        ([1, 2, 3], [1, 2, 3], {"confidence": 1.0}, "confidence"),
    ],
)
def test_fit_errors(x, y, kw, match):
    with pytest.raises(ValueError, match=match):
        scaling.fit_power_law(x, y, **kw)


# ----------------------------------------------------------------------------- balance


def _softmax_rows(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def test_per_class_quantities():
    rng = np.random.default_rng(2)
    probs = _softmax_rows(rng.standard_normal((3, 5, 5)))
    q = np.stack([np.diag(p) for p in probs])
    top1 = np.stack([(p.argmax(axis=1) != np.arange(5)).astype(float) for p in probs])
    np.testing.assert_array_equal(balance.per_class_top1_error(probs), top1)
    np.testing.assert_allclose(balance.gap(q), q.max(axis=1) - q.min(axis=1), rtol=1e-6)
    np.testing.assert_allclose(
        balance.error_ratio(q), (1 - q.min(axis=1)) / (1 - q.max(axis=1)), rtol=1e-5
    )
    with pytest.raises(ValueError, match="probs must be"):
        balance.per_class_top1_error(np.ones((3, 4)))
    with pytest.raises(ValueError, match="correct must be"):
        balance.gap(np.float32(1.0))


def _gd_one_step_correct(p, K):
    """Closed form: one GD step from W_0 = 0 gives q_k(η) = 1 / (1 + (K-1) exp(-η p_k))."""
    return lambda etas: 1.0 / (1.0 + (K - 1) * np.exp(-np.outer(etas, p)))


@pytest.mark.parametrize(
    ("K", "alpha", "beta", "eps"), [(50, 0.8, 0.2, 0.01), (200, 0.3, 0.6, 1e-3)]
)
def test_one_step_rho_gd_closed_form(K, alpha, beta, eps):
    L = round(beta * K)
    p = np.r_[np.full(L, alpha / L), np.full(K - L, (1 - alpha) / (K - L))]
    x = (1 / eps - 1) * (K - 1)
    r = p.min() / p.max()
    expected = x**r / (x**r + K - 1)  # docs/science.md#gd-one-step-closed-form
    res = balance.one_step_rho(_gd_one_step_correct(p, K), eps, eta_max=1e6)
    np.testing.assert_allclose(res.rho, expected, rtol=1e-9)
    np.testing.assert_allclose(res.eta_boundary, np.log(x) / p.max(), rtol=1e-9)
    np.testing.assert_allclose(res.rho_boundary, res.rho, rtol=1e-12)  # min_k q_k increasing
    assert res.n_feasible_grid > 0


def test_one_step_rho_infimum_not_at_boundary():
    """When the worst class decays for large η the infimum is inside the feasible set."""
    K, eps = 3, 0.1
    # class 0 has margin +1 (learned), class 2 has margin -0.05 (unlearned): q_2 -> 0
    margins = np.array([1.0, 0.5, -0.05])
    fn = lambda etas: 1.0 / (1.0 + (K - 1) * np.exp(-np.outer(etas, margins)))
    res = balance.one_step_rho(fn, eps, eta_max=200.0)
    np.testing.assert_allclose(res.rho, fn(np.array([200.0]))[0, 2], rtol=1e-12)
    assert res.rho < res.rho_boundary
    np.testing.assert_allclose(res.eta_boundary, np.log((K - 1) * (1 - eps) / eps), rtol=1e-9)


def test_one_step_rho_balanced_and_errors():
    K, eps = 10, 0.05
    same = lambda etas: np.tile(1.0 / (1.0 + (K - 1) * np.exp(-etas))[:, None], (1, K))
    np.testing.assert_allclose(balance.one_step_rho(same, eps, eta_max=100.0).rho, 1 - eps)
    with pytest.raises(ValueError, match="increase eta_max"):
        balance.one_step_rho(same, eps, eta_max=1.0)
    with pytest.raises(ValueError, match="decrease eta_min"):
        balance.one_step_rho(same, eps, eta_max=100.0, eta_min=50.0)
    with pytest.raises(ValueError, match="eps"):
        balance.one_step_rho(same, 1.5, eta_max=100.0)
    with pytest.raises(ValueError, match=r"\[n, K\]"):
        balance.one_step_rho(lambda e: e, eps, eta_max=100.0)


def test_head_tail():
    K, L = 20, 4
    two = np.r_[np.full(L, 0.8 / L), np.full(K - L, 0.2 / (K - L))]
    head, tail = balance.head_tail_masks(two)
    np.testing.assert_array_equal(head, np.arange(K) < L)
    np.testing.assert_array_equal(tail, ~head)
    with pytest.raises(ValueError, match="constant"):
        balance.head_tail_masks(np.full(4, 0.25))
