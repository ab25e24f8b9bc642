"""Ratio-of-sums estimates and paired differences with their intervals (``lrv`` for the variance).

The estimand of every quantity is a ratio of sums over the units (steps, or bins of steps) of a
window: ``R = sum(num) / sum(den)``. It is linearised, ``z_t = (num_t - R den_t) / mean(den)``, so
that ``R - R_true`` is ``mean(z)`` to first order; the interval is ``R ± t_df sqrt(LRV / n)`` with
the long-run variance of ``z`` around its smooth trend (``lrv.long_run_variance``). A paired
difference subtracts the two runs' linearised series unit by unit (on the log-ratio scale each
divided by its ratio), so whatever the runs share at a unit cancels.

A bounded quantity (a clip fraction in [0, 1], a reward in known bounds) gets its interval on the
logit scale of ``(R - lo) / (hi - lo)`` (delta method) and mapped back, so it never leaves its bounds;
one bounded below only (``bounds=(lo, inf)``: a KL, a mean ``|log ratio|``, a throughput) gets it on
the log scale of ``R - lo``, so it never goes below ``lo``.
"""

from __future__ import annotations

import math

import numpy as np
from cliptrack.compare.stats.estimate import (
    ABSOLUTE,
    DIRECTION_CONFIDENCE,
    GATED_SPREADS,
    MIN_ESS,
    SCALES,
    Estimate,
)
from cliptrack.compare.stats.lrv import LongRunVariance, long_run_variance
from cliptrack.compare.stats.quantiles import t_criticals


def as_arrays(name: str, *arrays: np.ndarray) -> list[np.ndarray]:
    """The series as flat float64 arrays of one length; ValueError naming ``name`` otherwise."""
    out = [np.asarray(a, dtype=float).reshape(-1) for a in arrays]
    n = out[0].size
    if any(a.size != n for a in out):
        raise ValueError(f"{name}: arrays must have one entry per unit (sizes {[a.size for a in out]})")
    return out


def _check_bounds(bounds: tuple[float, float] | None) -> None:
    if bounds is None:
        return
    lo, hi = bounds
    if not (math.isfinite(lo) and (math.isfinite(hi) or hi == math.inf) and lo < hi):
        raise ValueError(
            f"bounds must be two finite numbers low < high (or (low, inf) for a lower bound only), got {bounds}"
        )


LOG_SPREAD_MAX = 700.0
"""Largest log-scale half-width mapped back (``exp(700)`` is finite in float64)."""


def _bounded_below(value: float, half: float, lo: float) -> tuple[float, float]:
    """Interval of half-width ``half`` around ``value`` on the log scale of ``value - lo`` (delta
    method): ``lo + (value - lo) exp(±half / (value - lo))``. A value below ``lo`` (data the quantity
    cannot take) keeps the plain interval; at ``lo`` with spread the upper side reaches by ``half``."""
    excess = value - lo
    if excess < 0 or half == 0:
        return value - half, value + half
    if excess == 0:
        return value, value + half
    spread = min(half / excess, LOG_SPREAD_MAX)
    # the log round trip can land one rounding step past the value when the spread is tiny
    return min(value, lo + excess * math.exp(-spread)), max(value, lo + excess * math.exp(spread))


def nan_estimate(value: float, n: int, confidence: float, reason: str = "") -> Estimate:
    """An estimate without an interval."""
    nan = float("nan")
    return Estimate(value, nan, nan, n, nan, nan, nan, confidence, reason=reason)


def linearised(num: np.ndarray, den: np.ndarray) -> tuple[float, np.ndarray]:
    """``(R, z)``: the ratio of sums and its linearised series (NaN when ``sum(den)`` is 0 or not finite)."""
    total = float(np.sum(den))
    if total == 0 or not math.isfinite(total):
        return float("nan"), np.full(num.size, np.nan)
    ratio = float(np.sum(num)) / total
    return ratio, (num - ratio * den) / (total / num.size)


