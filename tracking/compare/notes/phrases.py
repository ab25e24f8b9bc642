"""The pieces the report's sentences and table cells are made of: a quantity's name, a run's value
(with what it rests on), a margin, stretches of the window, the rows that are judged.

Numbers are shown by ``cliptrack.compare.formatting``; run-provided text is left as given here
(the sentences make it ``printable``; tables are escaped where they are printed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias

from cliptrack.compare import formatting as fmt
from cliptrack.compare.findings import Difference, DifferenceSegment, Findings, GroupDifference, GroupSegment
from cliptrack.compare.notes.words import AXIS_WORDS
from cliptrack.compare.quantities import AUTO
from cliptrack.compare.stats import INCONCLUSIVE, INSUFFICIENT, LOG_RATIO

if TYPE_CHECKING:
    from cliptrack.compare.stats import Estimate

Row: TypeAlias = Difference | GroupDifference
"""A judged row: a pair's difference, or a group's."""


def what(result: Findings, metric: str) -> str:
    """The quantity's label from the registry (``quantities.Quantity.label``)."""
    return result.quantity(metric).label


def rows(result: Findings) -> list[Row]:
    """The rows of the comparison: group differences when groups were compared, else pairs'."""
    return list(result.group_differences if result.groups else result.differences)


def judged(result: Findings) -> list[Row]:
    """The rows of the quantities the on-policy answer is judged on."""
    return [d for d in rows(result) if d.metric in result.on_policy]


def decisive(result: Findings) -> Row | None:
    """The judged row that carries the on-policy verdict (the first with that verdict)."""
    rows_ = judged(result)
    return next((d for d in rows_ if d.verdict == result.on_policy_verdict), rows_[0] if rows_ else None)


def unsettled(d: GroupDifference) -> bool:
    """Whether more seeds could settle a group row: inconclusive or insufficient, with a count."""
    return d.verdict in (INCONCLUSIVE, INSUFFICIENT) and d.seeds_needed is not None


# ------------------------------------------------------------------------------------- margins


def difference(result: Findings, d: Row, e: Estimate | None = None) -> str:
    """A row's difference (``e``, default its estimate) with its interval, in pp (fractions), %
    (log-ratio) or the quantity's units."""
    return fmt.difference_interval(d.estimate if e is None else e, d.scale, result.quantity(d.metric).percent)


def short_margin(result: Findings, d: Row) -> str:
    """The margin a row was judged against, on the scale it used; an ``auto`` quantity's absolute
    floor is named as such."""
    q = result.quantity(d.metric)
    text = fmt.margin(d.margin, d.scale, q.percent)
    if d.scale != LOG_RATIO and q.scale == AUTO and d.margin == q.abs_margin:
        text += " (the floor near zero)"
    return text


def full_margin(result: Findings, d: Row) -> str:
    """:func:`short_margin` with the log-ratio tolerance it stands for."""
    text = short_margin(result, d)
    return f"{text} ({fmt.tolerance(d.tolerance)})" if d.scale == LOG_RATIO else text


def edge_margin(result: Findings, d: Row, far: bool) -> str:
    """The margin at which a row's verdict would flip: its interval's nearest (or farthest) edge
    from zero, in the margin's terms."""
    lo, hi = d.estimate.low, d.estimate.high
    edge = max(abs(lo), abs(hi)) if far else min(abs(lo), abs(hi))
    if d.scale == LOG_RATIO:
        return fmt.margin(math.expm1(edge), LOG_RATIO, False)
    return fmt.margin(edge, d.scale, result.quantity(d.metric).percent)


def margins_of(result: Findings, metric: str) -> str:
    """The margins ``metric`` was judged against (those of its rows, in order), or its registry
    margin when no row judged it."""
    used = [short_margin(result, d) for d in rows(result) if d.metric == metric]
    return " / ".join(dict.fromkeys(used)) or result.quantity(metric).margin_text()


# -------------------------------------------------------------------------------------- values


def approximate_mark(result: Findings, group: str, metric: str) -> str:
    """``≈`` when a seed of ``group`` logged ``metric`` only as a mean of means, else ""."""
    return fmt.APPROX if any(result.run_estimate(metric, r).approximate for r in result.groups[group]) else ""


def paired_value(result: Findings, d: Difference, run: str, ci: bool = True) -> str:
    """A run's value over the paired units (with its effective sample size when ``ci``); its
    full-window value beside it when that used more units."""
    percent = result.quantity(d.metric).percent
    paired = d.reference_paired if run == d.reference else d.run_paired
    text = fmt.value(paired, percent, ci)
    if ci and math.isfinite(paired.ess):
        text += f" ESS {paired.ess:.0f}"
    full = result.run_estimate(d.metric, run)
    if full.units != paired.n_units and math.isfinite(full.estimate.value):
        text += f" (all {full.units} units: {fmt.value(full.estimate, percent, ci=False)})"
    return f"{fmt.APPROX}{text} approx." if full.approximate else text


def group_mean(result: Findings, group: str, metric: str, named: bool = False) -> str:
    """The mean over a group's seeds of their window values, after the group's name when ``named``."""
    mean = result.group_mean(group, metric)
    if not math.isfinite(mean):
        return fmt.NA
    text = approximate_mark(result, group, metric) + fmt.number(mean, result.quantity(metric).percent)
    return f"{group} {text}" if named else text


def group_value(result: Findings, group: str, metric: str) -> str:
    """:func:`group_mean` with the number of seeds it is the mean of."""
    text = group_mean(result, group, metric)
    if text == fmt.NA:
        return text
    seeds = sum(math.isfinite(result.run_estimate(metric, r).estimate.value) for r in result.groups[group])
    return f"{text} (mean of {seeds} seeds)"


def approximate(d: Row) -> str:
    """The mark before an approximate row's difference."""
    return fmt.APPROX if d.approximate else ""


def verdict_cell(d: Row) -> str:
    """A row's verdict, in parentheses when it does not count for the answer."""
    return d.verdict if d.counts_for_verdict else f"({d.verdict})"


# ------------------------------------------------------------------------------------- stretches


def spans(
    result: Findings, segments: Sequence[DifferenceSegment | GroupSegment], verdicts: bool = True
) -> str:
    """``steps 0-99 different; steps 100-199 equivalent``: segments of the window on its axis."""
    unit = AXIS_WORDS[result.align].units
    return "; ".join(
        f"{unit} {fmt.axis_value(s.start)}-{fmt.axis_value(s.end)}" + (f" {s.verdict}" if verdicts else "")
        for s in segments
    )


def spans_with_verdicts(result: Findings, segments: Sequence[DifferenceSegment | GroupSegment]) -> str:
    """``steps 0-99 (different), steps 100-199 (inconclusive)``."""
    unit = AXIS_WORDS[result.align].units
    return ", ".join(
        f"{unit} {fmt.axis_value(s.start)}-{fmt.axis_value(s.end)} ({s.verdict})" for s in segments
    )


def segments_cell(result: Findings, d: Difference) -> str:
    """A pair's segments in a table cell: how many, and those not shown within the margin."""
    if not d.segments:
        return "-"
    if not d.differing:
        return f"{len(d.segments)}, all within"
    return f"{len(d.segments)}: {spans(result, d.differing)}"
