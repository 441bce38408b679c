"""Orthogonalisation kernels: Newton-Schulz iterations and the exact polar factor.

Every function here works on arrays ``[..., m, n]``: the last two axes are the
matrix, any leading axes are independent batch entries (one call orthogonalises
a whole stack of same-shape matrices).

The *polar factor* (``msign``) of ``X = U diag(s) V^T`` is ``U diag(sign(s)) V^T``:
the nearest semi-orthogonal matrix, with directions of zero singular value kept
at zero. Newton-Schulz (NS) approximates it with odd matrix polynomials
``X <- a X + b (X X^T) X + c (X X^T)^2 X`` that only need matmuls. Each step
maps every singular value ``s`` through the scalar polynomial
``p(s) = a s + b s^3 + c s^5`` and leaves the singular vectors unchanged, so
the quality of an NS output is fully described by where the scalar iteration
sends the normalised singular values ``s / ||X||_F``.

Sources: Keller Jordan, "Muon: An optimizer for hidden layers" (2024),
https://kellerjordan.github.io/posts/muon/ (coefficients 3.4445, -4.7750,
2.0315); Amsel et al., "The Polar Express", arXiv 2505.16932, Algorithm 1
(per-step coefficients, safety factor 1.01).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "COEFFICIENT_SETS",
    "coefficient_table",
    "newton_schulz",
    "orthogonality_error",
    "polar",
    "singular_value_range",
]

# Keller Jordan's quintic: maximal slope at zero (3.4445) while keeping the
# iterates bounded; converged singular values oscillate in about [0.68, 1.13].
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

#: Named coefficient sets: name -> (per-step triples, pre-normalisation factor).
#: The input is divided by ``factor * ||X||_F + eps`` before the first step.
COEFFICIENT_SETS: dict[str, tuple[tuple[tuple[float, float, float], ...], float]] = {
    "jordan": ((_JORDAN,), 1.0),
    "polar_express": (_POLAR_EXPRESS, 1.01),
}


def coefficient_table(coeffs: str | Any = "jordan", steps: int = 5) -> tuple[np.ndarray, float]:
    """Resolve a coefficient spec into a per-step table.

    Args:
      coeffs: ``"jordan"`` (the same triple every step), ``"polar_express"``
        (per-step table, its last triple repeated past step 8), or an array-like
        of shape ``[steps, 3]`` (used as given, pre-normalisation factor 1) or
        ``[3]`` (repeated).
      steps: number of NS steps, ``>= 1``.

    Returns:
      ``(table, factor)``: ``table`` float64 ``[steps, 3]`` of ``(a, b, c)``
      triples, ``factor`` the Frobenius pre-normalisation factor.

    Raises:
      ValueError: unknown name (lists the allowed ones), bad ``steps``, or a
        user table of the wrong shape.
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
    table = np.asarray(coeffs, dtype=np.float64)
    if table.shape == (3,):
        return np.tile(table, (steps, 1)), 1.0
    if table.ndim != 2 or table.shape[1] != 3 or table.shape[0] != steps:
        raise ValueError(
            f"coeffs array must have shape [steps, 3] = [{steps}, 3] or [3], got {table.shape}"
        )
    return table, 1.0


def _check_matrix(x: jax.Array, name: str) -> None:
    if x.ndim < 2:
        raise ValueError(f"{name} needs an array [..., m, n] with ndim >= 2, got shape {x.shape}")


