"""``compare``: per-run estimates, paired differences against a reference run (or group differences
between stacks over seeds), verdicts that hold throughout the window, and the notes that go with
them. A pure function of the loaded runs: it builds its result once and never rewrites it.

The first run named is the reference; every other run is compared with it, and comparing A with B
mirrors comparing B with A (same verdict, negated difference). For each quantity of the registry
(``quantities.QUANTITIES``):

- per run, the ratio-of-sums estimate over every unit of the window it logged validly, with its
  interval kept within the quantity's bounds (``stats.ratio_estimate``), the step-weighted
  estimate beside it and, for token fractions, the Wilson interval on token counts for reference;
- per pair, the units both runs logged validly; each run's estimate over exactly those units and
  the paired difference with its interval (``stats.paired_difference``); the window split into
  segments (``stats.segment_differences``) and a verdict that is ``equivalent`` only when every
  segment is (``stats.throughout_verdict``); single steps that decide the verdict
  (``stats.influential_units``); a lag between two curves (``stats.lead_lag``);
- per pair of groups (stacks, several seeds each), the difference of the groups with an interval
  that includes the between-seed variation (``stats.group_difference``) and the seeds a margin needs;
- notes for whatever was left out or refused: units with non-finite values or bad counts, units
  without the quantity's keys, a step logged twice, a reward compared on the absolute scale, a
  quantity no run logged, seed variation not covered by a single pair.

Intervals are 90 % by default (``DEFAULT_CONFIDENCE``), which makes "equivalent" a two one-sided
test at the 5 % level. There is no resampling: a comparison repeats exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from cliptrack.compare import quantities as qs
from cliptrack.compare import stats as st
from cliptrack.compare.align import ALIGNMENTS, Window, check_token_axis, unit_table
from cliptrack.compare.frame import RunSet, count_problems
from cliptrack.compare.quantities import Quantity
from cliptrack.compare.result import (
    ComparisonResult,
    Difference,
    DifferenceSegment,
    GroupDifference,
    Lead,
    Note,
    RunEstimate,
)
from cliptrack.compare.stats import (
    ABSOLUTE,
    DIFFERENT,
    EQUIVALENT,
    INSUFFICIENT,
    LOG_RATIO,
    Estimate,
    GroupEstimate,
    equivalence_verdict,
    paired_difference,
    wilson_interval,
)
from cliptrack.compare.stats.estimate import MIN_ESS, MIN_UNITS, counted, interval_verdict
from cliptrack.compare.stats.influence import ROBUST_Z
from cliptrack.compare.stats.intervals import difference_series

DEFAULT_CONFIDENCE = 0.90
"""Two-sided confidence of every interval (TOST at 5 %)."""
DEFAULT_TOLERANCES = dict(qs.DEFAULT_MARGINS)
"""Equivalence margins by quantity: clip fractions 0.02 absolute, reward and throughput ±5 %."""
METHOD = st.METHOD
"""The interval method, as stated in every rendering."""


# ------------------------------------------------------------------------------- settings


def _labels(
    runset: RunSet, runs: Sequence[str] | None, groups: Mapping[str, Sequence[str]] | None
) -> tuple[list[str], dict[str, list[str]]]:
    if groups is None:
        labels = [runset.info(r).display for r in (runs or runset.labels)]
        if len(labels) < 2:
            raise ValueError(f"compare needs at least two runs, got {labels}")
        if len(set(labels)) != len(labels):
            raise ValueError(f"a run is named twice in {labels}")
        return labels, {}
    if runs:
        raise ValueError("name runs either as runs or as groups, not both")
    if len(groups) < 2:
        raise ValueError(f"compare needs at least two groups, got {list(groups)}")
    named = {name: [runset.info(r).display for r in members] for name, members in groups.items()}
    for name, members in named.items():
        if len(members) < 2:
            raise ValueError(
                f"group {name!r} has {len(members)} run(s): a group needs 2 or more seeds "
                "(compare single runs without groups)"
            )
    labels = [label for members in named.values() for label in members]
    if len(set(labels)) != len(labels):
        raise ValueError(f"a run is named twice in the groups {named}")
    return labels, named


def _choose_quantities(
    runset: RunSet, labels: Sequence[str], tolerances: Mapping[str, float], reward_abs_tolerance: float | None
) -> list[Quantity]:
    """The registry with the margins given and, per quantity, the first estimand every run logs; an
    optional quantity that no run logs at all (the gauge of a run without it) is left out."""
    chosen = []
    for q in qs.QUANTITIES:
        if q.optional and not any(_logs_any(runset, label, q) for label in labels):
            continue
        estimand = next(
            (e for e in q.estimands if all(set(e.keys) <= set(runset.wide(label)) for label in labels)),
            q.estimands[-1],
        )
        chosen.append(q.using(estimand))
    abs_margins = {
        q.name: reward_abs_tolerance
        for q in chosen
        if q.scale == qs.AUTO and reward_abs_tolerance is not None
    }
    logged = {q.name for q in chosen}
    known = {q.name for q in qs.QUANTITIES}
    given = {name: value for name, value in tolerances.items() if name in logged or name not in known}
    return qs.with_margins(chosen, given, abs_margins)


def _logs_any(runset: RunSet, label: str, q: Quantity) -> bool:
    columns = set(runset.wide(label))
    wanted = {e.numerator for e in q.estimands} | ({q.approximate_key} if q.approximate_key else set())
    return bool(columns & wanted)


# ------------------------------------------------------------------------------- per run


def _where(x: float | None) -> str:
    return "?" if x is None else f"{x:g}"


def _run_notes(q: Quantity, label: str, table: pd.DataFrame, align: str) -> list[Note]:
    unit = "step" if align == "step" else "unit"
    bad = table[f"{q.name}.bad"].to_numpy() > 0
    logged = table[f"{q.name}.logged"].to_numpy() > 0
    n = len(table)
    if n and not logged.any():
        warn = q.verdict and not q.optional
        return [Note(q.name, label, f"{label} logs no {q.estimand} in the window", warning=warn)]
    notes = []
    if bad.any():
        xs = table["x"].to_numpy()[bad]
        tail = " from there to the end" if bad[np.argmax(bad) :].all() else ""
        notes.append(
            Note(
                q.name,
                label,
                f"{label}: {q.estimand} is NaN or infinite at {int(bad.sum())} of {n} {unit}s (first at "
                f"{unit} {_where(float(xs[0]))}{tail}); those {unit}s are left out of {q.name} for this "
                f"run and of its paired difference",
                warning=True,
            )
        )
    missing = int((~logged).sum())
    if missing and logged.any():
        notes.append(
            Note(
                q.name,
                label,
                f"{label}: {q.estimand} not logged at {missing} of {n} {unit}s (left out, nothing is counted as 0)",
            )
        )
    return notes


def _valid(table: pd.DataFrame, q: Quantity) -> tuple[np.ndarray, np.ndarray, pd.Index]:
    num, den = table[f"{q.name}.num"], table[f"{q.name}.den"]
    ok = (num.notna() & den.notna()).to_numpy()
    return num.to_numpy()[ok], den.to_numpy()[ok], table.index[ok]


def _step_weighted(q: Quantity, num: np.ndarray, den: np.ndarray, confidence: float) -> Estimate | None:
    if q.denominator is None or not q.verdict:
        return None  # one per step: token- and step-weighted are the same number; or a diagnostic split
    return st.step_weighted_estimate(num, den, confidence=confidence, bounds=q.bounds)


def _estimate_run(
    q: Quantity, label: str, backend: str, table: pd.DataFrame, confidence: float, group: str
) -> RunEstimate:
    nv, dv, _ = _valid(table, q)
    est = st.ratio_estimate(nv, dv, confidence=confidence, bounds=q.bounds)
    w_low, w_high = float("nan"), float("nan")
    if q.estimand.counts:
        w_low, w_high = wilson_interval(float(nv.sum()), float(dv.sum()), confidence)
    bad = table[f"{q.name}.bad"].to_numpy() > 0
    logged = table[f"{q.name}.logged"].to_numpy() > 0
    first = float(table["x"].to_numpy()[bad][0]) if bad.any() else None
    invalid = int((table[f"{q.name}.invalid"].to_numpy() > 0).sum()) if f"{q.name}.invalid" in table else 0
    return RunEstimate(
        metric=q.name,
        run=label,
        backend=backend,
        estimate=est,
        total_numerator=float(nv.sum()),
        total_denominator=float(dv.sum()),
        units=int(nv.size),
        nonfinite=int(bad.sum()),
        missing=int((~logged).sum()) if logged.any() else 0,
        first_nonfinite=first,
        wilson_low=w_low,
        wilson_high=w_high,
        step_weighted=_step_weighted(q, nv, dv, confidence),
        invalid=invalid,
        group=group,
    )


def _weighting_note(
    q: Quantity, label: str, token: Estimate, step: Estimate | None, tolerance: float
) -> list[Note]:
    """A note when the token-weighted and step-weighted estimates disagree by more than the margin."""
    if step is None or not (np.isfinite(token.value) and np.isfinite(step.value)):
        return []
    gap = abs(token.value - step.value)
    if q.scale != ABSOLUTE:
        if token.value <= 0 or step.value <= 0:
            return []
        gap = abs(np.log(token.value / step.value))
    if gap <= tolerance:
        return []
    return [
        Note(
            q.name,
            label,
            f"{label}: {q.name} token-weighted {token.value:.4g} and step-weighted {step.value:.4g} differ by "
            f"more than the margin: steps with more tokens behave differently from the others; the verdict "
            f"is on the token-weighted ratio of sums",
            warning=True,
        )
    ]


def steps_text(steps: Sequence[int], most: int = 6) -> str:
    """Steps as ranges, ``"100-199, 250"``, the first ``most`` ranges and a count of the rest."""
    ranges: list[list[int]] = []
    for step in sorted(steps):
        if ranges and step == ranges[-1][1] + 1:
            ranges[-1][1] = step
        else:
            ranges.append([step, step])
    words = [f"{a}" if a == b else f"{a}-{b}" for a, b in ranges[:most]]
    if len(ranges) > most:
        words.append(f"and {len(ranges) - most} more ranges")
    return ", ".join(words)


def _data_notes(runset: RunSet, labels: Sequence[str], quantities: Sequence[Quantity]) -> list[Note]:
    """Bad data named: keys logged twice at a step with different values (last kept), and exact
    counts refused (negative, fractional, above their total), by run, key and steps."""
    notes = []
    for label in labels:
        for dup in runset.info(label).duplicates:
            notes.append(
                Note(
                    "",
                    label,
                    f"{label}: {dup.metric} logged more than once with different values at "
                    f"{counted(len(dup.steps), 'step')} ({steps_text(dup.steps)}): the last value logged is kept, as when a resumed run "
                    "replays its last steps",
                    warning=True,
                )
            )
        wide = runset.wide(label)
        found: dict[tuple[str, str], tuple[np.ndarray, list[str]]] = {}
        for q in quantities:
            if not (q.estimand.counts and q.denominator is not None):
                continue
            for key, problem, mask in count_problems(wide, q.numerator, q.denominator):
                found.setdefault((key, problem), (mask, []))[1].append(q.name)
        for (key, problem), (mask, names) in found.items():
            steps = wide.index.to_numpy()[mask]
            notes.append(
                Note(
                    names[0],
                    label,
                    f"{label}: {key} is {problem} at {counted(steps.size, 'step')} ({steps_text(steps.tolist())}): "
                    f"not a valid token count, so those steps are refused (left out of {', '.join(names)})",
                    warning=True,
                )
            )
    return notes


# ------------------------------------------------------------------------------- per pair


@dataclass(frozen=True)
class _Pair:
    """The units two runs both logged validly for one quantity, as arrays."""

    num_a: np.ndarray
    den_a: np.ndarray
    num_b: np.ndarray
    den_b: np.ndarray
    x: np.ndarray
    only: int
    only_a: pd.Index
    only_b: pd.Index

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.num_a, self.den_a, self.num_b, self.den_b


def _pair(q: Quantity, a: pd.DataFrame, b: pd.DataFrame) -> _Pair:
    _, _, va = _valid(a, q)
    _, _, vb = _valid(b, q)
    common = va.intersection(vb)
    num, den = f"{q.name}.num", f"{q.name}.den"
    return _Pair(
        a.loc[common, num].to_numpy(dtype=float),
        a.loc[common, den].to_numpy(dtype=float),
        b.loc[common, num].to_numpy(dtype=float),
        b.loc[common, den].to_numpy(dtype=float),
        a.loc[common, "x"].to_numpy(dtype=float),
        len(va.union(vb)) - len(common),
        va.difference(vb),
        vb.difference(va),
    )


MISSING_MIN_UNITS = 5
"""Fewest units missing from one run of a pair for the missing-pattern check to speak."""


def _missing_pattern(
    q: Quantity, reference: str, label: str, a: pd.DataFrame, b: pd.DataFrame, pair: _Pair, tolerance: float
) -> list[Note]:
    """Units one run lacks, judged by the other run's values there: when the other run's ratio over
    the missing units differs from its ratio over the paired units by more than the margin, the
    units are missing in a pattern tied to the quantity (not at random), and the paired comparison
    may be biased. Figures in the note."""
    notes = []
    for present, table, absent, other, missing, common_num, common_den in (
        (reference, a, label, b, pair.only_a, pair.num_a, pair.den_a),
        (label, b, reference, a, pair.only_b, pair.num_b, pair.den_b),
    ):
        span = other["x"].to_numpy()[(other[f"{q.name}.logged"] > 0).to_numpy()]
        if span.size:  # gaps inside the other run's range, not a shorter run
            x = table.loc[missing, "x"].to_numpy()
            missing = missing[(x >= span.min()) & (x <= span.max())]
        if len(missing) < MISSING_MIN_UNITS or not common_den.sum():
            continue
        there = float(table.loc[missing, f"{q.name}.num"].sum()) / float(
            table.loc[missing, f"{q.name}.den"].sum()
        )
        paired = float(common_num.sum()) / float(common_den.sum())
        gap = (
            abs(there - paired)
            if q.scale == ABSOLUTE or there <= 0 or paired <= 0
            else abs(np.log(there / paired))
        )
        if not gap > tolerance:
            continue
        fmt = (lambda v: f"{v * 100:.2f}%") if q.percent else (lambda v: f"{v:.4g}")
        notes.append(
            Note(
                q.name,
                label,
                f"{absent} lacks a valid {q.name} at {counted(len(missing), 'unit')} where {present} has one, and there "
                f"{present}'s {q.name} is {fmt(there)} against {fmt(paired)} at the paired units: units are "
                f"missing in a pattern tied to {q.name}, so the paired comparison may be biased",
                warning=True,
            )
        )
    return notes


def _scale(
    q: Quantity, ref: Estimate, run: Estimate, reference: str, label: str
) -> tuple[str, float, list[Note]]:
    """(scale, margin, notes): an ``auto`` quantity is relative only when clearly away from zero."""
    if q.scale != qs.AUTO:
        return q.scale, q.margin, []
    floor = q.relative_floor()
    clear = (
        ref.has_interval
        and run.has_interval
        and ((ref.low > 0 and run.low > 0) or (ref.high < 0 and run.high < 0))
        and min(abs(ref.value), abs(run.value)) >= floor
    )
    if clear:
        return LOG_RATIO, q.margin, []
    text = (
        f"{label} vs {reference}: {q.name} compared on the absolute scale (±{q.abs_margin:g}) instead of "
        f"±{q.margin * 100:g}%: relative margins apply only when both runs' {q.name} is clearly away from zero "
        f"(both intervals on one side of 0 and |{q.name}| >= {floor:g}); here {ref.value:.4g} and {run.value:.4g}"
    )
    return ABSOLUTE, q.abs_margin, [Note(q.name, label, text, warning=True)]


def _no_result_reason(
    q: Quantity, reference: str, label: str, a: pd.DataFrame, b: pd.DataFrame, pair: _Pair, est: Estimate
) -> str:
    """Why a pair has no verdict: the real reason, most basic first."""
    for run, table in ((reference, a), (label, b)):
        if not (table[f"{q.name}.logged"] > 0).any():
            return f"{run} logs no {q.numerator} in the window"
    if pair.x.size == 0:
        return "no unit where both runs logged finite values"
    if q.denominator is not None:
        for run, den in ((reference, pair.den_a), (label, pair.den_b)):
            if float(den.sum()) == 0:
                return f"{run} logged 0 {q.denominator} at all {den.size} paired units: {q.name} is undefined"
    if not np.isfinite(est.value):
        return f"{q.name} is not positive in both runs, so it has no log-ratio"
    return est.insufficiency() or "no interval"


def _verdict_reason(est: Estimate, verdict: str) -> str:
    if verdict == EQUIVALENT:
        return "the whole interval lies within the margin, and so does every segment's"
    if verdict == DIFFERENT:
        return "the whole interval lies outside the margin"
    if est.low > 0 or est.high < 0:
        return "a difference is detected (the interval excludes 0) but it may be within the margin"
    return "the interval is wider than the margin"


def _span(segment: DifferenceSegment, align: str) -> str:
    what = {"step": "steps", "tokens": "tokens seen", "time": "seconds"}[align]
    return f"{what} {segment.start:g}-{segment.end:g}"


def _segments(pair: _Pair, found: Sequence[st.Segment]) -> list[DifferenceSegment]:
    """The stats' segments (unit ranges of the paired units) with their x ranges."""
    return [
        DifferenceSegment(
            float(pair.x[s.start]),
            float(pair.x[s.stop - 1]),
            int(s.start),
            int(s.stop),
            s.estimate,
            s.verdict,
            bool(s.episode),
        )
        for s in found
        if s.stop > s.start
    ]


