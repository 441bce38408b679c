"""Tests for amemory.data.frequencies and amemory.data.memory_tasks.

References are independent: closed forms written out here, and chi-square
goodness-of-fit tests (scipy) of the samplers against the exact priors.
"""

import chex
import jax
import numpy as np
import pytest
from scipy import stats

from amemory.data import frequencies as fq
from amemory.data import memory_tasks as mt


def test_two_level_values_and_shape():
    K, alpha, beta = 999, 0.8, 0.2
    p = fq.two_level(K, alpha, beta)
    assert p.shape == (K,) and p.dtype == np.float64
    L = 200  # round(0.2 * 999)
    assert fq.two_level_split(K, beta) == L
    np.testing.assert_allclose(p[:L], alpha / L, rtol=1e-15)
    np.testing.assert_allclose(p[L:], (1 - alpha) / (K - L), rtol=1e-15)
    np.testing.assert_allclose(p.sum(), 1.0, rtol=0, atol=1e-12)
    # alpha == beta (with L exact) is uniform
    np.testing.assert_allclose(fq.two_level(10, 0.3, 0.3), np.full(10, 0.1), atol=1e-15)


def test_power_law_closed_form():
    K, s = 37, 1.3
    p = fq.power_law(K, s)
    ref = np.array([k ** (-s) for k in range(1, K + 1)])
    ref /= ref.sum()
    assert p.shape == (K,)
    np.testing.assert_allclose(p, ref, rtol=1e-12)
    np.testing.assert_allclose(fq.power_law(5, 0.0), np.full(5, 0.2))
    # very steep law: no NaN, head takes all the mass
    steep = fq.power_law(1000, 400.0)
    assert np.all(np.isfinite(steep)) and steep[0] > 1 - 1e-12


def test_hierarchical_closed_form():
    M, C, b = 7, 3, 1.5
    p = fq.hierarchical(M, C, b)
    assert p.shape == (M * C,)
    g = np.arange(1, M + 1, dtype=float) ** (-b)
    g /= g.sum()
    for j in range(M * C):
        np.testing.assert_allclose(p[j], g[j // C] / C, rtol=1e-12)
    np.testing.assert_allclose(p.sum(), 1.0, atol=1e-12)


def test_from_counts():
    p = fq.from_counts([3, 0, 1])
    np.testing.assert_allclose(p, [0.75, 0.0, 0.25])
    assert p.dtype == np.float64


@pytest.mark.parametrize(
    "fn,args,name",
    [
        (fq.two_level, (1, 0.5, 0.5), "K"),
        (fq.two_level, (10, 1.0, 0.5), "alpha"),
        (fq.two_level, (10, 0.5, 0.0), "beta"),
        (fq.two_level, (10, 0.5, 0.01), "beta"),
        (fq.power_law, (0, 1.0), "K"),
        (fq.power_law, (5, -1.0), "exponent"),
        (fq.power_law, (5, float("nan")), "exponent"),
        (fq.power_law, (5.0, 1.0), "K"),
        (fq.hierarchical, (0, 2, 1.5), "M"),
        (fq.hierarchical, (2, 0, 1.5), "C"),
        (fq.from_counts, ([],), "counts"),
        (fq.from_counts, ([1, -1],), "counts"),
        (fq.from_counts, ([0, 0],), "counts"),
        (fq.from_counts, ([[1, 2]],), "counts"),
    ],
)
def test_bad_arguments_name_the_field(fn, args, name):
    with pytest.raises(ValueError, match=name):
        fn(*args)


def test_conditional_and_joint():
    K, a = 6, 0.3
    c = mt.conditional(K, a)
    for k in range(K):
        for i in range(K):
            expect = (1 - a) * (i == k) + a / K
            assert c[k, i] == pytest.approx(expect, abs=1e-15)
    np.testing.assert_allclose(c.sum(1), 1.0)
    prior = fq.power_law(K, 1.0)
    j = mt.joint(prior, a)
    np.testing.assert_allclose(j.sum(), 1.0)
    np.testing.assert_allclose(j.sum(1), prior)
    # Bayes loss: brute-force entropy of the conditional rows
    ref = -sum(prior[k] * sum(c[k, i] * np.log(c[k, i]) for i in range(K)) for k in range(K))
    assert mt.optimal_loss(prior, a) == pytest.approx(ref, rel=1e-12)
    assert mt.optimal_loss(prior, 0.0) == 0.0
    with pytest.raises(ValueError, match="noise"):
        mt.conditional(K, 1.0)
    with pytest.raises(ValueError, match="prior"):
        mt.joint([0.5, 0.6], 0.0)


def test_sampled_queries_match_prior_chi_square():
    K, B = 40, 200_000
    prior = fq.hierarchical(8, 5, 1.5)
    q, a = mt.sample_pairs(jax.random.key(0), prior, B)
    chex.assert_shape([q, a], (B,))
    chex.assert_type([q, a], np.int32)
    np.testing.assert_array_equal(np.asarray(q), np.asarray(a))  # noiseless
    counts = np.bincount(np.asarray(q), minlength=K)
    res = stats.chisquare(counts, B * prior)
    assert res.pvalue > 1e-3, res


def test_label_noise_rate_and_joint_chi_square():
    K, B, noise = 10, 200_000, 0.25
    prior = fq.two_level(K, 0.8, 0.2)
    q, a = mt.sample_pairs(jax.random.key(1), prior, B, noise=noise)
    q, a = np.asarray(q), np.asarray(a)
    rate = np.mean(q != a)
    expect = noise * (K - 1) / K  # a noisy answer is uniform over all K, the true one included
    # 5 standard errors of a binomial proportion
    assert abs(rate - expect) < 5 * np.sqrt(expect * (1 - expect) / B)
    counts = np.bincount(q * K + a, minlength=K * K)
    res = stats.chisquare(counts, B * mt.joint(prior, noise).ravel())
    assert res.pvalue > 1e-3, res


def test_sample_pairs_deterministic_and_validates():
    prior = fq.power_law(5, 1.0)
    q1, a1 = mt.sample_pairs(jax.random.key(3), prior, 64, noise=0.1)
    q2, a2 = mt.sample_pairs(jax.random.key(3), prior, 64, noise=0.1)
    np.testing.assert_array_equal(q1, q2)
    np.testing.assert_array_equal(a1, a2)
    with pytest.raises(ValueError, match="batch_size"):
        mt.sample_pairs(jax.random.key(0), prior, 0)
    with pytest.raises(ValueError, match="noise"):
        mt.sample_pairs(jax.random.key(0), prior, 4, noise=-0.1)


def test_make_sampler_matches_sample_pairs_under_jit():
    prior = fq.two_level(12, 0.7, 0.25)
    sample = mt.make_sampler(prior, 32, noise=0.2)
    key = jax.random.key(7)
    q1, a1 = sample(key)
    q2, a2 = mt.sample_pairs(key, prior, 32, noise=0.2)
    np.testing.assert_array_equal(q1, q2)
    np.testing.assert_array_equal(a1, a2)
    keys = jax.random.split(key, 3)
    qs, _ = jax.vmap(sample)(keys)
    chex.assert_shape(qs, (3, 32))
    with pytest.raises(ValueError, match="noise"):
        mt.make_sampler(prior, 32, noise=2.0)
