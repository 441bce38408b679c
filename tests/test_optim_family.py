"""The Muon family against numpy references: Gram Newton-Schulz with restarts, AOL and
Schatten pre-conditioning, PolarGrad's nuclear-norm scaling, Scion's norm balls, AdaMuon,
and complex parameters. Every reference is written from the paper / official code in
float64 numpy, in PyTorch's [out, in] layout where the peer uses it.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from amemory import optim

PE = optim.coefficient_table("polar_express", 5)[0]
JORDAN = (3.4445, -4.7750, 2.0315)


def _np_normalise(x, eps=1e-7, factor=1.0):
    return x / (factor * np.linalg.norm(x) + eps)


def _np_direct(x, table):
    """Newton-Schulz on the wide side, X <- a X + (b A + c A^2) X, A = X X^T."""
    for a, b, c in table:
        A = x @ x.T
        x = a * x + (b * A + c * A @ A) @ x
    return x


def _np_gram(x, table, restarts=(2,)):
    """Gram Newton-Schulz as written in Zhang, Amsel, Chen, Dao (2026): R = X X^T, Q = I,
    Z = b R + c R^2, Q <- Q (a I + Z), R <- (a I + Z) R (a I + Z); restart X <- Q X."""
    k = x.shape[0]
    R, Q = x @ x.T, np.eye(k)
    for i, (a, b, c) in enumerate(table):
        if i in restarts:
            x, Q = Q @ x, np.eye(k)
            R = x @ x.T
        P = a * np.eye(k) + b * R + c * R @ R
        Q, R = Q @ P, P @ R @ P
    return Q @ x


def _ill_conditioned(rng, b, k, l, decades):
    out = []
    for _ in range(b):
        u, _ = np.linalg.qr(rng.standard_normal((k, k)))
        v, _ = np.linalg.qr(rng.standard_normal((l, k)))
        out.append((u * np.geomspace(1.0, 10.0**-decades, k)) @ v.T)
    return np.stack(out)


def test_gram_newton_schulz_matches_numpy_gram_algorithm():
    x = np.random.default_rng(0).standard_normal((3, 16, 40))
    for restarts in ((2,), (), (1, 3)):
        ref = np.stack([_np_gram(_np_normalise(m, factor=1.01), PE, restarts) for m in x])
        exact = np.stack([_np_direct(_np_normalise(m, factor=1.01), PE) for m in x])
        np.testing.assert_allclose(ref, exact, atol=1e-9)  # the algebra is exact in float64
        got = optim.newton_schulz(
            jnp.asarray(x, jnp.float32), coeffs="polar_express", method="gram",
            gram_restarts=restarts,
        )  # fmt: skip
        np.testing.assert_allclose(got, ref, atol=2e-4, err_msg=str(restarts))
        tall = optim.newton_schulz(
            jnp.asarray(np.swapaxes(x, 1, 2), jnp.float32), coeffs="polar_express",
            method="gram", gram_restarts=restarts,
        )  # fmt: skip
        np.testing.assert_allclose(np.swapaxes(tall, 1, 2), ref, atol=2e-4)


def test_gram_restart_keeps_float16_stable_and_auto_keeps_bf16_direct():
    """Singular values over two decades: without the restart the fp16 Gram iteration
    diverges; with it, it is as accurate as the direct form (fp16 on CPU is emulated)."""
    x = jnp.asarray(_ill_conditioned(np.random.default_rng(1), 2, 24, 96, 2), jnp.float32)

    def err(**kw):
        o = optim.newton_schulz(x, coeffs="polar_express", dtype=jnp.float16, **kw)
        return float(jnp.max(optim.orthogonality_error(o)))

    direct, restart, none = (
        err(method="direct"),
        err(method="gram"),
        err(method="gram", gram_restarts=()),
    )
    assert restart < direct + 0.03, (restart, direct)
    assert none > 0.3, none
    restarts_fp32 = optim.newton_schulz(x, method="gram")  # float32: restarts (2, 4)
    np.testing.assert_array_equal(
        restarts_fp32, optim.newton_schulz(x, method="gram", gram_restarts=(2, 4))
    )
    # over 4 decades, in float32: without restarts the Gram form drifts from the direct one
    # (docs/peers.md, "Gram Newton-Schulz in fp32"); the default restarts remove the drift
    y = jnp.asarray(_ill_conditioned(np.random.default_rng(1), 2, 24, 96, 4), jnp.float32)
    ns = lambda **kw: np.asarray(optim.newton_schulz(y, coeffs="polar_express", steps=8, **kw))  # noqa: E731
    direct = ns(method="direct")
    assert np.abs(ns(method="gram") - direct).max() < 1e-4
    assert np.abs(ns(method="gram", gram_restarts=()) - direct).max() > 1e-3
    auto = optim.newton_schulz(x, dtype=jnp.bfloat16, method="auto")
    np.testing.assert_array_equal(auto, optim.newton_schulz(x, dtype=jnp.bfloat16, method="direct"))


def _np_aol_ns(x, table, eps=1e-7):
    """Turbo-Muon (arXiv 2512.04632): no norm division; the first step rescales row i of X
    by (sum_j |A_ij|)^(-1/2) with A = X X^T and uses the rescaled A."""
    A = x @ x.T
    s = 1.0 / np.sqrt(np.maximum(np.abs(A).sum(axis=1), eps))
    x, A = x * s[:, None], A * s[:, None] * s[None, :]
    a, b, c = table[0]
    x = a * x + (b * A + c * A @ A) @ x
    return _np_direct(x, table[1:])


def _np_schatten_ns(x, table, eps=1e-7):
    """Schatten-4 start (arXiv 2506.10935): X / ||X X^T||_F^(1/2)."""
    return _np_direct(x / np.sqrt(max(np.linalg.norm(x @ x.T), eps)), table)


@pytest.mark.parametrize("method", ["direct", "gram"])
def test_aol_and_schatten_preconditioning_match_numpy(method):
    x = np.random.default_rng(2).standard_normal((2, 12, 30)) * 3.0
    table = np.tile(JORDAN, (4, 1))
    for pre, ref_fn in (("aol", _np_aol_ns), ("schatten", _np_schatten_ns)):
        ref = np.stack([ref_fn(m, table) for m in x])
        got = optim.newton_schulz(
            jnp.asarray(x, jnp.float32), steps=4, preconditioning=pre, method=method
        )
        np.testing.assert_allclose(got, ref, atol=3e-4, err_msg=pre)
    # the AOL rescale bounds the spectral norm by 1 (its purpose): check on the first step
    m = x[0]
    s = 1.0 / np.sqrt(np.abs(m @ m.T).sum(axis=1))
    assert np.linalg.norm(s[:, None] * m, 2) <= 1.0 + 1e-12


def test_polargrad_nuclear_scale_per_matrix_and_per_leaf():
    g = np.random.default_rng(3).standard_normal((2, 5, 7))

    def ref(m):
        u, s, vh = np.linalg.svd(m, full_matrices=False)
        return u @ vh, s.sum()

    common = dict(momentum=0.0, orthogonalizer="polar", shape_scale="none", matrix_axes=(-2, -1))
    for mode in ("matrix", "leaf"):
        tx = optim.scale_by_muon(nuclear_scale=mode, **common)
        u, _ = tx.update({"w": jnp.asarray(g, jnp.float32)}, tx.init({"w": jnp.zeros(g.shape)}))
        parts = [ref(m) for m in g]
        total = sum(nuc for _, nuc in parts)
        for i, (polar, nuc) in enumerate(parts):
            scale = nuc if mode == "matrix" else total
            np.testing.assert_allclose(u["w"][i], scale * polar, rtol=1e-5, atol=1e-5)


NP_LMO = {
    # norm: (LMO in the [fan_in, fan_out] layout, dual norm of G, the norm of D)
    "spectral": (
        lambda g: (lambda u, s, vh: u @ vh)(*np.linalg.svd(g, full_matrices=False)),
        lambda g: np.linalg.svd(g, compute_uv=False).sum(),
        lambda d: np.linalg.norm(d, 2),
    ),
    "sign": (np.sign, lambda g: np.abs(g).sum(), lambda d: np.abs(d).max()),
    "colnorm": (
        lambda g: g / np.linalg.norm(g, axis=1, keepdims=True),
        lambda g: np.linalg.norm(g, axis=1).sum(),
        lambda d: np.linalg.norm(d, axis=1).max(),
    ),
    "rownorm": (
        lambda g: g / np.linalg.norm(g, axis=0, keepdims=True),
        lambda g: np.linalg.norm(g, axis=0).sum(),
        lambda d: np.linalg.norm(d, axis=0).max(),
    ),
}


@pytest.mark.parametrize("norm", optim.NORMS)
def test_norm_balls_are_the_linear_minimisation_oracles(norm):
    g = np.random.default_rng(4).standard_normal((7, 11))
    lmo, dual, primal = NP_LMO[norm]
    d = np.asarray(optim.norm_ball_lmo(jnp.asarray(g, jnp.float32), norm), np.float64)
    np.testing.assert_allclose(d, lmo(g), atol=2e-5)
    np.testing.assert_allclose(np.sum(g * d), dual(g), rtol=1e-5)  # <G, D> = ||G||_*
    np.testing.assert_allclose(primal(d), 1.0, rtol=1e-5)  # on the unit sphere
    # one transform spans SignGD to Muon: Muon's path with this norm, no momentum/scale
    tx = optim.scale_by_muon(norm=norm, momentum=0.0, shape_scale="none", orthogonalizer="polar")
    u, _ = tx.update({"w": jnp.asarray(g, jnp.float32)}, tx.init({"w": jnp.zeros(g.shape)}))
    np.testing.assert_allclose(u["w"], lmo(g), atol=2e-5)


def test_muon_with_sign_ball_is_signgd():
    g = {"w": jnp.asarray(np.random.default_rng(5).standard_normal((6, 9)), jnp.float32)}
    a = optim.muon(0.1, norm="sign", momentum=0.0, shape_scale="none")
    b = optim.signgd(0.1)
    ua, _ = a.update(g, a.init(g), g)
    ub, _ = b.update(g, b.init(g), g)
    np.testing.assert_array_equal(ua["w"], ub["w"])


def _np_ns5(x, steps=5, eps=1e-7):
    tall = x.shape[0] > x.shape[1]
    x = x.T if tall else x
    x = _np_direct(_np_normalise(x, eps), [JORDAN] * steps)
    return x.T if tall else x


def test_adamuon_matches_official_update():
    """github.com/Chongjie-Si/AdaMuon gpt2/models/optimizers/adamuon.py, in numpy float64
    on W [out, in]: lerp momentum + Nesterov, NS(sign(U)), V decayed with the momentum
    coefficient, O / (sqrt(V) + eps), rescaled to 0.2 sqrt(mn) / ||.||_F."""
    rng = np.random.default_rng(6)
    params = {"w": jnp.zeros((9, 14)), "t": jnp.zeros((14, 9))}  # [fan_in, fan_out]
    tx = optim.adamuon(1.0)
    state = tx.init(params)
    update = jax.jit(tx.update)
    beta, eps = 0.95, 1e-8
    buf = {k: np.zeros(v.shape[::-1]) for k, v in params.items()}
    v2 = {k: np.zeros(v.shape[::-1]) for k, v in params.items()}
    for _ in range(3):
        g = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in params.items()}
        u, state = update({k: jnp.asarray(x) for k, x in g.items()}, state, params)
        for k in params:
            G = np.asarray(g[k], np.float64).T
            buf[k] = buf[k] + (1 - beta) * (G - buf[k])
            U = G + beta * (buf[k] - G)
            O = _np_ns5(np.sign(U))
            v2[k] = beta * v2[k] + (1 - beta) * O * O
            O = O / (np.sqrt(v2[k]) + eps)
            O = O * 0.2 * np.sqrt(O.size) / (np.linalg.norm(O) + eps)
            np.testing.assert_allclose(-np.asarray(u[k]).T, O, atol=3e-5, err_msg=k)
    assert state[0].nu["t"].shape == (14, 9) and state[0].nu["t"].dtype == jnp.float32


def test_complex_parameters_are_orthogonalised_with_conjugate_transposes():
    rng = np.random.default_rng(7)
    g = rng.standard_normal((6, 9)) + 1j * rng.standard_normal((6, 9))
    u_, _, vh_ = np.linalg.svd(g, full_matrices=False)
    ref = u_ @ vh_  # unitary polar factor
    x = jnp.asarray(g, jnp.complex64)
    np.testing.assert_allclose(optim.polar(x), ref, atol=2e-5)
    ns = optim.newton_schulz(x, coeffs="polar_express", steps=8)
    np.testing.assert_allclose(ns, ref, atol=2e-3)
    assert float(optim.orthogonality_error(ns)) < 1e-3
    for method in ("direct", "gram"):
        o = optim.newton_schulz(jnp.swapaxes(x, 0, 1), steps=5, method=method)
        assert np.isfinite(np.asarray(o)).all()
        assert float(optim.orthogonality_error(o)) < 0.4  # Jordan x5: singular values 0.7-1.2
    tx = optim.muon(0.1, momentum=0.0, orthogonalizer="polar", shape_scale="none")
    w = jnp.zeros((6, 9), jnp.complex64)
    upd, _ = jax.jit(tx.update)(x, tx.init(w), w)
    assert upd.dtype == jnp.complex64
    np.testing.assert_allclose(upd, -0.1 * ref, atol=2e-6)
