"""Class priors (frequency spectra) for associative-memory tasks.

Every function returns a ``numpy.ndarray`` of dtype float64 and shape ``[K]``
whose entries are non-negative and sum to 1 (up to float64 rounding), sorted
from the most frequent class (index 0, the "head") to the rarest (the "tail").

Sources:
  * ``two_level``: Wang et al. 2025, "Muon Outperforms Adam in Tail-End
    Associative Memory Learning" (arXiv 2509.26030), Assumption 5.2.
  * ``hierarchical``: Li et al. 2026, "Muon in Associative Memory Learning:
    Training Dynamics and Scaling Laws" (arXiv 2602.05725), the hierarchical
    spectrum of M groups of C queries with a power law over groups.
  * ``power_law``: Zipf law p_k ∝ k^{-s}, the flat (C = 1) special case.
"""

from __future__ import annotations

import math
import numbers

import numpy as np


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_real(name: str, value, lo: float, hi: float, lo_open: bool, hi_open: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    v = float(value)
    inside = (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not (inside and math.isfinite(v)):
        lb, rb = ("(" if lo_open else "["), (")" if hi_open else "]")
        raise ValueError(f"{name} must lie in {lb}{lo}, {hi}{rb}, got {value!r}")
    return v


def two_level_split(K: int, beta: float) -> int:
    """Number of head classes L = round(beta * K) used by :func:`two_level`.

    Args:
      K: number of classes, an integer >= 2.
      beta: head fraction β = L / K in the open interval (0, 1).

    Returns:
      L, an int with 1 <= L <= K - 1.

    Raises:
      ValueError: naming ``K`` or ``beta`` when out of range or leaving no head or tail.
    """
    K = _check_int("K", K, 2)
    beta = _check_real("beta", beta, 0.0, 1.0, True, True)
    L = int(round(beta * K))
    if not 1 <= L <= K - 1:
        raise ValueError(
            f"beta={beta} with K={K} gives L=round(beta*K)={L} head classes; "
            f"beta must give 1 <= L <= K-1"
        )
    return L


def two_level(K: int, alpha: float, beta: float) -> np.ndarray:
    """Two-level imbalanced prior of paper A (Assumption 5.2).

    p_k = alpha / L for k < L (the head) and p_k = (1 - alpha) / (K - L) for k >= L (the
    tail), with L = round(beta * K) (:func:`two_level_split`); alpha == beta is uniform.

    Args:
      K: number of classes, integer >= 2.
      alpha, beta: the head's total probability and fraction of classes, in (0, 1).

    Returns:
      float64 array of shape [K], summing to 1; head first.

    Raises:
      ValueError: naming ``K``, ``alpha`` or ``beta`` when out of range.
    """
    alpha = _check_real("alpha", alpha, 0.0, 1.0, True, True)
    L = two_level_split(K, beta)  # validates K and beta
    p = np.empty(K, dtype=np.float64)
    p[:L] = alpha / L
    p[L:] = (1.0 - alpha) / (K - L)
    return p


def power_law(K: int, exponent: float) -> np.ndarray:
    """Zipf prior p_k ∝ k^{-exponent} for ranks k = 1..K.

    Args:
      K: number of classes, integer >= 1.
      exponent: Zipf exponent s >= 0 (0 gives the uniform prior).

    Returns:
      float64 array of shape [K], summing to 1, non-increasing.

    Raises:
      ValueError: naming ``K`` or ``exponent`` when out of range.
    """
    K = _check_int("K", K, 1)
    s = _check_real("exponent", exponent, 0.0, math.inf, False, True)
    # In log space, max subtracted, so large exponents do not underflow to 0/0.
    logw = -s * np.log(np.arange(1, K + 1, dtype=np.float64))
    w = np.exp(logw - logw.max())
    return w / w.sum()


def hierarchical(M: int, C: int, exponent: float) -> np.ndarray:
    """Hierarchical prior of paper B: M groups of C classes, power law over groups.

    p_j = p̃_g / C for the j in group g (classes g*C .. g*C + C - 1), with
    p̃_g ∝ g^{-exponent} for g = 1..M. Paper B's theorems take exponent > 1;
    any exponent >= 0 is accepted here (0 gives the uniform prior).

    Args:
      M, C: number of groups and classes per group, integers >= 1 (K = M * C).
      exponent: power-law exponent β >= 0 over the groups.

    Returns:
      float64 array of shape [M * C], summing to 1; group 1 first.

    Raises:
      ValueError: naming ``M``, ``C`` or ``exponent`` when out of range.
    """
    M = _check_int("M", M, 1)
    C = _check_int("C", C, 1)
    return np.repeat(power_law(M, exponent) / C, C)


def from_counts(counts) -> np.ndarray:
    """Empirical prior p_k = counts_k / sum(counts), in the order of ``counts`` (no sorting).

    Args:
      counts: [K] non-negative finite numbers with a positive sum.

    Returns:
      float64 array of shape [K], summing to 1.

    Raises:
      ValueError: naming ``counts`` when it is not 1-D, is empty, has a negative
        or non-finite entry, or sums to zero.
    """
    try:
        c = np.asarray(counts, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"counts must be a 1-D array of non-negative numbers ({e})") from None
    if c.ndim != 1 or c.size == 0:
        raise ValueError(f"counts must be a non-empty 1-D array, got shape {c.shape}")
    if not np.all(np.isfinite(c)):
        raise ValueError("counts must be finite; got NaN or inf")
    if np.any(c < 0):
        raise ValueError(f"counts must be non-negative; got minimum {c.min()}")
    total = c.sum()
    if total <= 0:
        raise ValueError("counts must have a positive sum; got all zeros")
    return c / total
