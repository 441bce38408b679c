"""Seed statistics: Student-t intervals of means and paired differences, and three-way verdicts.

Seed s of two optimizers starts from the same weights and reads the same batches, so the
runs are paired: a claim is judged by the Student-t interval of the mean per-seed
difference ``d_s = a_s - b_s``, ``mean(d) ± t_{n-1, (1+c)/2} · sd(d) / sqrt(n)``. The claim
"d > threshold" is held when the whole interval lies above the threshold, not held when
below, undecided otherwise (:func:`verdict`); a spread claim uses the F interval of a
variance ratio with threshold 1. Imports no other part of amemory.

Reference: Wasserman, *All of Statistics* (2004), Sec. 10.7 (paired comparisons);
Casella & Berger, *Statistical Inference*, 2nd ed., Sec. 9.2 (t and F intervals).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
from scipy import stats

#: Claimed directions of a difference: "greater" (d > threshold) or "less" (d < threshold).
DIRECTIONS = ("greater", "less")


class Interval(NamedTuple):
    """A point estimate with a two-sided confidence interval.

    Attributes:
      estimate: the mean (or, for a variance ratio, the ratio of sample variances).
      lo, hi: ends of the interval (units of ``estimate``).
      n: number of seeds used; for a variance ratio, the smaller sample size.
      confidence: level of the interval, e.g. 0.95.
    """

    estimate: float
    lo: float
    hi: float
    n: int
    confidence: float

    @property
    def half_width(self) -> float:
        """``(hi - lo) / 2`` (the "±" of a symmetric interval)."""
        return (self.hi - self.lo) / 2.0

    def describe(self, digits: int = 3) -> str:
        """``0.087 ± 0.012 (95% CI, n=3)``; ``nan`` parts when the interval is undefined."""
        if not all(math.isfinite(x) for x in (self.estimate, self.lo, self.hi)):
            return f"{self.estimate:.{digits}g} (no interval, n={self.n})"
        ci = f"({round(100 * self.confidence)}% CI, n={self.n})"
        return f"{_g(self.estimate, digits)} ± {_g(self.half_width, digits)} {ci}"

    def describe_range(self, digits: int = 3) -> str:
        """``0.79 [0.52, 1.07] (95% CI, n=3)`` (for asymmetric intervals such as ratios)."""
        ci = f"({round(100 * self.confidence)}% CI, n={self.n})"
        return f"{_g(self.estimate, digits)} [{_g(self.lo, digits)}, {_g(self.hi, digits)}] {ci}"


def _g(x: float, digits: int) -> str:
    if not math.isfinite(x):
        return "nan"
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e4):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}f}"


def _check_confidence(confidence: float) -> float:
    if not (isinstance(confidence, (int, float)) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    return float(confidence)


def _samples(name: str, values: object) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one value per seed), got shape {a.shape}")
    if a.size < 2:
        raise ValueError(f"{name} needs at least 2 seeds for an interval, got {a.size}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite, got {a.tolist()}")
    return a


def mean_interval(values: object, *, confidence: float = 0.95) -> Interval:
    """Student-t interval of the mean of per-seed values.

    Args:
      values: ``[n]`` finite numbers, one per seed, n >= 2 (any unit; the interval has it).
      confidence: level in (0, 1).

    Returns:
      :class:`Interval` ``mean ± t_{n-1,(1+c)/2} · sd / sqrt(n)`` (``sd`` with ``n - 1`` in
      the denominator).

    Raises:
      ValueError: if ``values`` is not 1-D, has fewer than 2 entries or a non-finite
        entry, or ``confidence`` is outside (0, 1).
    """
    c = _check_confidence(confidence)
    a = _samples("values", values)
    n, mean = a.size, float(a.mean())
    se = float(a.std(ddof=1)) / math.sqrt(n)
    t = float(stats.t.ppf(0.5 + c / 2.0, n - 1))
    return Interval(mean, mean - t * se, mean + t * se, n, c)


def paired_difference(a: object, b: object, *, confidence: float = 0.95) -> Interval:
    """Interval of the mean per-seed difference ``a_s - b_s`` (paired t interval).

    Args:
      a: ``[n]`` per-seed values of one arm (e.g. Adam's final loss for seeds s).
      b: ``[n]`` the other arm on the same seeds, in the same order.
      confidence: level in (0, 1).

    Returns:
      :func:`mean_interval` of ``a - b``.

    Raises:
      ValueError: if the lengths differ, or as :func:`mean_interval`.
    """
    aa, bb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if aa.shape != bb.shape:
        raise ValueError(f"paired arms must have the same shape, got {aa.shape} and {bb.shape}")
    return mean_interval(aa - bb, confidence=confidence)


def slope_interval(x: object, values: object, *, confidence: float = 0.95) -> Interval:
    """Interval of a dose-response slope: per-seed least-squares slopes, then their t interval.

    Args:
      x: ``[k]`` doses (k >= 2 distinct values, e.g. a Zipf exponent or log2 of a vocabulary).
      values: ``[k, seeds]`` the response of every seed at every dose (seeds >= 2).
      confidence: level in (0, 1).

    Returns:
      :func:`mean_interval` of the ``[seeds]`` slopes of ``values[:, s]`` against ``x``
      (units of values per unit of x).

    Raises:
      ValueError: if the shapes disagree, x has fewer than 2 distinct values, or as
        :func:`mean_interval`.
    """
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(values, dtype=np.float64)
    if xs.ndim != 1 or ys.ndim != 2 or ys.shape[0] != xs.size or np.unique(xs).size < 2:
        raise ValueError(f"x must be [k] with >= 2 distinct doses and values [k, seeds], got "
                         f"{xs.shape} and {ys.shape}")  # fmt: skip
    xc = xs - xs.mean()
    return mean_interval(xc @ ys / (xc @ xc), confidence=confidence)


def seeds_needed(interval: Interval, threshold: float = 0.0, *, cap: int = 10_000) -> float:
    """Seeds a t interval of the observed effect would need to exclude ``threshold``.

    With ``sd = half_width · sqrt(n) / t_{n-1}`` recovered from the interval and the effect
    held at its observed size, the smallest n >= 2 with ``t_{n-1} · sd / sqrt(n) <
    |estimate - threshold|``: a power calculation at the observed effect, not a promise.

    Returns:
      n as a float; ``inf`` when the effect is 0 or needs more than ``cap`` seeds, NaN for
      an undefined interval or one not symmetric about its estimate (not a t interval of
      a mean, e.g. :func:`variance_ratio_interval`'s); 0-width intervals need 2.
    """
    n, c = int(interval.n), float(interval.confidence)
    effect = abs(float(interval.estimate) - float(threshold))
    if n < 2 or not all(math.isfinite(v) for v in (interval.lo, interval.hi, effect)):
        return math.nan
    up, down = interval.hi - interval.estimate, interval.estimate - interval.lo
    if abs(up - down) > 1e-9 * max(abs(up), abs(down), 1e-300):
        return math.nan
    sd = interval.half_width * math.sqrt(n) / float(stats.t.ppf(0.5 + c / 2.0, n - 1))
    if sd == 0.0:
        return 2.0 if effect > 0 else math.inf
    k = np.arange(2, cap + 1)
    ok = np.flatnonzero(stats.t.ppf(0.5 + c / 2.0, k - 1) * sd / np.sqrt(k) < effect)
    return float(k[ok[0]]) if ok.size else math.inf


def variance_ratio_interval(a: object, b: object, *, confidence: float = 0.95) -> Interval:
    """F interval of ``var(a) / var(b)`` for two independent Gaussian samples.

    ``r = s_a² / s_b²``, interval ``[r / F_{(1+c)/2}, r / F_{(1-c)/2}]`` with F quantiles of
    ``(n_a - 1, n_b - 1)`` degrees of freedom (3 seeds per arm: ``F_{0.975}(2, 2) = 39``).

    Args:
      a, b: ``[n_a]``, ``[n_b]`` finite samples, each with at least 2 entries.
      confidence: level in (0, 1).

    Returns:
      :class:`Interval` with ``estimate = r`` (``inf`` if ``var(b) = 0 < var(a)``, NaN
      if both are 0) and ``n = min(n_a, n_b)``.

    Raises:
      ValueError: as :func:`mean_interval` for either sample.
    """
    c = _check_confidence(confidence)
    xa, xb = _samples("a", a), _samples("b", b)
    va, vb = float(xa.var(ddof=1)), float(xb.var(ddof=1))
    n = min(xa.size, xb.size)
    if vb == 0.0:
        r = math.nan if va == 0.0 else math.inf
        return Interval(r, r, r, n, c)
    r = va / vb
    d1, d2 = xa.size - 1, xb.size - 1
    hi_q = float(stats.f.ppf(0.5 + c / 2.0, d1, d2))
    lo_q = float(stats.f.ppf(0.5 - c / 2.0, d1, d2))
    return Interval(r, r / hi_q, r / lo_q, n, c)


def verdict(interval: Interval, direction: str, threshold: float = 0.0) -> bool | None:
    """Three-way verdict on the claim "the quantity is ``direction`` than ``threshold``".

    Args:
      interval: an :class:`Interval` of this module.
      direction: one of :data:`DIRECTIONS` (``"greater"``: ``> threshold``).
      threshold: what the claim compares against (0 for a difference, 1 for a ratio).

    Returns:
      ``True`` (held) if the whole interval lies on the claimed side of ``threshold``,
      ``False`` (not held) if it lies wholly on the other side, ``None`` (undecided)
      if it contains ``threshold`` or is undefined (NaN).

    Raises:
      ValueError: for a ``direction`` outside :data:`DIRECTIONS`.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    lo, hi = float(interval.lo), float(interval.hi)
    if math.isnan(lo) or math.isnan(hi):
        return None
    held, refuted = (lo > threshold, hi < threshold)
    if direction == "less":
        held, refuted = refuted, held
    return True if held else (False if refuted else None)


def all_verdicts(verdicts: Iterable[bool | None]) -> bool | None:
    """Verdict of a claim made of several parts: held if every part is held, not held if
    any part is not held, else (and for no parts) undecided."""
    vs = list(verdicts)
    if any(v is False for v in vs):
        return False
    return True if vs and all(v is True for v in vs) else None


def band(values: Sequence[Sequence[float]], *, confidence: float = 0.95):
    """Mean and t interval along the last (seed) axis, for curves with seed bands.

    Args:
      values: ``[n, seeds]`` array (e.g. validation loss at n eval steps for each seed).
        NaN entries are ignored per row; a row with fewer than 2 finite seeds gets a
        zero-width band at its mean.
      confidence: level in (0, 1).

    Returns:
      ``(mean [n], lo [n], hi [n])`` float64 arrays.

    Raises:
      ValueError: if ``values`` is not 2-D or ``confidence`` is outside (0, 1).
    """
    c = _check_confidence(confidence)
    a = np.asarray(values, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"values must be [n, seeds], got shape {a.shape}")
    ok = np.isfinite(a)
    k = ok.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(k > 0, np.nansum(np.where(ok, a, 0.0), axis=1) / np.maximum(k, 1), np.nan)
        dev = np.where(ok, a - mean[:, None], 0.0)
        sd = np.sqrt((dev**2).sum(axis=1) / np.maximum(k - 1, 1))
        t = np.where(k >= 2, stats.t.ppf(0.5 + c / 2.0, np.maximum(k - 1, 1)), 0.0)
        half = t * sd / np.sqrt(np.maximum(k, 1))
    return mean, mean - half, mean + half
