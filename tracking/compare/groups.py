"""Per pair of groups (stacks, several seeds each): the difference of the groups' mean per-seed
values with an interval that includes the between-seed variation (``stats.group_difference``),
the same step ranges judged across seeds (segments, when the shortest seed has two or more of
``MIN_SEGMENT_UNITS`` units: they name stretches shown to differ), the stack-level verdict (the
window's over seeds) and its reason, the probability that one
stack's value exceeds the other's, and the seeds per group (or steps per seed) the margin needs at
the measured spread (``stats.seeds_needed``, ``stats.seeds.steps_factor``).

``groups_by(runset, tag)``: the runs grouped by a tag (``stack``: the run's backend label; any
other name: that run parameter), for ``compare(runset, group_by=...)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from cliptrack.compare import quantities as qs
from cliptrack.compare import reasons as r
from cliptrack.compare import stats as st
from cliptrack.compare.estimates import valid
from cliptrack.compare.findings import GroupDifference, GroupSegment, RunEstimate
from cliptrack.compare.notes import sentence
from cliptrack.compare.quantities import Quantity
from cliptrack.compare.stats import (
    ABSOLUTE,
    DIFFERENT,
    INSUFFICIENT,
    LOG_RATIO,
    Estimate,
    GroupEstimate,
)
from cliptrack.compare.stats.estimate import interval_verdict
from cliptrack.compare.stats.seeds import segment_verdict, stack_verdict, steps_factor
from cliptrack.compare.stats.segments import segment_bounds
from cliptrack.compare.verdicts import whole_window

if TYPE_CHECKING:
    from cliptrack.store.frame import RunSet

Seed = tuple[np.ndarray, np.ndarray, np.ndarray]
"""One seed's ``(num, den, x)``: its sums at the units it logged validly, and their x."""


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


def _seeds(q: Quantity, members: Sequence[str], units: dict[str, pd.DataFrame]) -> list[Seed]:
    out = []
    for label in members:
        num, den, x = valid(units[label], q)
        out.append((num, den, np.asarray(x, dtype=float)))
    return out


def _sums(seeds: list[Seed]) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(num, den) for num, den, _ in seeds]


def _edges(seeds: list[Seed]) -> list[tuple[float, float]]:
    """The segments' x ranges ``[lo, hi)`` shared by every seed: ``segment_bounds`` of the shortest
    seed's unit count, cut at equal shares of the units any seed logged (none below two)."""
    n = min(len(x) for _, _, x in seeds)
    k = len(segment_bounds(n))
    if k < 2:
        return []
    xs = np.unique(np.concatenate([x for _, _, x in seeds]))
    cuts = [float(xs[round(i * len(xs) / k)]) for i in range(k)] + [math.inf]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def _sliced(seeds: list[Seed], lo: float, hi: float) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(num[(x >= lo) & (x < hi)], den[(x >= lo) & (x < hi)]) for num, den, x in seeds]


def _segments(
    seeds_a: list[Seed], seeds_b: list[Seed], scale: str, confidence: float, tolerance: float
) -> tuple[GroupSegment, ...]:
    """The same x ranges of every seed, judged across seeds (none when the window is too short)."""
    edges = _edges(seeds_a + seeds_b)
    xs = np.unique(np.concatenate([x for _, _, x in seeds_a + seeds_b]))
    out = []
    for lo, hi in edges:
        est = _group_estimate(_sliced(seeds_a, lo, hi), _sliced(seeds_b, lo, hi), scale, confidence)
        inside = xs[(xs >= lo) & (xs < hi)]
        verdict = segment_verdict(est, tolerance, len(edges))
        out.append(GroupSegment(float(inside[0]), float(inside[-1]), est, verdict))
    return tuple(out)


def _group_verdict(
    estimate: GroupEstimate, tolerance: float, segments: tuple[GroupSegment, ...], align: str
) -> tuple[str, str, r.VerdictReason, tuple[GroupSegment, ...]]:
    """(the stack-level verdict, the window's verdict, why, the segments shown to differ): the
    window's verdict over seeds, different also when a segment is shown different
    (``stats.seeds.stack_verdict``)."""
    if not estimate.has_interval:
        return INSUFFICIENT, INSUFFICIENT, r.TooLittleData(estimate.reason), ()
    average = interval_verdict(estimate.low, estimate.high, tolerance)
    verdict = stack_verdict(average, [s.verdict for s in segments])
    differing = tuple(s for s in segments if s.verdict == DIFFERENT)
    as_estimate = Estimate(estimate.value, estimate.low, estimate.high, 0, 0, 0, 0, 0)
    why: r.VerdictReason = whole_window(as_estimate, average, r.SEGMENTS if segments else r.SEEDS)
    if differing and average != DIFFERENT:
        why = r.NotThroughout(
            r.WholeWindow(average, bool(estimate.low > 0 or estimate.high < 0), r.SEGMENTS),
            tuple(r.Span(align, s.start, s.end, s.verdict) for s in differing),
        )
    return verdict, average, why, differing


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


