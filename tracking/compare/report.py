"""Renderings of what a comparison found (``findings.Findings``, and so a ``ComparisonResult``):
tables, the plain-language summary, markdown, HTML, JSON. ``result.ComparisonResult`` offers them
as methods.

Each reads the result and nothing else, so the terminal, the dashboard, the MLflow comparison run,
the notebook and scripts (``--json``) all say the same thing.

Run-provided text (labels, reasons and notes that quote them) is escaped for the medium, through
``cliptrack.core.text``: the summary and headline hold it ``printable`` (one line each: a newline in a
run name cannot start a forged line), ``markdown`` and ``html_table`` escape every cell for their
medium, and the tables (data frames) hold it as given, escaped where they are printed. JSON holds
it as given (``json.dumps`` escapes control characters). The summary, markdown and JSON hold no
credential (``cliptrack.core.secrets.redact``, before any escaping).
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

from cliptrack.compare.findings import Difference, DifferenceSegment, Findings, GroupDifference, GroupSegment
from cliptrack.compare.quantities import AUTO
from cliptrack.compare.reasons import DefinedDifferently
from cliptrack.compare.stats import (
    DIFFERENT,
    EQUIVALENT,
    INCONCLUSIVE,
    INSUFFICIENT,
    LOG_RATIO,
    MIN_ESS,
    MIN_UNITS,
    Estimate,
)
from cliptrack.compare.stats.estimate import counted
from cliptrack.core.secrets import redact, redact_value
from cliptrack.core.text import html_text, markdown_lines, markdown_text, printable

if TYPE_CHECKING:  # pandas is imported when a table is built, so importing the report stays light
    import pandas as pd
    from cliptrack.compare.stats.seeds import GroupEstimate


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows as a data frame, one column per key."""
    import pandas as pd

    return pd.DataFrame(rows)


def _what(result: Findings, metric: str) -> str:
    """The quantity's label from the registry (``quantities.Quantity.label``)."""
    return result.quantity(metric).label


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


def _paired_value(result: Findings, d: Difference, run: str, ci: bool = True) -> str:
    """A run's value over the paired units (with its effective sample size when ``ci``); its
    full-window value beside it when that used more units."""
    percent = result.quantity(d.metric).percent
    paired = d.reference_paired if run == d.reference else d.run_paired
    text = _value(paired, percent, ci)
    if ci and math.isfinite(paired.ess):
        text += f" ESS {paired.ess:.0f}"
    full = result.run_estimate(d.metric, run)
    if full.units != paired.n_units and math.isfinite(full.estimate.value):
        text += f" (all {full.units} units: {_value(full.estimate, percent, ci=False)})"
    return f"≈{text} approx." if full.approximate else text


def relative_change(log_ratio: float) -> float:
    """A log-ratio difference as a relative change: ``exp(d) - 1``."""
    return math.expm1(log_ratio) if math.isfinite(log_ratio) else float("nan")


def _difference_text(result: Findings, d: Difference | GroupDifference, x: float) -> str:
    """One value of a difference in its terms: % (log-ratio), pp (fractions) or the quantity's units."""
    if d.scale == LOG_RATIO:
        return f"{relative_change(x) * 100:+.2f}%"
    if result.quantity(d.metric).percent:
        return f"{x * 100:+.3f} pp"
    return f"{x:+.4g}"


def format_difference(result: Findings, d: Difference | GroupDifference, e: Any = None) -> str:
    """The difference (``e``, default ``d.estimate``) and its interval, in pp (fractions), %
    (log-ratio) or the quantity's units."""
    e = d.estimate if e is None else e
    if not math.isfinite(e.value):
        return "n/a"
    text = _difference_text(result, d, e.value)
    if not e.has_interval:
        return text + " [no interval]"
    if d.scale == LOG_RATIO:
        return text + f" [{relative_change(e.low) * 100:+.2f}, {relative_change(e.high) * 100:+.2f}]%"
    if result.quantity(d.metric).percent:
        return text + f" [{e.low * 100:+.3f}, {e.high * 100:+.3f}] pp"
    return text + f" [{e.low:+.4g}, {e.high:+.4g}]"


def format_margin(result: Findings, d: Difference | GroupDifference) -> str:
    """The margin a difference was judged against, on the scale it used; an ``auto`` quantity's
    absolute floor is named as such."""
    if d.scale == LOG_RATIO:
        return f"±{d.margin * 100:.3g}% (|log ratio| < {d.tolerance:.4f})"
    q = result.quantity(d.metric)
    text = q.absolute_text(d.margin)
    if q.scale == AUTO and d.margin == q.abs_margin:
        text += " (the floor near zero)"
    return text


def _verdict_cell(d: Difference | GroupDifference) -> str:
    return d.verdict if d.counts_for_verdict else f"({d.verdict})"


def _ess(e: Estimate) -> str:
    return "n/a" if not math.isfinite(e.ess) else f"{e.ess:.1f}"


def _lag1(e: Estimate) -> str:
    return "n/a" if not math.isfinite(e.lag1) else f"{e.lag1:.2f}"


# -------------------------------------------------------------------------------------- tables


