"""``compare``: per-run estimates, paired differences against a reference run (or group differences
between stacks over seeds), verdicts that hold throughout the window, and the notes that go with
them. A pure function of the loaded runs: it builds its result once and never rewrites it.

The first run named is the reference; every other run is compared with it, and comparing A with B
mirrors comparing B with A (same verdict, negated difference). For each quantity of the registry
(``quantities.QUANTITIES``) the work is done by one module per concern:

- ``estimates``: per run, the ratio-of-sums estimate over every unit of the window it logged
  validly, the step-weighted estimate and the Wilson interval beside it, and the notes on its data;
- ``pairs``: per pair, the paired difference over the units both runs logged validly, with
  ``verdicts`` deciding the verdict throughout the window (segments, deciding units);
- ``groups``: per pair of groups (stacks, several seeds each), the difference with the
  between-seed variation and the seeds a margin needs.

Every decision is recorded as a reason (``reasons``) and worded once (``notes``). Intervals are
90 % by default (``DEFAULT_CONFIDENCE``), which makes "equivalent" a two one-sided test at the 5 %
level. There is no resampling: a comparison repeats exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from cliptrack.compare import audit
from cliptrack.compare import quantities as qs
from cliptrack.compare import reasons as r
from cliptrack.compare import stats as st
from cliptrack.compare.align import ALIGNMENTS, token_axis, unit_table
from cliptrack.compare.estimates import (
    approximate_quantities,
    data_notes,
    estimate_run,
    run_notes,
    run_weighting_note,
)
from cliptrack.compare.findings import Difference, GroupDifference, Note, RunEstimate
from cliptrack.compare.groups import group_differences, groups_by
from cliptrack.compare.notes import note
from cliptrack.compare.pairs import differences
from cliptrack.compare.quantities import Quantity
from cliptrack.compare.result import ComparisonResult
from cliptrack.compare.window import Window
from cliptrack.core import recipe as rc
from cliptrack.store.frame import RunSet

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_CONFIDENCE = 0.90
"""Two-sided confidence of every interval (TOST at 5 %)."""
DEFAULT_TOLERANCES = dict(qs.DEFAULT_MARGINS)
"""Equivalence margins by quantity (``quantities.Margin``): clip fractions, mismatch KL and the other
gauge quantities ±25 % relative with an absolute floor near zero, reward and throughput ±5 %."""
METHOD = st.METHOD
"""The interval method, as stated in every rendering."""


# ------------------------------------------------------------------------------- settings


def _run_labels(runset: RunSet, runs: Sequence[str] | None) -> list[str]:
    labels = [runset.info(run).display for run in (runs or runset.labels)]
    if len(labels) < 2:
        raise ValueError(f"compare needs at least two runs, got {labels}")
    if len(set(labels)) != len(labels):
        raise ValueError(f"a run is named twice in {labels}")
    return labels


def _group_labels(
    runset: RunSet, groups: Mapping[str, Sequence[str]]
) -> tuple[list[str], dict[str, list[str]]]:
    if len(groups) < 2:
        raise ValueError(f"compare needs at least two groups, got {list(groups)}")
    named = {name: [runset.info(run).display for run in members] for name, members in groups.items()}
    for name, members in named.items():
        if len(members) < 2:
            raise ValueError(
                f"group {name!r} has {len(members)} run(s): a group needs 2 or more seeds "
                "(compare single runs without groups)"
            )
    labels = [label for members in named.values() for label in members]
    if len(set(labels)) != len(labels):
        raise ValueError(f"a run is named twice in the groups {named}")
    return labels, named


def _labels(
    runset: RunSet, runs: Sequence[str] | None, groups: Mapping[str, Sequence[str]] | None
) -> tuple[list[str], dict[str, list[str]]]:
    """The runs compared (the first is the reference) and the groups (empty without groups)."""
    if groups is None:
        return _run_labels(runset, runs), {}
    if runs:
        raise ValueError("name runs either as runs or as groups, not both")
    return _group_labels(runset, groups)


def _logs_any(runset: RunSet, label: str, q: Quantity) -> bool:
    columns = set(runset.wide(label))
    wanted = {e.numerator for e in q.estimands} | ({q.approximate_key} if q.approximate_key else set())
    return bool(columns & wanted)


def _estimand(runset: RunSet, labels: Sequence[str], q: Quantity) -> qs.Estimand:
    """The first estimand of ``q`` every run logs (else its last)."""
    logged = [set(runset.wide(label)) for label in labels]
    return next((e for e in q.estimands if all(set(e.keys) <= keys for keys in logged)), q.estimands[-1])


def _wanted(runset: RunSet, labels: Sequence[str], quantities: Sequence[Quantity]) -> list[Quantity]:
    """Each quantity with the first estimand every run logs; an optional quantity that no run logs at
    all (the gauge of a run without it) is left out."""
    return [
        q.using(_estimand(runset, labels, q))
        for q in quantities
        if not q.optional or any(_logs_any(runset, label, q) for label in labels)
    ]


def _choose_quantities(
    runset: RunSet,
    labels: Sequence[str],
    margins: Mapping[str, qs.Margin | float],
    reward_abs_tolerance: float | None,
) -> list[Quantity]:
    """The registry with the margins given and, per quantity, the first estimand every run logs; an
    optional quantity that no run logs at all (the gauge of a run without it) is left out."""
    chosen = _wanted(runset, labels, qs.QUANTITIES)
    abs_margins = {}
    if reward_abs_tolerance is not None and "reward" in {q.name for q in chosen}:
        abs_margins = {"reward": reward_abs_tolerance}
    logged = {q.name for q in chosen}
    known = {q.name for q in qs.QUANTITIES}
    given = {name: value for name, value in margins.items() if name in logged or name not in known}
    return qs.with_margins(chosen, given, abs_margins)


def _check_settings(align: str, confidence: float) -> None:
    if align not in ALIGNMENTS:
        raise ValueError(f"alignment {align!r} is not one of {sorted(ALIGNMENTS)}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")


# ------------------------------------------------------------------------------- compare


def _on_policy(quantities: Sequence[Quantity], estimates: Sequence[RunEstimate]) -> list[str]:
    """The on-policy quantities to judge: required ones always, optional ones when every run logs them."""
    logged = {(e.metric, e.run) for e in estimates if e.units > 0}
    runs = {e.run for e in estimates}
    return [
        q.name
        for q in quantities
        if q.on_policy and (not q.optional or all((q.name, run) in logged for run in runs))
    ]


RECIPE_TOPICS: dict[str, tuple[tuple[str, ...], str]] = {
    "loss": (("loss",), "loss"),
    "clip_band": (("clip_low", "clip_high", "dual_clip"), "band_text"),
    "clip_reference": (("clip_reference",), "clip_reference"),
    "ratio_outside": (("ratio_outside_low", "ratio_outside_high"), "outside_text"),
    "aggregation": (("aggregation",), "aggregation"),
}
"""A recipe note's topic -> the recipe fields it covers and how a recipe says it (a field or a method)."""


