"""The summary: the answer, how the comparison was made, one line per judged row, the audits, the
warnings and notes. Run-provided text in it is ``printable``, so each line is one of these."""

from __future__ import annotations

from dataclasses import replace
from typing import TypeAlias

from cliptrack.compare import formatting as fmt
from cliptrack.compare import reasons as r
from cliptrack.compare.findings import Difference, Findings, GroupDifference, Note
from cliptrack.compare.notes import phrases as p
from cliptrack.compare.notes.headline import headline
from cliptrack.compare.notes.sentences import sentence
from cliptrack.compare.notes.words import AXIS_WORDS, listed
from cliptrack.compare.stats import MIN_ESS, MIN_UNITS
from cliptrack.compare.stats.estimate import counted
from cliptrack.core.secrets import redact
from cliptrack.core.text import printable


def _pct(result: Findings) -> int:
    """The confidence level in percent."""
    return int(round(result.confidence * 100))


def context(result: Findings) -> str:
    """The summary's second line: axis, window, interval method and the gates of a verdict."""
    whole = result.window.start is None and result.window.end is None
    span = "all steps" if whole else f"window {result.window}"
    return (
        f"Aligned by {AXIS_WORDS[result.align].name}, {span}; {_pct(result)}% intervals: {result.method}. "
        f"No verdict below {MIN_UNITS} paired units or an effective sample size of {MIN_ESS:g}."
    )


def _pair_line(result: Findings, d: Difference) -> str:
    sw = "" if d.step_weighted is None else f"; step-weighted {p.difference(result, d, d.step_weighted)}"
    segments = f"; {counted(len(d.segments), 'segment')}" + (
        f", not within: {p.spans(result, d.differing)}" if d.differing else ""
    )
    head = (
        f"{p.what(result, d.metric)}: {printable(d.run)} {p.paired_value(result, d, d.run, ci=False)} vs "
        f"{printable(d.reference)} "
        f"{p.paired_value(result, d, d.reference, ci=False)}; difference {p.difference(result, d)} "
        f"({_pct(result)}% CI, {d.estimate.n_units} paired units, lag-1 autocorrelation "
        f"{fmt.lag1(d.estimate.lag1)}, effective sample size {fmt.ess(d.estimate.ess)}){sw}"
        f"{segments if d.segments else ''} against a margin of {p.full_margin(result, d)}"
    )
    return f"- {head} -> {d.verdict}: {printable(d.reason)}."


def _group_line(result: Findings, d: GroupDifference) -> str:
    e = d.estimate
    return (
        f"- {p.what(result, d.metric)}: {printable(d.group)} {p.group_value(result, d.group, d.metric)} vs "
        f"{printable(d.reference)} "
        f"{p.group_value(result, d.reference, d.metric)}; difference {p.difference(result, d)} "
        f"({_pct(result)}% CI over {e.seeds_a}+{e.seeds_b} seeds, between-seed variation included; "
        f"P({printable(d.group)} > {printable(d.reference)}) {fmt.probability(d.probability_greater)})"
        f"{_group_segments(result, d)} against a margin of {p.full_margin(result, d)}{_seeds_text(result, d)} "
        f"-> {d.verdict}: {printable(d.reason)}."
    )


def _group_segments(result: Findings, d: GroupDifference) -> str:
    if not d.segments:
        return ""
    return f"; {counted(len(d.segments), 'segment')} across seeds" + (
        f", not within: {p.spans(result, d.differing)}" if d.differing else ""
    )


def _seeds_text(result: Findings, d: GroupDifference) -> str:
    """The seeds (and steps) a row needs, on a row more seeds could settle only."""
    if not p.unsettled(d) or d.seeds_needed is None:
        return ""
    have = min(d.estimate.seeds_a, d.estimate.seeds_b)
    margin = p.short_margin(result, d)
    if d.seeds_needed > have:
        seeds = (
            f"{d.seeds_needed - have} more seeds per stack ({d.seeds_needed} in all) would settle {margin}"
        )
    else:
        seeds = f"{d.seeds_needed} seeds per stack would settle {margin}"
    if d.steps_factor is None:
        steps = "; more steps alone would not (the between-seed spread is too large)"
    elif d.steps_factor > 1:
        steps = f", or {fmt.factor(d.steps_factor)} the steps per seed with the present seeds"
    else:
        steps = ""
    return f"; {seeds} at the measured spread{steps}"


SEGMENTS_HEADING = "Difference over training (per segment):"
"""The heading of the per-segment table (markdown)."""


def audit_lines(result: Findings) -> list[str]:
    """One line per run and quantity where a framework's own number was logged beside our exact one
    (``Findings.audits``): both, the gap, and why they differ; run-provided text ``printable``."""
    return [
        printable(f"Audit: {a.run}: {a.sentence()}; compared on the exact {a.metric} (ratio of token sums)")
        for a in result.audits
    ]


def summary(result: Findings) -> str:
    """A plain-language summary: the answer, the method, one line per verdict quantity, warnings,
    notes; run-provided text in it is ``printable``, so each line is one of these."""
    if result.groups:
        lines = [_group_line(result, d) for d in result.group_differences if d.counts_for_verdict]
    else:
        lines = [_pair_line(result, d) for d in result.differences if d.counts_for_verdict]
    warnings = [f"Warning: {printable(n.text)}" for n in result.notes if n.warning]
    notes = [f"Note: {printable(n.text)}" for n in result.notes if not n.warning]
    audited = audit_lines(result)
    return redact("\n".join([headline(result), context(result), *lines, *audited, *warnings, *notes]))


# ------------------------------------------------------------------------------- grouped notes


Listable: TypeAlias = (
    r.Approximate | r.NonFinite | r.WeightingGap | r.Influential | r.Stretches | r.ShortMemory | r.Lagging
)
"""Note reasons whose sentence names their ``metric`` once, and so can say the same of several
quantities at once ("each of a, b and c")."""
LISTABLE = (r.Approximate, r.NonFinite, r.WeightingGap, r.Influential, r.Stretches, r.ShortMemory, r.Lagging)
"""The :data:`Listable` reasons, for ``isinstance``."""


def _same_but_metric(n: Note) -> Listable | None:
    """A note's reason with its quantity left out, when the reason is :data:`LISTABLE` and about the
    note's quantity; None otherwise (the note is shown as it is)."""
    reason = n.reason
    if not isinstance(reason, LISTABLE) or not n.metric or reason.metric != n.metric:
        return None
    return replace(reason, metric="")


def grouped_notes(result: Findings) -> list[str]:
    """How the comparison was made (axis, window, intervals, gates), then the notes, warnings
    first, each once: notes that say the same of several quantities are one line naming them all
    (written from their reason with the quantities listed)."""
    grouped: dict[tuple[bool, Listable | str], list[str]] = {}
    for n in result.notes:
        shape = _same_but_metric(n)
        metrics = grouped.setdefault((not n.warning, printable(n.text) if shape is None else shape), [])
        if shape is not None and n.metric not in metrics:
            metrics.append(n.metric)
    lines = [context(result), *audit_lines(result)]
    for (is_note, key), metrics in sorted(grouped.items(), key=lambda kv: kv[0][0]):
        text = key if isinstance(key, str) else printable(sentence(replace(key, metric=listed(metrics))))
        lines.append(f"{'Note' if is_note else 'Warning'}: {text}")
    return [redact(line) for line in lines]
