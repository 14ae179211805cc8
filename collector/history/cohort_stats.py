"""The statistics of comparing two cohorts, pure: numbers in, numbers out (`bench/compare.py` checks them by
simulation: coverage, false-alarm rate under repeated checks, power).

- A pass rate: the Wilson score interval.
- The difference of two pass rates: Newcombe's hybrid score interval (method 10, from the two Wilson intervals),
  and the two-sided p-value of the pooled two-proportion z-test.
- A mean score and the difference of two means: Welch's t interval and test (Student's t from the regularized
  incomplete beta function).
- Several differences at once: Holm's step-down adjustment of their p-values (family-wise error control).
- The canary gate: an always-valid confidence sequence for the difference of pass rates, from the normal-mixture
  sequential probability ratio test (mSPRT; Robbins 1970, Johari et al. 2017), with Agresti-Caffo's smoothed rates
  in the variance so that cohorts that pass everything still have a width. It stays valid however often it is
  checked while a canary runs; a fixed-n interval checked every minute does not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054
DEFAULT_TAU = 0.1  # the mixture's scale: near the narrowest sequence from 100 conversations a cohort upward


@dataclass(frozen=True)
class Interval:
    value: float | None
    low: float | None
    high: float | None


def _z(level: float) -> float:
    """The two-sided standard normal quantile for `level` (0.95 -> 1.96), by bisection on erf."""
    if level == 0.95:
        return Z95
    target, lo, hi = (1 + level) / 2, 0.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < target else (lo, mid)
    return (lo + hi) / 2


def wilson(passes: float, n: float, level: float = 0.95) -> Interval:
    if n <= 0:
        return Interval(None, None, None)
    z, p = _z(level), passes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Interval(p, max(0.0, centre - half), min(1.0, centre + half))


def rate_difference(passes_a: float, n_a: float, passes_b: float, n_b: float, level: float = 0.95) -> Interval:
    """B's rate minus A's, with Newcombe's hybrid score interval."""
    a, b = wilson(passes_a, n_a, level), wilson(passes_b, n_b, level)
    if a.value is None or b.value is None:
        return Interval(None, None, None)
    assert a.low is not None and a.high is not None and b.low is not None and b.high is not None
    d = b.value - a.value
    low = d - math.sqrt((b.value - b.low) ** 2 + (a.high - a.value) ** 2)
    high = d + math.sqrt((b.high - b.value) ** 2 + (a.value - a.low) ** 2)
    return Interval(d, low, high)


def _normal_two_sided(z: float) -> float:
    return math.erfc(abs(z) / math.sqrt(2))


