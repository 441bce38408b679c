"""NVIDIA Emerging-Optimizers' Newton-Schulz tests, ported to amemory (our own code).

Source: NVIDIA-NeMo/Emerging-Optimizers ``tests/test_muon_utils.py`` (read at commit
fd77292), class ``TestNewtonSchulz``; the kernel it tests is
``emerging_optimizers/orthogonalized_optimizers/muon_utils.py::newton_schulz``. Their
coefficient names map to ours: "simple" = ``jordan``, "quintic" = ``dion`` (the same
five triples), "polar_express", "deepseekv4" = ``deepseek_v4``, "cans". Matrix sizes are
shrunk (512 -> 64-128, 511/513/257 -> 61/67/31) to keep the suite fast on CPU. Ported
cases, each against :func:`_ns_reference` (the iteration written out in float64 numpy,
Frobenius norm clamped at 1e-7 as their ``newton_schulz_ref``) or an exact SVD:

- ``test_newtonschulz5_close_to_svd``: "quintic" x5 within 0.1 of ``U V^T``.
- ``test_newtonschulz5_close_to_reference``, ``test_cubic5_close_to_reference`` (as
  CANS), ``test_cans_close_to_reference``, ``test_cans_9steps_close_to_reference``,
  ``test_polar_express_9steps_close_to_reference``, ``test_deepseekv4_close_to_reference``:
  our fp32 kernel against the reference, last triple repeated past a table's end (their
  atol 2e-6 is fp32 against an fp32 reference; ours is fp32 against fp64: 4e-6).
- ``test_newtonschulz_custom_coeff_close_to_reference``: a custom ``[2, 3]`` table on
  power-of-two inputs.
- ``test_newtonschulz_3d_input_close_to_per_slice``: a batch ``[b, m, n]`` equals the
  per-slice calls.
- ``test_polar_express_and_deepseekv4_10steps_better_than_quintic``: condition number
  1e12 (singular values 1e6 .. 1e-6), 10 steps of Polar Express / DeepSeek-V4 closer to
  ``U V^T`` than 5 "quintic" steps.
- ``test_polar_express_16steps_almost_orthogonal``: Gram matrix within 1e-5 of I.
- ``test_preserve_values_with_underflowed_norm_in_fp64``: a 1e-30 input whose fp32 sum of
  squares underflows gives the same (finite, orthogonal) output as the unscaled input;
  theirs reduces in fp64, ours rescales by a power of two first.
- Scale invariance down to 2^-60 (and 2^-100, above fp32's subnormals) and the zero
  matrix (Emerging-Optimizers issue #230, "tiny-norm inputs degenerate with an additive
  eps"; not in the file we read): bit-equal outputs for ``2^-k x``, zero maps to zero.

Not ported: the input-type checks (theirs accepts only 2-D/3-D float32; ours takes any
batch and dtype), the SYRK / tensor-parallel and coefficient-iterator tests (torch
kernels we do not have), "cubic5" and "aol" tables (not among our sets).
"""

import jax.numpy as jnp
import numpy as np
import pytest

from amemory import optim

SHAPES = [(64, 64), (64, 32), (32, 64)]
ODD = [(61, 67), (61, 31), (31, 67)]


def _ns_reference(x, coeffs, steps):
    """Newton-Schulz in float64 numpy: transpose tall, divide by factor max(||X||, 1e-7)."""
    table, factor = optim.coefficient_table(coeffs, steps)
    x = np.asarray(x, np.float64)
    tall = x.shape[-2] > x.shape[-1]
    X = np.swapaxes(x, -1, -2) if tall else x
    X = X / (factor * np.maximum(np.linalg.norm(X, axis=(-2, -1), keepdims=True), 1e-7))
    for a, b, c in np.asarray(table, np.float64):
        A = X @ np.swapaxes(X, -1, -2)
        X = a * X + (b * A + c * A @ A) @ X
    return np.swapaxes(X, -1, -2) if tall else X


def _ns(x, coeffs, steps):
    return np.asarray(optim.newton_schulz(jnp.asarray(x, jnp.float32), coeffs=coeffs, steps=steps))


def _polar(x):
    u, _, vt = np.linalg.svd(x, full_matrices=False)
    return u @ vt


@pytest.mark.parametrize("shape", SHAPES)
def test_quintic_close_to_svd(shape):
    x = np.random.default_rng(0).standard_normal(shape)
    np.testing.assert_allclose(_ns(x, "dion", 5), _polar(x), atol=0.1)


