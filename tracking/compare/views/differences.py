"""The comparison's differences as a reader takes them in: a log-ratio difference as a ratio
(``×7.76 (+676 %)`` from 2-fold up, ``+1.58 %`` below), a fraction's absolute difference in
percentage points, anything else in its own units; one row per compared quantity that counts for a
verdict, with the values, the interval, the margin and the verdict.

Layout only: every number comes from the result (``findings``); nothing here judges anything.
Throughput is *machine-dependent* (``MACHINE_DEPENDENT``): its value depends on the machine each
run ran on and its load, not on the stack, so its rows are marked as such and never styled as an
on-policy difference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cliptrack.compare.findings import Difference, Findings, GroupDifference
from cliptrack.compare.stats.estimate import LOG_RATIO

MACHINE_DEPENDENT = frozenset({"throughput"})
"""Compared quantities whose value depends on the machine a run ran on (its hardware, its load),
not on the stack: shown apart and never styled as an on-policy difference."""
FOLD_FROM = 2.0
"""A ratio at least this (or at most its inverse) is shown as ``×r``; closer to 1 as a percentage."""


def _sig(x: float) -> str:
    """``x`` to 3 significant digits, without exponent below a million."""
    return f"{x:.3g}" if abs(x) < 1e6 else f"{x:.2e}"


def folds(log_ratio: float) -> bool:
    """Whether a log-ratio difference is shown as a ratio ``×r`` (2-fold or more either way)."""
    return math.isfinite(log_ratio) and abs(log_ratio) >= math.log(FOLD_FROM)


def percent_change(log_ratio: float) -> str:
    """A log-ratio difference as a relative change: ``+676 %``, ``−15 %`` (``exp(d) − 1``)."""
    change = math.expm1(log_ratio) * 100
    return f"{'+' if change >= 0 else '−'}{_sig(abs(change))} %"


def ratio(log_ratio: float) -> str:
    """A log-ratio difference as a ratio: ``×7.76``, ``×0.13``."""
    return f"×{_sig(math.exp(log_ratio))}"


def _signed(x: float, unit: str = "") -> str:
    return f"{'+' if x >= 0 else '−'}{_sig(abs(x))}{unit}"


def value_text(d: Difference | GroupDifference, percent: bool, x: float | None = None) -> str:
    """One difference (``x``, default the row's) as read: ``×7.76 (+676 %)`` or ``+1.58 %`` for
    a log ratio, ``+0.042 pp`` for a fraction, else ``−0.0108`` in the quantity's units."""
    x = d.estimate.value if x is None else x
    if not math.isfinite(x):
        return "n/a"
    if d.scale == LOG_RATIO:
        return f"{ratio(x)} ({percent_change(x)})" if folds(x) else percent_change(x)
    return _signed(x * 100, " pp") if percent else _signed(x)


def interval_text(d: Difference | GroupDifference, percent: bool) -> str:
    """The row's interval in the terms of its value: ``×6.03 to ×10`` (a ratio), ``−15 % to
    +21.4 %``, ``−0.022 to +0.106 pp``; "no interval" when there is none."""
    e = d.estimate
    if not (math.isfinite(e.low) and math.isfinite(e.high)):
        return "no interval"
    if d.scale == LOG_RATIO:
        if folds(e.value):
            return f"{ratio(e.low)} to {ratio(e.high)}"
        return f"{percent_change(e.low)} to {percent_change(e.high)}"
    if percent:
        return f"{_signed(e.low * 100)} to {_signed(e.high * 100)} pp"
    return f"{_signed(e.low)} to {_signed(e.high)}"


def margin_text(d: Difference | GroupDifference, percent: bool) -> str:
    """The margin the row was judged against: ``±25 %``, ``±0.01 pp``, ``±0.02``."""
    if d.scale == LOG_RATIO:
        return f"±{_sig(d.margin * 100)} %"
    return f"±{_sig(d.margin * 100)} pp" if percent else f"±{_sig(d.margin)}"


def level_text(value: float, percent: bool) -> str:
    """A quantity's own value: ``10.7 %`` for a fraction, ``10,490`` from 1,000 up, else ``0.0142``."""
    if not math.isfinite(value):
        return "n/a"
    if percent:
        return f"{_sig(value * 100)} %"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def short_text(d: Difference | GroupDifference, percent: bool) -> str:
    """A difference in one word: ``×7.76`` from 2-fold either way, else ``+1.58 %`` (a log ratio),
    ``+0.042 pp`` (a fraction) or the quantity's units."""
    x = d.estimate.value
    if d.scale == LOG_RATIO and folds(x):
        return ratio(x)
    return value_text(d, percent)


def short_label(label: str) -> str:
    """A quantity's label without its parenthesis: ``clip fraction`` for ``clip fraction (token-weighted)``."""
    return label.split(" (")[0]


def edge_margin(d: Difference | GroupDifference, far: bool) -> str:
    """The margin at which the row's verdict would flip: its interval's edge nearest to (or
    farthest from) no difference, in the margin's terms (``±503 %``, ``±0.04 pp``)."""
    edge = (
        max(abs(d.estimate.low), abs(d.estimate.high))
        if far
        else min(abs(d.estimate.low), abs(d.estimate.high))
    )
    if d.scale == LOG_RATIO:
        return f"±{_sig(math.expm1(edge) * 100)} %"
    return f"±{_sig(edge)}"


@dataclass(frozen=True)
class Row:
    """One compared quantity of one run (or group) against the reference, as shown: the labels,
    the two values, the difference, its interval, the margin and the verdict (all text);
    ``machine``: a machine-dependent quantity; ``on_policy``: judged for "equally on-policy"."""

    metric: str
    label: str
    compared: str
    values: str
    difference: str
    interval: str
    margin: str
    verdict: str
    machine: bool
    on_policy: bool


def rows(result: Findings, every: bool = False) -> list[Row]:
    """The rows that count for a verdict (``every``: all, the diagnostic ones too), groups' rows
    when the comparison has groups, else pairs'."""
    found: list[Difference | GroupDifference] = list(
        result.group_differences if result.groups else result.differences
    )
    return [_row(result, d) for d in found if every or d.counts_for_verdict]


def values_of(result: Findings, d: Difference | GroupDifference) -> tuple[float, float]:
    """The two values a row compares, run (or group) first: the groups' means over seeds, or the
    pair's estimates over the paired units."""
    if isinstance(d, GroupDifference):
        return result.group_mean(d.group, d.metric), result.group_mean(d.reference, d.metric)
    return d.run_paired.value, d.reference_paired.value


def who(d: Difference | GroupDifference) -> str:
    """The run or group a row compares with the reference."""
    return d.group if isinstance(d, GroupDifference) else d.run


def _row(result: Findings, d: Difference | GroupDifference) -> Row:
    q = result.quantity(d.metric)
    mine, reference = values_of(result, d)
    return Row(
        metric=d.metric,
        label=q.label,
        compared=f"{who(d)} vs {d.reference}",
        values=f"{level_text(mine, q.percent)} vs {level_text(reference, q.percent)}",
        difference=value_text(d, q.percent),
        interval=interval_text(d, q.percent),
        margin=margin_text(d, q.percent),
        verdict=d.verdict,
        machine=d.metric in MACHINE_DEPENDENT,
        on_policy=d.metric in result.on_policy,
    )
