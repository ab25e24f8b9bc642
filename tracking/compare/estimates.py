"""Per run: each quantity's estimate over the units of the window it logged validly, and the
reasons to note about a run's data (units left out, values logged twice, refused counts, a
tracker that logged only a mean of means).

A run's estimate is the ratio of sums over its valid units, with its interval kept within the
quantity's bounds (``stats.ratio_estimate``), the step-weighted estimate beside it and, for token
fractions, the Wilson interval on token counts for reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from cliptrack.compare import quantities as qs
from cliptrack.compare import reasons as r
from cliptrack.compare import stats as st
from cliptrack.compare.align import unit_table
from cliptrack.compare.columns import Columns, X
from cliptrack.compare.findings import Note, RunEstimate
from cliptrack.compare.notes import note
from cliptrack.compare.quantities import Quantity
from cliptrack.compare.stats import ABSOLUTE, LOG_RATIO, Estimate, wilson_interval
from cliptrack.compare.window import Window
from cliptrack.core import keys
from cliptrack.store.frame import RunSet, count_problems


def valid(table: pd.DataFrame, q: Quantity) -> tuple[np.ndarray, np.ndarray, pd.Index]:
    """``(num, den, units)``: a run's sums at the units where both were logged validly."""
    columns = Columns.of(q.name)
    num, den = table[columns.num], table[columns.den]
    ok = (num.notna() & den.notna()).to_numpy()
    return num.to_numpy()[ok], den.to_numpy()[ok], table.index[ok]


def flags(table: pd.DataFrame, column: str) -> np.ndarray:
    """Units where the per-step flag ``column`` of a unit table is set (bool per unit)."""
    return table[column].to_numpy() > 0


def _step_weighted(q: Quantity, num: np.ndarray, den: np.ndarray, confidence: float) -> Estimate | None:
    if q.denominator is None or not q.verdict:
        return None  # one per step: token- and step-weighted are the same number; or a diagnostic split
    return st.step_weighted_estimate(num, den, confidence=confidence, bounds=q.bounds)


def estimate_run(
    q: Quantity, label: str, backend: str, table: pd.DataFrame, confidence: float, group: str
) -> RunEstimate:
    """One run's estimate of ``q`` over the units of ``table`` it logged validly."""
    columns = Columns.of(q.name)
    nv, dv, _ = valid(table, q)
    est = st.ratio_estimate(nv, dv, confidence=confidence, bounds=q.bounds)
    w_low, w_high = float("nan"), float("nan")
    if q.estimand.counts:
        w_low, w_high = wilson_interval(float(nv.sum()), float(dv.sum()), confidence)
    bad, logged = flags(table, columns.bad), flags(table, columns.logged)
    invalid = int(flags(table, columns.invalid).sum()) if columns.invalid in table else 0
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
        first_nonfinite=float(table[X].to_numpy()[bad][0]) if bad.any() else None,
        wilson_low=w_low,
        wilson_high=w_high,
        step_weighted=_step_weighted(q, nv, dv, confidence),
        invalid=invalid,
        group=group,
    )


def run_notes(q: Quantity, label: str, table: pd.DataFrame, align: str) -> list[Note]:
    """Units of a run left out of ``q``: none logged, non-finite values, units without its keys."""
    per = "step" if align == "step" else "unit"
    columns = Columns.of(q.name)
    bad, logged = flags(table, columns.bad), flags(table, columns.logged)
    n, estimand = len(table), str(q.estimand)
    if n and not logged.any():
        return [note(q.name, label, r.NotInWindow(label, estimand, q.verdict and not q.optional))]
    notes = []
    if bad.any():
        first = float(table[X].to_numpy()[bad][0])
        to_end = bool(bad[np.argmax(bad) :].all())
        reason = r.NonFinite(label, estimand, q.name, int(bad.sum()), n, per, first, to_end)
        notes.append(note(q.name, label, reason))
    missing = int((~logged).sum())
    if missing and logged.any():
        notes.append(note(q.name, label, r.Unlogged(label, estimand, missing, n, per)))
    return notes


def token_counts_vary(q: Quantity, *dens: np.ndarray) -> bool:
    """Whether ``q`` is weighted by token counts (its denominator is ``loss_tokens:sum``) and those
    counts vary from unit to unit in one of ``dens``: only then can the token-weighted and the
    step-weighted estimates differ."""
    if q.denominator != keys.LOSS_TOKENS:
        return False
    return any(den.size > 1 and float(np.min(den)) != float(np.max(den)) for den in dens)