def newton_schulz(
    x: jax.Array,
    *,
    coeffs: str | Any = "jordan",
    steps: int = 5,
    eps: float = 1e-7,
    dtype: Any = None,
    method: str = "direct",
) -> jax.Array:
    r"""Approximate the polar factor of ``x`` with quintic Newton-Schulz steps.

    With ``X0 = x / (factor * ||x||_F + eps)`` (Frobenius norm per matrix), each
    step is ``X <- a X + (b A + c A^2) X`` with ``A = X X^T`` taken on the
    smaller side (tall matrices are transposed first, which gives the same
    result because the iteration commutes with transposition).

    Output singular values (per matrix, for inputs with normalised singular
    values ``s / ||x||_F`` in ``[0.01, 1]``; computed from the scalar
    iteration in float64): ``"jordan"`` x5 lies in ``[0.68, 1.14]`` (also x4
    to x8: the iteration oscillates, it does not converge to 1);
    ``"polar_express"`` x5 in ``[0.87, 1.13]``, x6 in ``[0.997, 1.002]``,
    x8 within 1e-12 of 1; smaller normalised singular
    values are only multiplied by the product of the ``a`` coefficients
    (``3.4445^5 ~ 487`` for jordan).

    Args:
      x: ``[..., m, n]`` float array; leading axes are batch axes.
      coeffs: ``"jordan"``, ``"polar_express"`` or an array ``[steps, 3]``
        (see :func:`coefficient_table`).
      steps: number of NS steps.
      eps: added to the Frobenius norm before dividing (guards zero inputs:
        a zero matrix maps to zero).
      dtype: compute dtype of the iteration (e.g. ``jnp.bfloat16`` on GPU/TPU,
        as in the PyTorch reference); ``None`` keeps ``x.dtype``. The result
        is cast back to ``x.dtype``.
      method: ``"direct"`` iterates on ``X`` (3 matmuls a step, two of them
        ``k x k x l`` for ``k = min(m, n)``, ``l = max(m, n)``);
        ``"gram"`` iterates on the ``k x k`` Gram matrix and applies the
        accumulated polynomial to ``X`` once at the end (fewer FLOPs when
        ``l >= 2k``; same result in exact arithmetic; keep fp32 or wider).
        ``"auto"`` picks ``"gram"`` when ``l >= 2k`` and the compute dtype has
        at least 32 bits, else ``"direct"``.

    Returns:
      ``[..., m, n]`` array of ``x.dtype``.

    Raises:
      ValueError: ``x.ndim < 2``, unknown ``coeffs``/``method``, bad ``steps``.

    References:
      Jordan (2024), https://kellerjordan.github.io/posts/muon/ ;
      Amsel et al. (2025), arXiv 2505.16932.
    """
    _check_matrix(x, "newton_schulz")
    if method not in ("direct", "gram", "auto"):
        raise ValueError(f"method={method!r}; allowed: 'direct', 'gram', 'auto'")
    table, factor = coefficient_table(coeffs, steps)
    out_dtype = x.dtype
    cdtype = jnp.dtype(dtype) if dtype is not None else jnp.result_type(x.dtype, jnp.float32)
    m, n = x.shape[-2], x.shape[-1]
    tall = m > n
    X = jnp.swapaxes(x, -1, -2) if tall else x  # [..., k, l], k <= l
    k, l = X.shape[-2], X.shape[-1]
    if method == "auto":
        method = "gram" if (l >= 2 * k and jnp.finfo(cdtype).bits >= 32) else "direct"
    X = X.astype(cdtype)
    norm = jnp.sqrt(jnp.sum(jnp.square(X.astype(jnp.float32)), axis=(-2, -1), keepdims=True))
    X = X / (factor * norm + eps).astype(cdtype)
    if method == "direct":
        for a, b, c in table:
            A = X @ jnp.swapaxes(X, -1, -2)  # [..., k, k]
            B = b * A + c * (A @ A)
            X = a * X + B @ X
    else:
        X = _gram_ns(X, table)
    if tall:
        X = jnp.swapaxes(X, -1, -2)
    return X.astype(out_dtype)


def _gram_ns(X: jax.Array, table: np.ndarray) -> jax.Array:
    """NS on the Gram matrix: X_t = Q_t X_0 with A_t = X_t X_t^T = Q_t A_0 Q_t^T.

    Every iterate is a polynomial in A_0, so all factors commute and
    ``P_t = a + b A_t + c A_t^2``, ``Q_{t+1} = P_t Q_t``,
    ``A_{t+1} = P_t^2 A_t``. Per step: 4 matmuls ``k x k x k`` instead of
    2 of ``k x k x l`` plus one ``k^3``; plus 2 of ``k x k x l`` overall.
    """
    k = X.shape[-2]
    eye = jnp.eye(k, dtype=X.dtype)
    A = X @ jnp.swapaxes(X, -1, -2)  # [..., k, k]
    Q = None
    last = len(table) - 1
    for i, (a, b, c) in enumerate(table):
        A2 = A @ A
        P = a * eye + b * A + c * A2
        Q = P if Q is None else P @ Q
        if i < last:
            PA = a * A + b * A2 + c * (A2 @ A)  # P A
            A = P @ PA  # P^2 A
            A = 0.5 * (A + jnp.swapaxes(A, -1, -2))  # keep exactly symmetric
    return Q @ X


