"""The headline: are the runs equally on-policy, the figure that answer rests on, what would change
it, and why (the mismatch KL's parts). Run-provided text in it is ``printable``."""

from __future__ import annotations

import math

from cliptrack.compare import formatting as fmt
from cliptrack.compare.findings import Difference, Findings, GroupDifference
from cliptrack.compare.notes import phrases as p
from cliptrack.compare.reasons import DefinedDifferently
from cliptrack.compare.stats import DIFFERENT, EQUIVALENT, INCONCLUSIVE, INSUFFICIENT, MIN_ESS, MIN_UNITS
from cliptrack.core.secrets import redact
from cliptrack.core.text import printable


def subject(result: Findings) -> str:
    """What the answer is about: these stacks (groups, with their seeds), these runs, or the runs
    compared with the reference."""
    if result.groups:
        names = [printable(g) for g in result.groups]
        seeds = " and ".join(str(len(result.groups[g])) for g in reversed(names[:2]))
        pair = f"{names[1]} and {names[0]}" if len(names) == 2 else f"the groups compared with {names[0]}"
        return f"these stacks ({pair}, {seeds} seeds)"
    if len(result.runs) == 2:  # one pair answers for these runs, never for the stacks
        return f"these runs ({printable(result.runs[1])} and {printable(result.runs[0])})"
    return f"the runs compared with {printable(result.reference)}"


def _where(result: Findings, d: p.Row, verdict: str) -> str:
    """Where in the window a row's ``verdict`` comes from, when the segments decided it: the
    different segments for ``different``; every segment not shown within, with its verdict, else."""
    if not (d.differing and d.average_verdict != verdict):
        return ""
    average = " (within the margin on average)" if d.average_verdict == EQUIVALENT else ""
    if verdict == DIFFERENT:
        spans = tuple(s for s in d.differing if s.verdict == DIFFERENT)
        return f" at {p.spans(result, spans, verdicts=False)}{average}" if spans else ""
    return f" at {p.spans_with_verdicts(result, d.differing)}{average}"


def _what_differs(result: Findings, verdict: str) -> str:
    """Which quantities (and steps) carry ``verdict``, as words: "beyond" the margin for
    ``different`` only; "not shown within" it for ``inconclusive``."""
    parts = []
    how = "beyond" if verdict == DIFFERENT else "not shown within"
    for d in p.judged(result):
        if d.verdict == verdict:
            where = _where(result, d, verdict)
            parts.append(f"{p.what(result, d.metric)} {how} {p.short_margin(result, d)}{where}")
    return "; ".join(dict.fromkeys(parts))


def _groups_segmented(result: Findings) -> bool:
    """Whether every judged group row was tested segment by segment across seeds (2+ segments)."""
    rows = p.judged(result)
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


def _insufficient(result: Findings, subject: str) -> str:
    """The quantities without data named with their reasons (each labelled when they differ), and the
    other judged quantities' own verdicts: the sentence names only what cannot be compared."""
    judged = p.judged(result)
    short = [d for d in judged if d.verdict == INSUFFICIENT]
    reasons = {printable(d.reason): d for d in short if d.reason}
    labelled = len(reasons) > 1
    why = "; ".join(f"{p.what(result, d.metric)}: {r}" if labelled else r for r, d in reasons.items())
    metrics = [d.metric for d in short] or list(result.on_policy)
    names = " and ".join(result.quantity(m).plural_label for m in metrics) or "clip fractions"
    others = "".join(
        f" The {p.what(result, d.metric)} is inconclusive: neither within nor beyond {p.short_margin(result, d)} is shown."
        if d.verdict == INCONCLUSIVE
        else f" The {p.what(result, d.metric)} is {d.verdict}."
        for d in judged
        if d.verdict != INSUFFICIENT
    )
    return (
        f"Insufficient data: the {names} of {subject} cannot be compared ({why or 'no clip counts'}).{others}"
    )


def _inconclusive(result: Findings, subject: str, margins: str) -> str:
    unclear = _what_differs(result, INCONCLUSIVE)
    return f"Inconclusive: {subject} cannot be shown equal or different within {margins}" + (
        f" ({unclear})." if unclear else "."
    )


def _answer(result: Findings) -> str:
    verdict = result.on_policy_verdict
    who = subject(result)
    margins = (
        ", ".join(f"{p.what(result, m)} {p.margins_of(result, m)}" for m in result.on_policy)
        or "no clip counts"
    )
    if verdict == INSUFFICIENT:
        return _insufficient(result, who)
    if verdict == EQUIVALENT:
        return _agree(result, who, margins)
    if verdict == DIFFERENT:
        return f"Not equally on-policy: {who} differ in {_what_differs(result, DIFFERENT)}."
    return _inconclusive(result, who, margins)


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


# --------------------------------------------------------------------- the figure and what changes it


