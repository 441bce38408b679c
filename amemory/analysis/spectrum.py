"""Isotropy metrics of weight matrices from their singular values.

Definitions (Wang et al. 2025, arXiv 2509.26030, Section 4; see
docs/science.md#isotropy-metrics): for a matrix with NON-ZERO singular values
sigma_1 >= ... >= sigma_n and energy shares q_i = sigma_i^2 / sum_j sigma_j^2,

  entropy            H = -(1 / log n) sum_i q_i log q_i          in [0, 1]; 1 = flat spectrum
  effective_rank     eRank = exp(-sum_i q_i log q_i)              in [1, n]   (Roy & Vetterli 2007)
  top_k_energy       TopE_k = sum_{i<=k} sigma_i^2 / sum_j sigma_j^2   (k = 10 in the paper)
  q75_25             Q3(sigma^2) / Q1(sigma^2), quartiles with linear interpolation (numpy.quantile)
  stable_rank        ||A||_F^2 / ||A||_2^2 = sum_i sigma_i^2 / sigma_1^2
  condition_number   sigma_1 / sigma_n

"Non-zero" means sigma_i > rtol * sigma_1 with rtol = max(m, n) * eps(input dtype),
the numpy.linalg.matrix_rank convention; every metric is restricted to these
values (a rank-deficient matrix has a finite condition number over its range).
For n = 1 the normalised entropy is 0/0; it is reported as 0 (all energy in one
direction). An all-zero matrix gives NaN for every metric.

The metrics are computed on the host in float64 with numpy's SVD: they are logged
every few hundred steps, where exactness matters more than speed.
"""

from __future__ import annotations

import numpy as np

METRICS = (
    "entropy",
    "effective_rank",
    "top10_energy",
    "q75_25",
    "stable_rank",
    "condition_number",
)


def singular_values(x) -> np.ndarray:
    """Singular values of a matrix or stack, descending, float64.

    Args:
      x: array ``[..., m, n]`` (numpy or jax; any float dtype).

    Returns:
      ``[..., min(m, n)]`` float64, descending along the last axis.

    Raises:
      ValueError: if ``x`` has fewer than 2 dimensions.
    """
    a = np.asarray(x)
    if a.ndim < 2:
        raise ValueError(f"x must be a matrix [..., m, n]; got shape {a.shape}")
    return np.linalg.svd(a.astype(np.float64), compute_uv=False)


def _nonzero_mask(s: np.ndarray, shape: tuple[int, ...], dtype, rtol: float | None) -> np.ndarray:
    if rtol is None:
        eps = np.finfo(dtype).eps if np.issubdtype(dtype, np.floating) else np.finfo(np.float64).eps
        rtol = max(shape[-2], shape[-1]) * float(eps)
    return s > rtol * s[..., :1]


