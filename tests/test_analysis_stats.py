"""amemory.analysis.stats against closed forms (t quantiles for 2 and 4 degrees of freedom,
the F quantile for (2, 2)) and hand-computed intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from amemory.analysis import stats


def _t_quantile(p: float, df: int) -> float:
    """Closed forms of Student's t quantile (Hill 1970): df = 2 and df = 4."""
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    a = 4 * p * (1 - p)  # df == 4
    q = math.cos(math.acos(math.sqrt(a)) / 3) / math.sqrt(a)
    return math.copysign(2 * math.sqrt(q - 1), p - 0.5)


T_975 = {df: _t_quantile(0.975, df) for df in (2, 4)}
# F(2, 2) has CDF x / (1 + x), so F_{0.975}(2, 2) = 0.975 / 0.025 = 39 exactly.
F_975_2_2 = 39.0


def test_mean_interval_matches_hand_formula():
    x = [3.0, 5.0, 10.0]
    iv = stats.mean_interval(x)
    mean, sd = 6.0, math.sqrt(((3 - 6) ** 2 + (5 - 6) ** 2 + (10 - 6) ** 2) / 2)
    half = T_975[2] * sd / math.sqrt(3)
    assert iv.estimate == pytest.approx(mean)
    assert (iv.lo, iv.hi) == pytest.approx((mean - half, mean + half), rel=1e-12)
    assert iv.half_width == pytest.approx(half) and iv.n == 3
    assert "± " in iv.describe() and "95% CI, n=3" in iv.describe()
    same = stats.mean_interval([2.0, 2.0, 2.0])
    assert same.lo == same.hi == 2.0


def test_paired_difference_is_interval_of_differences():
    a = np.array([1.0, 2.0, 4.0, 3.0, 5.0])
    b = np.array([0.5, 2.5, 3.0, 3.5, 4.0])
    iv = stats.paired_difference(a, b)
    d = a - b
    half = T_975[4] * d.std(ddof=1) / math.sqrt(5)
    assert (iv.estimate, iv.lo, iv.hi) == pytest.approx(
        (d.mean(), d.mean() - half, d.mean() + half)
    )
    with pytest.raises(ValueError, match="same shape"):
        stats.paired_difference([1.0, 2.0], [1.0, 2.0, 3.0])


@pytest.mark.parametrize(
    "lo, hi, direction, threshold, want",
    [
        (0.1, 0.5, "greater", 0.0, True),
        (-0.5, -0.1, "greater", 0.0, False),
        (-0.1, 0.5, "greater", 0.0, None),
        (-0.5, -0.1, "less", 0.0, True),
        (0.1, 0.5, "less", 0.0, False),
        (0.5, 0.65, "less", 0.6, None),
        (0.2, 0.55, "less", 0.6, True),
        (0.61, 0.9, "less", 0.6, False),
        (math.nan, math.nan, "greater", 0.0, None),
    ],
)
def test_verdict_three_way(lo, hi, direction, threshold, want):
    iv = stats.Interval((lo + hi) / 2, lo, hi, 3, 0.95)
    assert stats.verdict(iv, direction, threshold) is want


def test_all_verdicts_and_validation():
    assert stats.all_verdicts([True, True]) is True
    assert stats.all_verdicts([True, None]) is None
    assert stats.all_verdicts([None, False, True]) is False
    assert stats.all_verdicts([]) is None
    with pytest.raises(ValueError, match="direction"):
        stats.verdict(stats.Interval(0, 0, 0, 2, 0.95), "bigger")
    with pytest.raises(ValueError, match="at least 2"):
        stats.mean_interval([1.0])
    with pytest.raises(ValueError, match="finite"):
        stats.mean_interval([1.0, math.nan])
    with pytest.raises(ValueError, match="confidence"):
        stats.mean_interval([1.0, 2.0], confidence=1.5)
    with pytest.raises(ValueError, match="1-D"):
        stats.mean_interval([[1.0, 2.0]])


def test_variance_ratio_interval_uses_f_quantiles():
    a = [0.0, 1.0, 2.0]  # variance 1
    b = [0.0, 2.0, 4.0]  # variance 4
    iv = stats.variance_ratio_interval(a, b)
    assert iv.estimate == pytest.approx(0.25)
    # [r / F_{0.975}(2, 2), r / F_{0.025}(2, 2)] = [r / 39, 39 r]
    assert (iv.lo, iv.hi) == pytest.approx((0.25 / F_975_2_2, 0.25 * F_975_2_2), rel=1e-9)
    assert stats.verdict(iv, "less", 1.0) is None  # 3 seeds cannot decide a ratio of 4
    flat = stats.variance_ratio_interval([1.0, 2.0], [3.0, 3.0])
    assert math.isinf(flat.estimate)