def _spans(
    result: Findings, segments: tuple[DifferenceSegment | GroupSegment, ...], verdicts: bool = True
) -> str:
    what = {"step": "steps", "tokens": "tokens seen", "time": "seconds"}[result.align]
    return "; ".join(
        f"{what} {s.start:g}-{s.end:g}" + (f" {s.verdict}" if verdicts else "") for s in segments
    )


def _step_weighted_columns(sw: Estimate | None, value_column: str) -> dict[str, float]:
    """The step-weighted estimate as table columns (value, interval); NaN where there is none."""
    nan = float("nan")
    return {
        value_column: nan if sw is None else sw.value,
        "step_weighted_ci_low": nan if sw is None else sw.low,
        "step_weighted_ci_high": nan if sw is None else sw.high,
    }


def _pair_row(result: Findings, d: Difference) -> dict[str, Any]:
    return {
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
        **_step_weighted_columns(d.step_weighted, "step_weighted_difference"),
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
        "segments": len(d.segments),
        "differing": _spans(result, d.differing),
        "influential": ", ".join(f"{x:g}" for x in d.influential),
        "average_verdict": d.average_verdict,
        "verdict": _verdict_cell(d),
        "reason": d.reason,
    }


def _group_row(d: GroupDifference) -> dict[str, Any]:
    e = d.estimate
    return {
        "metric": d.metric,
        "reference": d.reference,
        "run": d.group,
        "difference": e.value,
        "ci_low": e.low,
        "ci_high": e.high,
        "scale": d.scale,
        "margin": d.margin,
        "tolerance": d.tolerance,
        "reference_seeds": e.seeds_a,
        "run_seeds": e.seeds_b,
        "reference_between_sd": e.between_sd_a,
        "run_between_sd": e.between_sd_b,
        "df": e.df,
        "seeds_needed": d.seeds_needed,
        "verdict": _verdict_cell(d),
        "reason": d.reason,
    }


def table(result: Findings) -> pd.DataFrame:
    """One row per quantity and compared run (or group, when groups were compared): paired-window
    estimates, token- and step-weighted differences with intervals, ESS, segments, verdict."""
    if result.groups:
        return _frame([_group_row(d) for d in result.group_differences])
    return _frame([_pair_row(result, d) for d in result.differences])


def segments_table(result: Findings) -> pd.DataFrame:
    """One row per quantity, compared run and segment of the window: the difference over training."""
    rows = []
    for d in result.differences:
        for s in d.segments:
            rows.append(
                {
                    "metric": d.metric,
                    "reference": d.reference,
                    "run": d.run,
                    "start": s.start,
                    "end": s.end,
                    "units": s.estimate.n_units,
                    "difference": s.estimate.value,
                    "ci_low": s.estimate.low,
                    "ci_high": s.estimate.high,
                    "verdict": s.verdict,
                }
            )
    return _frame(rows)


def estimates_table(result: Findings) -> pd.DataFrame:
    """One row per quantity and run over the whole window: estimate, interval, step-weighted
    estimate, units, ESS, totals."""
    rows = []
    for e in result.estimates:
        rows.append(
            {
                "metric": e.metric,
                "run": e.run,
                "group": e.group,
                "backend": e.backend,
                "estimate": e.estimate.value,
                "ci_low": e.estimate.low,
                "ci_high": e.estimate.high,
                **_step_weighted_columns(e.step_weighted, "step_weighted"),
                "wilson_low": e.wilson_low,
                "wilson_high": e.wilson_high,
                "units": e.units,
                "lag1": e.estimate.lag1,
                "ess": e.estimate.ess,
                "nonfinite": e.nonfinite,
                "invalid": e.invalid,
                "missing": e.missing,
                "numerator": e.total_numerator,
                "denominator": e.total_denominator,
            }
        )
    return _frame(rows)


def _segments_cell(result: Findings, d: Difference) -> str:
    if not d.segments:
        return "-"
    if not d.differing:
        return f"{len(d.segments)}, all within"
    return f"{len(d.segments)}: {_spans(result, d.differing)}"


def _group_value(result: Findings, group: str, metric: str) -> str:
    mean = result.group_mean(group, metric)
    if not math.isfinite(mean):
        return "n/a"
    seeds = sum(math.isfinite(result.run_estimate(metric, r).estimate.value) for r in result.groups[group])
    text = _approximate_mark(result, group, metric) + (
        _pct(mean) if result.quantity(metric).percent else f"{mean:.4g}"
    )
    return f"{text} (mean of {seeds} seeds)"


def _approximate_mark(result: Findings, group: str, metric: str) -> str:
    """``≈`` when a seed of ``group`` logged ``metric`` only as a mean of means, else ""."""
    return "≈" if any(result.run_estimate(metric, r).approximate for r in result.groups[group]) else ""


