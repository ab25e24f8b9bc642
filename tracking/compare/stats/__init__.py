"""The comparison's statistics in one import: estimates with intervals, verdicts, segments, seeds.

The estimand of every quantity is a ratio of sums over the units (steps, or bins of steps) of a
window, ``R = sum(num) / sum(den)``; a run's smooth trend over the window is part of it, not noise.
Parts (each documented in its module; the method in docs/STATISTICS.md):

- ``estimate``: ``Estimate``, the verdict names, ``equivalence_verdict`` (TOST on the interval);
- ``cosines``: the orthonormal cosines and the Legendre trend basis ``lrv`` and ``memory`` share;
- ``quantiles``: Student t and F quantiles (scipy, imported on first use);
- ``lrv``: the long-run variance around each run's trend (equal-weighted cosine estimate, t
  degrees of freedom, long-memory check); the effective sample size comes from the same estimate;
- ``intervals``: ``ratio_estimate``, ``step_weighted_estimate``, ``paired_difference``;
- ``segments``: ``segment_bounds``, ``segment_differences`` (with an episode scan) and
  ``throughout_verdict`` (intersection–union test);
- ``influence``: ``influential_units`` (units that decide a verdict alone), ``lead_lag``;
- ``groups``: ``group_difference`` over seeds and ``seeds_needed``.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

from cliptrack.core.lazy import lazy_attribute

_HOMES = {
    "ABSOLUTE": "cliptrack.compare.stats.estimate",
    "DIFFERENT": "cliptrack.compare.stats.estimate",
    "EQUIVALENT": "cliptrack.compare.stats.estimate",
    "INCONCLUSIVE": "cliptrack.compare.stats.estimate",
    "INSUFFICIENT": "cliptrack.compare.stats.estimate",
    "LOG_RATIO": "cliptrack.compare.stats.estimate",
    "METHOD": "cliptrack.compare.stats.estimate",
    "MIN_ESS": "cliptrack.compare.stats.estimate",
    "MIN_SEGMENT_UNITS": "cliptrack.compare.stats.estimate",
    "MIN_UNITS": "cliptrack.compare.stats.estimate",
    "SCALES": "cliptrack.compare.stats.estimate",
    "VERDICTS": "cliptrack.compare.stats.estimate",
    "Estimate": "cliptrack.compare.stats.estimate",
    "equivalence_verdict": "cliptrack.compare.stats.estimate",
    "Lag": "cliptrack.compare.stats.influence",
    "influential_units": "cliptrack.compare.stats.influence",
    "lead_lag": "cliptrack.compare.stats.influence",
    "mean_estimate": "cliptrack.compare.stats.intervals",
    "paired_difference": "cliptrack.compare.stats.intervals",
    "ratio_estimate": "cliptrack.compare.stats.intervals",
    "step_weighted_estimate": "cliptrack.compare.stats.intervals",
    "autocovariances": "cliptrack.compare.stats.lrv",
    "long_run_variance": "cliptrack.compare.stats.lrv",
    "GroupEstimate": "cliptrack.compare.stats.estimate",
    "group_difference": "cliptrack.compare.stats.seeds",
    "seeds_needed": "cliptrack.compare.stats.seeds",
    "Segment": "cliptrack.compare.stats.segments",
    "Throughout": "cliptrack.compare.stats.segments",
    "segment_bounds": "cliptrack.compare.stats.segments",
    "segment_differences": "cliptrack.compare.stats.segments",
    "throughout_verdict": "cliptrack.compare.stats.segments",
}
"""Public name -> the module that holds it, imported on first use (``stats.estimate`` alone stays light)."""

FIXED_B = 1.0
"""Bandwidth fraction of the previous fixed-b Bartlett method; no longer used by the intervals
(kept for callers that still print it; use ``METHOD``)."""

__all__ = [
    "ABSOLUTE",
    "DIFFERENT",
    "EQUIVALENT",
    "FIXED_B",
    "INCONCLUSIVE",
    "INSUFFICIENT",
    "LOG_RATIO",
    "METHOD",
    "MIN_ESS",
    "MIN_SEGMENT_UNITS",
    "MIN_UNITS",
    "SCALES",
    "VERDICTS",
    "Estimate",
    "GroupEstimate",
    "Lag",
    "Segment",
    "Throughout",
    "autocovariances",
    "equivalence_verdict",
    "group_difference",
    "influential_units",
    "lead_lag",
    "long_run_variance",
    "mean_estimate",
    "paired_difference",
    "ratio_estimate",
    "seeds_needed",
    "segment_bounds",
    "segment_differences",
    "step_weighted_estimate",
    "throughout_verdict",
    "wilson_interval",
]


def wilson_interval(successes: float, trials: float, confidence: float = 0.90) -> tuple[float, float]:
    """Wilson score interval for ``successes / trials`` treating every trial as independent.

    Shown for reference only: tokens within and across steps are correlated, so this interval is
    far too narrow for clip fractions; the verdict never uses it.
    """
    if trials <= 0:
        return float("nan"), float("nan")
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    p = successes / trials
    denom = 1.0 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _HOMES, name)