def test_band_matches_per_row_intervals_and_ignores_nan():
    rng = np.random.default_rng(0)
    v = rng.normal(size=(4, 3))
    v[2, 1] = np.nan
    mean, lo, hi = stats.band(v)
    for i in range(4):
        row = v[i][np.isfinite(v[i])]
        iv = stats.mean_interval(row)
        assert (mean[i], lo[i], hi[i]) == pytest.approx((iv.estimate, iv.lo, iv.hi))
    one = stats.band(np.array([[1.0], [2.0]]))
    np.testing.assert_allclose(one[0], one[1])
    with pytest.raises(ValueError, match="seeds"):
        stats.band(np.zeros(3))


def test_slope_interval_is_the_interval_of_per_seed_polyfit_slopes():
    x = [0.0, 0.5, 1.0, 1.5]
    y = np.array([[0.0, 0.1, -0.1], [0.2, 0.1, 0.0], [0.3, 0.4, 0.1], [0.5, 0.4, 0.3]])
    slopes = [np.polyfit(x, y[:, s], 1)[0] for s in range(3)]  # numpy's fit, seed by seed
    iv = stats.slope_interval(x, y)
    half = T_975[2] * np.std(slopes, ddof=1) / math.sqrt(3)
    assert (iv.estimate, iv.lo, iv.hi) == pytest.approx(
        (np.mean(slopes), np.mean(slopes) - half, np.mean(slopes) + half)
    )
    with pytest.raises(ValueError, match="distinct doses"):
        stats.slope_interval([1.0, 1.0], [[0.0, 1.0], [1.0, 2.0]])


def test_seeds_needed_by_brute_force():
    # Observed: mean 0.088, sd s over 3 seeds (the tail_lm gain_in_tail numbers' shape).
    d = [0.0, 0.088, 0.176]
    iv = stats.mean_interval(d)
    s = float(np.std(d, ddof=1))
    # n = 6: t_5 s / sqrt(6) = 2.571 * 0.088 / 2.449 = 0.0924 > 0.088 (still contains 0);
    # n = 7: t_6 s / sqrt(7) = 2.447 * 0.088 / 2.646 = 0.0814 < 0.088 (excludes it).
    assert 2.571 * s / math.sqrt(6) > 0.088 > 2.447 * s / math.sqrt(7)
    want = 7
    assert stats.seeds_needed(iv) == want
    assert stats.seeds_needed(stats.mean_interval([1.0, 1.1, 0.9])) == 2  # already decided
    assert stats.seeds_needed(stats.mean_interval([-1.0, 0.0, 1.0])) == math.inf  # no effect
    assert math.isnan(stats.seeds_needed(stats.variance_ratio_interval([1, 2, 4], [1, 1.5, 2])))
    # against a threshold: the distance to it is the effect
    assert stats.seeds_needed(stats.mean_interval(np.add(d, 0.5)), 0.5) == want


def test_report_sets_the_seeds_needed_beside_the_verdict():
    from experiments import report

    # tail_lm/gain_in_tail's interval: 0.088 ± 0.091 with 3 seeds -> sd 0.0366, and
    # t_3 * 0.0366 / 2 = 0.058 < 0.088: 4 seeds would exclude 0 at the observed effect.
    iv = {"estimate": 0.0878, "lo": -0.0036, "hi": 0.1792, "n": 3, "confidence": 0.95,
          "direction": "greater", "threshold": 0.0}  # fmt: skip
    assert report.seeds_note({"interval": iv, "held": None}) == " (n=3; 4 needed)"
    assert report.seeds_note({"interval": None, "held": None}) == ""
    flat = {**iv, "estimate": 0.0, "lo": -1.0, "hi": 1.0}
    assert report.seeds_note({"interval": flat, "held": None}) == " (n=3; ∞ needed)"
    # not for an equivalence claim, nor for a verdict that is not the interval's own
    # (QK-Clip: the loss interval is held, the claim is not, by the logit cap)
    assert report.seeds_note({"interval": {**flat, "direction": "within"}, "held": None}) == ""
    decided = {**iv, "estimate": 0.1, "lo": 0.05, "hi": 0.15}
    assert report.seeds_note({"interval": decided, "held": True}).startswith(" (n=3;")
    assert report.seeds_note({"interval": decided, "held": False}) == ""
