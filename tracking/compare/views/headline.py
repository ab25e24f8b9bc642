"""The dashboard's headline, three short lines laid out from the result's numbers: the verdict
(with the on-policy quantities that decide it, as ratios), the figure it rests on with its
interval and margin, and what would change it; and, when a control comparison was run (the demo's
Megatron path as stale as Miles, against Miles), one line with the control's verdict and what it
says of the cause.

The long form of each line (the report's prose) stays in the dashboard's folded details.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cliptrack.compare.findings import Difference, Findings, GroupDifference
from cliptrack.compare.stats.estimate import DIFFERENT, EQUIVALENT, INCONCLUSIVE, INSUFFICIENT
from cliptrack.compare.views.differences import (
    edge_margin,
    interval_text,
    level_text,
    margin_text,
    short_label,
    short_text,
    value_text,
    values_of,
    who,
)
from cliptrack.core.text import printable

OPENING = {
    EQUIVALENT: "Equally on-policy",
    DIFFERENT: "Not equally on-policy",
    INCONCLUSIVE: "Inconclusive",
    INSUFFICIENT: "Insufficient data",
}
"""The first words of the headline, by on-policy verdict."""


def _rows(result: Findings) -> list[Difference | GroupDifference]:
    """The rows judged for "equally on-policy"."""
    found: list[Difference | GroupDifference] = list(
        result.group_differences if result.groups else result.differences
    )
    return [d for d in found if d.metric in result.on_policy]


def decisive(result: Findings) -> Difference | GroupDifference | None:
    """The judged row that carries the on-policy verdict (the first with that verdict)."""
    judged = _rows(result)
    verdict = result.on_policy_verdict
    return next((d for d in judged if d.verdict == verdict), judged[0] if judged else None)


def subject(result: Findings) -> str:
    """What was compared: ``miles vs megatron (3 seeds each)``, ``run-b vs run-a (150 paired steps)``."""
    if result.groups:
        names = list(result.groups)
        sizes = {len(result.groups[g]) for g in names}
        seeds = (
            f"{sizes.pop()} seeds each"
            if len(sizes) == 1
            else "seeds: " + ", ".join(f"{len(result.groups[g])}" for g in names)
        )
        others = ", ".join(printable(g) for g in names[1:])
        return f"{others} vs {printable(names[0])} ({seeds})"
    others = ", ".join(printable(r) for r in result.runs[1:])
    return f"{others} vs {printable(result.reference)} (one run each: seeds not covered)"


def _label(result: Findings, d: Difference | GroupDifference) -> str:
    return short_label(result.quantity(d.metric).label)


def _verdict_line(result: Findings) -> str:
    verdict = result.on_policy_verdict
    opening = OPENING.get(verdict, verdict)
    judged = _rows(result)
    if verdict == EQUIVALENT:
        return f"{opening}: {subject(result)} agree within every on-policy margin."
    if verdict == INSUFFICIENT:
        short = [d for d in judged if d.verdict == INSUFFICIENT]
        why = printable(short[0].reason) if short and short[0].reason else "too few paired units"
        return f"{opening}: {subject(result)}: {why}."
    shown = [d for d in judged if d.verdict == verdict]
    parts = [f"{_label(result, d)} {short_text(d, result.quantity(d.metric).percent)}" for d in shown]
    how = "differ beyond" if verdict == DIFFERENT else "not shown within or beyond"
    margins = " / ".join(dict.fromkeys(margin_text(d, result.quantity(d.metric).percent) for d in shown))
    return f"{opening}: {subject(result)} {how} {margins}: {', '.join(parts)}."


def _figure_line(result: Findings, d: Difference | GroupDifference) -> str:
    q = result.quantity(d.metric)
    mine, reference = values_of(result, d)
    pct = int(round(result.confidence * 100))
    over = (
        "between-seed variation included"
        if isinstance(d, GroupDifference)
        else (f"{d.estimate.n_units} paired steps")
    )
    return (
        f"The figure: {short_label(q.label)}, {printable(who(d))} {level_text(mine, q.percent)} vs "
        f"{printable(d.reference)} {level_text(reference, q.percent)}: {value_text(d, q.percent)}, "
        f"{pct} % interval {interval_text(d, q.percent)} ({over}), margin {margin_text(d, q.percent)}."
    )


def _change_line(result: Findings, d: Difference | GroupDifference) -> str:
    e = d.estimate
    has_interval = math.isfinite(e.low) and math.isfinite(e.high)
    if d.verdict == DIFFERENT and has_interval:
        return (
            f"What would change it: only a margin wider than {edge_margin(d, far=False)}; more seeds "
            "or steps narrow the interval, not the gap."
        )
    if d.verdict == EQUIVALENT and has_interval:
        return f"What would change it: a margin narrower than {edge_margin(d, far=True)}."
    if isinstance(d, GroupDifference) and d.seeds_needed is not None:
        return f"What would change it: about {d.seeds_needed} seeds per stack, at the measured spread."
    if isinstance(d, GroupDifference):
        return "What would change it: more seeds per stack."
    return "What would change it: more paired steps, or seeds compared as groups (--group)."


def headline_lines(result: Findings) -> list[str]:
    """Three lines: the verdict, the figure with its interval, what would change it (one line, the
    verdict, when nothing was judged)."""
    d = decisive(result)
    lines = [_verdict_line(result)]
    if d is not None:
        lines += [_figure_line(result, d), _change_line(result, d)]
    return lines


@dataclass(frozen=True)
class Control:
    """A control comparison shown beside the main one: ``result``, what it compares (``what``:
    "megatron-stale2 (the Megatron path as stale as Miles) vs miles"), and the cause it holds
    equal on both sides (``holds``: "staleness")."""

    result: Findings
    what: str
    holds: str


def control_line(control: Control, main_verdict: str) -> str:
    """``Control (what): equivalent, clip fraction +1.58 % within ±25 %: staleness is the cause.``
    The cause is named only when the main comparison differs and the control does not."""
    result = control.result
    verdict = result.on_policy_verdict
    d = decisive(result)
    figure = ""
    if d is not None:
        q = result.quantity(d.metric)
        pct = int(round(result.confidence * 100))
        figure = (
            f": {short_label(q.label)} {value_text(d, q.percent)} ({pct} % interval "
            f"{interval_text(d, q.percent)}, margin {margin_text(d, q.percent)})"
        )
    if main_verdict == DIFFERENT and verdict == EQUIVALENT:
        meaning = f". {control.holds[:1].upper()}{control.holds[1:]} is the cause of the gap, not the stack"
    elif main_verdict == DIFFERENT and verdict == DIFFERENT:
        meaning = f". The gap remains at equal {control.holds}: {control.holds} alone does not explain it"
    else:
        meaning = ""
    return f"Control: {verdict} — {printable(control.what)}{figure}{meaning}."