def _power(
    est: GroupEstimate, within: Sequence[Estimate], scale: str, tolerance: float, confidence: float
) -> tuple[int | None, float | None]:
    """(seeds per group, times the steps per seed) for this margin at the measured spread (None
    when it cannot be said, or when more steps alone cannot settle it)."""
    ses = _within_standard_errors(within, scale)
    spread = _between_sd(est, within, scale)
    if not ses or spread is None:
        return None, None
    # The seeds' observed spread is one seed's whole variance around its stack (within-run noise
    # included): the seeds needed are planned with it alone. Each run's own long-run standard error
    # only says how much of that spread more steps would remove (never more than the spread itself:
    # on real runs it can exceed the seeds' whole spread, and planning with it then asked for
    # hundreds of seeds where 4-6 settle the margin).
    within_se = min(float(np.sqrt(np.mean(np.square(ses)))), spread)
    between = float(np.sqrt(spread**2 - within_se**2))
    seeds = min(est.seeds_a, est.seeds_b)
    try:
        needed = int(st.seeds_needed(spread, 0.0, tolerance, confidence=confidence))
    except ValueError:
        needed = None
    factor = steps_factor(between, within_se, tolerance, seeds, confidence=confidence) if seeds >= 2 else None
    return needed, factor


def group_differences(
    quantities: list[Quantity],
    groups: dict[str, list[str]],
    units: dict[str, pd.DataFrame],
    estimates: list[RunEstimate],
    confidence: float,
    align: str = "step",
) -> list[GroupDifference]:
    """Every group against the first one, quantity by quantity."""
    by = {(e.metric, e.run): e for e in estimates}
    names = list(groups)
    out = []
    for q in quantities:
        scale, margin = _group_scale(q, [by[q.name, run].estimate for g in names for run in groups[g]])
        tolerance = qs.log_margin(margin) if scale == LOG_RATIO else margin
        reference = _seeds(q, groups[names[0]], units)
        for g in names[1:]:
            members = groups[names[0]] + groups[g]
            seeds = _seeds(q, groups[g], units)
            est = _group_estimate(_sums(reference), _sums(seeds), scale, confidence)
            segments = (
                _segments(reference, seeds, scale, confidence, tolerance)
                if est.has_interval and q.verdict
                else ()
            )
            verdict, average, why, differing = _group_verdict(est, tolerance, segments, align)
            within = [by[q.name, run].estimate for run in members]
            needed, factor = _power(est, within, scale, tolerance, confidence)
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
                    seeds_needed=needed,
                    approximate=any(by[q.name, run].approximate for run in members),
                    why=why,
                    probability_greater=est.probability_greater,
                    steps_factor=factor,
                    segments=segments,
                    differing=differing,
                    average_verdict=average,
                )
            )
    return out


STACK = "stack"
"""``group_by`` name for the run's training stack (its backend label)."""


def groups_by(runset: RunSet, tag: str, runs: Sequence[str] | None = None) -> dict[str, list[str]]:
    """The runs of ``runset`` (or only ``runs`` of it) grouped by ``tag`` (``"stack"``: the backend label; otherwise the run
    parameter of that name), groups in order of their first run. Raises ValueError when a run lacks
    the tag, or when fewer than two groups result."""
    out: dict[str, list[str]] = {}
    missing = []
    chosen = None if not runs else {runset.info(run).display for run in runs}
    for run in runset.runs:
        if chosen is not None and run.display not in chosen:
            continue
        info = run.run
        value = info.backend_label if tag == STACK else info.config.get(tag)
        if value is None or str(value) == "":
            missing.append(run.display)
            continue
        out.setdefault(str(value), []).append(run.display)
    if missing:
        raise ValueError(f"group_by {tag!r}: run(s) {missing} have no {tag!r} (tag them, or name groups)")
    if len(out) < 2:
        raise ValueError(
            f"group_by {tag!r}: the runs form {len(out)} group(s) {list(out)}; two or more are needed"
        )
    return out
