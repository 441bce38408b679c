"""amemory.optim.orthogonalize against numpy SVD and the scalar NS iteration (references)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from amemory.optim import (
    coefficient_table,
    newton_schulz,
    orthogonality_error,
    polar,
    singular_value_range,
)


def _np_polar(x, rtol=None):
    u, s, vh = np.linalg.svd(x, full_matrices=False)
    if rtol is None:
        rtol = max(x.shape) * np.finfo(x.dtype).eps
    keep = s > rtol * s.max() if s.max() > 0 else np.zeros_like(s, bool)
    return (u * keep) @ vh


def _rank_r(rng, m, n, r):
    return rng.standard_normal((m, r)) @ rng.standard_normal((r, n))


@pytest.mark.parametrize("shape", [(7, 7), (11, 5), (5, 13)])
def test_polar_matches_numpy_svd_full_rank(shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(np.asarray(polar(jnp.asarray(x))), _np_polar(x), atol=2e-5)


def test_polar_rank_deficient_keeps_null_space_float64():
    rng = np.random.default_rng(1)
    x = _rank_r(rng, 13, 11, 4)
    x -= x.mean(axis=0, keepdims=True)  # 1^T X = 0 as in the theory's gradients
    with jax.enable_x64(True):
        out = polar(jnp.asarray(x))
        assert out.dtype == jnp.float64
        out = np.asarray(out)
    ref = _np_polar(x)
    np.testing.assert_allclose(out, ref, atol=1e-12)
    s = np.linalg.svd(out, compute_uv=False)
    np.testing.assert_allclose(np.sort(s)[::-1], [1.0] * 4 + [0.0] * 7, atol=1e-12)
    np.testing.assert_allclose(np.ones(13) @ out, 0.0, atol=1e-12)


def test_polar_zero_and_batched():
    z = polar(jnp.zeros((2, 4, 3)))
    np.testing.assert_array_equal(np.asarray(z), 0.0)
    x = np.random.default_rng(2).standard_normal((3, 2, 6, 4)).astype(np.float32)
    out = np.asarray(polar(jnp.asarray(x)))
    for idx in np.ndindex(3, 2):
        np.testing.assert_allclose(out[idx], _np_polar(x[idx]), atol=2e-5)


def _scalar_ns(s, coeffs, steps):
    """Reference: NS maps each normalised singular value through the scalar polynomials."""
    table, factor = coefficient_table(coeffs, steps)
    s = s / factor
    for a, b, c in table:
        s = a * s + b * s**3 + c * s**5
    return s


@pytest.mark.parametrize("coeffs", ["jordan", "polar_express"])
@pytest.mark.parametrize("shape", [(24, 40), (40, 24)])
def test_ns_singular_values_follow_scalar_iteration(coeffs, shape):
    x = np.random.default_rng(3).standard_normal(shape)
    o = np.asarray(newton_schulz(jnp.asarray(x, jnp.float32), coeffs=coeffs, eps=0.0), np.float64)
    s_in = np.linalg.svd(x, compute_uv=False)
    expected = np.sort(_scalar_ns(s_in / np.linalg.norm(x), coeffs, 5))
    got = np.sort(np.linalg.svd(o, compute_uv=False))
    np.testing.assert_allclose(got, expected, atol=2e-3)
    # singular vectors are those of x: o is close to polar(x) * diag-scaled, check span
    u, _, vh = np.linalg.svd(x, full_matrices=False)
    core = u.T @ o @ vh.T  # diagonal for an exact NS output
    off = core - np.diag(np.diag(core))
    assert np.abs(off).max() < 5e-3


# Documented bands (docstring of newton_schulz) for normalised singular values in [0.01, 1]:
# name -> (steps, lower, upper).
BANDS = {
    "jordan": (5, 0.68, 1.14),
    "polar_express": (5, 0.87, 1.13),
    "deepseek_v4": (10, 0.99999, 1.0006),
    "cans": (5, 0.88, 1.12),
}


@pytest.mark.parametrize("coeffs", sorted(BANDS))
def test_ns_output_inside_documented_band(coeffs):
    steps, lower, upper = BANDS[coeffs]
    rng = np.random.default_rng(4)
    # prescribed spectrum: normalised singular values spread over [0.01, 1]
    u, _ = np.linalg.qr(rng.standard_normal((32, 16)))
    v, _ = np.linalg.qr(rng.standard_normal((16, 16)))
    s = np.geomspace(1.0, 0.05, 16)
    x = (u * s) @ v.T
    assert (s / np.linalg.norm(s)).min() >= 0.01
    x = jnp.asarray(x, jnp.float32)
    lo, hi = singular_value_range(newton_schulz(x, coeffs=coeffs, steps=steps))
    assert lower <= float(lo) and float(hi) <= upper


def test_ns_error_shrinks_with_steps_and_polar_express_beats_jordan():
    x = jnp.asarray(np.random.default_rng(5).standard_normal((4, 48, 96)), jnp.float32)
    p = polar(x)

    def dist(o):
        return float(jnp.max(jnp.linalg.norm(o - p, axis=(-2, -1)) / jnp.sqrt(48.0)))

    errs = [dist(newton_schulz(x, coeffs="polar_express", steps=k)) for k in (4, 5, 6, 8)]
    assert all(a > b for a, b in zip(errs, errs[1:], strict=False)), errs
    assert errs[-1] < 1e-3
    j5 = newton_schulz(x, coeffs="jordan", steps=5)
    pe5 = newton_schulz(x, coeffs="polar_express", steps=5)
    assert jnp.all(orthogonality_error(pe5) < orthogonality_error(j5))
    assert dist(pe5) < dist(j5)


def test_ns_batched_equals_loop_and_gram_equals_direct():
    x = jnp.asarray(np.random.default_rng(6).standard_normal((3, 2, 16, 40)), jnp.float32)
    batched = newton_schulz(x)
    for i in range(3):
        for j in range(2):
            np.testing.assert_allclose(batched[i, j], newton_schulz(x[i, j]), atol=1e-5)
    for coeffs in ("jordan", "polar_express"):
        for shape_x in (x, jnp.swapaxes(x, -1, -2)):
            d = newton_schulz(shape_x, coeffs=coeffs, method="direct")
            g = newton_schulz(shape_x, coeffs=coeffs, method="gram")
            np.testing.assert_allclose(g, d, atol=2e-4)


def test_ns_user_table_and_bf16():
    x = jnp.asarray(np.random.default_rng(7).standard_normal((16, 24)), jnp.float32)
    table = np.tile([3.4445, -4.7750, 2.0315], (5, 1))
    np.testing.assert_allclose(newton_schulz(x, coeffs=table), newton_schulz(x), atol=1e-6)
    o = newton_schulz(x, dtype=jnp.bfloat16)
    assert o.dtype == jnp.float32
    np.testing.assert_allclose(o, newton_schulz(x), atol=0.05)
    assert not np.any(np.isnan(np.asarray(newton_schulz(jnp.zeros((4, 6))))))


def test_orthogonality_error_matches_singular_value_formula():
    rng = np.random.default_rng(8)
    for shape in [(9, 5), (5, 9)]:
        o = rng.standard_normal(shape)
        s = np.linalg.svd(o, compute_uv=False)
        ref = np.sqrt(np.mean((s**2 - 1) ** 2))
        np.testing.assert_allclose(orthogonality_error(jnp.asarray(o, jnp.float32)), ref, rtol=1e-4)
        lo, hi = singular_value_range(jnp.asarray(o, jnp.float32))
        np.testing.assert_allclose([lo, hi], [s.min(), s.max()], rtol=1e-5)
    q, _ = np.linalg.qr(rng.standard_normal((10, 4)))
    assert float(orthogonality_error(jnp.asarray(q, jnp.float32))) < 1e-6


def test_bad_inputs_raise_valueerror():
    with pytest.raises(ValueError, match="polar_express"):
        newton_schulz(jnp.ones((3, 3)), coeffs="nope")
    with pytest.raises(ValueError, match=r"\[5, 3\]"):
        newton_schulz(jnp.ones((3, 3)), coeffs=np.ones((4, 3)))
    with pytest.raises(ValueError, match="steps"):
        newton_schulz(jnp.ones((3, 3)), steps=0)
    with pytest.raises(ValueError, match="shape"):
        polar(jnp.ones(3))
    with pytest.raises(ValueError, match="method"):
        newton_schulz(jnp.ones((3, 3)), method="fast")