def _formatted_groups(result: Findings) -> pd.DataFrame:
    rows = []
    for d in result.group_differences:
        rows.append(
            {
                "metric": d.metric,
                "reference": f"{d.reference}: {_group_value(result, d.reference, d.metric)}",
                "group": f"{d.group}: {_group_value(result, d.group, d.metric)}",
                "difference [CI]": ("≈" if d.approximate else "") + format_difference(result, d),
                "margin": format_margin(result, d),
                "seeds": f"{d.estimate.seeds_a}+{d.estimate.seeds_b}",
                "seeds needed": d.seeds_needed if _unsettled(d) else "-",
                "verdict": _verdict_cell(d),
            }
        )
    return _frame(rows)


def formatted_table(result: Findings) -> pd.DataFrame:
    """``table`` formatted for people (percent for fractions and relative differences)."""
    if result.groups:
        return _formatted_groups(result)
    two = len(result.runs) == 2
    rows = []
    for d in result.differences:
        sw = "-" if d.step_weighted is None else format_difference(result, d, d.step_weighted)
        rows.append(
            {
                "metric": d.metric,
                d.reference if two else "reference": _paired_value(result, d, d.reference),
                d.run if two else "run": _paired_value(result, d, d.run),
                "difference [CI]": ("≈" if d.approximate else "") + format_difference(result, d),
                "step-weighted": sw,
                "margin": format_margin(result, d),
                "paired": d.estimate.n_units,
                "lag-1": _lag1(d.estimate),
                "ESS": _ess(d.estimate),
                "segments": _segments_cell(result, d),
                "verdict": _verdict_cell(d),
            }
        )
    return _frame(rows)


# ------------------------------------------------------------------------------------- summary


def _unsettled(d: GroupDifference) -> bool:
    """Whether more seeds could settle a group row: inconclusive or insufficient, with a count."""
    return d.verdict in (INCONCLUSIVE, INSUFFICIENT) and d.seeds_needed is not None


def _short_margin(result: Findings, d: Difference | GroupDifference) -> str:
    """``format_margin`` without the log-ratio tolerance, for the headline."""
    return f"±{d.margin * 100:.3g}%" if d.scale == LOG_RATIO else format_margin(result, d)


def _margin_text(result: Findings, metric: str) -> str:
    """The margins ``metric`` was judged against (those of its rows, in order), or its registry
    margin when no row judged it."""
    used = [_short_margin(result, d) for d in _rows(result) if d.metric == metric]
    return " / ".join(dict.fromkeys(used)) or result.quantity(metric).margin_text()


def _subject(result: Findings) -> str:
    if result.groups:
        names = [printable(g) for g in result.groups]
        seeds = " and ".join(str(len(result.groups[g])) for g in reversed(names[:2]))
        pair = f"{names[1]} and {names[0]}" if len(names) == 2 else f"the groups compared with {names[0]}"
        return f"these stacks ({pair}, {seeds} seeds)"
    if len(result.runs) == 2:  # one pair answers for these runs, never for the stacks
        return f"these runs ({printable(result.runs[1])} and {printable(result.runs[0])})"
    return f"the runs compared with {printable(result.reference)}"


def _rows(result: Findings) -> list[Difference | GroupDifference]:
    return list(result.group_differences if result.groups else result.differences)


def _judged(result: Findings) -> list[Difference | GroupDifference]:
    return [d for d in _rows(result) if d.metric in result.on_policy]


def _spans_with_verdicts(result: Findings, segments: tuple[DifferenceSegment | GroupSegment, ...]) -> str:
    what = {"step": "steps", "tokens": "tokens seen", "time": "seconds"}[result.align]
    return ", ".join(f"{what} {s.start:g}-{s.end:g} ({s.verdict})" for s in segments)


def _where(result: Findings, d: Difference | GroupDifference, verdict: str) -> str:
    """Where in the window a row's ``verdict`` comes from, when the segments decided it: the
    different segments for ``different``; every segment not shown within, with its verdict, else."""
    if not (d.differing and d.average_verdict != verdict):
        return ""
    average = " (within the margin on average)" if d.average_verdict == EQUIVALENT else ""
    if verdict == DIFFERENT:
        spans = tuple(s for s in d.differing if s.verdict == DIFFERENT)
        return f" at {_spans(result, spans, verdicts=False)}{average}" if spans else ""
    return f" at {_spans_with_verdicts(result, d.differing)}{average}"


def _what_differs(result: Findings, verdict: str) -> str:
    """Which quantities (and steps) carry ``verdict``, as words: "beyond" the margin for
    ``different`` only; "not shown within" it for ``inconclusive``."""
    parts = []
    for d in _judged(result):
        if d.verdict != verdict:
            continue
        how = "beyond" if verdict == DIFFERENT else "not shown within"
        parts.append(
            f"{_what(result, d.metric)} {how} {_short_margin(result, d)}{_where(result, d, verdict)}"
        )
    return "; ".join(dict.fromkeys(parts))


def _groups_segmented(result: Findings) -> bool:
    """Whether every judged group row was tested segment by segment across seeds (2+ segments)."""
    rows = _judged(result)
    return bool(rows) and all(isinstance(d, GroupDifference) and len(d.segments) > 1 for d in rows)


