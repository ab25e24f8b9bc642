"""Per pair (every run against the reference, quantity by quantity): the units both runs logged
validly, each run's estimate over exactly those units, the paired difference with its interval
(``stats.paired_difference``) on the quantity's scale, its verdict throughout the window
(``verdicts.judge``), a lag between the two curves (``stats.lead_lag``), and the reasons to note
about the pair (a scale switched, units missing in a pattern, deciding units, short memory, a lag).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from cliptrack.compare import quantities as qs
from cliptrack.compare import reasons as r
from cliptrack.compare import stats as st
from cliptrack.compare.columns import Columns, X
from cliptrack.compare.estimates import flags, token_counts_vary, valid, weighting_gap
from cliptrack.compare.findings import Difference, Lead, Note, RunEstimate
from cliptrack.compare.notes import note, sentence
from cliptrack.compare.quantities import Quantity
from cliptrack.compare.stats import ABSOLUTE, EQUIVALENT, LOG_RATIO, Estimate, paired_difference
from cliptrack.compare.verdicts import PairedUnits, judge


@dataclass(frozen=True)
class _Pair:
    """The paired units of two runs and the units only one of them logged validly: ``only`` counts
    them, ``only_a`` / ``only_b`` are the reference's and the other run's (unit indices)."""

    units: PairedUnits
    only: int
    only_a: pd.Index
    only_b: pd.Index


def _pair(q: Quantity, a: pd.DataFrame, b: pd.DataFrame) -> _Pair:
    _, _, va = valid(a, q)
    _, _, vb = valid(b, q)
    common = va.intersection(vb)
    columns = Columns.of(q.name)
    units = PairedUnits(
        a.loc[common, columns.num].to_numpy(dtype=float),
        a.loc[common, columns.den].to_numpy(dtype=float),
        b.loc[common, columns.num].to_numpy(dtype=float),
        b.loc[common, columns.den].to_numpy(dtype=float),
        a.loc[common, X].to_numpy(dtype=float),
    )
    return _Pair(units, len(va.union(vb)) - len(common), va.difference(vb), vb.difference(va))


MISSING_MIN_UNITS = 5
"""Fewest units missing from one run of a pair for the missing-pattern check to speak."""


def _within_span(q: Quantity, table: pd.DataFrame, other: pd.DataFrame, missing: pd.Index) -> pd.Index:
    """The units of ``missing`` inside the other run's logged range (gaps, not a shorter run)."""
    span = other[X].to_numpy()[flags(other, Columns.of(q.name).logged)]
    if not span.size:
        return missing
    x = table.loc[missing, X].to_numpy()
    return missing[(x >= span.min()) & (x <= span.max())]


def _gap(scale: str, there: float, paired: float) -> float:
    """How far apart two values are on ``scale`` (absolute, or |log ratio| when both > 0)."""
    if scale == ABSOLUTE or there <= 0 or paired <= 0:
        return abs(there - paired)
    return float(abs(np.log(there / paired)))


def _missing_pattern(
    q: Quantity,
    reference: str,
    label: str,
    a: pd.DataFrame,
    b: pd.DataFrame,
    pair: _Pair,
    scale: str,
    tolerance: float,
) -> list[Note]:
    """Units one run lacks, judged by the other run's values there: when the other run's ratio over
    the missing units differs from its ratio over the paired units by more than the margin, the
    units are missing in a pattern tied to the quantity (not at random), and the paired comparison
    may be biased. Figures in the note."""
    columns = Columns.of(q.name)
    u = pair.units
    notes = []
    for present, table, absent, other, missing, common_num, common_den in (
        (reference, a, label, b, pair.only_a, u.num_a, u.den_a),
        (label, b, reference, a, pair.only_b, u.num_b, u.den_b),
    ):
        missing = _within_span(q, table, other, missing)
        if len(missing) < MISSING_MIN_UNITS or not common_den.sum():
            continue
        there = float(table.loc[missing, columns.num].sum()) / float(table.loc[missing, columns.den].sum())
        paired = float(common_num.sum()) / float(common_den.sum())
        if not _gap(scale, there, paired) > tolerance:
            continue
        reason = r.MissingPattern(absent, present, q.name, len(missing), there, paired, q.percent)
        notes.append(note(q.name, label, reason))
    return notes