def _per_unit(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return num / den


def _lead(q: Quantity, pair: _Pair) -> Lead | None:
    if not q.lead_lag or pair.x.size < 2:
        return None
    a, b = _per_unit(pair.num_a, pair.den_a), _per_unit(pair.num_b, pair.den_b)
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return None
    found = st.lead_lag(a, b)
    if found is None:
        return None
    spacing = float(np.median(np.diff(pair.x))) if pair.x.size > 1 else 1.0
    return Lead(int(found.lag), float(found.lag) * spacing, float(found.gain), bool(found.explained))


@dataclass(frozen=True)
class _Judged:
    verdict: str
    reason: str
    average: str
    segments: tuple[DifferenceSegment, ...]
    differing: tuple[DifferenceSegment, ...]
    influential: tuple[float, ...]


HINGE_SAFETY = 3.0
"""Safety factor of the screen that skips the exact leave-one-out check (``_could_hinge``)."""


def _hinges(drop: np.ndarray, n: int, gamma0: float, est: Estimate, distance: float) -> bool:
    k = drop.size
    if k == 0 or k > n // 10:
        return False
    spread = float(np.sum(drop * drop)) / (n * gamma0)
    effect = float(drop.sum()) / (n - k) + (est.high - est.low) / 2.0 * spread
    return HINGE_SAFETY * effect >= distance or est.ess * (1 - HINGE_SAFETY * spread) < MIN_ESS


def _could_hinge(pair: _Pair, est: Estimate, scale: str, tolerance: float) -> bool:
    """Whether leaving out one unit (or all robust outliers together) could change the whole-window
    verdict, by a first-order bound: the shift of the value, ``sum |z_i - mean| / (n - k)``, plus
    the change of the half-width, ``half * sum (z_i - mean)^2 / (n gamma0)``, times
    ``HINGE_SAFETY``, against the distance of the interval's bounds from ``±tolerance``; or the
    unit or ESS gates being near. Only when it could is the exact check
    (``stats.influential_units``, which refits the long-run variance per candidate unit) run."""
    n = pair.x.size
    if not est.has_interval or n - 1 < MIN_UNITS * 1.1 or not est.ess >= MIN_ESS * 1.5:
        return True
    _, z = difference_series(*pair.arrays, scale)
    if not np.all(np.isfinite(z)):
        return False
    dev = np.abs(z - z.mean())
    gamma0 = float(np.mean(dev * dev))
    if not gamma0 > 0:
        return False
    from_median = np.abs(z - np.median(z))  # the robust score of ``stats.influential_units``
    mad = 1.4826 * float(np.median(from_median))
    robust = from_median / mad if mad > 0 else np.where(from_median > 0, np.inf, 0.0)
    distance = min(abs(b - t) for b in (est.low, est.high) for t in (-tolerance, tolerance))
    return any(
        _hinges(drop, n, gamma0, est, distance) for drop in (np.array([dev.max()]), dev[robust > ROBUST_Z])
    )


def _judge(
    pair: _Pair, est: Estimate, scale: str, tolerance: float, confidence: float, align: str, influence: bool
) -> _Judged:
    """The verdict throughout the window, its reason, the segments and the deciding steps (for a
    quantity with a verdict, ``influence``; a diagnostic one gets its whole-window verdict only)."""
    average = equivalence_verdict(est, tolerance)
    if average == INSUFFICIENT:
        return _Judged(INSUFFICIENT, "", average, (), (), ())
    if not influence:  # a diagnostic quantity (no verdict of its own): the whole window only
        return _Judged(average, _verdict_reason(est, average).split(", and so")[0], average, (), (), ())
    found = st.segment_differences(*pair.arrays, scale=scale, confidence=confidence, tolerance=tolerance)
    segments = _segments(pair, found)
    throughout = st.throughout_verdict(est, found, tolerance)
    ranges = set(throughout.differing)
    differing = tuple(s for s in segments if (s.start_unit, s.stop_unit) in ranges)
    reason = _verdict_reason(est, average)
    if differing and average != DIFFERENT:  # the segments decide: name their steps
        spans = ", ".join(f"{_span(s, align)} ({s.verdict})" for s in differing)
        whole = (
            "the whole-window interval lies within the margin, but" if average == EQUIVALENT else f"{reason};"
        )
        reason = f"{whole} not throughout the window: {spans}"
    units: list[int] = []
    if influence and _could_hinge(pair, est, scale, tolerance):
        units = st.influential_units(*pair.arrays, scale=scale, confidence=confidence, tolerance=tolerance)
    influential = tuple(float(pair.x[i]) for i in units)
    return _Judged(throughout.verdict, reason, average, tuple(segments), differing, influential)


def _pair_notes(q: Quantity, reference: str, label: str, d: Difference, align: str) -> list[Note]:
    notes = []
    if d.influential:
        where = ", ".join(f"{x:g}" for x in d.influential)
        unit = "step" if align == "step" else "the unit at x ="
        notes.append(
            Note(
                q.name,
                label,
                f"{label} vs {reference}: the whole-window {q.name} verdict ({d.average_verdict}) rests on single "
                f"units: leaving out {unit} {where} (any one of them, or the outliers among them together) "
                f"changes it; look at those steps",
                warning=True,
            )
        )
    if d.verdict == EQUIVALENT and not d.estimate.memory_tested:
        notes.append(
            Note(
                q.name,
                label,
                f"{label} vs {reference}: {q.name} is equivalent over {d.estimate.n_units} paired units, short of "
                f"the about 470 the long-memory test needs (more with a trend or strong persistence): the "
                f"interval assumes short memory (docs/STATISTICS.md, long memory)",
            )
        )
    if d.lead is not None and d.lead.explained:
        behind, ahead = (label, reference) if d.lead.lag > 0 else (reference, label)
        what = {"step": "steps", "tokens": "tokens seen", "time": "seconds"}[align]
        notes.append(
            Note(
                q.name,
                label,
                f"{label} vs {reference}: {behind}'s {q.name} curve lags {ahead}'s by {abs(d.lead.shift):g} {what} "
                f"({abs(d.lead.lag)} units; shifting it removes {d.lead.gain * 100:.0f}% of the squared difference "
                f"of the smoothed curves): the difference is mostly a shift in time, not a level",
                warning=True,
            )
        )
    return notes


def _paired_estimate(
    q: Quantity, num: np.ndarray, den: np.ndarray, full: RunEstimate, confidence: float
) -> Estimate:
    """A run's estimate over the paired units: its full-window estimate when those are all its units."""
    if full.units == num.size:
        return full.estimate
    return st.ratio_estimate(num, den, confidence=confidence, bounds=q.bounds)


def _difference(
    q: Quantity,
    reference: str,
    label: str,
    a: pd.DataFrame,
    b: pd.DataFrame,
    confidence: float,
    align: str,
    full: tuple[RunEstimate, RunEstimate],
) -> tuple[Difference, _Pair, list[Note]]:
    pair = _pair(q, a, b)
    ref_paired = _paired_estimate(q, pair.num_a, pair.den_a, full[0], confidence)
    run_paired = _paired_estimate(q, pair.num_b, pair.den_b, full[1], confidence)
    scale, margin, notes = _scale(q, ref_paired, run_paired, reference, label)
    tolerance = qs.log_margin(margin) if scale == LOG_RATIO else margin
    est = paired_difference(*pair.arrays, scale=scale, confidence=confidence)
    judged = _judge(pair, est, scale, tolerance, confidence, align, influence=q.verdict)
    reason = judged.reason or _no_result_reason(q, reference, label, a, b, pair, est)
    step_weighted = None
    if q.denominator is not None and q.verdict and pair.x.size:
        ra, rb = _per_unit(pair.num_a, pair.den_a), _per_unit(pair.num_b, pair.den_b)
        ones = np.ones(pair.x.size)
        step_weighted = paired_difference(ra, ones, rb, ones, scale=scale, confidence=confidence)
    d = Difference(
        metric=q.name,
        reference=reference,
        run=label,
        estimate=est,
        reference_paired=ref_paired,
        run_paired=run_paired,
        tolerance=tolerance,
        margin=margin,
        scale=scale,
        verdict=judged.verdict,
        reason=reason,
        counts_for_verdict=q.verdict,
        average_verdict=judged.average,
        segments=judged.segments,
        differing=judged.differing,
        step_weighted=step_weighted,
        influential=judged.influential,
        lead=_lead(q, pair) if q.verdict else None,
    )
    notes += _pair_notes(q, reference, label, d, align)
    notes += _missing_pattern(q, reference, label, a, b, pair, tolerance)
    notes += _weighting_note(q, f"{label} - {reference}", est, step_weighted, tolerance)
    return d, pair, notes


def _pairing_notes(reference: str, only: dict[str, dict[int, list[str]]]) -> list[Note]:
    """One note per compared run and count of units logged validly by only one run of the pair."""
    notes = []
    for label, counts in only.items():
        for count, names in counts.items():
            notes.append(
                Note(
                    names[0],
                    label,
                    f"{label} vs {reference}: {count} units with a valid {', '.join(names)} in only one run are "
                    f"left out of the paired comparison; per-run values are shown over the paired units, the "
                    f"full-window value beside them",
                )
            )
    return notes


# ------------------------------------------------------------------------------- groups


def _group_scale(q: Quantity, estimates: list[Estimate]) -> tuple[str, float]:
    if q.scale != qs.AUTO:
        return q.scale, q.margin
    values = np.array([e.value for e in estimates])
    lows = np.array([e.low for e in estimates])
    highs = np.array([e.high for e in estimates])
    clear = (
        bool(np.all(lows > 0) or np.all(highs < 0)) and float(np.min(np.abs(values))) >= q.relative_floor()
    )
    return (LOG_RATIO, q.margin) if clear else (ABSOLUTE, q.abs_margin)


def _group_verdict(estimate: GroupEstimate, tolerance: float) -> tuple[str, str]:
    if not estimate.has_interval:
        return INSUFFICIENT, estimate.reason or "no interval"
    verdict = interval_verdict(estimate.low, estimate.high, tolerance)
    reason = _verdict_reason(Estimate(estimate.value, estimate.low, estimate.high, 0, 0, 0, 0, 0), verdict)
    return verdict, reason.replace(
        ", and so does every segment's", " (the window average over seeds; groups get no per-segment test)"
    )


def _seeds(
    q: Quantity, members: Sequence[str], units: dict[str, pd.DataFrame]
) -> list[tuple[np.ndarray, np.ndarray]]:
    return [_valid(units[label], q)[:2] for label in members]


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


def _seeds_needed(
    est: GroupEstimate, within: Sequence[Estimate], scale: str, tolerance: float, confidence: float
) -> int | None:
    """Seeds per group for this margin at the measured spread (None when it cannot be said)."""
    ses = [
        float(np.sqrt(e.lrv / e.n_units)) / (abs(e.value) if scale == LOG_RATIO else 1.0)
        for e in within
        if np.isfinite(e.lrv) and e.n_units > 0 and e.value != 0
    ]
    sds = [x for x in (est.between_sd_a, est.between_sd_b) if np.isfinite(x)]
    if not ses or not sds:
        return None
    between = float(np.sqrt(np.mean(np.square(sds))))
    if scale == LOG_RATIO:
        means = [abs(e.value) for e in within if np.isfinite(e.value) and e.value != 0]
        between /= float(np.mean(means)) if means else 1.0
    try:
        return int(st.seeds_needed(between, float(np.mean(ses)), tolerance, confidence=confidence))
    except ValueError:
        return None


def _group_differences(
    quantities: list[Quantity],
    groups: dict[str, list[str]],
    units: dict[str, pd.DataFrame],
    estimates: list[RunEstimate],
    confidence: float,
) -> list[GroupDifference]:
    by = {(e.metric, e.run): e for e in estimates}
    names = list(groups)
    out = []
    for q in quantities:
        scale, margin = _group_scale(q, [by[q.name, r].estimate for g in names for r in groups[g]])
        tolerance = qs.log_margin(margin) if scale == LOG_RATIO else margin
        for g in names[1:]:
            members = groups[names[0]] + groups[g]
            est = _group_estimate(
                _seeds(q, groups[names[0]], units), _seeds(q, groups[g], units), scale, confidence
            )
            verdict, reason = _group_verdict(est, tolerance)
            within = [by[q.name, r].estimate for r in members]
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
                    reason=reason,
                    counts_for_verdict=q.verdict,
                    seeds_needed=_seeds_needed(est, within, scale, tolerance, confidence),
                    approximate=any(by[q.name, r].approximate for r in members),
                )
            )
    return out