def polar(x: jax.Array, *, rtol: float | None = None) -> jax.Array:
    r"""Exact polar factor ``msign(x) = U sign(S) V^T`` via the SVD.

    Singular values ``s <= rtol * s_max`` are treated as zero and their
    directions are dropped (the output has the rank of ``x``), so
    rank-deficient inputs, e.g. gradients with ``1^T G = 0``, keep their null
    space. A zero matrix maps to zero.

    Works in the input dtype: with ``jax.config.update("jax_enable_x64", True)``
    a float64 input gives a float64 result.

    Args:
      x: ``[..., m, n]`` float array.
      rtol: relative threshold for zero singular values; default
        ``max(m, n) * finfo(dtype).eps`` (numpy's ``matrix_rank`` rule). In
        float32 with ``K = 1000`` that is ``1.2e-4 * s_max``: genuine singular
        values below it (e.g. very rare classes of a steep power law) are
        dropped, so use float64 (x64) for spectra spanning many decades, or pass
        ``rtol`` explicitly.

    Returns:
      ``[..., m, n]`` array of ``x.dtype`` with singular values in ``{0, 1}``.

    Raises:
      ValueError: ``x.ndim < 2`` or a negative ``rtol``.

    Source: papers.md notation ``msgn``; Wang et al. 2025 (arXiv 2509.26030),
    Li et al. 2026 (arXiv 2602.05725).
    """
    _check_matrix(x, "polar")
    if rtol is not None and rtol < 0:
        raise ValueError(f"rtol must be >= 0, got {rtol}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        x = x.astype(jnp.float32)
    m, n = x.shape[-2:]
    if rtol is None:
        rtol = max(m, n) * float(jnp.finfo(x.dtype).eps)
    u, s, vh = jnp.linalg.svd(x, full_matrices=False)  # [..., m, k], [..., k], [..., k, n]
    smax = jnp.max(s, axis=-1, keepdims=True)
    keep = (s > rtol * smax) & (s > 0)
    return (u * keep[..., None, :].astype(x.dtype)) @ vh


def _gram_small(o: jax.Array) -> jax.Array:
    m, n = o.shape[-2:]
    o32 = o.astype(jnp.result_type(o.dtype, jnp.float32))
    if m >= n:
        return jnp.swapaxes(o32, -1, -2) @ o32  # [..., n, n]
    return o32 @ jnp.swapaxes(o32, -1, -2)  # [..., m, m]


def orthogonality_error(o: jax.Array) -> jax.Array:
    r"""Distance of ``o`` from semi-orthogonality, per matrix.

    ``err(O) = ||G - I_k||_F / sqrt(k)`` with ``k = min(m, n)`` and ``G`` the
    ``k x k`` Gram matrix on the smaller side (``O^T O`` for tall ``O``,
    ``O O^T`` for wide). Equivalently the RMS over the ``k`` singular values
    of ``(s_i^2 - 1)``: 0 for a semi-orthogonal matrix; a direction with
    ``s_i = 0`` (rank deficiency) contributes 1. Computed in at least fp32.

    Args:
      o: ``[..., m, n]`` float array (usually an NS or polar output).

    Returns:
      ``[...]`` float array (dimensionless).

    Raises:
      ValueError: ``o.ndim < 2``.
    """
    _check_matrix(o, "orthogonality_error")
    g = _gram_small(o)
    k = g.shape[-1]
    diff = g - jnp.eye(k, dtype=g.dtype)
    return jnp.sqrt(jnp.sum(jnp.square(diff), axis=(-2, -1)) / k)


def singular_value_range(o: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Smallest and largest of the ``min(m, n)`` singular values of each matrix.

    Args:
      o: ``[..., m, n]`` float array.

    Returns:
      ``(s_min, s_max)``, each ``[...]``, in at least fp32.

    Raises:
      ValueError: ``o.ndim < 2``.
    """
    _check_matrix(o, "singular_value_range")
    s = jnp.linalg.svd(o.astype(jnp.result_type(o.dtype, jnp.float32)), compute_uv=False)
    return jnp.min(s, axis=-1), jnp.max(s, axis=-1)
