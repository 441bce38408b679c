"""Straight-line and power-law fits with Student-t confidence intervals.

The interval is the usual OLS one, exact for i.i.d. Gaussian residuals. In the theory
checks the residuals are mostly systematic (finite-size corrections bend the log-log
curve): there it measures how straight the curve is over the fitted window, and each check
states its own tolerance. Imports no other part of amemory.

Reference: Draper & Smith, *Applied Regression Analysis*, ch. 1 (slope standard error
``sqrt(RSS / (n - 2) / Sxx)``, t quantile with ``n - 2`` degrees of freedom).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from scipy import stats


class LineFit(NamedTuple):
    """Result of :func:`fit_line` for ``y ≈ intercept + slope * x``.

    Attributes:
      slope, intercept: least-squares estimates (units of y per unit of x, units of y).
      slope_ci, intercept_ci: ``(lo, hi)`` two-sided Student-t intervals.
      slope_stderr: standard error of the slope.
      r2: coefficient of determination; n: number of points; confidence: e.g. 0.95.
    """

    slope: float
    intercept: float
    slope_ci: tuple[float, float]
    intercept_ci: tuple[float, float]
    slope_stderr: float
    r2: float
    n: int
    confidence: float

    def describe(self, name: str = "slope") -> str:
        """One-line summary ``slope = 2.01 [1.98, 2.04] (95% CI, n=6)``."""
        lo, hi = self.slope_ci
        pct = round(100 * self.confidence)
        return f"{name} = {self.slope:.4g} [{lo:.4g}, {hi:.4g}] ({pct}% CI, n={self.n})"


class PowerLawFit(LineFit):
    """:class:`LineFit` of ``log y = intercept + slope * log x``, i.e. ``y ≈ e^intercept x^slope``:
    slope is the exponent s, intercept the natural log of the prefactor."""

    __slots__ = ()

    def describe(self, name: str = "s") -> str:
        """One-line summary ``s = -0.937 [-0.941, -0.933] (95% CI, n=6)``."""
        return super().describe(name)


def _as_finite_1d(name: str, v: object, positive: bool = False) -> np.ndarray:
    a = np.asarray(v, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite, got {a}")
    if positive and np.any(a <= 0):
        raise ValueError(f"{name} must be > 0 for a log-log fit, got minimum {a.min()}")
    return a


def fit_line(x: object, y: object, *, confidence: float = 0.95) -> LineFit:
    """Least-squares fit of ``y = intercept + slope * x`` with t-based intervals.

    Args:
      x: ``[n]`` finite numbers, at least 2 distinct values; y: ``[n]`` finite numbers.
      confidence: level of the two-sided intervals, in (0, 1); default 0.95.

    Returns:
      :class:`LineFit`: slope interval ``slope ± t_{n-2} sqrt(RSS/(n-2)/Sxx)``, intercept
      interval with standard error ``sqrt(RSS/(n-2) (1/n + mean(x)^2/Sxx))``
      (``scipy.stats.t.ppf``). Exact data give intervals of width 0.

    Raises:
      ValueError: if x or y is not 1-D and finite, their lengths differ, fewer than 3
        points are given, x has fewer than 2 distinct values, or ``confidence`` is outside
        (0, 1).
    """
    if not (isinstance(confidence, (int, float)) and 0.0 < confidence < 1.0):
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    xa, ya = _as_finite_1d("x", x), _as_finite_1d("y", y)
    if xa.shape != ya.shape:
        raise ValueError(f"x and y must have the same length, got {xa.shape} and {ya.shape}")
    n = xa.size
    if n < 3:
        raise ValueError(f"need at least 3 points for a fit with a confidence interval, got {n}")
    mx, my = xa.mean(), ya.mean()
    sxx = float(np.sum((xa - mx) ** 2))
    if sxx <= 0.0:
        raise ValueError("x must take at least 2 distinct values")
    slope = float(np.sum((xa - mx) * (ya - my)) / sxx)
    intercept = float(my - slope * mx)
    rss = float(np.sum((ya - (intercept + slope * xa)) ** 2))
    syy = float(np.sum((ya - my) ** 2))
    s2 = rss / (n - 2)
    se_slope, se_int = math.sqrt(s2 / sxx), math.sqrt(s2 * (1.0 / n + mx**2 / sxx))
    tq = float(stats.t.ppf(0.5 + confidence / 2.0, n - 2))
    return LineFit(
        slope=slope,
        intercept=intercept,
        slope_ci=(slope - tq * se_slope, slope + tq * se_slope),
        intercept_ci=(intercept - tq * se_int, intercept + tq * se_int),
        slope_stderr=se_slope,
        r2=float(1.0 - rss / syy if syy > 0 else 1.0),
        n=int(n),
        confidence=float(confidence),
    )


def fit_power_law(x: object, y: object, *, confidence: float = 0.95) -> PowerLawFit:
    """Least-squares fit of ``log y = intercept + slope * log x`` with t-based CIs.

    Args:
      x: ``[n]`` positive finite numbers (e.g. K, T, ε), at least 3 distinct values.
      y: ``[n]`` positive finite numbers (the measured quantity).
      confidence: level of the two-sided intervals, in (0, 1); default 0.95.

    Returns:
      :class:`PowerLawFit`: :func:`fit_line` of ``(log x, log y)``.

    Raises:
      ValueError: for non-positive values, or as :func:`fit_line`.
    """
    xa, ya = _as_finite_1d("x", x, positive=True), _as_finite_1d("y", y, positive=True)
    return PowerLawFit(*fit_line(np.log(xa), np.log(ya), confidence=confidence))
