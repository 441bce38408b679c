"""Orthogonalisation kernels: Newton-Schulz iterations, the exact polar factor, norm-ball LMOs.

Every function here works on arrays ``[..., m, n]``: the last two axes are the
matrix, any leading axes are independent batch entries (one call orthogonalises
a whole stack of same-shape matrices). Real and complex inputs are supported:
every transpose below is the conjugate transpose ``X^H``.

The *polar factor* (``msign``) of ``X = U diag(s) V^H`` is ``U diag(sign(s)) V^H``:
the nearest semi-orthogonal (semi-unitary) matrix, with directions of zero
singular value kept at zero. Newton-Schulz (NS) approximates it with odd matrix
polynomials ``X <- a X + b (X X^H) X + c (X X^H)^2 X`` that only need matmuls.
Each step maps every singular value ``s`` through the scalar polynomial
``p(s) = a s + b s^3 + c s^5`` and leaves the singular vectors unchanged.

Sources: Keller Jordan, "Muon: An optimizer for hidden layers" (2024),
https://kellerjordan.github.io/posts/muon/ ; each coefficient set and function below
names its own (paper and arXiv id, or the peer's repository).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "COEFFICIENT_SETS", "NORMS", "NS_EPS_MODES", "NS_METHODS", "PRECONDITIONINGS",
    "coefficient_table", "newton_schulz", "norm_ball_lmo", "orthogonality_error", "polar",
    "singular_value_range",
]  # fmt: skip

# Keller Jordan's quintic (2024): maximal slope at zero while keeping the iterates bounded.
_JORDAN = (3.4445, -4.7750, 2.0315)

# Polar Express, degree 5 (Amsel et al. 2025, Algorithm 1). The first seven
# triples are divided by (1.01, 1.01^3, 1.01^5) for numerical safety; the last
# triple (1.875, -1.25, 0.375) is repeated for any further step.
_POLAR_EXPRESS_RAW = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
)
_POLAR_EXPRESS = tuple((a / 1.01, b / 1.01**3, c / 1.01**5) for a, b, c in _POLAR_EXPRESS_RAW) + (
    (1.875, -1.25, 0.375),
)

# Dion's five per-step triples (Ahn et al. 2025, arXiv 2504.05295), as optax 0.2.8
# ships them (``optax.contrib.muon(ns_coeffs="dion")``); the last one is repeated.
_DION = (
    (4.0848, -6.8946, 2.9270),
    (3.9505, -6.3029, 2.6377),
    (3.7418, -5.5913, 2.3037),
    (2.8769, -3.1427, 1.2046),
    (2.8366, -3.0525, 1.2012),
)

# CANS (Grishina et al., arXiv 2506.10935, Sec. 4: Remez-optimal quintics on adaptive
# intervals): the five triples NVIDIA Emerging-Optimizers ships as "cans".
_CANS = (
    (8.4703, -25.1081, 18.6293), (4.1828, -3.1087, 0.5806), (3.9619, -2.9541, 0.5630),
    (3.2866, -2.4647, 0.5074), (2.2737, -1.6447, 0.4162),
)  # fmt: skip

# Dao-AILab's Gram Newton-Schulz table (github.com/Dao-AILab/gram-newton-schulz,
# ``coefficients.py``, ``YOU_COEFFICIENTS``, after @YouJiacheng; used with a restart before
# step 2), the table torch.optim.Muon's Gram path takes as ``gram_ns_coefficients``.
_DAO_GRAM = (
    (7.892582874424408, -20.38301394587957, 13.555306149406924),
    (3.911484868135431, -2.5464635929060884, 0.4268988319673074),
    (3.760657955697423, -2.512819018216563, 0.4323647349070073),
    (3.160399673686287, -2.149649518898498, 0.3996366907664389),
    (2.1910971618617303, -1.441662010214663, 0.328146487623155),
)

#: Named coefficient sets: name -> (per-step triples, pre-normalisation factor).
#: The input is divided by ``factor * ||X|| + eps`` before the first step; the
#: last triple is repeated when more steps are asked for than the set lists.
COEFFICIENT_SETS: dict[str, tuple[tuple[tuple[float, float, float], ...], float]] = {
    "jordan": ((_JORDAN,), 1.0),
    "polar_express": (_POLAR_EXPRESS, 1.01),
    "dion": (_DION, 1.0),
    # DeepSeek-V4: 8 Jordan steps, then 2 of the convergent (2, -1.5, 0.5) (DeepSeek-AI 2026).
    "deepseek_v4": ((_JORDAN,) * 8 + ((2.0, -1.5, 0.5),) * 2, 1.0),
    "cans": (_CANS, 1.0),
    "dao_gram": (_DAO_GRAM, 1.0),
}

#: How the input is scaled before the first NS step (see :func:`newton_schulz`).
PRECONDITIONINGS = ("frobenius", "spectral", "aol", "schatten")
#: Forms of the iteration (see :func:`newton_schulz`).
NS_METHODS = ("auto", "direct", "gram")
#: How ``eps`` guards the norm division (see :func:`newton_schulz`); ``"relative"`` is
#: scale-invariant at every scale: ``NS(2^j X) == NS(X)`` bit for bit.
NS_EPS_MODES = ("add", "clamp", "relative")
#: Unit balls whose linear-minimisation oracle :func:`norm_ball_lmo` returns.
NORMS = ("spectral", "sign", "colnorm", "rownorm")


def coefficient_table(coeffs: str | Any = "jordan", steps: int = 5) -> tuple[Any, float]:
    """Resolve a coefficient spec into a per-step table.

    Args:
      coeffs: a name in :data:`COEFFICIENT_SETS` (``"jordan"`` repeats one triple,
        the others are per-step tables whose last triple is
        repeated past their length), or an array-like of shape ``[steps, 3]`` (used as
        given, pre-normalisation factor 1) or ``[3]`` (repeated). A traced jax array
        (e.g. optimizer state under ``jit``) is kept as a jax array.
      steps: number of NS steps, ``>= 1``.

    Returns ``(table [steps, 3] of (a, b, c) triples, pre-normalisation factor)``, the
    table float64 numpy (a jax array for traced input). Raises ``ValueError`` for an unknown
    name (lists the allowed ones), bad ``steps``, or a user table of the wrong shape.
    """
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if isinstance(coeffs, str):
        if coeffs not in COEFFICIENT_SETS:
            raise ValueError(
                f"coeffs={coeffs!r} is not a known coefficient set; allowed: "
                f"{sorted(COEFFICIENT_SETS)} or an array of shape [steps, 3]"
            )
        triples, factor = COEFFICIENT_SETS[coeffs]
        rows = [triples[min(i, len(triples) - 1)] for i in range(steps)]
        return np.asarray(rows, dtype=np.float64), factor
    traced = isinstance(coeffs, jax.core.Tracer)
    table = coeffs if traced else np.asarray(coeffs, dtype=np.float64)
    if table.shape == (3,):
        return (jnp.tile(table, (steps, 1)) if traced else np.tile(table, (steps, 1))), 1.0
    if table.ndim != 2 or table.shape[1] != 3 or table.shape[0] != steps:
        raise ValueError(
            f"coeffs array must have shape [steps, 3] = [{steps}, 3] or [3], got {table.shape}"
        )
    return table, 1.0


def _check_matrix(x: jax.Array, name: str) -> None:
    if x.ndim < 2:
        raise ValueError(f"{name} needs an array [..., m, n] with ndim >= 2, got shape {x.shape}")


def _check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if isinstance(value, jax.core.Tracer) or value not in allowed:
        raise ValueError(f"{name}={value!r}; allowed: {allowed}")


def _ht(x: jax.Array) -> jax.Array:
    """Conjugate transpose of the last two axes (plain transpose for real arrays)."""
    x = jnp.swapaxes(x, -1, -2)
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


def _abs2(x: jax.Array) -> jax.Array:
    """``|x|^2`` entrywise, real, at least float32."""
    x = x.astype(jnp.result_type(x.dtype, jnp.float32))
    return jnp.real(x * jnp.conj(x)) if jnp.iscomplexobj(x) else jnp.square(x)


def _frobenius(x: jax.Array) -> jax.Array:
    return jnp.sqrt(jnp.sum(_abs2(x), axis=(-2, -1), keepdims=True))


def _compute_dtype(x: jax.Array, dtype: Any) -> Any:
    if dtype is None:
        return jnp.result_type(x.dtype, jnp.float32)
    dtype = jnp.dtype(dtype)
    if jnp.iscomplexobj(x) and not jnp.issubdtype(dtype, jnp.complexfloating):
        raise ValueError(f"dtype={dtype} is real but the input is complex ({x.dtype})")
    return dtype


def newton_schulz(
    x: jax.Array,
    *,
    coeffs: str | Any = "jordan",
    steps: int = 5,
    eps: float = 1e-7,
    eps_mode: str = "relative",
    dtype: Any = None,
    method: str = "direct",
    preconditioning: str = "frobenius",
    gram_restarts: tuple[int, ...] | None = None,
) -> jax.Array:
    r"""Approximate the polar factor of ``x`` with quintic Newton-Schulz steps.

    Tall matrices are transposed first (the iteration commutes with transposition), so
    the work is on ``X [k, l]``, ``k <= l``. Pre-conditioning before the first step:

    - ``"frobenius"``: ``X0 = X / (factor ||X||_F + eps)`` (Jordan 2024; every peer).
    - ``"spectral"``: ``X0 = X / (factor ||X||_2 + eps)`` with the exact spectral norm
      (an SVD: slow, but the most accurate start).
    - ``"aol"``: no norm division; the first step's ``A = X X^H`` rescales the rows of
      ``X`` by ``s_i = (sum_j |A_ij| + eps)^(-1/2)`` (``||diag(s) X||_2 <= 1``) and ``A <-
      diag(s) A diag(s)``: no extra matmul, a tighter start (Boissin et al., "Turbo-Muon",
      arXiv 2512.04632, Sec. 3).
    - ``"schatten"``: ``X0 = X / ||X X^H||_F^(1/2)`` (the Schatten-4 norm), folded into
      the first step the same way (Grishina et al., arXiv 2506.10935).

    Each step is ``X <- a X + (b A + c A^2) X`` with ``A = X X^H`` (the output band of each
    coefficient set: docs/peers.md).

    Args:
      x: ``[..., m, n]`` real or complex array; leading axes are batch axes.
      coeffs: a name of :data:`COEFFICIENT_SETS` or an array ``[steps, 3]``
        (see :func:`coefficient_table`).
      steps: number of NS steps.
      eps: added to the norm before dividing (guards zero inputs: zero maps to zero),
        and the floor of the AOL / Schatten rescale denominators.
      eps_mode: ``"relative"`` (``||X|| + eps 2^e``, ``2^e`` the power of two at or above
        ``max |X|``: the output does not depend on the input's scale, down to subnormal
        inputs), ``"add"`` (``||X|| + eps``: Keller Jordan, optax) or ``"clamp"``
        (``max(||X||, eps)``: torch.optim.Muon). In every mode the norm is computed
        after an exact power-of-two rescale, so its sum of squares cannot underflow.
      dtype: compute dtype (e.g. ``jnp.bfloat16`` on GPU/TPU, as in the PyTorch
        reference); ``None`` keeps ``x.dtype`` (at least float32). The result is cast
        back to ``x.dtype``.
      method: ``"direct"`` iterates on ``X`` (3 matmuls a step, two of them
        ``k x k x l``); ``"gram"`` iterates on the ``k x k`` Gram matrix ``R = X X^H``
        and applies the accumulated polynomial to ``X`` only at the restarts and at the
        end (4 ``k^3`` matmuls a step plus 2 ``k x k x l`` per restart; Gram Newton-Schulz,
        Zhang, Amsel, Chen, Dao 2026). ``"auto"``: ``"gram"`` when ``l >= 2k`` and the
        compute dtype is not bfloat16 (docs/peers.md), else ``"direct"``.
      preconditioning: ``"frobenius"``, ``"spectral"``, ``"aol"`` or ``"schatten"``.
      gram_restarts: step indices (0-based) before which the Gram form restarts.
        ``None``: Dao-AILab's ``(2,)`` (a restart after the second step) when the compute
        dtype has fewer than 32 bits, ``(2, 4)`` otherwise. Each restart costs two
        ``k x k x l`` matmuls and removes the error ``R`` accumulates (at 5 steps with
        ``(2, 4)``: ``11 + 6 l / k`` against the direct form's ``5 + 10 l / k`` units of
        ``k^3``). Measured errors: docs/peers.md, "Gram Newton-Schulz in fp32".

    Returns:
      ``[..., m, n]`` array of ``x.dtype``.

    Raises:
      ValueError: ``x.ndim < 2``, unknown ``coeffs``/``method``/``preconditioning``, bad
        ``steps``, or a real ``dtype`` for a complex input.

    References:
      Jordan (2024), https://kellerjordan.github.io/posts/muon/ ;
      Amsel et al. (2025), arXiv 2505.16932; Boissin et al. (2025), arXiv 2512.04632;
      Zhang et al. (2026), github.com/Dao-AILab/gram-newton-schulz.
    """
    _check_matrix(x, "newton_schulz")
    _check_choice("method", method, NS_METHODS)
    _check_choice("preconditioning", preconditioning, PRECONDITIONINGS)
    _check_choice("eps_mode", eps_mode, NS_EPS_MODES)
    table, factor = coefficient_table(coeffs, steps)
    cdtype = _compute_dtype(x, dtype)
    k, l = sorted(x.shape[-2:])
    if method == "auto":  # Gram form where it saves FLOPs and stays accurate
        method = "gram" if l >= 2 * k and jnp.dtype(cdtype) != jnp.bfloat16 else "direct"
    if gram_restarts is None:
        gram_restarts = (2,) if jnp.finfo(cdtype).bits < 32 else (2, 4)
    static = (factor, cdtype, method, preconditioning, tuple(map(int, gram_restarts)), eps_mode)
    if isinstance(table, np.ndarray):  # static: part of the compiled program
        return _ns_static(x, eps, tuple(map(tuple, table.tolist())), *static)
    return _ns_dynamic(x, eps, table, *static)


def _ns(x, eps, table, factor, cdtype, method, preconditioning, restarts, eps_mode):
    """The NS iteration (see :func:`newton_schulz`); arguments already validated."""
    out_dtype = x.dtype
    tall = x.shape[-2] > x.shape[-1]
    X = jnp.swapaxes(x, -1, -2) if tall else x  # [..., k, l], k <= l
    X = X.astype(jnp.result_type(X.dtype, jnp.float32))
    if preconditioning in ("frobenius", "spectral"):
        # X = 2^e X' with 2^e the power of two at or above max |X|: exact, so the norm of X'
        # (entries up to 1) cannot underflow, and the output is invariant under X -> 2^j X
        peak = jnp.max(jnp.abs(X), axis=(-2, -1), keepdims=True)
        two = jnp.ldexp(jnp.ones_like(peak), jnp.frexp(peak)[1])  # [..., 1, 1]; 1 for X = 0
        X = (X / two.astype(X.dtype)).astype(cdtype)
        if preconditioning == "frobenius":
            norm = _frobenius(X)
        else:
            xs = X.astype(jnp.result_type(X.dtype, jnp.float32))
            norm = jnp.linalg.svd(xs, compute_uv=False)[..., :1, None]
        eps = eps if eps_mode == "relative" else eps / two  # "add"/"clamp": eps on ||X||
        norm = jnp.maximum(factor * norm, eps) if eps_mode == "clamp" else factor * norm + eps
        X = X / norm.astype(cdtype)
    X = X.astype(cdtype)
    A = X @ _ht(X)  # [..., k, k]
    if preconditioning == "aol":
        s = jax.lax.rsqrt(jnp.maximum(jnp.sum(jnp.sqrt(_abs2(A)), axis=-1), eps))  # [..., k]
        s = s.astype(jnp.real(A).dtype)
        X = X * s[..., :, None]
        A = A * s[..., :, None] * s[..., None, :]
    elif preconditioning == "schatten":
        s = jax.lax.rsqrt(jnp.maximum(_frobenius(A), eps)).astype(jnp.real(A).dtype)
        X, A = X * s, A * (s * s)
    if method == "gram":
        X = _gram_ns(X, A, table, restarts, jnp.finfo(cdtype).bits < 32)
    else:
        for i, (a, b, c) in enumerate(table):
            if i > 0:
                A = X @ _ht(X)
            X = a * X + (b * A + c * (A @ A)) @ X
    if tall:
        X = jnp.swapaxes(X, -1, -2)
    return X.astype(out_dtype)


# One compiled program per shape and static options (inlined inside an outer ``jit``).
_STATIC = ("factor", "cdtype", "method", "preconditioning", "restarts", "eps_mode")
_ns_static = jax.jit(_ns, static_argnames=("table",) + _STATIC)
_ns_dynamic = jax.jit(_ns, static_argnames=_STATIC)


def _gram_ns(
    X: jax.Array, R: jax.Array, table: Any, restarts: tuple[int, ...], low_precision: bool
) -> jax.Array:
    """Gram Newton-Schulz on ``X [..., k, l]`` with ``R = X X^H`` given (see newton_schulz).

    Every iterate is ``X_t = Q_t X_0`` with ``Q_t`` a polynomial in ``R_0``, so all the
    factors commute: ``P_t = a I + Z_t`` with ``Z_t = b R + c R^2``, ``Q_t = Q_{t-1} P_t``
    and ``R_t = P_t R_{t-1} P_t``. A restart (``X <- Q X``, ``R <- X X^H``, ``Q <- I``)
    removes the error ``R`` accumulates in low precision, where ``R`` is also kept
    Hermitian. Zhang, Amsel, Chen, Dao (2026), Dao-AILab.
    """
    eye = jnp.eye(X.shape[-2], dtype=X.dtype)
    Q = None
    n = len(table)
    for i in range(n):
        a, b, c = table[i][0], table[i][1], table[i][2]
        if i in restarts and Q is not None:
            X = Q @ X
            R = X @ _ht(X)
            Q = None
        Z = b * R + c * (R @ R)
        Q = Z + a * eye if Q is None else Q @ Z + a * Q
        if i + 1 < n and (i + 1) not in restarts:
            RZ = R @ Z + a * R
            R = Z @ RZ + a * RZ
            if low_precision:  # keep R exactly Hermitian
                R = 0.5 * (R + _ht(R))
    return Q @ X


def polar(x: jax.Array, *, rtol: float | None = None) -> jax.Array:
    r"""Exact polar factor ``msign(x) = U sign(S) V^H`` via the SVD.

    Singular values ``s <= rtol * s_max`` are treated as zero and their
    directions are dropped (the output has the rank of ``x``), so
    rank-deficient inputs, e.g. gradients with ``1^T G = 0``, keep their null
    space. A zero matrix maps to zero. Complex inputs give the unitary polar factor.
    Works in the input dtype (float64 under ``jax_enable_x64``).

    Args:
      x: ``[..., m, n]`` real or complex array.
      rtol: relative threshold for zero singular values; default ``max(m, n) *
        finfo(dtype).eps`` (numpy's ``matrix_rank`` rule).

    Returns ``[..., m, n]`` of ``x.dtype`` with singular values in ``{0, 1}``; raises
    ``ValueError`` for ``x.ndim < 2`` or a negative ``rtol``.

    Source: the notation ``msgn`` of docs/science.md; Wang et al. 2025 (arXiv 2509.26030),
    Li et al. 2026 (arXiv 2602.05725).
    """
    _check_matrix(x, "polar")
    if rtol is not None and rtol < 0:
        raise ValueError(f"rtol must be >= 0, got {rtol}")
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        x = x.astype(jnp.float32)
    m, n = x.shape[-2:]
    if rtol is None:
        rtol = max(m, n) * float(jnp.finfo(x.dtype).eps)
    u, s, vh = jnp.linalg.svd(x, full_matrices=False)  # [..., m, k], [..., k], [..., k, n]
    smax = jnp.max(s, axis=-1, keepdims=True)
    keep = (s > rtol * smax) & (s > 0)
    return (u * keep[..., None, :].astype(x.dtype)) @ vh


def norm_ball_lmo(x: jax.Array, norm: str, *, eps: float = 1e-7) -> jax.Array:
    r"""Linear-minimisation oracle of a unit operator-norm ball: ``argmax_{||D|| <= 1} <x, D>``.

    The descent step of steepest descent / Scion under that norm is ``-lr * D``. With
    ``x`` a stack ``[..., fan_in, fan_out]`` (Flax kernel layout, ``y = x_in @ W``):

    - ``"spectral"`` (``||W||_{2->2}``): ``D = msign(x)``, the exact polar factor
      (:func:`polar`); Muon approximates it with :func:`newton_schulz`.
    - ``"sign"`` (``||W||_{1->inf}``, the max entry): ``D = sign(x)``: SignGD.
    - ``"colnorm"`` (``||W||_{1->2}``, PyTorch layout ``[out, in]``: the largest column
      norm): every input feature's weight vector ``x[..., i, :]`` scaled to unit l2 norm.
      Scion's ``ColNorm`` (unnormalised) is this times ``sqrt(fan_out)``.
    - ``"rownorm"`` (``||W||_{2->inf}``, PyTorch layout: the largest row norm): every
      output neuron's weight vector ``x[..., :, j]`` scaled to unit l2 norm.

    Dimension factors (Scion's ``normalized`` variants) are left to the caller's
    shape scaling (``amemory.optim.shape_scale_factor``).

    Args:
      x: ``[..., fan_in, fan_out]`` real array.
      norm: one of :data:`NORMS`.
      eps: added to the vector norms of ``colnorm``/``rownorm`` (zero maps to zero).

    Returns ``[..., fan_in, fan_out]`` of ``x.dtype``; raises ``ValueError`` for an unknown
    ``norm`` or ``x.ndim < 2``.

    Source: Pethick et al., "Training Deep Learning Models with Norm-Constrained LMOs"
    (Scion), arXiv 2502.07529, Sec. 3, Table 1; reference code github.com/LIONS-EPFL/scion.
    """
    _check_matrix(x, "norm_ball_lmo")
    _check_choice("norm", norm, NORMS)
    if norm == "spectral":
        return polar(x)
    if norm == "sign":
        return jnp.sign(x)
    axis = -1 if norm == "colnorm" else -2
    n = jnp.sqrt(jnp.sum(_abs2(x), axis=axis, keepdims=True))
    return (x / (n + eps).astype(x.dtype)).astype(x.dtype)


def orthogonality_error(o: jax.Array) -> jax.Array:
    r"""Distance of ``o`` from semi-orthogonality (semi-unitarity), per matrix.

    ``err(O) = ||G - I_k||_F / sqrt(k)`` with ``k = min(m, n)`` and ``G`` the
    ``k x k`` Gram matrix on the smaller side (``O^H O`` for tall ``O``,
    ``O O^H`` for wide). Equivalently the RMS over the ``k`` singular values
    of ``(s_i^2 - 1)``: 0 for a semi-orthogonal matrix; a direction with
    ``s_i = 0`` (rank deficiency) contributes 1. Computed in at least fp32.

    Args:
      o: ``[..., m, n]`` real or complex array (usually an NS or polar output).

    Returns ``[...]`` real, dimensionless; raises ``ValueError`` for ``o.ndim < 2``.
    """
    _check_matrix(o, "orthogonality_error")
    o32 = o.astype(jnp.result_type(o.dtype, jnp.float32))
    g = _ht(o32) @ o32 if o.shape[-2] >= o.shape[-1] else o32 @ _ht(o32)  # the smaller side
    k = g.shape[-1]
    diff = g - jnp.eye(k, dtype=g.dtype)
    return jnp.sqrt(jnp.sum(_abs2(diff), axis=(-2, -1)) / k)


def singular_value_range(o: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(s_min, s_max)``, each ``[...]`` real in at least fp32: the smallest and largest of
    the ``min(m, n)`` singular values of each matrix of ``o [..., m, n]`` (real or complex).
    Raises ``ValueError`` for ``o.ndim < 2``."""
    _check_matrix(o, "singular_value_range")
    s = jnp.linalg.svd(o.astype(jnp.result_type(o.dtype, jnp.float32)), compute_uv=False)
    return jnp.min(s, axis=-1), jnp.max(s, axis=-1)
