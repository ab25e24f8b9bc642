"""Renderings of a ``ComparisonResult``: tables, the plain-language summary, markdown, HTML, JSON.

Each reads the result and nothing else, so the terminal, the dashboard, the MLflow comparison run,
the notebook and scripts (``--json``) all say the same thing.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any

import pandas as pd

from tracking.compare.result import ComparisonResult, Difference
from tracking.compare.stats import (
    DIFFERENT,
    EQUIVALENT,
    INCONCLUSIVE,
    INSUFFICIENT,
    LOG_RATIO,
    MIN_ESS,
    MIN_UNITS,
    Estimate,
)

WHAT = {
    "clip_fraction": "clip fraction (token-weighted)",
    "reward": "mean reward",
    "throughput": "throughput",
}


# ------------------------------------------------------------------------------------- numbers


def _pct(x: float, digits: int = 3) -> str:
    return f"{x * 100:.{digits}f}%"


def _value(e: Estimate, fraction: bool, ci: bool = True) -> str:
    if not math.isfinite(e.value):
        return "n/a"
    if fraction:
        text = _pct(e.value)
        bounds = f" [{e.low * 100:.3f}, {e.high * 100:.3f}]%" if e.has_interval else ""
    else:
        text = f"{e.value:.4g}"
        bounds = f" [{e.low:.4g}, {e.high:.4g}]" if e.has_interval else ""
    return text + (bounds if ci else "")


def _paired_value(result: ComparisonResult, d: Difference, run: str, ci: bool = True) -> str:
    """A run's value over the paired units (with its effective sample size when ``ci``); its
    full-window value beside it when that used more units."""
    spec = result.spec(d.metric)
    paired = d.reference_paired if run == d.reference else d.run_paired
    text = _value(paired, spec.is_fraction, ci)
    if ci and math.isfinite(paired.ess):
        text += f" ESS {paired.ess:.0f}"
    full = result.run_estimate(d.metric, run)
    if full.units != paired.n_units and math.isfinite(full.estimate.value):
        text += f" (all {full.units} units: {_value(full.estimate, spec.is_fraction, ci=False)})"
    return f"≈{text} approx." if full.approximate else text


def relative_change(log_ratio: float) -> float:
    """A log-ratio difference as a relative change: ``exp(d) - 1``."""
    return math.expm1(log_ratio) if math.isfinite(log_ratio) else float("nan")


def format_difference(result: ComparisonResult, d: Difference) -> str:
    """The difference and its interval, in pp (fractions), % (log-ratio) or the quantity's units."""
    e = d.estimate
    if not math.isfinite(e.value):
        return "n/a"
    if d.scale == LOG_RATIO:
        text = f"{relative_change(e.value) * 100:+.2f}%"
        bounds = (
            f" [{relative_change(e.low) * 100:+.2f}, {relative_change(e.high) * 100:+.2f}]%"
            if e.has_interval
            else " [no interval]"
        )
    elif result.spec(d.metric).is_fraction:
        text = f"{e.value * 100:+.3f} pp"
        bounds = f" [{e.low * 100:+.3f}, {e.high * 100:+.3f}] pp" if e.has_interval else " [no interval]"
    else:
        text = f"{e.value:+.4g}"
        bounds = f" [{e.low:+.4g}, {e.high:+.4g}]" if e.has_interval else " [no interval]"
    return text + bounds


def format_margin(result: ComparisonResult, d: Difference) -> str:
    if d.scale == LOG_RATIO:
        return f"±{d.margin * 100:.3g}% (|log ratio| < {d.tolerance:.4f})"
    if result.spec(d.metric).is_fraction:
        return f"±{d.margin * 100:.3g} pp"
    return f"±{d.margin:.4g}"


def _verdict_cell(d: Difference) -> str:
    return d.verdict if d.counts_for_verdict else f"({d.verdict})"


def _ess(e: Estimate) -> str:
    return "n/a" if not math.isfinite(e.ess) else f"{e.ess:.1f}"


def _lag1(e: Estimate) -> str:
    return "n/a" if not math.isfinite(e.lag1) else f"{e.lag1:.2f}"


# -------------------------------------------------------------------------------------- tables


