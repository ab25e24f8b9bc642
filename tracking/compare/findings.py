"""What the comparison found, as plain dataclasses: per-run estimates, differences of pairs and of
groups, notes, and ``Findings``, all of them with the lookups and the combined verdict.

``engine.compare`` builds them once; the reasons behind each verdict and note are kept beside
their sentences (``reasons``, ``notes``). ``result.ComparisonResult`` is ``Findings`` with its
renderings (``report``) as methods.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cliptrack.compare.quantities import Quantity
from cliptrack.compare.stats.estimate import (
    DIFFERENT,
    EQUIVALENT,
    INCONCLUSIVE,
    INSUFFICIENT,
    LOG_RATIO,
    Estimate,
)

if TYPE_CHECKING:
    from cliptrack.compare.reasons import NoteReason, VerdictReason
    from cliptrack.compare.stats.estimate import GroupEstimate
    from cliptrack.compare.window import Window
    from cliptrack.compare.worst import WorstSequences

FAIL_ON = ("different", "not-equivalent")
"""``--fail-on`` choices: trip the gate on a ``different`` answer, or on anything but ``equivalent``."""


@dataclass(frozen=True)
class RunEstimate:
    """One run's estimate of one quantity over every unit of the window it logged validly.

    ``estimate``: the ratio of sums (token-weighted for fractions); ``step_weighted``: the mean of
    the per-unit ratios over the same units (every step counts once), shown beside it.
    ``units``: units with finite, valid numerator and denominator; ``nonfinite``: units where the
    run logged a NaN or infinite value of a key of this quantity; ``invalid``: units refused as
    bad data (a count above its total, negative or fractional); ``missing``: units the run logged
    (some metric) without this quantity's keys; ``first_nonfinite``: x of the first non-finite
    unit (step, or bin centre). Totals are the sums over ``units``. ``group``: the run's group
    ("" when the comparison has no groups).
    """

    metric: str
    run: str
    backend: str
    estimate: Estimate
    total_numerator: float
    total_denominator: float
    units: int
    nonfinite: int = 0
    missing: int = 0
    first_nonfinite: float | None = None
    wilson_low: float = float("nan")
    wilson_high: float = float("nan")
    approximate: bool = False
    """The run's tracker logged this quantity only as a mean of per-sample or per-micro-batch means."""
    step_weighted: Estimate | None = None
    invalid: int = 0
    group: str = ""


@dataclass(frozen=True)
class DifferenceSegment:
    """The paired difference over one segment of the window: units ``[start_unit, stop_unit)`` of
    the paired units, whose x (step, tokens seen or seconds; bin centres when binned) runs from
    ``start`` to ``end`` inclusive. ``episode``: a stretch found by the episode scan
    (``stats.segment_differences``), not one of the equal segments."""

    start: float
    end: float
    start_unit: int
    stop_unit: int
    estimate: Estimate
    verdict: str
    episode: bool = False


@dataclass(frozen=True)
class Lead:
    """One run's curve lagging the other's (``stats.lead_lag``): ``lag`` in paired units (positive:
    the compared run lags the reference), ``shift`` the same on the x axis (steps when aligned by
    step); ``gain``: share of the squared difference of the smoothed curves the shift removes
    (0..1); ``explained``: the shift accounts for most of the difference."""

    lag: int
    shift: float
    gain: float
    explained: bool


@dataclass(frozen=True)
class Difference:
    """Run ``run`` minus the reference on one quantity, over the units both logged validly.

    ``estimate`` is ``R_run - R_ref`` (``scale="absolute"``) or ``s * log(R_run / R_ref)``
    (``"log-ratio"``, ``s`` the sign of the ratios); ``tolerance`` is on the same scale (for a
    log-ratio, ``log(1 + margin)``) and ``margin`` is the margin as stated (0.05 = ±5 %).
    ``reference_paired`` / ``run_paired``: each run's estimate over the same paired units.
    ``verdict`` holds throughout the window: ``equivalent`` only when the whole-window interval
    and every segment's interval lie within the margin; ``average_verdict`` is the whole-window
    interval's verdict alone; ``segments`` the per-segment differences, ``differing`` those that
    keep the verdict from ``equivalent``. ``step_weighted``: the same difference of per-unit ratios
    (every step counts once). ``influential``: x of single units whose removal changes the
    verdict. ``lead``: a lag between the two curves, when one was found.
    ``reason`` says why the verdict is what it is (always set for ``insufficient data``); ``why``
    holds that reason as data (``reasons``).
    """

    metric: str
    reference: str
    run: str
    estimate: Estimate
    reference_paired: Estimate
    run_paired: Estimate
    tolerance: float
    margin: float
    scale: str
    verdict: str
    reason: str
    counts_for_verdict: bool
    approximate: bool = False
    """Either run's value is approximate (see :attr:`RunEstimate.approximate`)."""
    average_verdict: str = ""
    segments: tuple[DifferenceSegment, ...] = ()
    differing: tuple[DifferenceSegment, ...] = ()
    step_weighted: Estimate | None = None
    influential: tuple[float, ...] = ()
    lead: Lead | None = None
    why: VerdictReason | None = None
    """The reason ``reason`` words (``reasons``), as data."""

    @property
    def relative(self) -> bool:
        return self.scale == LOG_RATIO


