"""The comparison's statistics in one import: estimates with intervals, verdicts, segments, seeds.

The estimand of every quantity is a ratio of sums over the units (steps, or bins of steps) of a
window, ``R = sum(num) / sum(den)``; a run's smooth trend over the window is part of it, not noise.
Parts (each documented in its module; the method in docs/STATISTICS.md):

- ``estimate``: ``Estimate``, the verdict names, ``equivalence_verdict`` (TOST on the interval);
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

from tracking.compare.estimate import (
    ABSOLUTE,
    DIFFERENT,
    EQUIVALENT,
    INCONCLUSIVE,
    INSUFFICIENT,
    LOG_RATIO,
    METHOD,
    MIN_ESS,
    MIN_SEGMENT_UNITS,
    MIN_UNITS,
    SCALES,
    VERDICTS,
    Estimate,
    equivalence_verdict,
)
from tracking.compare.groups import GroupEstimate, group_difference, seeds_needed
from tracking.compare.influence import Lag, influential_units, lead_lag
from tracking.compare.intervals import (
    mean_estimate,
    paired_difference,
    ratio_estimate,
    step_weighted_estimate,
)
from tracking.compare.lrv import autocovariances, long_run_variance
from tracking.compare.segments import (
    Segment,
    Throughout,
    segment_bounds,
    segment_differences,
    throughout_verdict,
)

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