@pytest.mark.parametrize(
    "coeffs, steps, shapes, atol",
    [("dion", 5, SHAPES, 1e-6), ("cans", 5, SHAPES, 1e-5), ("cans", 9, ODD, 4e-6),
     ("polar_express", 9, ODD, 4e-6), ("deepseek_v4", 10, ODD, 4e-6)],
)  # fmt: skip
def test_close_to_reference(coeffs, steps, shapes, atol):
    rng = np.random.default_rng(1)
    for shape in shapes:
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(_ns(x, coeffs, steps), _ns_reference(x, coeffs, steps),
                                   atol=atol, rtol=1e-7, err_msg=str(shape))  # fmt: skip


@pytest.mark.parametrize("shape", ODD)
def test_custom_coefficients_close_to_reference(shape):
    x = 2.0 ** np.random.default_rng(2).integers(-10, -5, shape)
    table = np.asarray([(3, 5, 7), (11, 13, 17)], np.float64)
    np.testing.assert_allclose(_ns(x, table, 2), _ns_reference(x, table, 2), atol=0, rtol=2e-6)


@pytest.mark.parametrize("shape", [(2, 32, 32), (4, 16, 32), (3, 32, 16)])
def test_batched_equals_per_slice(shape):
    x = np.random.default_rng(3).integers(-3, 4, shape).astype(np.float32)
    batched = _ns(x, "jordan", 5)
    per_slice = np.stack([_ns(x[i], "jordan", 5) for i in range(shape[0])])
    np.testing.assert_allclose(batched, per_slice, atol=1e-6, rtol=0)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("coeffs", ["polar_express", "deepseek_v4"])
def test_ten_steps_beat_quintic_at_condition_number_1e12(shape, coeffs):
    rng = np.random.default_rng(4)
    k = min(shape)
    u, _ = np.linalg.qr(rng.standard_normal((shape[0], k)))
    v, _ = np.linalg.qr(rng.standard_normal((shape[1], k)))
    x = (u * np.logspace(6, -6, k)) @ v.T
    exact = u @ v.T
    better = np.linalg.norm(_ns(x, coeffs, 10) - exact)  # torch.norm(p=2): Frobenius
    quintic = np.linalg.norm(_ns(x, "dion", 5) - exact)
    assert better < quintic, (better, quintic)


@pytest.mark.parametrize("shape", [(64, 32), (32, 64)])
def test_polar_express_16_steps_almost_orthogonal(shape):
    o = _ns(np.random.default_rng(5).standard_normal(shape), "polar_express", 16)
    gram = o @ o.T if shape[0] <= shape[1] else o.T @ o
    np.testing.assert_allclose(np.diag(gram), 1.0, atol=1e-5)
    np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0.0, atol=1e-5)


def test_underflowed_norm_keeps_the_values():
    x = np.random.default_rng(6).standard_normal((64, 64)).astype(np.float32)
    tiny = (x * np.float32(1e-30)).astype(np.float32)
    assert np.sum(tiny * tiny, dtype=np.float32) == 0  # the fp32 sum of squares underflows
    out = _ns(tiny, "polar_express", 10)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, _ns(x, "polar_express", 10), atol=1e-5)
    assert float(optim.orthogonality_error(jnp.asarray(out))) < 1e-3


@pytest.mark.parametrize("k", [1, 20, 40, 60, 100])
def test_scale_invariance_down_to_2_pow_minus_60_and_beyond(k):
    x = np.random.default_rng(7).standard_normal((31, 67)).astype(np.float32)
    np.testing.assert_array_equal(_ns(x * 2.0**-k, "jordan", 5), _ns(x, "jordan", 5))


def test_zero_matrix_maps_to_zero():
    for mode in ("relative", "add", "clamp"):
        out = optim.newton_schulz(jnp.zeros((5, 7)), eps_mode=mode)
        np.testing.assert_array_equal(np.asarray(out), 0.0)


def test_muon_update_is_scale_invariant_for_tiny_gradients():
    """The whole Muon update (default options): update(2^-k g) == update(g) to 2^-60, and a
    1e-30 gradient gives a finite orthogonal update; the peers' presets keep their eps."""
    g = jnp.asarray(np.random.default_rng(8).standard_normal((13, 29)), jnp.float32)
    tx = optim.scale_by_muon()
    state = tx.init(g)
    ref = np.asarray(tx.update(g, state)[0])
    for k in (20, 40, 60):
        np.testing.assert_array_equal(np.asarray(tx.update(g * 2.0**-k, state)[0]), ref)
    tiny = np.asarray(tx.update(g * 1e-30, state)[0])
    np.testing.assert_allclose(tiny, ref, atol=1e-5)
    jordan = optim.muon(1.0, preset="jordan")  # ||U|| + 1e-7: a vanishing update, as Keller's
    assert np.max(np.abs(np.asarray(jordan.update(g * 1e-30, jordan.init(g))[0]))) < 1e-20