def rate_p_value(passes_a: float, n_a: float, passes_b: float, n_b: float) -> float | None:
    """Two-sided p-value of the pooled two-proportion z-test (None when it cannot be computed)."""
    if n_a <= 0 or n_b <= 0:
        return None
    pooled = (passes_a + passes_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    if se == 0:
        return 1.0
    return _normal_two_sided((passes_b / n_b - passes_a / n_a) / se)


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-14:
            break
    return h


def _incomplete_beta(a: float, b: float, x: float) -> float:
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1 - x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def t_two_sided(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom."""
    return _incomplete_beta(df / 2, 0.5, df / (df + t * t))


def _t_quantile(level: float, df: float) -> float:
    lo, hi = 0.0, 1000.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided(mid, df) > 1 - level else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class Moments:
    """n (an effective sample size for weighted scores), mean and sample variance of a cohort's scores."""

    n: float
    mean: float | None
    variance: float | None


def mean_interval(m: Moments, level: float = 0.95) -> Interval:
    if m.n == 0 or m.mean is None:
        return Interval(None, None, None)
    if m.n < 2 or m.variance is None:
        return Interval(m.mean, None, None)
    half = _t_quantile(level, m.n - 1) * math.sqrt(m.variance / m.n)
    return Interval(m.mean, m.mean - half, m.mean + half)


def mean_difference(a: Moments, b: Moments, level: float = 0.95) -> tuple[Interval, float | None]:
    """B's mean minus A's with Welch's interval, and Welch's two-sided p-value."""
    if a.mean is None or b.mean is None or a.n < 2 or b.n < 2 or a.variance is None or b.variance is None:
        return Interval(None if a.mean is None or b.mean is None else b.mean - a.mean, None, None), None
    va, vb = a.variance / a.n, b.variance / b.n
    d = b.mean - a.mean
    if va + vb == 0:
        return Interval(d, d, d), 1.0 if d == 0 else 0.0
    df = (va + vb) ** 2 / (va * va / (a.n - 1) + vb * vb / (b.n - 1))
    se = math.sqrt(va + vb)
    half = _t_quantile(level, df) * se
    return Interval(d, d - half, d + half), t_two_sided(d / se, df)


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None): reject where adjusted < alpha controls the
    family-wise error rate over the differences shown."""
    present = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    m = len(present)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, i) in enumerate(present):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


# --- the canary gate: an always-valid confidence sequence ----------------------------------------------------


@dataclass(frozen=True)
class GateDecision:
    """`fail`: the candidate's pass rate is worse than the baseline's by more than the margin; `pass`: it is not;
    `undecided`: not enough data yet, with about how many more conversations per cohort would decide it."""

    outcome: str
    difference: float | None
    low: float | None
    high: float | None
    more_needed: int | None


def _smoothed_variance(passes: float, n: float) -> float:
    p = (passes + 1) / (n + 2)  # Agresti-Caffo: a cohort that passes everything still has a variance
    return p * (1 - p) / n


def confidence_sequence_half_width(variance: float, alpha: float, tau: float) -> float:
    """Half-width of the normal-mixture (mSPRT) confidence sequence at one look: the set of differences where
    the mixture likelihood ratio stays below 1/alpha, for an estimate with this variance and mixture scale tau."""
    t2 = tau * tau
    return math.sqrt(variance * (variance + t2) / t2 * (2 * math.log(1 / alpha) + math.log((variance + t2) / variance)))


def gate(passes_a: float, n_a: float, passes_b: float, n_b: float, margin: float, alpha: float = 0.05,
         tau: float | None = None) -> GateDecision:
    """Is B (the candidate) worse than A (the baseline) by more than `margin` in pass rate? From the always-valid
    confidence sequence at level 1 - alpha with mixture scale `tau` (DEFAULT_TAU: a scale much smaller than the
    estimate's standard error widens the sequence at small n, one much larger at large n; 0.1 is within a few
    per cent of the narrowest for cohorts of 100 to 5,000 conversations, bench/compare.py)."""
    if n_a <= 0 or n_b <= 0:
        return GateDecision("undecided", None, None, None, None)
    scale = tau if tau is not None else DEFAULT_TAU
    variance = _smoothed_variance(passes_a, n_a) + _smoothed_variance(passes_b, n_b)
    d = passes_b / n_b - passes_a / n_a
    half = confidence_sequence_half_width(variance, alpha, scale)
    low, high = d - half, d + half
    if high < -margin:
        return GateDecision("fail", d, low, high, None)
    if low > -margin:
        return GateDecision("pass", d, low, high, None)
    return GateDecision("undecided", d, low, high, _more_needed(variance, n_a, n_b, abs(d + margin), alpha, scale))


def _more_needed(variance: float, n_a: float, n_b: float, distance: float, alpha: float, tau: float) -> int:
    """About how many more conversations per cohort shrink the sequence's half-width under the distance between
    the estimate and the margin, were the rates to stay as they are (None-free: a large number when they sit
    on the margin)."""
    if distance <= 0:
        return 1_000_000
    k = 1.0
    while k < 1e6 and confidence_sequence_half_width(variance / k, alpha, tau) >= distance:
        k *= 1.1
    return max(1, math.ceil(max(n_a, n_b) * (k - 1)))