def _recipes(runset: RunSet, labels: Sequence[str]) -> dict[str, rc.Recipe | None]:
    return {label: rc.recipe_from_config(runset.info(label).run.config) for label in labels}


def _said(recipe: rc.Recipe, how: str) -> str:
    value = getattr(recipe, how)
    return str(value() if callable(value) else value)


def _recipe_notes(recipes: Mapping[str, rc.Recipe | None]) -> list[Note]:
    """A note per recipe topic on which the runs differ, and one naming the runs that record none
    (when some do)."""
    differ = rc.differing_fields(recipes)
    known = {run: recipe for run, recipe in recipes.items() if recipe is not None}
    notes = []
    for topic, (covered, how) in RECIPE_TOPICS.items():
        if any(f in differ for f in covered):
            values = tuple((run, _said(recipe, how)) for run, recipe in known.items())
            notes.append(note("", "", r.RecipesDiffer(topic, values)))
    unknown = tuple(run for run, recipe in recipes.items() if recipe is None)
    if known and unknown:
        notes.append(note("", "", r.RecipeUnknown(unknown)))
    return notes


def _labelled(quantities: Sequence[Quantity], recipes: Mapping[str, rc.Recipe | None]) -> list[Quantity]:
    """The ratio-outside quantity labelled with the bounds the runs recorded: one pair when they
    agree, "each run's bounds" when they differ (unlabelled, the default bounds, when none records any)."""
    texts = {recipe.outside_text() for recipe in recipes.values() if recipe is not None}
    if not texts:
        return list(quantities)
    label = (
        f"tokens with ratio outside {next(iter(texts))}"
        if len(texts) == 1
        else "tokens with ratio outside each run's bounds"
    )
    return [replace(q, label=label) if q.name == "ratio_outside_fraction" else q for q in quantities]


def _seed_note(groups: dict[str, list[str]]) -> Note:
    if groups:
        return note("", "", r.SeedsCovered(tuple((g, len(m)) for g, m in groups.items())))
    return note("", "", r.OnePerStack())


