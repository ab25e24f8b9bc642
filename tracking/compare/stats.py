"""Ratio estimators with block-bootstrap intervals, and the Wilson interval for reference.

Training steps are autocorrelated (the policy drifts slowly), and the tokens of one step are not
independent draws either: they share a batch, a policy and often a prompt. An interval that treats
every token as an independent Bernoulli trial (Wilson on token counts) is therefore far too narrow.
The honest interval resamples whole steps in contiguous blocks (circular moving-block bootstrap,
Künsch 1989; Politis & Romano 1992), keeping the autocorrelation inside each block:

- block length ``ceil(n ** (1/3))`` steps by default (the usual rate for variance estimation);
- the statistic is recomputed as a ratio of resampled sums, never a mean of per-step ratios;
- the interval is the percentile interval of ``n_boot`` replicates from a seeded generator, so a
  comparison is reproducible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

MIN_UNITS = 3
"""Fewest units (steps or bins) for which an interval is computed; fewer give NaN bounds."""


@dataclass(frozen=True)
class Estimate:
    """A point estimate with a confidence interval. Bounds are NaN when there is too little data."""

    value: float
    low: float
    high: float
    n_units: int
    block_length: int
    confidence: float

    @property
    def has_interval(self) -> bool:
        return bool(np.isfinite(self.low) and np.isfinite(self.high))


def default_block_length(n: int) -> int:
    """Block length in units (steps) for ``n`` units: ``ceil(n ** (1/3))``, at least 1."""
    return max(1, math.ceil(n ** (1.0 / 3.0))) if n > 0 else 1


def block_bootstrap_indices(n: int, n_boot: int, block_length: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_boot, n)`` indices of circular moving-block resamples of ``0..n-1``.

    Each replicate concatenates blocks ``start, start+1, ..., start+block_length-1`` (mod ``n``)
    with uniform random starts, cut to length ``n``.
    """
    if n <= 0:
        raise ValueError(f"cannot resample {n} units")
    block_length = max(1, min(int(block_length), n))
    n_blocks = math.ceil(n / block_length)
    starts = rng.integers(0, n, size=(n_boot, n_blocks))
    offsets = np.arange(block_length)
    idx = (starts[:, :, None] + offsets[None, None, :]) % n
    return idx.reshape(n_boot, n_blocks * block_length)[:, :n]


def _percentile(values: np.ndarray, confidence: float) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    if finite.size < max(10, values.size // 2):
        return float("nan"), float("nan")
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(finite, [alpha, 1.0 - alpha])
    return float(low), float(high)


def _ratio(num: np.ndarray, den: np.ndarray) -> float:
    total = float(np.sum(den))
    return float(np.sum(num)) / total if total != 0 else float("nan")


def ratio_estimate(
    num: np.ndarray,
    den: np.ndarray,
    *,
    confidence: float = 0.90,
    n_boot: int = 2000,
    block_length: int | None = None,
    rng: np.random.Generator | None = None,
) -> Estimate:
    """``sum(num) / sum(den)`` over units, with a circular block-bootstrap percentile interval."""
    num = np.asarray(num, dtype=float)
    den = np.asarray(den, dtype=float)
    n = num.size
    value = _ratio(num, den)
    block = block_length or default_block_length(n)
    if n < MIN_UNITS:
        return Estimate(value, float("nan"), float("nan"), n, block, confidence)
    rng = rng if rng is not None else np.random.default_rng(0)
    idx = block_bootstrap_indices(n, n_boot, block, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        reps = num[idx].sum(axis=1) / den[idx].sum(axis=1)
    low, high = _percentile(reps, confidence)
    return Estimate(value, low, high, n, block, confidence)


def paired_ratio_difference(
    num_a: np.ndarray,
    den_a: np.ndarray,
    num_b: np.ndarray,
    den_b: np.ndarray,
    *,
    relative: bool = False,
    confidence: float = 0.90,
    n_boot: int = 2000,
    block_length: int | None = None,
    rng: np.random.Generator | None = None,
) -> Estimate:
    """Difference of ratio estimates over paired units: ``R_b - R_a``, or ``(R_b - R_a) / |R_a|`` when
    ``relative`` (``R_b / R_a - 1`` for a positive reference; dividing by ``|R_a|`` keeps the sign
    of the difference when the reference is negative, as a reward can be).

    Both runs are resampled with the same block indices, so what the two runs share at a step
    (the schedule, the data order) cancels in the difference, as in a paired test.
    """
    arrays = [np.asarray(a, dtype=float) for a in (num_a, den_a, num_b, den_b)]
    n = arrays[0].size
    if any(a.size != n for a in arrays):
        raise ValueError("paired arrays must have one entry per paired unit")

    def stat(na: np.ndarray, da: np.ndarray, nb: np.ndarray, db: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            ra = na / da
            rb = nb / db
            return (rb - ra) / np.abs(ra) if relative else rb - ra

    sums = [a.sum() for a in arrays]
    value = float(stat(*(np.asarray(s) for s in sums)))
    block = block_length or default_block_length(n)
    if n < MIN_UNITS:
        return Estimate(value, float("nan"), float("nan"), n, block, confidence)
    rng = rng if rng is not None else np.random.default_rng(0)
    idx = block_bootstrap_indices(n, n_boot, block, rng)
    reps = stat(*(a[idx].sum(axis=1) for a in arrays))
    low, high = _percentile(reps, confidence)
    return Estimate(value, low, high, n, block, confidence)


def wilson_interval(successes: float, trials: float, confidence: float = 0.90) -> tuple[float, float]:
    """Wilson score interval for ``successes / trials`` treating every trial as independent.

    Shown for reference only: tokens within and across steps are correlated, so this interval is
    too narrow for clip fractions; the verdict uses the block bootstrap.
    """
    if trials <= 0:
        return float("nan"), float("nan")
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    p = successes / trials
    denom = 1.0 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


EQUIVALENT = "equivalent"
DIFFERENT = "different"
INCONCLUSIVE = "inconclusive"


def equivalence_verdict(difference: Estimate, tolerance: float) -> str:
    """TOST-style verdict on a difference interval against ``±tolerance``.

    ``equivalent``: the whole interval lies inside ``(-tolerance, tolerance)``; ``different``: the
    whole interval lies outside ``[-tolerance, tolerance]`` (so it also excludes 0); otherwise, or
    without an interval, ``inconclusive``.
    """
    if not difference.has_interval:
        return INCONCLUSIVE
    if -tolerance < difference.low and difference.high < tolerance:
        return EQUIVALENT
    if difference.low > tolerance or difference.high < -tolerance:
        return DIFFERENT
    return INCONCLUSIVE