def _agree(result: Findings, subject: str, margins: str) -> str:
    if result.groups and _groups_segmented(result):
        return (
            f"Equally on-policy: {subject} agree on the window average over seeds within {margins} "
            "(no segment across seeds shown to differ)."
        )
    if result.groups:
        return f"Equally on-policy: {subject} agree on the window average over seeds within {margins}."
    return f"Equally on-policy: {subject} agree over the window within {margins}."


def _insufficient_headline(result: Findings, subject: str) -> str:
    """The quantities without data named with their reasons (each labelled when they differ), and the
    other judged quantities' own verdicts: the sentence names only what cannot be compared."""
    judged = _judged(result)
    short = [d for d in judged if d.verdict == INSUFFICIENT]
    reasons = {printable(d.reason): d for d in short if d.reason}
    labelled = len(reasons) > 1
    why = "; ".join(f"{_what(result, d.metric)}: {r}" if labelled else r for r, d in reasons.items())
    metrics = [d.metric for d in short] or list(result.on_policy)
    names = " and ".join(result.quantity(m).plural_label for m in metrics) or "clip fractions"
    others = "".join(
        f" The {_what(result, d.metric)} is inconclusive: neither within nor beyond {_short_margin(result, d)} is shown."
        if d.verdict == INCONCLUSIVE
        else f" The {_what(result, d.metric)} is {d.verdict}."
        for d in judged
        if d.verdict != INSUFFICIENT
    )
    return (
        f"Insufficient data: the {names} of {subject} cannot be compared ({why or 'no clip counts'}).{others}"
    )


def _inconclusive_headline(result: Findings, subject: str, margins: str) -> str:
    unclear = _what_differs(result, INCONCLUSIVE)
    return f"Inconclusive: {subject} cannot be shown equal or different within {margins}" + (
        f" ({unclear})." if unclear else "."
    )


def headline(result: Findings) -> str:
    """The one-sentence answer: are the runs equally on-policy? "Equally on-policy" only when every
    judged quantity is equivalent throughout the window; an on-policy quantity that the runs define
    differently (their recipes differ) is named after it, with no verdict."""
    unjudged = [
        n.text
        for n in result.notes
        if isinstance(n.reason, DefinedDifferently) and result.quantity(n.metric).on_policy
    ]
    return _answer(result) + "".join(f" {text[0].upper()}{text[1:]}." for text in unjudged)


def _answer(result: Findings) -> str:
    verdict = result.on_policy_verdict
    subject = _subject(result)
    margins = (
        ", ".join(f"{_what(result, m)} {_margin_text(result, m)}" for m in result.on_policy)
        or "no clip counts"
    )
    if verdict == INSUFFICIENT:
        return _insufficient_headline(result, subject)
    if verdict == EQUIVALENT:
        return _agree(result, subject, margins)
    if verdict == DIFFERENT:
        return f"Not equally on-policy: {subject} differ in {_what_differs(result, DIFFERENT)}."
    return _inconclusive_headline(result, subject, margins)


def _summary_line(result: Findings, d: Difference, pct: int) -> str:
    sw = "" if d.step_weighted is None else f"; step-weighted {format_difference(result, d, d.step_weighted)}"
    segments = f"; {counted(len(d.segments), 'segment')}" + (
        f", not within: {_spans(result, d.differing)}" if d.differing else ""
    )
    head = (
        f"{_what(result, d.metric)}: {printable(d.run)} {_paired_value(result, d, d.run, ci=False)} vs "
        f"{printable(d.reference)} "
        f"{_paired_value(result, d, d.reference, ci=False)}; difference {format_difference(result, d)} "
        f"({pct}% CI, {d.estimate.n_units} paired units, lag-1 autocorrelation {_lag1(d.estimate)}, "
        f"effective sample size {_ess(d.estimate)}){sw}{segments if d.segments else ''} against a margin of "
        f"{format_margin(result, d)}"
    )
    return f"- {head} -> {d.verdict}: {printable(d.reason)}."


def _group_line(result: Findings, d: GroupDifference, pct: int) -> str:
    e = d.estimate
    return (
        f"- {_what(result, d.metric)}: {printable(d.group)} {_group_value(result, d.group, d.metric)} vs "
        f"{printable(d.reference)} "
        f"{_group_value(result, d.reference, d.metric)}; difference {format_difference(result, d)} ({pct}% CI "
        f"over {e.seeds_a}+{e.seeds_b} seeds, between-seed variation included; "
        f"P({printable(d.group)} > {printable(d.reference)}) {_probability(d.probability_greater)})"
        f"{_group_segments(result, d)} against a margin of {format_margin(result, d)}{_seeds_text(result, d)} "
        f"-> {d.verdict}: {printable(d.reason)}."
    )


def _probability(p: float) -> str:
    if not math.isfinite(p):
        return "n/a"
    if p > 0.999:
        return "> 99.9%"
    if p < 0.001:
        return "< 0.1%"
    return f"{p * 100:.1f}%"


def _group_segments(result: Findings, d: GroupDifference) -> str:
    if not d.segments:
        return ""
    return f"; {counted(len(d.segments), 'segment')} across seeds" + (
        f", not within: {_spans(result, d.differing)}" if d.differing else ""
    )