@dataclass(frozen=True)
class GroupSegment:
    """A group difference over one step range of every seed (segments across seeds): x from
    ``start`` to ``end`` inclusive (steps, tokens seen or seconds), each seed's ratio of sums over it,
    the Welch interval over seeds (``estimate``) and its verdict (``stats.seeds.segment_verdict``)."""

    start: float
    end: float
    estimate: GroupEstimate
    verdict: str
    episode: bool = False


@dataclass(frozen=True)
class GroupDifference:
    """Group ``group`` minus group ``reference`` (stacks, each a list of seeds) on one quantity.

    ``estimate`` (``stats.GroupEstimate``): the difference of the groups' mean per-seed values
    (absolute or log-ratio, as ``scale``) with an interval that includes the between-seed
    variation. ``seeds_needed``: seeds per group for the interval to fall within the margin (80 %
    power when the stacks are equal) at the measured spread (None when it cannot be said);
    ``steps_factor``: how many times the steps per seed would settle it with the present seeds
    (None when more steps alone cannot: the between-seed spread is too large).
    ``probability_greater``: P(group > reference) (``stats.estimate.probability_greater``).
    ``segments``: the same step ranges judged across seeds (empty when the window is too short for
    two, under ``2 * MIN_SEGMENT_UNITS`` units in its shortest seed); ``differing``: those not shown
    within the margin; ``average_verdict``: the whole window's verdict alone (``verdict`` is the
    verdict throughout: the window and every segment).
    """

    metric: str
    reference: str
    group: str
    estimate: GroupEstimate
    tolerance: float
    margin: float
    scale: str
    verdict: str
    reason: str
    counts_for_verdict: bool
    seeds_needed: int | None
    approximate: bool = False
    why: VerdictReason | None = None
    """The reason ``reason`` words (``reasons``), as data."""
    probability_greater: float = float("nan")
    steps_factor: float | None = None
    segments: tuple[GroupSegment, ...] = ()
    differing: tuple[GroupSegment, ...] = ()
    average_verdict: str = ""


@dataclass(frozen=True)
class Note:
    """Something the reader must know about a quantity of a run (``run`` "" when about the comparison).

    ``warning``: flagged in the summary (non-finite values, bad data, a scale switched, a metric
    missing). ``reason``: what ``text`` says, as data (``reasons``; None for a note made from text).
    """

    metric: str
    run: str
    text: str
    warning: bool = False
    reason: NoteReason | None = None


def combined_verdict(verdicts: list[str]) -> str:
    """``different`` if any is, else ``insufficient data``, else ``inconclusive``, else
    ``equivalent`` (``insufficient data`` when there is none)."""
    if not verdicts:
        return INSUFFICIENT
    for worst in (DIFFERENT, INSUFFICIENT, INCONCLUSIVE):
        if worst in verdicts:
            return worst
    return EQUIVALENT


@dataclass(frozen=True)
class Audit:
    """A framework's own number beside cliptrack's exact one, for one quantity of one run (the
    aggregation audit, ``cliptrack.compare.audit``).

    ``name``: the metric as the framework logged it; ``theirs``: its mean over the window's steps
    that logged both; ``exact``: the ratio of our token sums over the same steps (both in the
    quantity's units); ``steps``: how many; ``why``: what the framework does differently ("TRL
    averages micro-steps"; "" when its number is exact within each step); ``percent``: shown in
    percent (the gap in percentage points); ``text``: all of it in words (``notes.audit_text``)."""

    run: str
    metric: str
    framework: str
    name: str
    theirs: float
    exact: float
    steps: int
    why: str = ""
    percent: bool = False
    text: str = ""

    @property
    def gap(self) -> float:
        """``theirs - exact``, in the quantity's units."""
        return self.theirs - self.exact

    def sentence(self) -> str:
        """The audit in words (``text``, written by ``cliptrack.compare.notes.audit_text``)."""
        return self.text


