"""Reasons into sentences: the comparison's explanations of its verdicts and notes.

``sentence(reason)`` turns a reason of ``reasons`` (a verdict reason or a note reason) into words,
true of the numbers the reason holds; ``note(metric, run, reason)`` makes the ``Note`` a result
carries. Nothing edits a sentence after it is written here: a different wording is a different
reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import singledispatch

from cliptrack.compare import formatting
from cliptrack.compare import reasons as r
from cliptrack.compare.findings import Audit, Note
from cliptrack.compare.notes.words import AXIS_WORDS
from cliptrack.compare.stats.estimate import ABSOLUTE, DIFFERENT, EQUIVALENT, LOG_RATIO, counted


def steps_text(steps: Sequence[int], most: int = 6) -> str:
    """Steps as ranges, ``"100-199, 250"``, the first ``most`` ranges and a count of the rest."""
    ranges: list[list[int]] = []
    for step in sorted(steps):
        if ranges and step == ranges[-1][1] + 1:
            ranges[-1][1] = step
        else:
            ranges.append([step, step])
    words = [f"{a}" if a == b else f"{a}-{b}" for a, b in ranges[:most]]
    if len(ranges) > most:
        words.append(f"and {len(ranges) - most} more ranges")
    return ", ".join(words)


def span_text(span: r.Span) -> str:
    """``"steps 100-199"``: a stretch of the window on its axis."""
    return f"{AXIS_WORDS[span.align].units} {span.start:g}-{span.end:g}"


def densities_text(densities: Sequence[r.TokenDensity]) -> str:
    """``"a logs loss_tokens:sum at 90 of 100 steps, ..."``: how densely each run logs its tokens."""
    return ", ".join(f"{d.run} logs loss_tokens:sum at {d.logged} of {d.span} steps" for d in densities)


def note(metric: str, run: str, reason: r.NoteReason) -> Note:
    """The note a result carries for ``reason`` about ``metric`` of ``run`` ("" for the comparison)."""
    return Note(metric, run, sentence(reason), warning=reason.warning, reason=reason)


@singledispatch
def sentence(reason: object) -> str:
    """The reason in words (one clause or sentence, no final period)."""
    raise TypeError(f"no sentence for {type(reason).__name__}: {reason!r}")


# ----------------------------------------------------------------------------- verdict reasons


@sentence.register
def _(reason: r.WholeWindow) -> str:
    if reason.verdict == EQUIVALENT:
        tail = {
            r.SEGMENTS: ", and so does every segment's",
            r.WINDOW: "",
            r.SEEDS: " (the window average over seeds; the window is too short to test segments of it across seeds)",
        }[reason.tested]
        return f"the whole interval lies within the margin{tail}"
    if reason.verdict == DIFFERENT:
        return "the whole interval lies outside the margin"
    if reason.detected:
        return "a difference is detected (the interval excludes 0) but it may be within the margin"
    return "the interval is wider than the margin"


@sentence.register
def _(reason: r.NotThroughout) -> str:
    spans = ", ".join(f"{span_text(s)} ({s.verdict})" for s in reason.spans)
    if reason.window.verdict == EQUIVALENT:
        whole = "the whole-window interval lies within the margin, but"
    else:
        whole = f"{sentence(reason.window)};"
    return f"{whole} not throughout the window: {spans}"


@sentence.register
def _(reason: r.RestsOnUnits) -> str:
    where = ", ".join(f"{x:g}" for x in reason.xs)
    unit = "step" if reason.by_step else "the unit at x ="
    return (
        f"the whole interval lies outside the margin only with {unit} {where}: leaving out any one of "
        "them (or the outliers among them together) brings it back, and single steps do not make a "
        "difference"
    )


@sentence.register
def _(reason: r.NothingLogged) -> str:
    return f"{reason.run} logs no {reason.key} in the window"


@sentence.register
def _(reason: r.NoCommonUnits) -> str:
    return "no unit where both runs logged finite values"


@sentence.register
def _(reason: r.ZeroDenominator) -> str:
    return (
        f"{reason.run} logged 0 {reason.key} at all {reason.units} paired units: {reason.metric} is undefined"
    )


@sentence.register
def _(reason: r.NoLogRatio) -> str:
    return f"{reason.metric} is not positive in both runs, so it has no log-ratio"


@sentence.register
def _(reason: r.TooLittleData) -> str:
    return reason.account or "no interval"


# -------------------------------------------------------------------------------- note reasons


@sentence.register
def _(reason: r.Approximate) -> str:
    return (
        f"{reason.run}: {reason.metric} is approximate: its tracker logged {reason.key} only as a mean "
        "of per-sample or per-micro-batch means (no token counts), so this is the mean of that value "
        "over steps, not a ratio of token sums"
    )


@sentence.register
def _(reason: r.FrameworkRun) -> str:
    parts = [
        f"{reason.run}: logged by {reason.framework} itself (its own metric names, read through the table "
        f"of {reason.framework} {reason.version}: docs/FRAMEWORKS.md)"
    ]
    if reason.approximate:
        parts.append(f"{', '.join(reason.approximate)} approximate (a mean of means, or the old log-probs)")
    if reason.per_step:
        parts.append(
            f"{', '.join(reason.per_step)} exact within each step but without token counts, so compared "
            "as the mean over steps"
        )
    if reason.different:
        parts.append(
            f"{', '.join(reason.different)} a different quantity, shown under its own name, not compared"
        )
    return "; ".join(parts)


@sentence.register
def _(reason: r.LoggedTwice) -> str:
    return (
        f"{reason.run}: {reason.key} logged more than once with different values at "
        f"{counted(len(reason.steps), 'step')} ({steps_text(reason.steps)}): the last value logged is kept, "
        "as when a resumed run replays its last steps"
    )


@sentence.register
def _(reason: r.RefusedCounts) -> str:
    return (
        f"{reason.run}: {reason.key} is {reason.problem} at {counted(len(reason.steps), 'step')} "
        f"({steps_text(reason.steps)}): not a valid token count, so those steps are refused (left out of "
        f"{', '.join(reason.metrics)})"
    )


@sentence.register
def _(reason: r.SparseTokenAxis) -> str:
    return (
        f"tokens seen counts only the steps that logged loss_tokens:sum ({densities_text(reason.densities)}); "
        "every run skips steps alike, so the axis is scaled alike in all runs, but its values are below "
        "the tokens trained on"
    )


@sentence.register
def _(reason: r.NotInWindow) -> str:
    return f"{reason.run} logs no {reason.estimand} in the window"


@sentence.register
def _(reason: r.NonFinite) -> str:
    per = reason.per
    first = "?" if reason.first is None else f"{reason.first:g}"
    tail = " from there to the end" if reason.to_end else ""
    return (
        f"{reason.run}: {reason.estimand} is NaN or infinite at {reason.count} of {reason.units} {per}s "
        f"(first at {per} {first}{tail}); those {per}s are left out of {reason.metric} for this run and of "
        "its paired difference"
    )


@sentence.register
def _(reason: r.Unlogged) -> str:
    return (
        f"{reason.run}: {reason.estimand} not logged at {reason.count} of {reason.units} {reason.per}s "
        "(left out, nothing is counted as 0)"
    )


@sentence.register
def _(reason: r.WeightingGap) -> str:
    return (
        f"{reason.subject}: {reason.metric} token-weighted {reason.token:.4g} and step-weighted "
        f"{reason.step:.4g} differ by more than the margin: steps with more tokens behave differently "
        "from the others; the verdict is on the token-weighted ratio of sums"
    )


@sentence.register
def _(reason: r.MissingPattern) -> str:
    def value(v: float) -> str:
        return f"{v * 100:.2f}%" if reason.percent else f"{v:.4g}"

    name = reason.metric
    return (
        f"{reason.absent} lacks a valid {name} at {counted(reason.count, 'unit')} where {reason.present} has "
        f"one, and there {reason.present}'s {name} is {value(reason.there)} against {value(reason.paired)} at "
        f"the paired units: units are missing in a pattern tied to {name}, so the paired comparison may be "
        "biased"
    )


@sentence.register
def _(reason: r.AbsoluteScale) -> str:
    name = reason.metric

    def value(v: float) -> str:
        return f"{v * 100:.3g}%" if reason.percent else f"{v:.4g}"

    floor = formatting.margin(reason.abs_margin, ABSOLUTE, reason.percent)
    relative = formatting.margin(reason.margin, LOG_RATIO, reason.percent)
    return (
        f"{reason.run} vs {reason.reference}: {name} compared on the absolute scale ({floor}, the floor near "
        f"zero) instead of {relative}: relative margins apply only when both runs' {name} is "
        f"clearly away from zero (both intervals on one side of 0 and |{name}| >= {value(reason.floor)}); here "
        f"{value(reason.reference_value)} and {value(reason.run_value)}"
    )


@sentence.register
def _(reason: r.PairedOnly) -> str:
    return (
        f"{reason.run} vs {reason.reference}: {reason.count} units with a valid {', '.join(reason.metrics)} "
        "in only one run are left out of the paired comparison; per-run values are shown over the paired "
        "units, the full-window value beside them"
    )


@sentence.register
def _(reason: r.Influential) -> str:
    where = ", ".join(f"{x:g}" for x in reason.xs)
    unit = "step" if reason.by_step else "the unit at x ="
    return (
        f"{reason.run} vs {reason.reference}: the whole-window {reason.metric} verdict ({reason.verdict}) "
        f"rests on single units: leaving out {unit} {where} (any one of them, or the outliers among them "
        "together) changes it; look at those steps"
    )


def _size_text(size: float, scale: str, percent: bool) -> str:
    if scale == "log-ratio":
        return f"{math.exp(size):.2g}×"
    return f"{size * 100:+.3g} pp" if percent else f"{size:+.3g}"


@sentence.register
def _(reason: r.Stretches) -> str:
    spans = ", ".join(
        f"{span_text(s)} ({_size_text(v, reason.scale, reason.percent)})"
        for s, v in zip(reason.spans, reason.sizes, strict=True)
    )
    return (
        f"{reason.run} vs {reason.reference}: {reason.metric} differs beyond the margin during {spans}; "
        "a stretch of one pair of runs is named, not a verdict (whether the stacks differ there needs "
        "2+ seeds each)"
    )


@sentence.register
def _(reason: r.ShortMemory) -> str:
    return (
        f"{reason.run} vs {reason.reference}: {reason.metric} is equivalent over {reason.units} paired units, "
        "short of the about 470 the long-memory test needs (more with a trend or strong persistence): the "
        "interval assumes short memory (docs/STATISTICS.md, long memory)"
    )


@sentence.register
def _(reason: r.Lagging) -> str:
    return (
        f"{reason.run} vs {reason.reference}: {reason.behind}'s {reason.metric} curve lags {reason.ahead}'s by "
        f"{abs(reason.shift):g} {AXIS_WORDS[reason.align].units} ({abs(reason.lag)} units; shifting it removes "
        f"{reason.gain * 100:.0f}% of the squared difference of the smoothed curves): the difference is "
        "mostly a shift in time, not a level"
    )


@sentence.register
def _(reason: r.SeedsCovered) -> str:
    sizes = ", ".join(f"{group}: {seeds} seeds" for group, seeds in reason.sizes)
    return f"stacks compared over seeds ({sizes}): intervals include the between-seed variation"


@sentence.register
def _(reason: r.OnePerStack) -> str:
    return (
        "one run per stack: seed-to-seed variation is not covered, so a difference may be the seeds', not "
        "the stacks' (compare groups of 2+ seeds per stack with --group)"
    )


RECIPE_WORDS = {
    "loss": ("use the losses", "clip fractions are not measured alike"),
    "clip_band": ("clip at", "clip fractions are not measured alike"),
    "clip_reference": ("clip against the log-probs of the", "clip fractions are not measured alike"),
    "ratio_outside": ("count ratios outside", "ratio-outside fractions are not measured alike"),
    "aggregation": (
        "aggregate the loss by",
        "their gradients weight tokens differently (counts are unaffected)",
    ),
}
"""A recipe field in words: what the runs do with it, and what a difference means."""


@sentence.register
def _(reason: r.RecipesDiffer) -> str:
    doing, meaning = RECIPE_WORDS[reason.field]
    values = ", ".join(f"{value} ({run})" for run, value in reason.values)
    return f"these runs {doing} {values}: {meaning}"


@sentence.register
def _(reason: r.DefinedDifferently) -> str:
    return (
        f"{reason.label}: no verdict, as it is defined differently in these runs (recipe "
        f"{', '.join(reason.fields)}); each run's own estimate is shown"
    )


@sentence.register
def _(reason: r.RecipeUnknown) -> str:
    return (
        f"{', '.join(reason.runs)}: no recipe recorded (loss, clip bounds, clip reference), so whether "
        "their clip fractions were counted like the others' is not known"
    )


def audit_text(a: Audit) -> str:
    """``TRL's clip_ratio/region_mean 3.1 % vs exact 2.4 % (+0.7 pp): TRL averages micro-steps``:
    a framework's own number beside the exact one, the gap, and why they differ."""
    if a.percent:
        shown, gap = f"{a.theirs * 100:.3g} %", f"{a.gap * 100:+.2g} pp"
        exact = f"{a.exact * 100:.3g} %"
    else:
        shown, exact, gap = f"{a.theirs:.4g}", f"{a.exact:.4g}", f"{a.gap:+.2g}"
    why = a.why or f"{a.framework}'s number is exact within each step; the window weights steps alike"
    return f"{a.framework}'s {a.name} {shown} vs exact {exact} ({gap}): {why}"