def _shares(s: np.ndarray, mask: np.ndarray) -> np.ndarray:
    e = np.where(mask, s * s, 0.0)
    total = e.sum(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return e / total


def _neg_q_log_q(q: np.ndarray, mask: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        t = np.where(mask & (q > 0), -q * np.log(np.where(q > 0, q, 1.0)), 0.0)
    out = t.sum(-1)
    return np.where(mask.any(-1), out, np.nan)


def _prep(x, rtol):
    a = np.asarray(x)
    s = singular_values(a)
    return s, _nonzero_mask(s, a.shape, a.dtype, rtol)


def entropy(x, *, rtol: float | None = None) -> np.ndarray:
    """Normalised SVD entropy ``H = -(1/log n) sum q_i log q_i`` of ``x [..., m, n]`` -> ``[...]``.

    Source: Wang et al. 2025 (arXiv 2509.26030), Section 4. n = number of non-zero singular
    values; n = 1 gives 0.
    """
    s, mask = _prep(x, rtol)
    q = _shares(s, mask)
    n = mask.sum(-1)
    h = _neg_q_log_q(q, mask)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(n > 1, h / np.log(np.maximum(n, 2)), np.where(n == 1, 0.0, np.nan))
    return out


def effective_rank(x, *, rtol: float | None = None) -> np.ndarray:
    """Effective rank ``exp(-sum q_i log q_i)`` of ``x [..., m, n]`` -> ``[...]`` in ``[1, n]``.

    Source: Roy & Vetterli (2007); Wang et al. 2025 (arXiv 2509.26030), Section 4.
    """
    s, mask = _prep(x, rtol)
    return np.exp(_neg_q_log_q(_shares(s, mask), mask))


def top_k_energy(x, k: int = 10, *, rtol: float | None = None) -> np.ndarray:
    """Share of squared singular values in the top ``k``: ``[..., m, n]`` -> ``[...]`` in (0, 1].

    Raises:
      ValueError: if ``k < 1``.
    """
    if int(k) < 1:
        raise ValueError(f"k must be >= 1; got {k}")
    s, mask = _prep(x, rtol)
    q = _shares(s, mask)
    out = np.where(mask, q, 0.0)[..., : int(k)].sum(-1)
    return np.where(mask.any(-1), out, np.nan)


def q75_25(x, *, rtol: float | None = None) -> np.ndarray:
    """Upper / lower quartile of the non-zero ``sigma^2``: ``[..., m, n]`` -> ``[...]``.

    Quartiles use numpy's default linear interpolation over the n non-zero values.
    """
    s, mask = _prep(x, rtol)
    return _q75_25_from(s, mask)


def _q75_25_from(s: np.ndarray, mask: np.ndarray) -> np.ndarray:
    e = s * s
    flat_e = e.reshape(-1, e.shape[-1])
    flat_m = mask.reshape(-1, mask.shape[-1])
    out = np.empty(flat_e.shape[0])
    for i, (row, m) in enumerate(zip(flat_e, flat_m, strict=True)):
        v = row[m]
        out[i] = np.nan if v.size == 0 else np.quantile(v, 0.75) / np.quantile(v, 0.25)
    return out.reshape(e.shape[:-1])


def stable_rank(x, *, rtol: float | None = None) -> np.ndarray:
    """Stable rank ``||A||_F^2 / ||A||_2^2``: ``[..., m, n]`` -> ``[...]`` in ``[1, rank]``."""
    s, mask = _prep(x, rtol)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(mask, s * s, 0.0).sum(-1) / (s[..., 0] ** 2)
    return np.where(mask.any(-1), out, np.nan)


def condition_number(x, *, rtol: float | None = None) -> np.ndarray:
    """``sigma_max / sigma_min`` over the non-zero singular values: ``[..., m, n]`` -> ``[...]``."""
    s, mask = _prep(x, rtol)
    smin = np.where(mask, s, np.inf).min(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = s[..., 0] / smin
    return np.where(mask.any(-1), out, np.nan)


def spectrum_metrics(x, *, k: int = 10, rtol: float | None = None) -> dict[str, np.ndarray | float]:
    """All isotropy metrics of one matrix ``[m, n]`` (floats) or a stack ``[..., m, n]`` (arrays).

    Keys are ``METRICS`` (``top10_energy`` is ``top{k}_energy`` for other ``k``).
    One SVD is shared by all metrics.

    Raises:
      ValueError: if ``x`` has fewer than 2 dimensions or ``k < 1``.
    """
    a = np.asarray(x)
    if a.ndim < 2:
        raise ValueError(f"x must be a matrix [..., m, n]; got shape {a.shape}")
    if int(k) < 1:
        raise ValueError(f"k must be >= 1; got {k}")
    k = int(k)
    s = singular_values(a)
    mask = _nonzero_mask(s, a.shape, a.dtype, rtol)
    q = _shares(s, mask)
    n = mask.sum(-1)
    any_ = mask.any(-1)
    h = _neg_q_log_q(q, mask)
    with np.errstate(invalid="ignore", divide="ignore"):
        ent = np.where(n > 1, h / np.log(np.maximum(n, 2)), np.where(n == 1, 0.0, np.nan))
        stable = np.where(any_, np.where(mask, s * s, 0.0).sum(-1) / s[..., 0] ** 2, np.nan)
        cond = np.where(any_, s[..., 0] / np.where(mask, s, np.inf).min(-1), np.nan)
    out = {
        "entropy": ent,
        "effective_rank": np.exp(h),
        f"top{int(k)}_energy": np.where(any_, np.where(mask, q, 0.0)[..., :k].sum(-1), np.nan),
        "q75_25": _q75_25_from(s, mask),
        "stable_rank": stable,
        "condition_number": cond,
    }
    if a.ndim == 2:
        return {key: float(v) for key, v in out.items()}
    return out
