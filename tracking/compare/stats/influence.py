"""Units that decide a verdict alone (``influential_units``) and whether two curves are one curve
shifted (``lead_lag``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from cliptrack.compare.stats.estimate import ABSOLUTE, equivalence_verdict
from cliptrack.compare.stats.intervals import as_arrays, difference_series, paired_difference

CANDIDATES = 16
"""Units tried one by one by ``influential_units`` (those furthest from the median, robustly)."""
EXACT_UNITS = 5_000
"""Above this many units only ``LONG_CANDIDATES`` units are tried one by one (each try is a full refit)."""
LONG_CANDIDATES = 4
ROBUST_Z = 5.0
"""Robust z-score (``|x - median| / (1.4826 MAD)``) above which a unit is an outlier."""


def _outliers(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(order, flagged)``: unit indices by decreasing robust z-score, and those above ``ROBUST_Z``."""
    med = np.median(z)
    dev = np.abs(z - med)
    mad = 1.4826 * float(np.median(dev))
    score = dev / mad if mad > 0 else np.where(dev > 0, np.inf, 0.0)
    order = np.argsort(-score, kind="stable")
    return order, np.flatnonzero(score > ROBUST_Z)


def influential_units(
    num_a: np.ndarray,
    den_a: np.ndarray,
    num_b: np.ndarray,
    den_b: np.ndarray,
    *,
    scale: str = ABSOLUTE,
    confidence: float = 0.90,
    tolerance: float,
) -> list[int]:
    """Paired-unit indices whose removal changes the verdict of ``paired_difference`` against
    ``±tolerance``: each of the ``CANDIDATES`` units with the largest robust z-score of the paired
    linearised series left out alone, and all robust outliers (z > ``ROBUST_Z``) left out together
    (returned together when that set changes it). Sorted; empty when no unit decides the verdict.
    Above ``EXACT_UNITS`` units only the ``LONG_CANDIDATES`` most extreme units are tried alone."""
    arrays = as_arrays("influential_units", num_a, den_a, num_b, den_b)
    n = arrays[0].size
    value, z = difference_series(arrays[0], arrays[1], arrays[2], arrays[3], scale)
    if n < 3 or not np.all(np.isfinite(z)):
        return []
    base = equivalence_verdict(paired_difference(*arrays, scale=scale, confidence=confidence), tolerance)
    order, flagged = _outliers(z)

    def changes(drop: np.ndarray) -> bool:
        keep = np.ones(n, bool)
        keep[drop] = False
        est = paired_difference(*(a[keep] for a in arrays), scale=scale, confidence=confidence)
        return equivalence_verdict(est, tolerance) != base

    tried = CANDIDATES if n <= EXACT_UNITS else LONG_CANDIDATES
    found = {int(i) for i in order[:tried] if changes(np.array([i]))}
    if flagged.size > 1 and flagged.size <= n // 10 and changes(flagged):
        found |= {int(i) for i in flagged}
    return sorted(found)


@dataclass(frozen=True)
class Lag:
    """Curve b is curve a shifted by ``lag`` units (b behind a when ``lag > 0``). ``gain``: share of
    the mean squared difference of the smoothed curves removed by the shift (0..1); ``explained``:
    the shift accounts for most of the difference (``gain >= LAG_GAIN``)."""

    lag: int
    gain: float
    explained: bool


LAG_GAIN = 0.5
"""Share of the squared difference a shift must remove to explain it."""


def _smooth(x: np.ndarray, width: int) -> np.ndarray:
    if width <= 1:
        return x
    c = np.concatenate([[0.0], np.cumsum(x)])
    return (c[width:] - c[:-width]) / width


def _shifted_msd(a: np.ndarray, b: np.ndarray, max_lag: int) -> np.ndarray:
    """Mean squared difference ``mean_t (b_t - a_{t-k})^2`` over the overlap, ``k = -max_lag .. max_lag``."""
    n = a.size
    size = 1 << int(2 * n - 1).bit_length()
    cross = np.fft.irfft(np.fft.rfft(b, size) * np.conj(np.fft.rfft(a, size)), size)  # sum_t b_t a_{t-k}
    ca = np.concatenate([[0.0], np.cumsum(a * a)])
    cb = np.concatenate([[0.0], np.cumsum(b * b)])
    k = np.arange(-max_lag, max_lag + 1)
    kp, km = np.maximum(k, 0), np.maximum(-k, 0)  # b over [kp, n - km), a over [km, n - kp)
    sab = cross[k % size]
    sa = ca[n - kp] - ca[km]
    sb = cb[n - km] - cb[kp]
    return (sa + sb - 2.0 * sab) / (n - np.abs(k))


def lead_lag(x_a: np.ndarray, x_b: np.ndarray, *, max_fraction: float = 0.25) -> Lag | None:
    """Whether curve b (per-unit values) is curve a shifted by up to ``max_fraction`` of the units.

    Both curves are smoothed (moving mean over ``n // 50`` units) so that per-unit noise does not
    hide the shape, then the shift minimising their mean squared difference over the overlap is
    found (one FFT cross-correlation, O(n log n)). None under 20 units or for curves that do not
    differ at shift 0.
    """
    a, b = (np.asarray(x, dtype=float).reshape(-1) for x in (x_a, x_b))
    if a.size != b.size:
        raise ValueError(f"lead_lag: curves must have one value per paired unit ({a.size} vs {b.size})")
    if not 0 < max_fraction < 1:
        raise ValueError(f"max_fraction must be in (0, 1), got {max_fraction}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("lead_lag: curves must be finite")
    if a.size < 20:
        return None
    width = max(1, a.size // 50)
    a, b = _smooth(a, width), _smooth(b, width)
    max_lag = int(max_fraction * a.size)
    msd = _shifted_msd(a, b, max_lag)
    base = msd[max_lag]
    if not base > 0:
        return None
    best = int(np.argmin(msd))
    gain = float(max(0.0, 1.0 - msd[best] / base))
    lag = best - max_lag
    return Lag(lag, gain, lag != 0 and gain >= LAG_GAIN)