def _data_notes(
    runset: RunSet,
    labels: Sequence[str],
    quantities: Sequence[Quantity],
    approximate: Mapping[tuple[str, str], r.Approximate],
    align: str,
) -> list[Note]:
    """The notes on the runs' data before any estimate: approximate quantities, values logged twice,
    refused counts, and a tokens-seen axis that counts only some steps."""
    notes = [note(q, label, reason) for (q, label), reason in approximate.items()]
    notes += data_notes(runset, labels, quantities)
    axis = token_axis(runset, labels) if align == "tokens" else None
    return notes + ([note("", "", axis)] if axis is not None else [])


def _run_estimates(
    quantities: Sequence[Quantity],
    labels: Sequence[str],
    units: Mapping[str, pd.DataFrame],
    approximate: Mapping[tuple[str, str], r.Approximate],
    backends: Mapping[str, str],
    group_of: Mapping[str, str],
    confidence: float,
    align: str,
) -> tuple[list[RunEstimate], list[Note]]:
    """Every run's estimate of every quantity, with the notes on each run's units."""
    estimates, notes = [], []
    for q in quantities:
        for label in labels:
            table = units[label]
            e = estimate_run(q, label, backends[label], table, confidence, group_of.get(label, ""))
            estimates.append(replace(e, approximate=(q.name, label) in approximate))
            notes += run_notes(q, label, table, align)
            notes += run_weighting_note(q, e, table)
    return estimates, notes


def compare(
    runset: RunSet,
    runs: Sequence[str] | None = None,
    *,
    groups: Mapping[str, Sequence[str]] | None = None,
    group_by: str | None = None,
    align: str = "step",
    window: Window | None = None,
    margins: Mapping[str, qs.Margin | float] | None = None,
    reward_abs_tolerance: float | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
) -> ComparisonResult:
    """Compare two or more runs of ``runset`` (default: all, in load order; the first is the
    reference), or two or more ``groups`` of runs (name -> runs, 2+ seeds each; the first group is
    the reference stack). ``group_by`` (opt-in) forms the groups from the runs' tags instead:
    ``"stack"`` groups by the run's backend label, any other name by that run parameter (e.g.
    ``"recipe"``); the first group is the one of the first run.

    ``margins`` maps quantity names (``quantities.QUANTITIES``: ``clip_fraction``, ``kl_k3``,
    ``reward``, ``throughput``, ...) to margins: ``quantities.relative(0.25)`` (±25 % on the
    log-ratio scale, with the quantity's absolute floor near zero; ``relative(0.25, floor=1e-4)``
    sets the floor), ``quantities.absolute(0.002)`` (in the quantity's units, at every level), or a
    plain number (absolute). Defaults: ``DEFAULT_TOLERANCES``. ``reward_abs_tolerance`` (reward units, default 0.02) is
    the reward's floor, the margin used when the rewards are near zero.
    """
    if group_by is not None:
        if groups is not None:
            raise ValueError("name groups either as groups or with group_by, not both")
        groups = groups_by(runset, group_by, runs)
        runs = None
    labels, named = _labels(runset, runs, groups)
    _check_settings(align, confidence)
    window = window or Window()
    given = margins or {}
    recipes = _recipes(runset, labels)
    quantities = _labelled(_choose_quantities(runset, labels, given, reward_abs_tolerance), recipes)
    withheld = rc.quantities_defined_differently(recipes)
    judged = [q for q in quantities if q.name not in withheld]
    units = unit_table(runset, labels, quantities, by=align, window=window)
    units, approximate = approximate_quantities(runset, labels, quantities, units, align, window)
    backends = {label: runset.info(label).run.backend_label or "" for label in labels}
    group_of = {label: g for g, members in named.items() for label in members}
    notes = _recipe_notes(recipes)
    notes += [
        note(q.name, "", r.DefinedDifferently(q.label, withheld[q.name]))
        for q in quantities
        if q.name in withheld
    ]
    notes += _data_notes(runset, labels, quantities, approximate, align)
    estimates, run_notes_ = _run_estimates(
        quantities, labels, units, approximate, backends, group_of, confidence, align
    )
    notes += run_notes_
    pairs: list[Difference] = []
    found: list[GroupDifference] = []
    if named:
        found = group_differences(judged, named, units, estimates, confidence, align)
    else:
        pairs, pair_notes = differences(judged, labels, units, approximate, confidence, align, estimates)
        notes += pair_notes
    notes.append(_seed_note(named))
    notes += audit.framework_notes(runset, labels)
    return ComparisonResult(
        runs=labels,
        backends=backends,
        align=align,
        window=window,
        confidence=confidence,
        method=METHOD,
        quantities=quantities,
        estimates=estimates,
        differences=pairs,
        notes=notes,
        on_policy=_on_policy(judged, estimates),
        groups=named,
        group_differences=found,
        audits=audit.audits(runset, labels, quantities, estimates, align, window),
    )