def _figure(result: Findings, d: p.Row) -> str:
    """The second headline line: the decisive row's values, difference, interval and margin."""
    pct = int(round(result.confidence * 100))
    if isinstance(d, GroupDifference):
        e = d.estimate
        values = (
            f"{printable(d.group)} {p.group_mean(result, d.group, d.metric)} vs {printable(d.reference)} "
            f"{p.group_mean(result, d.reference, d.metric)} (means of {e.seeds_b} and {e.seeds_a} seeds)"
        )
        over = "between-seed variation included"
    else:
        percent = result.quantity(d.metric).percent
        values = (
            f"{printable(d.run)} {fmt.value(d.run_paired, percent, ci=False)} vs {printable(d.reference)} "
            f"{fmt.value(d.reference_paired, percent, ci=False)}"
        )
        over = f"{d.estimate.n_units} paired units"
    return (
        f"The figure: {p.what(result, d.metric)} {values}; difference {p.difference(result, d)} "
        f"({pct}% CI, {over}) against {p.short_margin(result, d)}."
    )


def _what_would_change(result: Findings, d: p.Row) -> str:
    """The third headline line: what would change the verdict, from the decisive row's numbers."""
    what = p.what(result, d.metric)
    if d.verdict == DIFFERENT and d.estimate.has_interval:
        return (
            f"What would change it: a {what} margin wider than {p.edge_margin(result, d, far=False)} (the "
            "interval's edge nearest zero); more seeds or steps narrow the interval around the same gap."
        )
    if d.verdict == EQUIVALENT and d.estimate.has_interval:
        return (
            f"What would change it: a {what} margin narrower than {p.edge_margin(result, d, far=True)} (the "
            "interval's edge farthest from zero)."
        )
    if isinstance(d, GroupDifference):
        if d.seeds_needed is not None:
            return (
                f"What would change it: {d.seeds_needed} seeds per stack would settle the {what} "
                f"margin of {p.short_margin(result, d)} at the measured spread."
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
        f"{d.estimate.n_units} and {fmt.ess(d.estimate.ess)}"
    )
    if not math.isfinite(d.estimate.value):
        return f"What would change it: more paired steps ({need})."
    gap = fmt.difference(d.estimate.value, d.scale, result.quantity(d.metric).percent)
    return (
        f"These runs differ by about {gap}; whether the stacks do needs 2+ seeds each "
        f"(--group NAME=RUN,RUN), or more paired steps ({need})."
    )


# ---------------------------------------------------------------------------------------- why


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


def _values(result: Findings, d: p.Row) -> str:
    """A row's two values, ``b 0.01 vs a 0.001``."""
    if isinstance(d, GroupDifference):
        return (
            f"{printable(d.group)} {p.group_mean(result, d.group, d.metric)} vs {printable(d.reference)} "
            f"{p.group_mean(result, d.reference, d.metric)}"
        )
    percent = result.quantity(d.metric).percent
    return (
        f"{printable(d.run)} {fmt.value(d.run_paired, percent, ci=False)} vs {printable(d.reference)} "
        f"{fmt.value(d.reference_paired, percent, ci=False)}"
    )


def _rows_for(result: Findings, like: p.Row) -> dict[str, p.Row]:
    """The rows of the run (or group) of ``like``, by quantity."""

    def who(d: p.Row) -> str:
        return d.group if isinstance(d, GroupDifference) else d.run

    return {d.metric: d for d in p.rows(result) if who(d) == who(like)}


def _part_said(result: Findings, d: p.Row, label: str) -> str:
    """One part of the mismatch KL in words: its verdict and the two values (its margin when equal)."""
    percent = result.quantity(d.metric).percent
    within = f", within {fmt.margin(d.margin, d.scale, percent)}" if d.verdict == EQUIVALENT else ""
    return f"the {label} part {_PART_VERDICT[d.verdict]} ({_values(result, d)}{within})"


def why(result: Findings) -> str:
    """Why the runs are (or are not) equally on-policy: the verdicts of the mismatch KL's drift and
    engine parts (:data:`CAUSES`) for the decisive row's run or group, the sampler's weight lag
    where logged, and which cause the gap comes from when exactly one part differs. Empty when
    the runs do not log the parts."""
    decisive = p.decisive(result)
    rows = _rows_for(result, decisive) if decisive is not None else {}
    parts = [(rows[name], label, cause) for name, label, cause in CAUSES if name in rows]
    if not parts:
        return ""
    said = "; ".join(_part_said(result, d, label) for d, label, _ in parts)
    lag = rows.get("weight_lag")
    lag_text = f"; the sampler's mean weight lag: {_values(result, lag)} versions" if lag is not None else ""
    differing = [(label, cause) for d, label, cause in parts if d.verdict == DIFFERENT]
    cause = ""
    if len(differing) == 1 and len(parts) == len(CAUSES):
        cause = f". The gap is in the {differing[0][0]} part: {differing[0][1]}"
    return f"Why: of the mismatch KL, {said}{lag_text}{cause}."


def headline_lines(result: Findings) -> list[str]:
    """At most four lines: the verdict (``headline``), the figure it rests on, what would change
    it, and, when the runs log the mismatch KL's parts, why (:func:`why`)."""
    d = p.decisive(result)
    lines = [headline(result)]
    if d is not None:
        lines += [_figure(result, d), _what_would_change(result, d)]
    reason = why(result)
    if reason:
        lines.append(reason)
    return [redact(line) for line in lines]