def _seeds_text(result: Findings, d: GroupDifference) -> str:
    """The seeds (and steps) a row needs, on a row more seeds could settle only."""
    if not _unsettled(d) or d.seeds_needed is None:
        return ""
    have = min(d.estimate.seeds_a, d.estimate.seeds_b)
    margin = _short_margin(result, d)
    if d.seeds_needed > have:
        seeds = (
            f"{d.seeds_needed - have} more seeds per stack ({d.seeds_needed} in all) would settle {margin}"
        )
    else:
        seeds = f"{d.seeds_needed} seeds per stack would settle {margin}"
    if d.steps_factor is None:
        steps = "; more steps alone would not (the between-seed spread is too large)"
    elif d.steps_factor > 1:
        steps = f", or {d.steps_factor:.1f}× the steps per seed with the present seeds"
    else:
        steps = ""
    return f"; {seeds} at the measured spread{steps}"


AXIS_NAMES = {"step": "step", "tokens": "tokens seen", "time": "wall time"}
"""An alignment as the summary names its axis."""


def _context(result: Findings, pct: int) -> str:
    """The summary's second line: axis, window, interval method and the gates of a verdict."""
    whole = result.window.start is None and result.window.end is None
    span = "all steps" if whole else f"window {result.window}"
    return (
        f"Aligned by {AXIS_NAMES[result.align]}, {span}; {pct}% intervals: {result.method}. No verdict below "
        f"{MIN_UNITS} paired units or an effective sample size of {MIN_ESS:g}."
    )


def summary(result: Findings) -> str:
    """A plain-language summary: the answer, the method, one line per verdict quantity, warnings,
    notes; run-provided text in it is ``printable``, so each line is one of these."""
    pct = int(round(result.confidence * 100))
    if result.groups:
        lines = [_group_line(result, d, pct) for d in result.group_differences if d.counts_for_verdict]
    else:
        lines = [_summary_line(result, d, pct) for d in result.differences if d.counts_for_verdict]
    warnings = [f"Warning: {printable(n.text)}" for n in result.notes if n.warning]
    notes = [f"Note: {printable(n.text)}" for n in result.notes if not n.warning]
    audited = audit_lines(result)
    return redact("\n".join([headline(result), _context(result, pct), *lines, *audited, *warnings, *notes]))


def audit_lines(result: Findings) -> list[str]:
    """One line per run and quantity where a framework's own number was logged beside our exact one
    (``Findings.audits``): both, the gap, and why they differ; run-provided text ``printable``."""
    return [
        printable(f"Audit: {a.run}: {a.sentence()}; compared on the exact {a.metric} (ratio of token sums)")
        for a in result.audits
    ]


def _audit(a: Any) -> dict[str, Any]:
    return {
        "run": a.run,
        "metric": a.metric,
        "framework": a.framework,
        "name": a.name,
        "theirs": _num(a.theirs),
        "exact": _num(a.exact),
        "gap": _num(a.gap),
        "steps": a.steps,
        "why": a.why,
        "text": a.sentence(),
    }