def table(result: ComparisonResult) -> pd.DataFrame:
    """One row per quantity and compared run: paired-window estimates, difference, interval, ESS, verdict."""
    rows = []
    for d in result.differences:
        rows.append(
            {
                "metric": d.metric,
                "reference": d.reference,
                "reference_value": d.reference_paired.value,
                "reference_full_value": result.run_estimate(d.metric, d.reference).estimate.value,
                "run": d.run,
                "run_value": d.run_paired.value,
                "run_full_value": result.run_estimate(d.metric, d.run).estimate.value,
                "difference": d.estimate.value,
                "ci_low": d.estimate.low,
                "ci_high": d.estimate.high,
                "scale": d.scale,
                "margin": d.margin,
                "tolerance": d.tolerance,
                "paired_units": d.estimate.n_units,
                "lag1": d.estimate.lag1,
                "ess": d.estimate.ess,
                "reference_lag1": d.reference_paired.lag1,
                "reference_ess": d.reference_paired.ess,
                "run_lag1": d.run_paired.lag1,
                "run_ess": d.run_paired.ess,
                "verdict": _verdict_cell(d),
                "reason": d.reason,
            }
        )
    return pd.DataFrame(rows)


def estimates_table(result: ComparisonResult) -> pd.DataFrame:
    """One row per quantity and run over the whole window: estimate, interval, units, ESS, totals."""
    rows = []
    for e in result.estimates:
        rows.append(
            {
                "metric": e.metric,
                "run": e.run,
                "backend": e.backend,
                "estimate": e.estimate.value,
                "ci_low": e.estimate.low,
                "ci_high": e.estimate.high,
                "wilson_low": e.wilson_low,
                "wilson_high": e.wilson_high,
                "units": e.units,
                "lag1": e.estimate.lag1,
                "ess": e.estimate.ess,
                "nonfinite": e.nonfinite,
                "missing": e.missing,
                "numerator": e.total_numerator,
                "denominator": e.total_denominator,
            }
        )
    return pd.DataFrame(rows)


def formatted_table(result: ComparisonResult) -> pd.DataFrame:
    """``table`` formatted for people (percent for fractions and relative differences)."""
    two = len(result.runs) == 2
    rows = []
    for d in result.differences:
        rows.append(
            {
                "metric": d.metric,
                d.reference if two else "reference": _paired_value(result, d, d.reference),
                d.run if two else "run": _paired_value(result, d, d.run),
                "difference [CI]": ("≈" if d.approximate else "") + format_difference(result, d),
                "margin": format_margin(result, d),
                "paired": d.estimate.n_units,
                "lag-1": _lag1(d.estimate),
                "ESS": _ess(d.estimate),
                "verdict": _verdict_cell(d),
            }
        )
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------- summary


def _clip_margin(result: ComparisonResult) -> str:
    try:
        spec = result.spec("clip_fraction")
    except KeyError:
        return "?"
    return f"{spec.tolerance * 100:.3g} pp of tokens"


def headline(result: ComparisonResult) -> str:
    """The one-sentence answer: are the runs equally on-policy?"""
    verdict = result.on_policy_verdict
    subject = (
        f"{result.runs[1]} and {result.runs[0]}"
        if len(result.runs) == 2
        else f"the runs compared with {result.reference}"
    )
    margin = _clip_margin(result)
    if verdict == INSUFFICIENT:
        reasons = sorted(
            {
                d.reason
                for d in result.differences
                if d.metric == "clip_fraction" and d.verdict == INSUFFICIENT
            }
        )
        return (
            f"Insufficient data: the clip fractions of {subject} cannot be compared "
            f"({'; '.join(reasons) or 'no clip counts'})."
        )
    return {
        EQUIVALENT: f"Equally on-policy: {subject} clip within ±{margin} of each other.",
        DIFFERENT: f"Not equally on-policy: {subject} differ in clip fraction by more than ±{margin}.",
        INCONCLUSIVE: f"Inconclusive: the clip fractions of {subject} cannot be shown equal or different "
        f"within ±{margin}.",
    }[verdict]