def _clearly_away_from_zero(q: Quantity, ref: Estimate, run: Estimate) -> bool:
    """Both intervals on one side of 0 and both values at least the quantity's relative floor."""
    same_side = (ref.low > 0 and run.low > 0) or (ref.high < 0 and run.high < 0)
    return (
        ref.has_interval
        and run.has_interval
        and same_side
        and min(abs(ref.value), abs(run.value)) >= q.relative_floor()
    )


def _scale(
    q: Quantity, ref: Estimate, run: Estimate, reference: str, label: str
) -> tuple[str, float, list[Note]]:
    """(scale, margin, notes): an ``auto`` quantity is relative only when clearly away from zero."""
    if q.scale != qs.AUTO:
        return q.scale, q.margin, []
    if _clearly_away_from_zero(q, ref, run):
        return LOG_RATIO, q.margin, []
    reason = r.AbsoluteScale(
        label, reference, q.name, q.abs_margin, q.margin, q.relative_floor(), ref.value, run.value, q.percent
    )
    return ABSOLUTE, q.abs_margin, [note(q.name, label, reason)]


def _no_result_reason(
    q: Quantity, reference: str, label: str, a: pd.DataFrame, b: pd.DataFrame, pair: _Pair, est: Estimate
) -> r.VerdictReason:
    """Why a pair has no verdict: the real reason, most basic first."""
    logged = Columns.of(q.name).logged
    for run, table in ((reference, a), (label, b)):
        if not flags(table, logged).any():
            return r.NothingLogged(run, q.numerator)
    u = pair.units
    if u.x.size == 0:
        return r.NoCommonUnits()
    if q.denominator is not None:
        for run, den in ((reference, u.den_a), (label, u.den_b)):
            if float(den.sum()) == 0:
                return r.ZeroDenominator(run, q.denominator, den.size, q.name)
    if not np.isfinite(est.value):
        return r.NoLogRatio(q.name)
    return r.TooLittleData(est.insufficiency())