def _bounded(value: float, half: float, bounds: tuple[float, float]) -> tuple[float, float]:
    """Interval of half-width ``half`` around ``value`` on the logit scale of ``bounds`` (on the log
    scale of ``value - lo`` when ``bounds`` is ``(lo, inf)``)."""
    lo, hi = bounds
    if hi == math.inf:
        return _bounded_below(value, half, lo)
    if value < lo or value > hi:
        raise ValueError(f"estimate {value:g} lies outside its bounds [{lo:g}, {hi:g}]")
    width = hi - lo
    p = (value - lo) / width
    if half == 0 or p in (0.0, 1.0):
        if half > 0:  # at a bound with spread: the other side reaches by half, the bound side stays
            return (lo, min(hi, value + half)) if p == 0.0 else (max(lo, value - half), hi)
        return value, value
    centre = math.log(p / (1.0 - p))
    spread = half / width / (p * (1.0 - p))

    def expit(x: float) -> float:
        return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))

    # the logit round trip can land one rounding step past the value when the spread is tiny
    return min(value, lo + width * expit(centre - spread)), max(value, lo + width * expit(centre + spread))


def interval_rows(
    values: np.ndarray,
    n: int,
    v: LongRunVariance,
    confidence: float,
    bounds: tuple[float, float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)`` per row: ``values ± t_df sqrt(lrv / n)``, on the logit scale of ``bounds`` when
    given (the log scale of ``values - lo`` for ``(lo, inf)``). Vectorised over rows, so the simulation measures exactly this code."""
    values = np.asarray(values, dtype=float).reshape(-1)
    crit = t_criticals(confidence, v.df)
    half = crit * np.sqrt(np.maximum(v.lrv, 0.0) / n)
    if bounds is None:
        return values - half, values + half
    pairs = [_bounded(float(x), float(h), bounds) for x, h in zip(values, half, strict=True)]
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def direction_rows(
    values: np.ndarray, n: int, v: LongRunVariance, spread: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)`` per row of the interval a ``different`` verdict needs: ``values ± t sqrt(lrv /
    n)`` at ``DIRECTION_CONFIDENCE``, and where the effective sample size is below ``MIN_ESS`` at
    least ``GATED_SPREADS * spread`` (``spread``: the standard deviation of the linearised series
    around its mean). Vectorised over rows, so the simulation measures exactly this code."""
    values = np.asarray(values, dtype=float).reshape(-1)
    half = t_criticals(DIRECTION_CONFIDENCE, v.df) * np.sqrt(np.maximum(v.lrv, 0.0) / n)
    gated = ~(np.asarray(v.ess) >= MIN_ESS)
    half = np.where(gated, np.maximum(half, GATED_SPREADS * np.asarray(spread, dtype=float)), half)
    return values - half, values + half


def estimate_from(
    value: float,
    n: int,
    v: LongRunVariance,
    confidence: float,
    bounds: tuple[float, float] | None = None,
    spread: float = float("nan"),
) -> Estimate:
    """The ``Estimate`` of ``value`` whose first-order error is the mean of a series with long-run
    variance ``v`` (its first row); with the direction interval (``direction_rows``) when the
    series' ``spread`` is given and there are no bounds (a difference)."""
    lrv, df = float(v.lrv[0]), float(v.df[0])
    if not (math.isfinite(value) and math.isfinite(lrv)):
        return nan_estimate(value, n, confidence)
    low, high = interval_rows(np.array([value]), n, v, confidence, bounds)
    d_low, d_high = (float("nan"),) * 2
    if bounds is None and math.isfinite(spread):
        dl, dh = direction_rows(np.array([value]), n, v, np.array([spread]))
        d_low, d_high = float(dl[0]), float(dh[0])
    terms = int(v.terms[0])
    return Estimate(
        float(value),
        float(low[0]),
        float(high[0]),
        n,
        float(v.lag1[0]),
        float(v.ess[0]),
        n / terms if terms else float("nan"),
        confidence,
        lrv=lrv,
        df=df,
        trend_terms=int(v.trend_terms[0]),
        long_memory=bool(v.long_memory[0]),
        memory=float(v.memory[0]),
        memory_tested=bool(v.memory_tested[0]),
        direction_low=d_low,
        direction_high=d_high,
    )


def mean_estimate(
    z: np.ndarray, value: float, confidence: float = 0.90, bounds: tuple[float, float] | None = None
) -> Estimate:
    """The estimate of ``value`` whose first-order error is ``mean(z)`` (no interval under 2 units or
    with non-finite input)."""
    z = np.asarray(z, dtype=float)
    n = z.size
    if n < 2 or not math.isfinite(value) or not np.all(np.isfinite(z)):
        return nan_estimate(value, n, confidence)
    return estimate_from(value, n, long_run_variance(z), confidence, bounds, float(np.std(z)))


def ratio_estimate(
    num: np.ndarray,
    den: np.ndarray,
    *,
    confidence: float = 0.90,
    bounds: tuple[float, float] | None = None,
) -> Estimate:
    """``sum(num) / sum(den)`` over units with its interval (NaN when ``sum(den) == 0``); within
    ``bounds`` (e.g. ``(0, 1)`` for a fraction) when given."""
    num, den = as_arrays("ratio_estimate", num, den)
    _check_bounds(bounds)
    ratio, z = linearised(num, den)
    return mean_estimate(z, ratio, confidence, bounds)


def step_weighted_estimate(
    num: np.ndarray,
    den: np.ndarray,
    *,
    confidence: float = 0.90,
    bounds: tuple[float, float] | None = None,
) -> Estimate:
    """The mean over units of the per-unit ratios ``num_t / den_t`` (every unit weighs the same,
    whatever its denominator), over units with ``den_t != 0``; compare with the token-weighted
    ``ratio_estimate`` to see whether large steps behave differently."""
    num, den = as_arrays("step_weighted_estimate", num, den)
    _check_bounds(bounds)
    keep = den != 0
    per_unit = num[keep] / den[keep]
    return ratio_estimate(per_unit, np.ones(per_unit.size), confidence=confidence, bounds=bounds)


def difference_series(
    num_a: np.ndarray,
    den_a: np.ndarray,
    num_b: np.ndarray,
    den_b: np.ndarray,
    scale: str,
) -> tuple[float, np.ndarray]:
    """``(value, z)``: the difference b − a on ``scale`` and its linearised unit series (value NaN
    when undefined: a zero denominator total, or on the log-ratio scale ratios of zero or of
    opposite signs)."""
    if scale not in SCALES:
        raise ValueError(f"scale {scale!r} is not one of {SCALES}")
    ra, za = linearised(num_a, den_a)
    rb, zb = linearised(num_b, den_b)
    if scale == ABSOLUTE:
        return rb - ra, zb - za
    if not (math.isfinite(ra) and math.isfinite(rb)) or ra == 0 or rb == 0 or (ra > 0) != (rb > 0):
        return float("nan"), np.full(za.size, np.nan)
    sign = 1.0 if ra > 0 else -1.0
    return sign * math.log(rb / ra), sign * (zb / rb - za / ra)


def paired_difference(
    num_a: np.ndarray,
    den_a: np.ndarray,
    num_b: np.ndarray,
    den_b: np.ndarray,
    *,
    scale: str = ABSOLUTE,
    confidence: float = 0.90,
) -> Estimate:
    """Run b minus run a over paired units: ``R_b - R_a`` (``scale="absolute"``) or
    ``s * log(R_b / R_a)`` with ``s = sign(R_a)`` (``"log-ratio"``; NaN unless both ratios are
    non-zero with one sign). Swapping a and b negates the value and mirrors the interval exactly.
    """
    arrays = as_arrays("paired_difference", num_a, den_a, num_b, den_b)
    value, z = difference_series(arrays[0], arrays[1], arrays[2], arrays[3], scale)
    return mean_estimate(z, value, confidence)
