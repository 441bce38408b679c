"""Isotropy metrics of weight matrices from their singular values.

Definitions (Wang et al. 2025, arXiv 2509.26030, Section 4; see
docs/science.md#isotropy-metrics): for a matrix with NON-ZERO singular values
sigma_1 >= ... >= sigma_n and energy shares q_i = sigma_i^2 / sum_j sigma_j^2,

  entropy            H = -(1 / log n) sum_i q_i log q_i          in [0, 1]; 1 = flat spectrum
  effective_rank     eRank = exp(-sum_i q_i log q_i)              in [1, n]   (Roy & Vetterli 2007)
  top{k}_energy      TopE_k = sum_{i<=k} sigma_i^2 / sum_j sigma_j^2   (k = 10 in the paper)
  q75_25             Q3(sigma^2) / Q1(sigma^2), quartiles with linear interpolation (numpy.quantile)
  stable_rank        ||A||_F^2 / ||A||_2^2 = sum_i sigma_i^2 / sigma_1^2
  condition_number   sigma_1 / sigma_n

"Non-zero" means sigma_i > rtol * sigma_1 with rtol = max(m, n) * eps(input dtype),
the numpy.linalg.matrix_rank convention; every metric is restricted to these
values (a rank-deficient matrix has a finite condition number over its range).
For n = 1 the normalised entropy is reported as 0; an all-zero matrix gives NaN for
every metric. Computed on the host in float64 with numpy's SVD (exactness over speed).
"""

from __future__ import annotations

import numpy as np

METRICS = ("entropy", "effective_rank", "top10_energy", "q75_25", "stable_rank", "condition_number")


def spectrum_metrics(x, *, k: int = 10, rtol: float | None = None) -> dict[str, np.ndarray | float]:
    """All isotropy metrics of one matrix ``[m, n]`` (floats) or a stack ``[..., m, n]`` (arrays).

    Keys are ``METRICS`` (``top10_energy`` is ``top{k}_energy`` for other ``k``).
    One float64 SVD is shared by all metrics; ``rtol`` overrides the non-zero threshold.

    Raises:
      ValueError: if ``x`` has fewer than 2 dimensions or ``k < 1``.
    """
    a = np.asarray(x)
    if a.ndim < 2:
        raise ValueError(f"x must be a matrix [..., m, n]; got shape {a.shape}")
    if int(k) < 1:
        raise ValueError(f"k must be >= 1; got {k}")
    k = int(k)
    s = np.linalg.svd(a.astype(np.float64), compute_uv=False)  # [..., min(m, n)], descending
    if rtol is None:
        floating = np.issubdtype(a.dtype, np.floating)
        rtol = max(a.shape[-2:]) * float(np.finfo(a.dtype if floating else np.float64).eps)
    mask = s > rtol * s[..., :1]  # the non-zero singular values
    n, any_ = mask.sum(-1), mask.any(-1)
    e = np.where(mask, s * s, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = e / e.sum(-1, keepdims=True)
        h = np.where(mask & (q > 0), -q * np.log(np.where(q > 0, q, 1.0)), 0.0).sum(-1)
        h = np.where(any_, h, np.nan)
        quartiles = np.full(e.shape[:-1], np.nan)
        for i in np.ndindex(e.shape[:-1]):
            if n[i]:
                v = e[i][mask[i]]
                quartiles[i] = np.quantile(v, 0.75) / np.quantile(v, 0.25)
        out = {
            "entropy": np.where(n > 1, h / np.log(np.maximum(n, 2)), np.where(n == 1, 0.0, np.nan)),
            "effective_rank": np.exp(h),
            f"top{k}_energy": np.where(any_, np.where(mask, q, 0.0)[..., :k].sum(-1), np.nan),
            "q75_25": quartiles,
            "stable_rank": np.where(any_, e.sum(-1) / s[..., 0] ** 2, np.nan),
            "condition_number": np.where(
                any_, s[..., 0] / np.where(mask, s, np.inf).min(-1), np.nan
            ),
        }
    if a.ndim == 2:
        return {key: float(v) for key, v in out.items()}
    return out