def summary(result: ComparisonResult) -> str:
    """A plain-language summary: the answer, the method, one line per verdict quantity, warnings, notes."""
    pct = int(round(result.confidence * 100))
    lines = []
    for d in result.differences:
        if not d.counts_for_verdict:
            continue
        what = WHAT.get(d.metric, d.metric)
        head = (
            f"{what}: {d.run} {_paired_value(result, d, d.run, ci=False)} vs {d.reference} "
            f"{_paired_value(result, d, d.reference, ci=False)}; difference {format_difference(result, d)} "
            f"({pct}% CI, {d.estimate.n_units} paired units, lag-1 autocorrelation {_lag1(d.estimate)}, "
            f"effective sample size {_ess(d.estimate)}) against a margin of {format_margin(result, d)}"
        )
        lines.append(f"- {head} -> {d.verdict}: {d.reason}.")
    axis = {"step": "step", "tokens": "tokens seen", "time": "wall time"}[result.align]
    span = (
        "all steps"
        if result.window.start is None and result.window.end is None
        else f"window {result.window}"
    )
    context = (
        f"Aligned by {axis}, {span}; {pct}% intervals: {result.method}. No verdict below {MIN_UNITS} "
        f"paired units or an effective sample size of {MIN_ESS:g}."
    )
    warnings = [f"Warning: {n.text}" for n in result.notes if n.warning]
    notes = [f"Note: {n.text}" for n in result.notes if not n.warning]
    return "\n".join([headline(result), context, *lines, *warnings, *notes])


def markdown(result: ComparisonResult) -> str:
    """Summary and table as markdown."""
    frame = formatted_table(result)
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = [
        "| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |"
        for row in frame.itertuples(index=False)
    ]
    return "\n".join([summary(result), "", header, rule, *body]) + "\n"


def html_table(result: ComparisonResult) -> str:
    """The formatted table as an HTML ``<table>``; every cell is escaped."""
    frame = formatted_table(result)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    body = []
    for row in frame.itertuples(index=False):
        cells = []
        for column, value in zip(frame.columns, row, strict=True):
            cls = ""
            if column == "verdict":
                cls = f' class="verdict {html.escape(str(value).strip("()").replace(" ", "-"))}"'
            cells.append(f"<td{cls}>{html.escape(str(value))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f'<table class="verdict-table"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    )


# ---------------------------------------------------------------------------------------- JSON


def _num(x: float) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def _estimate(e: Estimate) -> dict[str, Any]:
    return {
        "value": _num(e.value),
        "ci_low": _num(e.low),
        "ci_high": _num(e.high),
        "units": e.n_units,
        "lag1": _num(e.lag1),
        "ess": _num(e.ess),
        "bandwidth": _num(e.bandwidth),
        "confidence": e.confidence,
        "enough_data": e.enough_data,
    }


def as_dict(result: ComparisonResult) -> dict[str, Any]:
    """Every estimate, interval, effective sample size, verdict and note as JSON-ready data (NaN -> null)."""
    return {
        "verdict": result.on_policy_verdict,
        "headline": headline(result),
        "runs": [
            {"label": r, "backend": result.backends[r], "reference": r == result.reference}
            for r in result.runs
        ],
        "align": result.align,
        "window": str(result.window),
        "confidence": result.confidence,
        "method": result.method,
        "minimum": {"units": MIN_UNITS, "ess": MIN_ESS},
        "specs": [
            {
                "metric": s.name,
                "numerator": s.numerator,
                "denominator": s.denominator,
                "tolerance": s.tolerance,
                "scale": s.scale,
                "abs_tolerance": _num(s.abs_tolerance),
                "unit": s.unit,
                "verdict": s.verdict,
            }
            for s in result.specs
        ],
        "estimates": [
            {
                "metric": e.metric,
                "run": e.run,
                "backend": e.backend,
                **_estimate(e.estimate),
                "units_valid": e.units,
                "nonfinite": e.nonfinite,
                "missing": e.missing,
                "first_nonfinite": e.first_nonfinite,
                "numerator": _num(e.total_numerator),
                "denominator": _num(e.total_denominator),
                "wilson_low": _num(e.wilson_low),
                "wilson_high": _num(e.wilson_high),
                "approximate": e.approximate,
            }
            for e in result.estimates
        ],
        "differences": [
            {
                "metric": d.metric,
                "reference": d.reference,
                "run": d.run,
                "scale": d.scale,
                "margin": d.margin,
                "tolerance": d.tolerance,
                "verdict": d.verdict,
                "reason": d.reason,
                "counts_for_verdict": d.counts_for_verdict,
                "approximate": d.approximate,
                "difference": _estimate(d.estimate),
                "reference_paired": _estimate(d.reference_paired),
                "run_paired": _estimate(d.run_paired),
            }
            for d in result.differences
        ],
        "notes": [
            {"metric": n.metric, "run": n.run, "text": n.text, "warning": n.warning} for n in result.notes
        ],
    }


def as_json(result: ComparisonResult) -> str:
    return json.dumps(as_dict(result), indent=2, allow_nan=False)