def weighting_gap(
    q: Quantity, subject: str, token: Estimate, step: Estimate | None, scale: str, tolerance: float
) -> list[Note]:
    """A note when the token-weighted and step-weighted estimates disagree by more than the margin
    (``tolerance`` on ``scale``); callers check first that the token counts vary
    (``token_counts_vary``)."""
    if step is None or not (np.isfinite(token.value) and np.isfinite(step.value)):
        return []
    gap = abs(token.value - step.value)
    if scale != ABSOLUTE:
        if token.value <= 0 or step.value <= 0:
            return []
        gap = abs(np.log(token.value / step.value))
    if gap <= tolerance:
        return []
    return [note(q.name, subject, r.WeightingGap(subject, q.name, token.value, step.value))]


def run_scale(q: Quantity, value: float) -> tuple[str, float]:
    """``(scale, tolerance)`` of one run's value of ``q``: the relative margin (log-ratio scale) unless
    the quantity is absolute, or ``auto`` with ``|value|`` below its relative floor (then the floor)."""
    if q.scale == ABSOLUTE:
        return ABSOLUTE, q.margin
    if q.scale == qs.AUTO and not abs(value) >= q.relative_floor():
        return ABSOLUTE, q.abs_margin
    return LOG_RATIO, qs.log_margin(q.margin)


def run_weighting_note(q: Quantity, e: RunEstimate, table: pd.DataFrame) -> list[Note]:
    """``weighting_gap`` of one run against the quantity's own margin on its scale, where its token
    counts vary."""
    if not token_counts_vary(q, valid(table, q)[1]):
        return []
    scale, tolerance = run_scale(q, e.estimate.value)
    return weighting_gap(q, e.run, e.estimate, e.step_weighted, scale, tolerance)


def _refused_counts(wide: pd.DataFrame, label: str, quantities: Sequence[Quantity]) -> list[Note]:
    """Exact counts refused (negative, fractional, above their total), one note per key and problem."""
    found: dict[tuple[str, str], tuple[np.ndarray, list[str]]] = {}
    for q in quantities:
        if not (q.estimand.counts and q.denominator is not None):
            continue
        for key, problem, mask in count_problems(wide, q.numerator, q.denominator):
            found.setdefault((key, problem), (mask, []))[1].append(q.name)
    notes = []
    for (key, problem), (mask, names) in found.items():
        steps = tuple(int(s) for s in wide.index.to_numpy()[mask])
        notes.append(note(names[0], label, r.RefusedCounts(label, key, problem, steps, tuple(names))))
    return notes


def data_notes(runset: RunSet, labels: Sequence[str], quantities: Sequence[Quantity]) -> list[Note]:
    """Bad data named: keys logged twice at a step with different values (last kept), and exact
    counts refused (negative, fractional, above their total), by run, key and steps."""
    notes = []
    for label in labels:
        for dup in runset.info(label).duplicates:
            notes.append(note("", label, r.LoggedTwice(label, dup.metric, tuple(dup.steps))))
        notes += _refused_counts(runset.wide(label), label, quantities)
    return notes


def _logged_only_as_mean(runset: RunSet, label: str, q: Quantity, table: pd.DataFrame) -> bool:
    """Whether ``label``'s tracker logged ``q`` only as a mean (of means, or a framework's exact
    per-step value: ``LoadedRun.per_step``) and no exact counts."""
    info = runset.info(label)
    return (q.approximate_key in info.approximate or q.approximate_key in info.per_step) and not flags(
        table, Columns.of(q.name).logged
    ).any()


def approximate_quantities(
    runset: RunSet,
    labels: Sequence[str],
    quantities: Sequence[Quantity],
    units: dict[str, pd.DataFrame],
    align: str,
    window: Window,
) -> tuple[dict[str, pd.DataFrame], dict[tuple[str, str], r.Approximate]]:
    """Unit tables with, for runs whose tracker logged a quantity only as a mean of per-sample or
    per-micro-batch means (``LoadedRun.approximate``, ``frameworks.ALIASES``) or as a framework's exact
    per-step value (``LoadedRun.per_step``), that logged value in place of the missing counts (a
    mean over steps); and (quantity, run) -> why it is approximate (mean-of-means runs only)."""
    found: dict[tuple[str, str], r.Approximate] = {}
    tables = dict(units)
    for q in quantities:
        if q.approximate_key is None:
            continue
        for label in labels:
            if not _logged_only_as_mean(runset, label, q, tables[label]):
                continue  # exact counts were logged: the ratio of sums is used
            fallback = q.using(qs.Estimand(q.approximate_key))
            alt = unit_table(runset, [label], [fallback], by=align, window=window)[label]
            table = tables[label].copy()
            for column in Columns.of(q.name).values:
                table[column] = alt[column].reindex(table.index)
            tables[label] = table
            if q.approximate_key in runset.info(label).approximate:  # else exact per step (audit's note)
                found[q.name, label] = r.Approximate(label, q.name, q.approximate_key)
    return tables, found