def _markdown_rows(frame: pd.DataFrame) -> list[str]:
    header = "| " + " | ".join(markdown_text(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = [
        "| " + " | ".join(markdown_text(redact(str(v))) for v in row) + " |"
        for row in frame.itertuples(index=False)
    ]
    return [header, rule, *body]


def markdown(result: Findings) -> str:
    """Summary, table and the per-segment differences as markdown; every run-provided text renders
    as itself (``cliptrack.core.text.markdown_text``: no link, image or HTML from a run name)."""
    parts = [markdown_lines(summary(result)), "", *_markdown_rows(formatted_table(result))]
    segments = segments_table(result)
    if len(segments):
        parts += ["", "Difference over training (per segment):", "", *_markdown_rows(segments)]
    return "\n".join(parts) + "\n"


def html_table(result: Findings) -> str:
    """The formatted table as an HTML ``<table>``; every cell is escaped (``cliptrack.core.text.html_text``)."""
    frame = formatted_table(result)
    head = "".join(f"<th>{html_text(c)}</th>" for c in frame.columns)
    body = []
    for row in frame.itertuples(index=False):
        cells = []
        for column, value in zip(frame.columns, row, strict=True):
            cls = ""
            if column == "verdict":
                cls = f' class="verdict {html_text(str(value).strip("()").replace(" ", "-"))}"'
            cells.append(f"<td{cls}>{html_text(value)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f'<table class="verdict-table"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    )


# ---------------------------------------------------------------------------------------- JSON


def _num(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def _estimate(e: Estimate | None) -> dict[str, Any] | None:
    if e is None:
        return None
    return {
        "value": _num(e.value),
        "ci_low": _num(e.low),
        "ci_high": _num(e.high),
        "units": e.n_units,
        "lag1": _num(e.lag1),
        "ess": _num(e.ess),
        "bandwidth": _num(e.bandwidth),
        "long_memory": e.long_memory,
        "memory_d": _num(e.memory),
        "memory_tested": e.memory_tested,
        "confidence": e.confidence,
        "enough_data": e.enough_data,
    }


def _quantity(q: Any) -> dict[str, Any]:
    return {
        "metric": q.name,
        "label": q.label,
        "numerator": q.numerator,
        "denominator": q.denominator,
        "margin": q.margin,
        "scale": q.scale,
        "abs_margin": _num(q.abs_margin),
        "bounds": [_num(b) for b in q.bounds] if q.bounds else None,  # null: unbounded above
        "unit": q.unit,
        "percent": q.percent,
        "verdict": q.verdict,
        "on_policy": q.on_policy,
    }


def _difference(d: Difference) -> dict[str, Any]:
    return {
        "metric": d.metric,
        "reference": d.reference,
        "run": d.run,
        "scale": d.scale,
        "margin": d.margin,
        "tolerance": d.tolerance,
        "verdict": d.verdict,
        "average_verdict": d.average_verdict,
        "reason": d.reason,
        "counts_for_verdict": d.counts_for_verdict,
        "approximate": d.approximate,
        "difference": _estimate(d.estimate),
        "step_weighted": _estimate(d.step_weighted),
        "reference_paired": _estimate(d.reference_paired),
        "run_paired": _estimate(d.run_paired),
        "segments": [
            {
                "start": s.start,
                "end": s.end,
                "start_unit": s.start_unit,
                "stop_unit": s.stop_unit,
                "verdict": s.verdict,
                "difference": _estimate(s.estimate),
                "differs": s in d.differing,
            }
            for s in d.segments
        ],
        "influential": list(d.influential),
        "lead": None
        if d.lead is None
        else {
            "lag": d.lead.lag,
            "shift": d.lead.shift,
            "gain": _num(d.lead.gain),
            "explained": d.lead.explained,
        },
    }


def _group_estimate(e: GroupEstimate) -> dict[str, Any]:
    return {
        "value": _num(e.value),
        "ci_low": _num(e.low),
        "ci_high": _num(e.high),
        "se": _num(e.se),
        "confidence": e.confidence,
        "seeds_reference": e.seeds_a,
        "seeds_group": e.seeds_b,
        "between_sd_reference": _num(e.between_sd_a),
        "between_sd_group": _num(e.between_sd_b),
        "df": _num(e.df),
    }


def _group_difference(d: GroupDifference) -> dict[str, Any]:
    return {
        "metric": d.metric,
        "reference": d.reference,
        "group": d.group,
        "scale": d.scale,
        "margin": d.margin,
        "tolerance": d.tolerance,
        "verdict": d.verdict,
        "reason": d.reason,
        "counts_for_verdict": d.counts_for_verdict,
        "approximate": d.approximate,
        "seeds_needed": d.seeds_needed,
        "steps_factor": _num(d.steps_factor),
        "probability_greater": _num(d.probability_greater),
        "average_verdict": d.average_verdict,
        "difference": _group_estimate(d.estimate),
        "segments": [
            {
                "start": s.start,
                "end": s.end,
                "verdict": s.verdict,
                "difference": _group_estimate(s.estimate),
                "differs": s in d.differing,
            }
            for s in d.segments
        ],
    }


def as_dict(result: Findings) -> dict[str, Any]:
    """Every estimate, interval, effective sample size, segment, verdict and note as JSON-ready
    data (NaN -> null)."""
    return {
        "verdict": result.on_policy_verdict,
        "headline": headline(result),
        "why": why(result),
        "on_policy": list(result.on_policy),
        "seeds_covered": result.seeds_covered,
        "groups": {g: list(m) for g, m in result.groups.items()},
        "runs": [
            {"label": r, "backend": result.backends[r], "reference": r == result.reference}
            for r in result.runs
        ],
        "align": result.align,
        "window": str(result.window),
        "confidence": result.confidence,
        "method": result.method,
        "minimum": {"units": MIN_UNITS, "ess": MIN_ESS},
        "quantities": [_quantity(q) for q in result.quantities],
        "estimates": [
            {
                "metric": e.metric,
                "run": e.run,
                "group": e.group,
                "backend": e.backend,
                **(_estimate(e.estimate) or {}),
                "step_weighted": _estimate(e.step_weighted),
                "units_valid": e.units,
                "nonfinite": e.nonfinite,
                "invalid": e.invalid,
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
        "differences": [_difference(d) for d in result.differences],
        "group_differences": [_group_difference(d) for d in result.group_differences],
        "notes": [
            {"metric": n.metric, "run": n.run, "text": n.text, "warning": n.warning} for n in result.notes
        ],
        "audits": [_audit(a) for a in result.audits],
    }


def as_json(result: Findings) -> str:
    return json.dumps(redact_value(as_dict(result)), indent=2, allow_nan=False)


# ------------------------------------------------------------------------- the terminal's layout


def compact_table(result: Findings) -> pd.DataFrame:
    """``formatted_table`` with the columns a reader needs first (quantity, the two values, the
    difference with its interval, the margin, the verdict); every other column is in
    ``formatted_table`` (``--verbose``) and ``as_dict`` (``--json``)."""
    pct = int(round(result.confidence * 100))
    rows: list[dict[str, Any]] = []
    if result.groups:
        two = len(result.groups) == 2
        for g in result.group_differences:
            rows.append(
                {
                    "metric": g.metric,
                    g.reference if two else "reference": _group_mean(result, g.reference, g.metric, not two),
                    g.group if two else "group": _group_mean(result, g.group, g.metric, not two),
                    f"difference [{pct}% CI]": ("≈" if g.approximate else "") + format_difference(result, g),
                    "margin": _short_margin(result, g),
                    "seeds": f"{g.estimate.seeds_a}+{g.estimate.seeds_b}",
                    "verdict": _verdict_cell(g),
                }
            )
        return _frame(rows)
    two = len(result.runs) == 2
    for d in result.differences:
        percent = result.quantity(d.metric).percent
        rows.append(
            {
                "metric": d.metric,
                d.reference if two else "reference": _value(d.reference_paired, percent, ci=False),
                d.run if two else "run": _value(d.run_paired, percent, ci=False),
                f"difference [{pct}% CI]": ("≈" if d.approximate else "") + format_difference(result, d),
                "margin": _short_margin(result, d),
                "paired": d.estimate.n_units,
                "verdict": _verdict_cell(d),
            }
        )
    return _frame(rows)


def _group_mean(result: Findings, group: str, metric: str, named: bool = False) -> str:
    """The mean over a group's seeds of their window values (no seed count: the seeds column has
    it), after the group's name when ``named``."""
    mean = result.group_mean(group, metric)
    if not math.isfinite(mean):
        return "n/a"
    text = _approximate_mark(result, group, metric) + (
        _pct(mean) if result.quantity(metric).percent else f"{mean:.4g}"
    )
    return f"{group} {text}" if named else text


def _decisive(result: Findings) -> Difference | GroupDifference | None:
    """The judged row that carries the on-policy verdict (the first with that verdict)."""
    judged = _judged(result)
    return next((d for d in judged if d.verdict == result.on_policy_verdict), judged[0] if judged else None)


def _edge_margin(d: Difference | GroupDifference, far: bool) -> str:
    """The margin at which a row's verdict would flip: its interval's nearest (or farthest) edge
    from zero, in the margin's terms."""
    lo, hi = d.estimate.low, d.estimate.high
    edge = max(abs(lo), abs(hi)) if far else min(abs(lo), abs(hi))
    if d.scale == LOG_RATIO:
        return f"±{math.expm1(edge) * 100:.3g}%"
    return f"±{edge:.4g}"


def _what_would_change(result: Findings, d: Difference | GroupDifference) -> str:
    """The third headline line: what would change the verdict, from the decisive row's numbers."""
    what = _what(result, d.metric)
    if d.verdict == DIFFERENT and d.estimate.has_interval:
        return (
            f"What would change it: a {what} margin wider than {_edge_margin(d, far=False)} (the "
            "interval's edge nearest zero); more seeds or steps narrow the interval around the same gap."
        )
    if d.verdict == EQUIVALENT and d.estimate.has_interval:
        return (
            f"What would change it: a {what} margin narrower than {_edge_margin(d, far=True)} (the "
            "interval's edge farthest from zero)."
        )
    if isinstance(d, GroupDifference):
        if d.seeds_needed is not None:
            return (
                f"What would change it: {d.seeds_needed} seeds per stack would settle the {what} "
                f"margin of {_short_margin(result, d)} at the measured spread."
            )
        return f"What would change it: more seeds per stack ({printable(d.reason)})."
    if d.verdict == INSUFFICIENT:
        return _pair_insufficient(result, d)
    return (
        f"What would change it: a narrower {what} interval (more paired steps, or seeds compared "
        "as groups) or a wider margin."
    )


def _pair_insufficient(result: Findings, d: Difference) -> str:
    """The third headline line of a pair that cannot be judged: what the runs plainly show, and
    that seeds, not one pair's steps, answer for the stacks."""
    need = (
        f"at least {MIN_UNITS} paired units and an effective sample size of {MIN_ESS:g}; now "
        f"{d.estimate.n_units} and {_ess(d.estimate)}"
    )
    if not math.isfinite(d.estimate.value):
        return f"What would change it: more paired steps ({need})."
    return (
        f"These runs differ by about {_difference_text(result, d, d.estimate.value)}; whether the stacks do needs 2+ seeds each "
        f"(--group NAME=RUN,RUN), or more paired steps ({need})."
    )


def _figure(result: Findings, d: Difference | GroupDifference) -> str:
    """The second headline line: the decisive row's values, difference, interval and margin."""
    pct = int(round(result.confidence * 100))
    if isinstance(d, GroupDifference):
        e = d.estimate
        values = (
            f"{printable(d.group)} {_group_mean(result, d.group, d.metric)} vs {printable(d.reference)} "
            f"{_group_mean(result, d.reference, d.metric)} (means of {e.seeds_b} and {e.seeds_a} seeds)"
        )
        over = "between-seed variation included"
    else:
        percent = result.quantity(d.metric).percent
        values = (
            f"{printable(d.run)} {_value(d.run_paired, percent, ci=False)} vs {printable(d.reference)} "
            f"{_value(d.reference_paired, percent, ci=False)}"
        )
        over = f"{d.estimate.n_units} paired units"
    return (
        f"The figure: {_what(result, d.metric)} {values}; difference {format_difference(result, d)} "
        f"({pct}% CI, {over}) against {_short_margin(result, d)}."
    )


CAUSES = (
    ("drift_kl_k3", "drift", "staleness or the update's own drift"),
    ("engine_kl_k3", "engine", "the inference engine's numerics or truncation"),
)
"""The mismatch KL's parts the "why" line reads (compared quantities), what each is called, and
what a difference in it means."""
_PART_VERDICT = {
    DIFFERENT: "differs",
    EQUIVALENT: "agrees",
    INCONCLUSIVE: "is not shown equal or different",
    INSUFFICIENT: "cannot be compared",
}


def _part_values(result: Findings, d: Difference | GroupDifference) -> str:
    if isinstance(d, GroupDifference):
        return (
            f"{printable(d.group)} {_group_mean(result, d.group, d.metric)} vs {printable(d.reference)} "
            f"{_group_mean(result, d.reference, d.metric)}"
        )
    return (
        f"{printable(d.run)} {_value(d.run_paired, False, ci=False)} vs {printable(d.reference)} "
        f"{_value(d.reference_paired, False, ci=False)}"
    )


def _bare_margin(d: Difference | GroupDifference) -> str:
    """A row's margin as one number: ``±25%`` on the log-ratio scale, ``±1e-05`` on the absolute one."""
    return f"±{d.margin * 100:.3g}%" if d.scale == LOG_RATIO else f"±{d.margin:.3g}"


def _rows_for(
    result: Findings, like: Difference | GroupDifference
) -> dict[str, Difference | GroupDifference]:
    """The rows of the run (or group) of ``like``, by quantity."""

    def who(d: Difference | GroupDifference) -> str:
        return d.group if isinstance(d, GroupDifference) else d.run

    return {d.metric: d for d in _rows(result) if who(d) == who(like)}


def _part_said(result: Findings, d: Difference | GroupDifference, label: str) -> str:
    """One part of the mismatch KL in words: its verdict and the two values (its margin when equal)."""
    within = f", within {_bare_margin(d)}" if d.verdict == EQUIVALENT else ""
    return f"the {label} part {_PART_VERDICT[d.verdict]} ({_part_values(result, d)}{within})"


def why(result: Findings) -> str:
    """Why the runs are (or are not) equally on-policy: the verdicts of the mismatch KL's drift and
    engine parts (:data:`CAUSES`) for the decisive row's run or group, the sampler's weight lag
    where logged, and which cause the gap comes from when exactly one part differs. Empty when
    the runs do not log the parts."""
    decisive = _decisive(result)
    rows = _rows_for(result, decisive) if decisive is not None else {}
    parts = [(rows[name], label, cause) for name, label, cause in CAUSES if name in rows]
    if not parts:
        return ""
    said = "; ".join(_part_said(result, d, label) for d, label, _ in parts)
    lag = rows.get("weight_lag")
    lag_text = (
        f"; the sampler's mean weight lag: {_part_values(result, lag)} versions" if lag is not None else ""
    )
    differing = [(label, cause) for d, label, cause in parts if d.verdict == DIFFERENT]
    cause = ""
    if len(differing) == 1 and len(parts) == len(CAUSES):
        cause = f". The gap is in the {differing[0][0]} part: {differing[0][1]}"
    return f"Why: of the mismatch KL, {said}{lag_text}{cause}."


def headline_lines(result: Findings) -> list[str]:
    """At most four lines: the verdict (``headline``), the figure it rests on, what would change
    it, and, when the runs log the mismatch KL's parts, why (:func:`why`)."""
    d = _decisive(result)
    lines = [headline(result)]
    if d is not None:
        lines += [_figure(result, d), _what_would_change(result, d)]
    reason = why(result)
    if reason:
        lines.append(reason)
    return [redact(line) for line in lines]


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"each of {', '.join(names[:-1])} and {names[-1]}"


def grouped_notes(result: Findings) -> list[str]:
    """How the comparison was made (axis, window, intervals, gates), then the notes, warnings
    first, each once: notes that say the same of several quantities are one line naming them all."""
    grouped: dict[tuple[bool, str], list[str]] = {}
    for n in result.notes:
        text = printable(n.text)
        metric = printable(n.metric)
        shape = re.sub(rf"\b{re.escape(metric)}\b", "\x00", text) if metric else text
        if shape == text or shape.count("\x00") != 1:  # not about one named quantity: as it is
            shape, metric = text, ""
        metrics = grouped.setdefault((not n.warning, shape), [])
        if metric and metric not in metrics:
            metrics.append(metric)
    lines = [_context(result, int(round(result.confidence * 100))), *audit_lines(result)]
    for (is_note, shape), metrics in sorted(grouped.items(), key=lambda kv: kv[0][0]):
        text = shape.replace("\x00", _listed(metrics)) if metrics else shape
        lines.append(f"{'Note' if is_note else 'Warning'}: {text}")
    return [redact(line) for line in lines]
