"""amemory.analysis.spectrum against closed forms on matrices with chosen singular values."""

import numpy as np
import pytest

from amemory.analysis import spectrum


def _with_singular_values(s, m, n, seed=0):
    """U diag(s) V^T with Haar-random U [m, r], V [n, r]; s given (any order)."""
    rng = np.random.default_rng(seed)
    r = len(s)
    u, _ = np.linalg.qr(rng.standard_normal((m, r)))
    v, _ = np.linalg.qr(rng.standard_normal((n, r)))
    return (u * np.asarray(s, np.float64)) @ v.T


def _closed_form(s, k=10):
    s = np.sort(np.asarray(s, np.float64))[::-1]
    e = s**2
    q = e / e.sum()
    h = -(q * np.log(q)).sum()
    n = len(s)
    return {
        "entropy": h / np.log(n) if n > 1 else 0.0,
        "effective_rank": np.exp(h),
        f"top{k}_energy": e[:k].sum() / e.sum(),
        "q75_25": np.percentile(e, 75) / np.percentile(e, 25),
        "stable_rank": e.sum() / e[0],
        "condition_number": s[0] / s[-1],
    }


@pytest.mark.parametrize("shape", [(13, 7), (7, 13), (11, 11)])
def test_metrics_match_closed_form(shape):
    m, n = shape
    s = np.geomspace(5.0, 0.3, min(m, n))
    got = spectrum.spectrum_metrics(_with_singular_values(s, m, n))
    want = _closed_form(s)
    assert set(got) == set(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-9, err_msg=key)


def test_flat_spectrum_is_isotropic():
    # An orthogonal matrix: H = 1, eRank = n, Q75/25 = 1, stable rank n, condition number 1.
    q, _ = np.linalg.qr(np.random.default_rng(1).standard_normal((17, 17)))
    got = spectrum.spectrum_metrics(q)
    np.testing.assert_allclose(got["entropy"], 1.0, rtol=1e-12)
    np.testing.assert_allclose(got["effective_rank"], 17.0, rtol=1e-12)
    np.testing.assert_allclose(got["top10_energy"], 10 / 17, rtol=1e-12)
    np.testing.assert_allclose(got["q75_25"], 1.0, rtol=1e-12)
    np.testing.assert_allclose(got["stable_rank"], 17.0, rtol=1e-12)
    np.testing.assert_allclose(got["condition_number"], 1.0, rtol=1e-12)


def test_rank_deficient_uses_nonzero_values_only():
    s = [4.0, 2.0, 1.0]  # rank 3 inside a 9 x 6 matrix (3 zero singular values)
    got = spectrum.spectrum_metrics(_with_singular_values(s, 9, 6).astype(np.float32))
    want = _closed_form(s)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, err_msg=key)


def test_rank_one_and_zero():
    got = spectrum.spectrum_metrics(np.outer(np.arange(1.0, 6.0), np.ones(4)))
    assert got["entropy"] == 0.0
    np.testing.assert_allclose(got["effective_rank"], 1.0)
    np.testing.assert_allclose(got["condition_number"], 1.0)
    z = spectrum.spectrum_metrics(np.zeros((3, 4)))
    assert all(np.isnan(v) for v in z.values())


def test_stack_matches_per_matrix():
    rng = np.random.default_rng(3)
    stack = rng.standard_normal((2, 3, 11, 7))
    got = spectrum.spectrum_metrics(stack, k=4)
    for key, v in got.items():
        assert v.shape == (2, 3), key
    for i in range(2):
        for j in range(3):
            s = np.linalg.svd(stack[i, j], compute_uv=False)
            want = _closed_form(s, k=4)
            for key in want:
                np.testing.assert_allclose(got[key][i, j], want[key], rtol=1e-9, err_msg=key)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="matrix"):
        spectrum.spectrum_metrics(np.ones(5))
    with pytest.raises(ValueError, match="k must be"):
        spectrum.spectrum_metrics(np.ones((3, 3)), k=0)