def _per_unit(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return num / den


def _lead(q: Quantity, u: PairedUnits) -> Lead | None:
    if not q.lead_lag or u.x.size < 2:
        return None
    a, b = _per_unit(u.num_a, u.den_a), _per_unit(u.num_b, u.den_b)
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return None
    found = st.lead_lag(a, b)
    if found is None:
        return None
    spacing = float(np.median(np.diff(u.x))) if u.x.size > 1 else 1.0
    return Lead(int(found.lag), float(found.lag) * spacing, float(found.gain), bool(found.explained))


def _paired_estimate(
    q: Quantity, num: np.ndarray, den: np.ndarray, full: RunEstimate, confidence: float
) -> Estimate:
    """A run's estimate over the paired units: its full-window estimate when those are all its units."""
    if full.units == num.size:
        return full.estimate
    return st.ratio_estimate(num, den, confidence=confidence, bounds=q.bounds)


def _step_weighted(q: Quantity, u: PairedUnits, scale: str, confidence: float) -> Estimate | None:
    """The paired difference of the per-unit ratios (every unit counts once), for a verdict quantity."""
    if q.denominator is None or not q.verdict or not u.x.size:
        return None
    ones = np.ones(u.x.size)
    ra, rb = _per_unit(u.num_a, u.den_a), _per_unit(u.num_b, u.den_b)
    return paired_difference(ra, ones, rb, ones, scale=scale, confidence=confidence)


def _pair_notes(q: Quantity, reference: str, label: str, d: Difference, align: str) -> list[Note]:
    """Deciding units, stretches beyond the margin (named, not a verdict), an equivalence short of the long-memory test, a lag that explains the difference."""
    found: list[r.NoteReason] = []
    if d.influential:
        found.append(
            r.Influential(label, reference, q.name, d.average_verdict, d.influential, align == "step")
        )
    if d.differing:
        spans = tuple(r.Span(align, s.start, s.end, s.verdict) for s in d.differing)
        sizes = tuple(s.estimate.value for s in d.differing)
        found.append(r.Stretches(label, reference, q.name, spans, sizes, d.scale, q.percent))
    if d.verdict == EQUIVALENT and not d.estimate.memory_tested:
        found.append(r.ShortMemory(label, reference, q.name, d.estimate.n_units))
    if d.lead is not None and d.lead.explained:
        behind, ahead = (label, reference) if d.lead.lag > 0 else (reference, label)
        found.append(
            r.Lagging(label, reference, behind, ahead, q.name, d.lead.shift, align, d.lead.lag, d.lead.gain)
        )
    return [note(q.name, label, reason) for reason in found]


@dataclass(frozen=True)
class PairInputs:
    """One pair to compare: the reference's and the other run's labels, unit tables and full-window
    estimates of the quantity."""

    reference: str
    label: str
    a: pd.DataFrame
    b: pd.DataFrame
    full_a: RunEstimate
    full_b: RunEstimate


def difference(
    q: Quantity, p: PairInputs, confidence: float, align: str
) -> tuple[Difference, _Pair, list[Note]]:
    """The pair's difference on ``q`` with its verdict and reason, the pairing, and the pair's notes."""
    pair = _pair(q, p.a, p.b)
    u = pair.units
    ref_paired = _paired_estimate(q, u.num_a, u.den_a, p.full_a, confidence)
    run_paired = _paired_estimate(q, u.num_b, u.den_b, p.full_b, confidence)
    scale, margin, notes = _scale(q, ref_paired, run_paired, p.reference, p.label)
    tolerance = qs.log_margin(margin) if scale == LOG_RATIO else margin
    est = paired_difference(*u.arrays, scale=scale, confidence=confidence)
    judged = judge(u, est, scale, tolerance, confidence, align, influence=q.verdict)
    why = judged.why or _no_result_reason(q, p.reference, p.label, p.a, p.b, pair, est)
    step_weighted = _step_weighted(q, u, scale, confidence)
    d = Difference(
        metric=q.name,
        reference=p.reference,
        run=p.label,
        estimate=est,
        reference_paired=ref_paired,
        run_paired=run_paired,
        tolerance=tolerance,
        margin=margin,
        scale=scale,
        verdict=judged.verdict,
        reason=sentence(why),
        counts_for_verdict=q.verdict,
        average_verdict=judged.average,
        segments=judged.segments,
        differing=judged.differing,
        step_weighted=step_weighted,
        influential=judged.influential,
        lead=_lead(q, u) if q.verdict else None,
        why=why,
    )
    notes += _pair_notes(q, p.reference, p.label, d, align)
    notes += _missing_pattern(q, p.reference, p.label, p.a, p.b, pair, scale, tolerance)
    if token_counts_vary(q, u.den_a, u.den_b):
        notes += weighting_gap(q, f"{p.label} - {p.reference}", est, step_weighted, scale, tolerance)
    return d, pair, notes


def _pairing_notes(reference: str, only: dict[str, dict[int, list[str]]]) -> list[Note]:
    """One note per compared run and count of units logged validly by only one run of the pair."""
    return [
        note(names[0], label, r.PairedOnly(label, reference, count, tuple(names)))
        for label, counts in only.items()
        for count, names in counts.items()
    ]


def differences(
    quantities: Sequence[Quantity],
    labels: Sequence[str],
    units: dict[str, pd.DataFrame],
    approximate: Mapping[tuple[str, str], object],
    confidence: float,
    align: str,
    estimates: Sequence[RunEstimate],
) -> tuple[list[Difference], list[Note]]:
    """Every run against the reference, quantity by quantity, with the notes of each pair."""
    reference = labels[0]
    by = {(e.metric, e.run): e for e in estimates}
    found, notes = [], []
    only: dict[str, dict[int, list[str]]] = {}
    for q in quantities:
        for label in labels[1:]:
            p = PairInputs(
                reference, label, units[reference], units[label], by[q.name, reference], by[q.name, label]
            )
            d, pair, pair_notes = difference(q, p, confidence, align)
            approx = (q.name, reference) in approximate or (q.name, label) in approximate
            found.append(replace(d, approximate=approx))
            notes += pair_notes
            if pair.only and pair.units.x.size:
                only.setdefault(label, {}).setdefault(pair.only, []).append(q.name)
    return found, notes + _pairing_notes(reference, only)