@dataclass
class Findings:
    """Everything ``compare`` found (``result.ComparisonResult`` adds the renderings as methods).

    ``quantities``: the registry entries compared, with the margins and estimand in use.
    ``on_policy``: names of the quantities the "equally on-policy" answer is judged on (those
    marked ``on_policy`` that the runs log). ``groups``: group name -> run labels (empty for a
    comparison of runs; then seed-to-seed variation is not covered, and a note says so).
    """

    runs: list[str]
    backends: dict[str, str]
    align: str
    window: Window
    confidence: float
    method: str
    quantities: list[Quantity]
    estimates: list[RunEstimate] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    on_policy: list[str] = field(default_factory=list)
    groups: dict[str, list[str]] = field(default_factory=dict)
    group_differences: list[GroupDifference] = field(default_factory=list)
    audits: list[Audit] = field(default_factory=list)
    """Where a run logged a framework's own number beside our exact one: both and the gap (the
    comparison uses the exact one)."""
    worst: WorstSequences | None = None
    """The runs' worst sequences and those that recur (``cliptrack.compare.worst``): a diagnostic
    beside the verdicts, set by ``cliptrack compare`` when the runs logged tables; no verdict reads it."""

    @property
    def reference(self) -> str:
        return self.runs[0]

    @property
    def seeds_covered(self) -> bool:
        """Whether the verdicts include seed-to-seed variation (groups of 2+ seeds were compared)."""
        return bool(self.groups)

    def quantity(self, metric: str) -> Quantity:
        for q in self.quantities:
            if q.name == metric:
                return q
        raise KeyError(f"no quantity {metric!r}; compared: {[q.name for q in self.quantities]}")

    def difference(self, metric: str, run: str | None = None) -> Difference:
        """The difference of ``run`` (default: the second run) from the reference on ``metric``."""
        run = run or self.runs[1]
        for d in self.differences:
            if d.metric == metric and d.run == run:
                return d
        raise KeyError(f"no difference for metric {metric!r} and run {run!r}")

    def group_difference(self, metric: str, group: str | None = None) -> GroupDifference:
        """The difference of ``group`` (default: the second group) from the first on ``metric``."""
        group = group or list(self.groups)[1]
        for d in self.group_differences:
            if d.metric == metric and d.group == group:
                return d
        raise KeyError(f"no group difference for metric {metric!r} and group {group!r}")

    def run_estimate(self, metric: str, run: str) -> RunEstimate:
        for e in self.estimates:
            if e.metric == metric and e.run == run:
                return e
        raise KeyError(f"no estimate for metric {metric!r} and run {run!r}")

    def group_mean(self, group: str, metric: str) -> float:
        """The mean over ``group``'s seeds of their window values of ``metric`` (the quantity's
        units; seeds without a finite value left out; NaN when none has one)."""
        values = [self.run_estimate(metric, r).estimate.value for r in self.groups[group]]
        finite = [v for v in values if math.isfinite(v)]
        return sum(finite) / len(finite) if finite else float("nan")

    def notes_for(self, metric: str) -> list[Note]:
        return [n for n in self.notes if n.metric == metric]

    def verdicts(self, metric: str) -> list[str]:
        """Every verdict on ``metric``: group differences when groups were compared, else pairs."""
        rows: list[Difference] | list[GroupDifference] = (
            self.group_differences if self.groups else self.differences
        )
        return [d.verdict for d in rows if d.metric == metric]

    @property
    def on_policy_verdict(self) -> str:
        """The answer to "equally on-policy?" over every compared pair (or group) and every quantity
        in :attr:`on_policy`, each against its own margin: ``different`` if any differs, else
        ``insufficient data`` if any has too little data, else ``inconclusive`` if any is, else
        ``equivalent`` (which then holds throughout the window)."""
        return combined_verdict([v for name in self.on_policy for v in self.verdicts(name)])

    def gate_tripped(self, fail_on: str) -> bool:
        """Whether a CI gate ``--fail-on fail_on`` trips: ``different`` trips on a ``different``
        on-policy answer; ``not-equivalent`` on anything but ``equivalent``."""
        if fail_on not in FAIL_ON:
            raise ValueError(f"fail_on {fail_on!r} is not one of {FAIL_ON}")
        verdict = self.on_policy_verdict
        return verdict == DIFFERENT if fail_on == "different" else verdict != EQUIVALENT