# ------------------------------------------------------------------------------- approximate runs


def _approximate_quantities(
    runset: RunSet,
    labels: Sequence[str],
    quantities: Sequence[Quantity],
    units: dict[str, pd.DataFrame],
    align: str,
    window: Window,
) -> tuple[dict[str, pd.DataFrame], dict[tuple[str, str], str]]:
    """Unit tables with, for runs whose tracker logged a quantity only as a mean of per-sample or
    per-micro-batch means (``LoadedRun.approximate``, ``keys.ALIASES``), that logged value in place
    of the missing counts (a mean over steps); and (quantity, run) -> why it is approximate."""
    found: dict[tuple[str, str], str] = {}
    tables = dict(units)
    for q in quantities:
        if q.approximate_key is None:
            continue
        for label in labels:
            table = tables[label]
            if (
                q.approximate_key not in runset.info(label).approximate
                or (table[f"{q.name}.logged"] > 0).any()
            ):
                continue  # exact counts were logged: the ratio of sums is used
            fallback = q.using(qs.Estimand(q.approximate_key))
            alt = unit_table(runset, [label], [fallback], by=align, window=window)[label]
            table = table.copy()
            for column in (f"{q.name}.num", f"{q.name}.den", f"{q.name}.bad", f"{q.name}.logged"):
                table[column] = alt[column].reindex(table.index)
            tables[label] = table
            found[q.name, label] = (
                f"{label}: {q.name} is approximate: its tracker logged {q.approximate_key} only as a mean "
                "of per-sample or per-micro-batch means (no token counts), so this is the mean of that value "
                "over steps, not a ratio of token sums"
            )
    return tables, found


