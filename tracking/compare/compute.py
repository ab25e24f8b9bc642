"""``compare``: per-run estimates, paired differences against a reference run, and verdicts.

The first run named is the reference; every other run is compared with it, and comparing A with B
mirrors comparing B with A (same verdict, negated difference). For each quantity
(``metrics.MetricSpec``):

- per run, the ratio-of-sums estimate over every unit of the window it logged validly, with its
  interval (``stats.ratio_estimate``) and, for token fractions, the Wilson interval on token counts
  for reference;
- per pair, the units both runs logged validly; each run's estimate over exactly those units and
  the paired difference with its interval (``stats.paired_difference``) and verdict
  (``stats.equivalence_verdict``): ``equivalent``, ``different``, ``inconclusive``, or
  ``insufficient data`` below ``stats.MIN_UNITS`` paired units or ``stats.MIN_ESS`` effective units;
- notes for whatever was left out: units with non-finite values (dropped from that quantity, for
  both runs of a pair), units without the quantity's keys, a reward compared on the absolute scale
  because it is near zero, a quantity no run logged.

Intervals are 90 % by default (``DEFAULT_CONFIDENCE``), which makes "equivalent" a two one-sided
test at the 5 % level. There is no resampling: a comparison repeats exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from tracking import keys
from tracking.compare import metrics as m
from tracking.compare.align import ALIGNMENTS, Window, unit_table
from tracking.compare.frame import RunSet
from tracking.compare.result import ComparisonResult, Difference, Note, RunEstimate
from tracking.compare.stats import (
    ABSOLUTE,
    DIFFERENT,
    EQUIVALENT,
    FIXED_B,
    INSUFFICIENT,
    LOG_RATIO,
    Estimate,
    equivalence_verdict,
    paired_difference,
    ratio_estimate,
    wilson_interval,
)

DEFAULT_CONFIDENCE = 0.90
"""Two-sided confidence of every interval (TOST at 5 %)."""
DEFAULT_TOLERANCES = {spec.name: spec.tolerance for spec in m.DEFAULT_SPECS}
"""Equivalence margins by quantity: clip fractions 0.02 absolute, reward and throughput ±5 %."""
METHOD = (
    f"fixed-b HAC interval (Bartlett kernel, bandwidth {FIXED_B:g} x units, Kiefer-Vogelsang "
    "critical values) on the linearised ratio of sums"
)
"""The interval method, as stated in every rendering."""


def _choose_specs(
    runset: RunSet, labels: Sequence[str], tolerances: Mapping[str, float], reward_abs_tolerance: float | None
) -> list[m.MetricSpec]:
    throughput = m.THROUGHPUT
    if all(
        keys.STEP_TIME in runset.wide(label) and keys.LOSS_TOKENS in runset.wide(label) for label in labels
    ):
        throughput = m.THROUGHPUT_FROM_TIME
    specs = [m.CLIP, m.CLIP_LOW, m.CLIP_HIGH, m.REWARD, throughput]
    unknown = set(tolerances) - {s.name for s in specs}
    if unknown:
        raise ValueError(
            f"tolerance given for unknown quantities {sorted(unknown)}; known: {[s.name for s in specs]}"
        )
    out = []
    for spec in specs:
        if spec.name in tolerances:
            spec = spec.with_tolerance(tolerances[spec.name])
        elif spec in (m.CLIP_LOW, m.CLIP_HIGH) and m.CLIP.name in tolerances:
            spec = spec.with_tolerance(tolerances[m.CLIP.name])
        if spec.scale == m.AUTO and reward_abs_tolerance is not None:
            spec = spec.with_abs_tolerance(reward_abs_tolerance)
        out.append(spec)
    return out


def _where(x: float | None) -> str:
    return "?" if x is None else f"{x:g}"


def _run_notes(spec: m.MetricSpec, label: str, table: pd.DataFrame, align: str) -> list[Note]:
    notes = []
    unit = "step" if align == "step" else "unit"
    bad = table[f"{spec.name}.bad"].to_numpy() > 0
    logged = table[f"{spec.name}.logged"].to_numpy() > 0
    n = len(table)
    keys_ = spec.numerator + ("" if spec.denominator is None else f" / {spec.denominator}")
    if n and not logged.any():
        notes.append(Note(spec.name, label, f"{label} logs no {keys_} in the window", warning=spec.verdict))
        return notes
    if bad.any():
        xs = table["x"].to_numpy()[bad]
        k = int(bad.sum())
        tail = " from there to the end" if bad[np.argmax(bad) :].all() else ""
        notes.append(
            Note(
                spec.name,
                label,
                f"{label}: {keys_} is NaN or infinite at {k} of {n} {unit}s (first at {unit} "
                f"{_where(float(xs[0]))}{tail}); those {unit}s are left out of {spec.name} for this "
                f"run and of its paired difference",
                warning=True,
            )
        )
    missing = int((~logged).sum())
    if missing and logged.any():
        notes.append(
            Note(
                spec.name,
                label,
                f"{label}: {keys_} not logged at {missing} of {n} {unit}s "
                f"(left out, nothing is counted as 0)",
            )
        )
    return notes


def _estimate_run(
    spec: m.MetricSpec, label: str, backend: str, table: pd.DataFrame, confidence: float
) -> RunEstimate:
    num, den = table[f"{spec.name}.num"], table[f"{spec.name}.den"]
    valid = num.notna() & den.notna()
    nv, dv = num[valid].to_numpy(), den[valid].to_numpy()
    est = ratio_estimate(nv, dv, confidence=confidence)
    w_low, w_high = float("nan"), float("nan")
    if spec.is_fraction:
        w_low, w_high = wilson_interval(float(nv.sum()), float(dv.sum()), confidence)
    bad = table[f"{spec.name}.bad"].to_numpy() > 0
    logged = table[f"{spec.name}.logged"].to_numpy() > 0
    first = float(table["x"].to_numpy()[bad][0]) if bad.any() else None
    return RunEstimate(
        spec.name,
        label,
        backend,
        est,
        float(nv.sum()),
        float(dv.sum()),
        int(valid.sum()),
        int(bad.sum()),
        int((~logged).sum()) if logged.any() else 0,
        first,
        w_low,
        w_high,
    )


def _no_result_reason(
    spec: m.MetricSpec,
    reference: str,
    label: str,
    a: pd.DataFrame,
    b: pd.DataFrame,
    common: pd.Index,
    est: Estimate,
) -> str:
    """Why a pair has no verdict: the real reason, most basic first."""
    name = spec.name
    for run, table in ((reference, a), (label, b)):
        if not (table[f"{name}.logged"] > 0).any():
            return f"{run} logs no {spec.numerator} in the window"
    if len(common) == 0:
        return "no unit where both runs logged finite values"
    if spec.denominator is not None:
        for run, table in ((reference, a), (label, b)):
            if float(table.loc[common, f"{name}.den"].sum()) == 0:
                return (
                    f"{run} logged 0 {spec.denominator} at all {len(common)} paired units: "
                    f"{name} is undefined"
                )
    if not np.isfinite(est.value):
        return f"{name} is not positive in both runs, so it has no log-ratio"
    return est.insufficiency() or "no interval"


def _verdict_reason(d_est: Estimate, tolerance: float, verdict: str) -> str:
    if verdict == EQUIVALENT:
        return "the whole interval lies within the margin"
    if verdict == DIFFERENT:
        return "the whole interval lies outside the margin"
    if d_est.low > 0 or d_est.high < 0:
        return "a difference is detected (the interval excludes 0) but it may be within the margin"
    return "the interval is wider than the margin; more steps would settle it"


def compare(
    runset: RunSet,
    runs: Sequence[str] | None = None,
    *,
    align: str = "step",
    window: Window | None = None,
    tolerances: Mapping[str, float] | None = None,
    reward_abs_tolerance: float | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
) -> ComparisonResult:
    """Compare two or more runs of ``runset`` (default: all, in load order; the first is the reference).

    ``tolerances`` maps quantity names (``clip_fraction``, ``reward``, ``throughput``) to margins:
    absolute for clip fractions, relative (0.05 = ±5 %, on the log-ratio scale) for reward and
    throughput. ``reward_abs_tolerance`` (reward units, default 0.02) is the reward margin used when
    the rewards are near zero (see ``metrics``).
    """
    labels = [runset.info(r).display for r in (runs or runset.labels)]
    if len(labels) < 2:
        raise ValueError(f"compare needs at least two runs, got {labels}")
    if len(set(labels)) != len(labels):
        raise ValueError(f"a run is named twice in {labels}")
    if align not in ALIGNMENTS:
        raise ValueError(f"alignment {align!r} is not one of {sorted(ALIGNMENTS)}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    window = window or Window()
    specs = _choose_specs(runset, labels, tolerances or {}, reward_abs_tolerance)
    units = unit_table(runset, labels, specs, by=align, window=window)
    backends = {label: runset.info(label).run.backend_label or "" for label in labels}
    result = ComparisonResult(
        runs=labels,
        backends=backends,
        align=align,
        window=window,
        confidence=confidence,
        method=METHOD,
        specs=specs,
    )
    approximate = _approximate_quantities(runset, labels, specs, units, align, window)
    reference = labels[0]
    for spec in specs:
        for label in labels:
            estimate = _estimate_run(spec, label, backends[label], units[label], confidence)
            if (spec.name, label) in approximate:
                estimate = replace(estimate, approximate=True)
                result.notes.append(Note(spec.name, label, approximate[spec.name, label], warning=True))
            result.estimates.append(estimate)
            result.notes.extend(_run_notes(spec, label, units[label], align))
        for label in labels[1:]:
            difference = _difference(
                spec, reference, label, units[reference], units[label], confidence, result
            )
            if (spec.name, reference) in approximate or (spec.name, label) in approximate:
                difference = replace(difference, approximate=True)
            result.differences.append(difference)
    return result


def _approximate_quantities(
    runset: RunSet,
    labels: Sequence[str],
    specs: Sequence[m.MetricSpec],
    units: dict[str, pd.DataFrame],
    align: str,
    window: Window,
) -> dict[tuple[str, str], str]:
    """(quantity, run) -> why it is approximate, for runs whose tracker logged the clip fraction only
    as a mean of per-sample or per-micro-batch means (``LoadedRun.approximate``, ``keys.ALIASES``).

    Such a run has no token counts, so its clip fraction is estimated from that logged fraction
    instead (a mean over steps, ``denominator=None``): its columns in ``units`` are replaced.
    """
    found: dict[tuple[str, str], str] = {}
    for spec in specs:
        if spec.numerator != keys.CLIPPED_TOKENS:
            continue
        for label in labels:
            info = runset.info(label)
            if keys.CLIP_FRACTION not in info.approximate:
                continue
            table = units[label]
            if (table[f"{spec.name}.logged"] > 0).any():
                continue  # exact counts were logged: the ratio of sums is used
            fallback = replace(spec, numerator=keys.CLIP_FRACTION, denominator=None)
            alt = unit_table(runset, [label], [fallback], by=align, window=window)[label]
            for column in (f"{spec.name}.num", f"{spec.name}.den", f"{spec.name}.bad", f"{spec.name}.logged"):
                table[column] = alt[column].reindex(table.index)
            found[spec.name, label] = (
                f"{label}: {spec.name} is approximate: its tracker logged {keys.CLIP_FRACTION} only as a mean "
                "of per-sample or per-micro-batch means (no token counts), so this is the mean of that value "
                "over steps, not a ratio of token sums"
            )
    return found


def _difference(
    spec: m.MetricSpec,
    reference: str,
    label: str,
    a: pd.DataFrame,
    b: pd.DataFrame,
    confidence: float,
    result: ComparisonResult,
) -> Difference:
    name = spec.name
    num, den = f"{name}.num", f"{name}.den"
    va = a.index[(a[num].notna() & a[den].notna()).to_numpy()]
    vb = b.index[(b[num].notna() & b[den].notna()).to_numpy()]
    common = va.intersection(vb)
    arrays = [
        a.loc[common, num].to_numpy(),
        a.loc[common, den].to_numpy(),
        b.loc[common, num].to_numpy(),
        b.loc[common, den].to_numpy(),
    ]
    ref_paired = ratio_estimate(arrays[0], arrays[1], confidence=confidence)
    run_paired = ratio_estimate(arrays[2], arrays[3], confidence=confidence)
    scale, tolerance, margin = spec.scale, spec.tolerance, spec.tolerance
    if scale == m.AUTO:
        floor = spec.relative_floor()
        clear = (
            ref_paired.has_interval
            and run_paired.has_interval
            and ((ref_paired.low > 0 and run_paired.low > 0) or (ref_paired.high < 0 and run_paired.high < 0))
            and min(abs(ref_paired.value), abs(run_paired.value)) >= floor
        )
        if clear:
            scale = LOG_RATIO
        else:
            scale, margin = ABSOLUTE, spec.abs_tolerance
            result.notes.append(
                Note(
                    name,
                    label,
                    (
                        f"{label} vs {reference}: {name} compared on the absolute scale (±{margin:g}) instead of "
                        f"±{spec.tolerance * 100:g}%: relative margins apply only when both runs' {name} is clearly away "
                        f"from zero (both intervals on one side of 0 and |{name}| >= {floor:g}); here "
                        f"{ref_paired.value:.4g} and {run_paired.value:.4g}"
                    ),
                    warning=True,
                )
            )
    tolerance = m.log_margin(margin) if scale == LOG_RATIO else margin
    est = paired_difference(*arrays, scale=scale, confidence=confidence)
    only = len(va.union(vb)) - len(common)
    said = [n.text for n in result.notes if n.run == label and "in only one run" in n.text]
    if only and len(common) and not any(f": {only} units" in t for t in said):
        result.notes.append(
            Note(
                name,
                label,
                f"{label} vs {reference}: {only} units with a valid {name} in only "
                f"one run are left out of the paired comparison ({len(common)} "
                f"paired); per-run values are shown over the paired units, the "
                f"full-window value beside them",
            )
        )
    verdict = equivalence_verdict(est, tolerance)
    if verdict == INSUFFICIENT:
        reason = _no_result_reason(spec, reference, label, a, b, common, est)
    else:
        reason = _verdict_reason(est, tolerance, verdict)
    return Difference(
        name,
        reference,
        label,
        est,
        ref_paired,
        run_paired,
        tolerance,
        margin,
        scale,
        verdict,
        reason,
        spec.verdict,
    )
