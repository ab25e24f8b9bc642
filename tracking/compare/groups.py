"""Per pair of groups (stacks, several seeds each): the difference of the groups' mean per-seed
values with an interval that includes the between-seed variation (``stats.group_difference``),
its verdict and reason, and the seeds per group the margin needs at the measured spread
(``stats.seeds_needed``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from cliptrack.compare import quantities as qs
from cliptrack.compare import reasons as r
from cliptrack.compare import stats as st
from cliptrack.compare.estimates import valid
from cliptrack.compare.findings import GroupDifference, RunEstimate
from cliptrack.compare.notes import sentence
from cliptrack.compare.quantities import Quantity
from cliptrack.compare.stats import ABSOLUTE, INSUFFICIENT, LOG_RATIO, Estimate, GroupEstimate
from cliptrack.compare.stats.estimate import interval_verdict
from cliptrack.compare.verdicts import whole_window


def _group_scale(q: Quantity, estimates: list[Estimate]) -> tuple[str, float]:
    """(scale, margin): an ``auto`` quantity is relative only when every seed is clearly away from zero."""
    if q.scale != qs.AUTO:
        return q.scale, q.margin
    values = np.array([e.value for e in estimates])
    lows = np.array([e.low for e in estimates])
    highs = np.array([e.high for e in estimates])
    clear = (
        bool(np.all(lows > 0) or np.all(highs < 0)) and float(np.min(np.abs(values))) >= q.relative_floor()
    )
    return (LOG_RATIO, q.margin) if clear else (ABSOLUTE, q.abs_margin)


def _group_verdict(estimate: GroupEstimate, tolerance: float) -> tuple[str, r.VerdictReason]:
    if not estimate.has_interval:
        return INSUFFICIENT, r.TooLittleData(estimate.reason)
    verdict = interval_verdict(estimate.low, estimate.high, tolerance)
    as_estimate = Estimate(estimate.value, estimate.low, estimate.high, 0, 0, 0, 0, 0)
    return verdict, whole_window(as_estimate, verdict, r.SEEDS)


def _seeds(
    q: Quantity, members: Sequence[str], units: dict[str, pd.DataFrame]
) -> list[tuple[np.ndarray, np.ndarray]]:
    return [valid(units[label], q)[:2] for label in members]


def _group_estimate(
    seeds_a: list[tuple[np.ndarray, np.ndarray]],
    seeds_b: list[tuple[np.ndarray, np.ndarray]],
    scale: str,
    confidence: float,
) -> GroupEstimate:
    try:
        return st.group_difference(seeds_a, seeds_b, scale=scale, confidence=confidence)
    except ValueError as exc:  # a seed without a defined ratio (e.g. a quantity it does not log)
        nan = float("nan")
        return GroupEstimate(nan, nan, nan, confidence, len(seeds_a), len(seeds_b), nan, nan, nan, str(exc))


def _within_standard_errors(within: Sequence[Estimate], scale: str) -> list[float]:
    """Each seed's standard error of its window value (relative to the value on the log-ratio scale)."""
    return [
        float(np.sqrt(e.lrv / e.n_units)) / (abs(e.value) if scale == LOG_RATIO else 1.0)
        for e in within
        if np.isfinite(e.lrv) and e.n_units > 0 and e.value != 0
    ]


def _between_sd(est: GroupEstimate, within: Sequence[Estimate], scale: str) -> float | None:
    """The groups' pooled between-seed standard deviation (relative on the log-ratio scale)."""
    sds = [x for x in (est.between_sd_a, est.between_sd_b) if np.isfinite(x)]
    if not sds:
        return None
    between = float(np.sqrt(np.mean(np.square(sds))))
    if scale == LOG_RATIO:
        means = [abs(e.value) for e in within if np.isfinite(e.value) and e.value != 0]
        between /= float(np.mean(means)) if means else 1.0
    return between


def _seeds_needed(
    est: GroupEstimate, within: Sequence[Estimate], scale: str, tolerance: float, confidence: float
) -> int | None:
    """Seeds per group for this margin at the measured spread (None when it cannot be said)."""
    ses = _within_standard_errors(within, scale)
    between = _between_sd(est, within, scale)
    if not ses or between is None:
        return None
    try:
        return int(st.seeds_needed(between, float(np.mean(ses)), tolerance, confidence=confidence))
    except ValueError:
        return None


def group_differences(
    quantities: list[Quantity],
    groups: dict[str, list[str]],
    units: dict[str, pd.DataFrame],
    estimates: list[RunEstimate],
    confidence: float,
) -> list[GroupDifference]:
    """Every group against the first one, quantity by quantity."""
    by = {(e.metric, e.run): e for e in estimates}
    names = list(groups)
    out = []
    for q in quantities:
        scale, margin = _group_scale(q, [by[q.name, run].estimate for g in names for run in groups[g]])
        tolerance = qs.log_margin(margin) if scale == LOG_RATIO else margin
        for g in names[1:]:
            members = groups[names[0]] + groups[g]
            est = _group_estimate(
                _seeds(q, groups[names[0]], units), _seeds(q, groups[g], units), scale, confidence
            )
            verdict, why = _group_verdict(est, tolerance)
            within = [by[q.name, run].estimate for run in members]
            out.append(
                GroupDifference(
                    metric=q.name,
                    reference=names[0],
                    group=g,
                    estimate=est,
                    tolerance=tolerance,
                    margin=margin,
                    scale=scale,
                    verdict=verdict,
                    reason=sentence(why),
                    counts_for_verdict=q.verdict,
                    seeds_needed=_seeds_needed(est, within, scale, tolerance, confidence),
                    approximate=any(by[q.name, run].approximate for run in members),
                    why=why,
                )
            )
    return out