# ------------------------------------------------------------------------------- compare


def _differences(
    quantities: Sequence[Quantity],
    labels: Sequence[str],
    units: dict[str, pd.DataFrame],
    approximate: Mapping[tuple[str, str], str],
    confidence: float,
    align: str,
    estimates: Sequence[RunEstimate],
) -> tuple[list[Difference], list[Note]]:
    """Every run against the reference, quantity by quantity, with the notes of each pair."""
    reference = labels[0]
    by = {(e.metric, e.run): e for e in estimates}
    differences, notes = [], []
    only: dict[str, dict[int, list[str]]] = {}
    for q in quantities:
        for label in labels[1:]:
            full = (by[q.name, reference], by[q.name, label])
            d, pair, pair_notes = _difference(
                q, reference, label, units[reference], units[label], confidence, align, full
            )
            approx = (q.name, reference) in approximate or (q.name, label) in approximate
            differences.append(replace(d, approximate=approx))
            notes += pair_notes
            if pair.only and pair.x.size:
                only.setdefault(label, {}).setdefault(pair.only, []).append(q.name)
    return differences, notes + _pairing_notes(reference, only)


def _check_settings(align: str, confidence: float) -> None:
    if align not in ALIGNMENTS:
        raise ValueError(f"alignment {align!r} is not one of {sorted(ALIGNMENTS)}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")


def _on_policy(quantities: Sequence[Quantity], estimates: Sequence[RunEstimate]) -> list[str]:
    """The on-policy quantities to judge: required ones always, optional ones when every run logs them."""
    logged = {(e.metric, e.run) for e in estimates if e.units > 0}
    runs = {e.run for e in estimates}
    return [
        q.name
        for q in quantities
        if q.on_policy and (not q.optional or all((q.name, r) in logged for r in runs))
    ]


def _seed_note(groups: dict[str, list[str]]) -> Note:
    if groups:
        sizes = ", ".join(f"{g}: {len(m)} seeds" for g, m in groups.items())
        return Note(
            "", "", f"stacks compared over seeds ({sizes}): intervals include the between-seed variation"
        )
    return Note(
        "",
        "",
        "one run per stack: seed-to-seed variation is not covered, so a difference may be the seeds', not the "
        "stacks' (compare groups of 2+ seeds per stack with --group)",
    )


def compare(
    runset: RunSet,
    runs: Sequence[str] | None = None,
    *,
    groups: Mapping[str, Sequence[str]] | None = None,
    align: str = "step",
    window: Window | None = None,
    tolerances: Mapping[str, float] | None = None,
    reward_abs_tolerance: float | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
) -> ComparisonResult:
    """Compare two or more runs of ``runset`` (default: all, in load order; the first is the
    reference), or two or more ``groups`` of runs (name -> runs, 2+ seeds each; the first group is
    the reference stack).

    ``tolerances`` maps quantity names (``quantities.QUANTITIES``: ``clip_fraction``, ``reward``,
    ``throughput``, ...) to margins: absolute for clip fractions, relative (0.05 = ±5 %, on the
    log-ratio scale) for reward and throughput. ``reward_abs_tolerance`` (reward units, default
    0.02) is the reward margin used when the rewards are near zero.
    """
    labels, named = _labels(runset, runs, groups)
    _check_settings(align, confidence)
    window = window or Window()
    quantities = _choose_quantities(runset, labels, tolerances or {}, reward_abs_tolerance)
    units = unit_table(runset, labels, quantities, by=align, window=window)
    units, approximate = _approximate_quantities(runset, labels, quantities, units, align, window)
    backends = {label: runset.info(label).run.backend_label or "" for label in labels}
    group_of = {label: g for g, members in named.items() for label in members}
    notes = [Note(q, label, text, warning=True) for (q, label), text in approximate.items()]
    notes += _data_notes(runset, labels, quantities)
    axis_note = check_token_axis(runset, labels) if align == "tokens" else ""
    notes += [Note("", "", axis_note, warning=True)] if axis_note else []
    estimates = []
    for q in quantities:
        for label in labels:
            e = _estimate_run(q, label, backends[label], units[label], confidence, group_of.get(label, ""))
            estimates.append(replace(e, approximate=(q.name, label) in approximate))
            notes += _run_notes(q, label, units[label], align)
            notes += _weighting_note(
                q,
                label,
                e.estimate,
                e.step_weighted,
                q.margin if q.scale == ABSOLUTE else qs.log_margin(q.margin),
            )
    differences: list[Difference] = []
    if not named:
        differences, pair_notes = _differences(
            quantities, labels, units, approximate, confidence, align, estimates
        )
        notes += pair_notes
    notes.append(_seed_note(named))
    return ComparisonResult(
        runs=labels,
        backends=backends,
        align=align,
        window=window,
        confidence=confidence,
        method=METHOD,
        quantities=quantities,
        estimates=estimates,
        differences=differences,
        notes=notes,
        on_policy=_on_policy(quantities, estimates),
        groups=named,
        group_differences=_group_differences(quantities, named, units, estimates, confidence)
        if named
        else [],
    )
