"""The one declaration of what a loss measures: every measured field, once (torch-free).

Everything that carries a measured value derives from a :class:`Declaration` (its measures,
means and :class:`Group` s): the loss output's measured tensors, the packed vector and its
collective, the metric keys, the per-datum (wire) fields, the merge rules and the validation
rules, every one read by name. A declaration is frozen data, passed as an argument to what needs
it; :data:`DEFAULT` (cliptrack's own measures) when none is given, and the module names below
(``MEASURES``, ``PACKED_FIELDS``, ...) are its plain constants. Adding a measure to cliptrack is
one :class:`Measure` entry here (and its per-token term, ``cliptrack.adapters.losses.formulas``);
for an experiment, :meth:`Declaration.extended` returns a new declaration with the measure (its
term carried on the entry) to pass to the losses and reductions, :data:`DEFAULT` unchanged
(docs/ARCHITECTURE.md, "Adding a measure").

Shape of the declaration
------------------------
A :class:`Measure` is one per-token quantity reduced over the eligible tokens (``mask != 0``) of a
loss call:

- ``name``: the quantity (``"kl_k3"``); ``reduction``: :data:`SUM`, :data:`MAX` or :data:`MIN`;
  its metric key is ``name:reduction`` (``"kl_k3:sum"``, :attr:`Measure.key`);
- ``exact``: an integer count (summed exactly, carried as a whole float below 2**53) or a float
  (summed in float64; max/min exact);
- ``group``: which losses emit it (a :class:`Group`): :data:`EVERY` (every loss), :data:`CLIP`
  (losses that clip), :data:`SPLIT` (clipping losses that split the clipped tokens by side),
  :data:`DUAL_CLIP` (PPO given a dual clip: the tokens where its bound bites), :data:`GAUGE` (losses with sampling log-probs: PPO, CISPO, importance sampling, DRO; cross
  entropy has none), :data:`CAUSES` (the gauge split into engine and drift, for a gauge loss given
  the trainer's log-probs at the sampling weights), :data:`STALENESS` (the weight-version lag, for a
  gauge loss given it), or a group of its own added with the measure. A group's measures come together:
  all present or all absent (extremes may be unknown after a merge);
- ``definition``: the per-token term or predicate, in words (units included);
- ``nonnegative``: whether the value is >= 0 by definition (validation refuses a negative one);
- :attr:`Measure.field`: the per-datum field on the Miles/Tinker wire (``loss_fn_outputs[i]``):
  ``name`` for a sum, ``name_max`` / ``name_min`` for an extreme.

A :class:`Mean` is a derived ratio ``numerator / denominator`` of two merged sums, formed once
from the sums after every merge (never averaged itself), absent when the denominator is 0.

Merge rules (:func:`combine`): sums add (counts as exact ints, floats with ``math.fsum``), a max
takes the max and a min the min; a group present in some terms and absent in others cannot be
merged (:func:`mixed_groups_error`), except a group declared ``dropped_when_mixed`` (:data:`SPLIT`),
dropped unless every term has it.

Packed layout (:data:`PACKED_FIELDS`): ``loss:sum``, then every sum measure in declaration order,
then the call counters (:data:`CALL_COUNTERS`: calls summed and, per optional group in
declaration order, the calls that carry it), then the bad-input counts (``invalid[i]``), all added; then the extremes, all
combined by **max**: a max as itself, a min negated (``-min(l) == max(-l)``), so one
``amax`` (or the rows of one all-gather) combines them. A field of an absent group is 0 in the
added part and ``-inf`` (the identity of max) in the extremes. Every value is float64.

The gauge (:data:`GAUGE`): with ``l = logprobs - sampling_logprobs`` per eligible token, the policy
being trained against the policy that sampled, it measures staleness, sampler-trainer numerics and
the update's own drift within a step together (docs/CONTRACT.md, "The on-policy gauge").
Given ``old_logprobs`` (the trainer's log-probs at the weights that sampled), :data:`CAUSES` splits
it per token as ``l = e + d``: the engine part ``e = old_logprobs - sampling_logprobs`` (the
inference engine's numerics and truncation against the trainer at the same weights) and the drift
part ``d = l - e`` (the trained policy against itself at the sampling weights: staleness and the
update's own drift). Given ``weight_lag``, :data:`STALENESS` sums each token's weight-version lag.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

__all__ = [
    "CALL_COUNTERS",
    "CAUSES",
    "CAUSES_MEASURES",
    "CLIP",
    "DEFAULT",
    "DATUM_MEASURES",
    "DUAL_CLIP",
    "EVERY",
    "EXTREME_FIELDS",
    "EXTREME_MEASURES",
    "GAUGE",
    "GAUGE_MEANS",
    "GAUGE_MEASURES",
    "GROUPS",
    "GROUP_LOSSES",
    "INVALID_SLOTS",
    "LOSS",
    "MAX",
    "MEANS",
    "MEASURES",
    "MIN",
    "OPTIONAL_GROUPS",
    "PACKED_ADDED",
    "PACKED_FIELDS",
    "RATIO_OUTSIDE_HIGH",
    "RATIO_OUTSIDE_HIGH_OPTION",
    "RATIO_OUTSIDE_LOW",
    "RATIO_OUTSIDE_LOW_OPTION",
    "REDUCTIONS",
    "SPLIT",
    "STALENESS",
    "STALENESS_MEASURES",
    "SUM",
    "SUM_MEASURES",
    "Declaration",
    "Group",
    "Mean",
    "Measure",
    "by_field",
    "by_key",
    "combine",
    "group",
    "group_measures",
    "identity",
    "mixed_groups_error",
    "present_groups",
]

SUM = "sum"
MAX = "max"
MIN = "min"
REDUCTIONS = (SUM, MAX, MIN)

EVERY = "every"
"""Group: measured by every loss."""
CLIP = "clip"
"""Group: measured by losses that clip (PPO, CISPO)."""
SPLIT = "split"
"""Group: the low/high split of the clipped tokens (optional even for a clipping loss)."""
DUAL_CLIP = "dual_clip"
"""Group: the tokens where PPO's dual clip bites (a PPO call with ``dual_clip``)."""
GAUGE = "gauge"
"""Group: the on-policy gauge, measured by losses with sampling log-probs."""
CAUSES = "causes"
"""Group: the gauge split into its causes, engine and drift (a gauge loss given ``old_logprobs``)."""
STALENESS = "staleness"
"""Group: the sampler's weight-version lag (a gauge loss given ``weight_lag``)."""

RATIO_OUTSIDE_LOW = 0.5
"""Default lower ratio bound of ``ratio_outside_tokens:sum`` (a per-call option of every gauge loss)."""
RATIO_OUTSIDE_HIGH = 2.0
"""Default upper ratio bound of ``ratio_outside_tokens:sum``."""
RATIO_OUTSIDE_LOW_OPTION = "ratio_outside_low"
"""The loss keyword (Tinker ``loss_fn_config`` key) setting the lower bound, an absolute ratio."""
RATIO_OUTSIDE_HIGH_OPTION = "ratio_outside_high"
"""The loss keyword setting the upper bound, an absolute ratio."""

INVALID_SLOTS = 3
"""Bad-input counters per loss output: non-finite values, mask entries not 0/1, bad thresholds
(messages: ``cliptrack.adapters.losses.builtin.INPUT_CHECKS``, in this order)."""


@dataclass(frozen=True, kw_only=True)
class Group:
    """Which losses emit a set of measures, and how terms that disagree on it merge.

    ``name``: the group (a :attr:`Measure.group`); ``emitted_by``: who emits it, in words (docs and
    error messages); ``optional``: whether a loss may leave it out (every group but :data:`EVERY`;
    an optional group has a call counter in the packed vector, ``counter``); ``within``: the
    group it refines, present only beside it (:data:`SPLIT` within :data:`CLIP`);
    ``dropped_when_mixed``: terms with and without it merge, the group dropped (else mixing them
    is refused, :func:`mixed_groups_error`).
    """

    name: str
    emitted_by: str
    optional: bool = True
    within: str | None = None
    dropped_when_mixed: bool = False
    counter: str = ""

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"group name must be a non-empty string, got {self.name!r}")
        if not self.counter:
            object.__setattr__(self, "counter", f"{self.name}_calls")


@dataclass(frozen=True, kw_only=True)
class Measure:
    """One per-token quantity reduced over the eligible tokens of a loss call (module docstring).

    ``term``: for a measure a declaration is extended with (:meth:`Declaration.extended`), its
    per-token term, computed by every built-in loss (eager and fused): a callable taking the call's
    ``cliptrack.adapters.losses.formulas.Tokens`` and returning the 0-dim value (``None`` where the
    loss lacks an input it needs); ``None`` for a built-in measure (written in its formula) or a
    measure only a loss of one's own emits.
    """

    name: str
    reduction: str
    exact: bool
    group: str
    definition: str
    nonnegative: bool = False
    term: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        if not self.name or ":" in self.name:
            raise ValueError(f"measure name {self.name!r} must be non-empty and without ':'")
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"measure {self.name}: reduction {self.reduction!r} is not one of {REDUCTIONS}")
        if self.exact and self.reduction != SUM:
            raise ValueError(f"measure {self.name}: an exact count is a sum")
        if self.term is not None and (self.reduction != SUM or not callable(self.term)):
            raise ValueError(f"measure {self.name}: a term is a callable, and only for a sum")

    @cached_property
    def key(self) -> str:
        """The metric key, ``name:reduction`` (formed once: read on every merge of every datum)."""
        return f"{self.name}:{self.reduction}"

    @cached_property
    def field(self) -> str:
        """The per-datum (wire) field: ``name`` for a sum, ``name_max`` / ``name_min`` for an extreme."""
        return self.name if self.reduction == SUM else f"{self.name}_{self.reduction}"

    @property
    def packed(self) -> str:
        """The name of its slot in :data:`PACKED_FIELDS` (a min is stored negated)."""
        return f"-{self.key}" if self.reduction == MIN else self.key


@dataclass(frozen=True, kw_only=True)
class Mean:
    """A derived ratio of two merged sums, formed once (never itself averaged or summed).

    ``key``: its metric key (``name:mean``); ``numerator`` / ``denominator``: keys of sum measures;
    ``fraction``: whether it lies in [0, 1] (a count of tokens over the eligible tokens).
    """

    key: str
    numerator: str
    denominator: str
    fraction: bool
    definition: str


@dataclass(frozen=True, eq=False, kw_only=True)
class Declaration:
    """The groups, measures and means a loss measures, and every layout derived from them (cached).

    Immutable data passed to what needs it (the losses, the packing, the merges, the reductions),
    :data:`DEFAULT` when not given; :meth:`extended` returns a new one with more measures. Checked
    when built (ValueError naming the entry): keys and fields unique, every measure's group
    declared, a mean's terms declared sums, ``loss_tokens:sum`` an exact count of :data:`EVERY`.
    """

    groups: tuple[Group, ...]
    measures: tuple[Measure, ...]
    means: tuple[Mean, ...]

    def __post_init__(self) -> None:
        self._check_groups()
        self._check_measures()
        if "loss_tokens:sum" not in self.by_key or self.by_key["loss_tokens:sum"].group != EVERY:
            raise ValueError("the declaration needs loss_tokens:sum, an exact count of every loss")

    def _check_groups(self) -> None:
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError(f"group names must be unique, got {names}")
        for g in self.groups:
            if g.within is not None and g.within not in names:
                raise ValueError(f"group {g.name}: within={g.within!r} is not a declared group ({names})")

    def _check_measures(self) -> None:
        for what, names in (
            ("keys", [m.key for m in self.measures]),
            ("fields", [m.field for m in self.measures]),
        ):
            if len(set(names)) != len(names):
                raise ValueError(f"measure {what} must be unique, got {names}")
        groups = [g.name for g in self.groups]
        for m in self.measures:
            if m.group not in groups:
                raise ValueError(f"measure {m.key}: group {m.group!r} is not one of {tuple(groups)}")
        sums = {m.key for m in self.measures if m.reduction == SUM}
        for mean in self.means:
            for term in (mean.numerator, mean.denominator):
                if term not in sums:
                    raise ValueError(f"mean {mean.key}: {term!r} is not a declared sum measure")

    @cached_property
    def by_key(self) -> dict[str, Measure]:
        """Metric key -> measure."""
        return {m.key: m for m in self.measures}

    @cached_property
    def by_field(self) -> dict[str, Measure]:
        """Per-datum field -> measure (every measure but the loss)."""
        return {m.field: m for m in self.datum_measures}

    @cached_property
    def group_by_name(self) -> dict[str, Group]:
        """Group name -> group."""
        return {g.name: g for g in self.groups}

    @cached_property
    def group_names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.groups)

    @cached_property
    def optional_groups(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.groups if g.optional)

    @cached_property
    def group_losses(self) -> dict[str, str]:
        return {g.name: g.emitted_by for g in self.groups}

    @cached_property
    def sum_measures(self) -> tuple[Measure, ...]:
        return tuple(m for m in self.measures if m.reduction == SUM)

    @cached_property
    def extreme_measures(self) -> tuple[Measure, ...]:
        return tuple(m for m in self.measures if m.reduction != SUM)

    @cached_property
    def datum_measures(self) -> tuple[Measure, ...]:
        return tuple(m for m in self.measures if m.key != LOSS.key)

    @cached_property
    def members(self) -> dict[str, tuple[Measure, ...]]:
        """Group name -> its measures, in declaration order."""
        return {g.name: tuple(m for m in self.measures if m.group == g.name) for g in self.groups}

    @cached_property
    def call_counters(self) -> tuple[str, ...]:
        return ("calls", *(g.counter for g in self.groups if g.optional))

    @cached_property
    def packed_added(self) -> tuple[str, ...]:
        return (
            *(m.key for m in self.sum_measures),
            *self.call_counters,
            *(f"invalid[{i}]" for i in range(INVALID_SLOTS)),
        )

    @cached_property
    def extreme_fields(self) -> tuple[str, ...]:
        return tuple(m.packed for m in self.extreme_measures)

    @cached_property
    def packed_fields(self) -> tuple[str, ...]:
        return (*self.packed_added, *self.extreme_fields)

    @cached_property
    def slot(self) -> dict[str, int]:
        """Packed field (and measure key: a min's key names its negated slot) -> its index."""
        index = {name: i for i, name in enumerate(self.packed_fields)}
        index.update({m.key: index[m.packed] for m in self.extreme_measures})
        return index

    @cached_property
    def terms(self) -> tuple[Measure, ...]:
        """The measures with a per-token term (:attr:`Measure.term`), in declaration order: what
        every built-in loss computes beside its own measures (none in :data:`DEFAULT`)."""
        return tuple(m for m in self.measures if m.term is not None)

    def extended(
        self, *measures: Measure, groups: Iterable[Group] = (), means: Iterable[Mean] = ()
    ) -> Declaration:
        """A new declaration: this one with ``measures`` (after its own), ``groups`` (new groups)
        and ``means`` (formed from the sums) added; this one is unchanged. Every measure added comes
        in a group of its own, not a group of :data:`DEFAULT` (whose producers, stack logs and older
        runs, lack it). ValueError naming the entry when a key or group is taken or a group is
        unknown; TypeError for an entry of the wrong type."""
        groups, means = tuple(groups), tuple(means)
        for what, entries, kind in (
            ("measures", measures, Measure),
            ("groups", groups, Group),
            ("means", means, Mean),
        ):
            wrong = [e for e in entries if not isinstance(e, kind)]
            if wrong:
                raise TypeError(f"extended takes {kind.__name__} entries as {what}, got {wrong[0]!r}")
        taken = [g.name for g in groups if g.name in self.group_names]
        if taken:
            raise ValueError(f"groups {taken} are already declared")
        for measure in measures:
            if measure.key in self.by_key:
                raise ValueError(f"measure {measure.key!r} is already declared")
            if measure.group in DEFAULT.group_names:
                raise ValueError(
                    f"measure {measure.key}: an added measure comes in a group of its own (pass groups=), "
                    f"not the built-in {measure.group!r}, whose producers (stack logs, older runs) lack it"
                )
        return Declaration(
            groups=(*self.groups, *groups),
            measures=(*self.measures, *measures),
            means=(*self.means, *means),
        )


_BUILTIN_GROUPS = (
    Group(name=EVERY, emitted_by="every loss", optional=False),
    Group(name=CLIP, emitted_by="losses that clip (ppo, cispo)", counter="clipping_calls"),
    Group(
        name=SPLIT,
        emitted_by="clipping losses that report the low/high split (ppo, cispo)",
        within=CLIP,
        dropped_when_mixed=True,
    ),
    Group(
        name=DUAL_CLIP,
        emitted_by="ppo with a dual clip (dual_clip, verl's clip_ratio_c)",
        within=CLIP,
        dropped_when_mixed=True,
    ),
    Group(name=GAUGE, emitted_by="losses with sampling log-probs (ppo, cispo, importance_sampling, dro)"),
    Group(
        name=CAUSES,
        emitted_by="losses with sampling log-probs given the trainer's log-probs at the sampling weights (old_logprobs)",
        within=GAUGE,
        dropped_when_mixed=True,
    ),
    Group(
        name=STALENESS,
        emitted_by="losses with sampling log-probs given each token's weight-version lag (weight_lag)",
        within=GAUGE,
        dropped_when_mixed=True,
    ),
)

LOSS = Measure(
    name="loss",
    reduction=SUM,
    exact=False,
    group=EVERY,
    definition="the per-token loss (Tinker's loss:sum; unchanged by cliptrack)",
)
"""The loss itself: packed and merged like a measure, but not a per-datum field."""

_BUILTIN_MEASURES: tuple[Measure, ...] = (
    LOSS,
    Measure(
        name="loss_tokens",
        reduction=SUM,
        exact=True,
        group=EVERY,
        definition="1 for every eligible token (mask != 0); tokens",
        nonnegative=True,
    ),
    Measure(
        name="clipped_tokens",
        reduction=SUM,
        exact=True,
        group=CLIP,
        definition="1 where clipping changes the update: PPO clamp(r)*A < r*A, CISPO clamp(r) != r; tokens",
        nonnegative=True,
    ),
    Measure(
        name="clipped_low_tokens",
        reduction=SUM,
        exact=True,
        group=SPLIT,
        definition="1 where clipped with r below the band; tokens",
        nonnegative=True,
    ),
    Measure(
        name="clipped_high_tokens",
        reduction=SUM,
        exact=True,
        group=SPLIT,
        definition="1 where clipped with r above the band; tokens",
        nonnegative=True,
    ),
    Measure(
        name="dual_clipped_tokens",
        reduction=SUM,
        exact=True,
        group=DUAL_CLIP,
        definition="1 where A < 0 and the dual bound -A*c lies strictly below PPO's per-token loss (the loss is then "
        "-A*c; verl's pg_clipfrac_lower); counted apart from clipped_tokens; tokens",
        nonnegative=True,
    ),
    Measure(
        name="log_ratio",
        reduction=SUM,
        exact=False,
        group=GAUGE,
        definition="l = logprobs - sampling_logprobs; nats",
    ),
    Measure(
        name="abs_log_ratio",
        reduction=SUM,
        exact=False,
        group=GAUGE,
        definition="|l|; nats",
        nonnegative=True,
    ),
    Measure(
        name="kl_k3",
        reduction=SUM,
        exact=False,
        group=GAUGE,
        definition="exp(l) - 1 - l, the k3 estimator of KL(sampler || trainer), without cancellation; nats",
        nonnegative=True,
    ),
    Measure(
        name="ratio_outside_tokens",
        reduction=SUM,
        exact=True,
        group=GAUGE,
        definition="1 where r = exp(l) < ratio_outside_low or r > ratio_outside_high (default [1/2, 2]); tokens",
        nonnegative=True,
    ),
    Measure(
        name="is_weight",
        reduction=SUM,
        exact=False,
        group=GAUGE,
        definition="the importance weight w = exp(l); dimensionless",
        nonnegative=True,
    ),
    Measure(
        name="is_weight_sq",
        reduction=SUM,
        exact=False,
        group=GAUGE,
        definition="w**2 = exp(2 l) (ESS = (sum w)**2 / (n sum w**2))",
        nonnegative=True,
    ),
    Measure(
        name="engine_log_ratio",
        reduction=SUM,
        exact=False,
        group=CAUSES,
        definition="e = old_logprobs - sampling_logprobs, the trainer at the sampling weights against the sampler "
        "(engine numerics, truncation); nats",
    ),
    Measure(
        name="engine_abs_log_ratio",
        reduction=SUM,
        exact=False,
        group=CAUSES,
        definition="|e|; nats",
        nonnegative=True,
    ),
    Measure(
        name="engine_kl_k3",
        reduction=SUM,
        exact=False,
        group=CAUSES,
        definition="exp(e) - 1 - e, k3 KL(sampler || trainer at sampling weights); nats",
        nonnegative=True,
    ),
    Measure(
        name="drift_log_ratio",
        reduction=SUM,
        exact=False,
        group=CAUSES,
        definition="d = l - e (= logprobs - old_logprobs to the rounding of l), the policy trained against itself at "
        "the sampling weights (staleness, the update's own drift); l = e + d per token; nats",
    ),
    Measure(
        name="drift_abs_log_ratio",
        reduction=SUM,
        exact=False,
        group=CAUSES,
        definition="|d|; nats",
        nonnegative=True,
    ),
    Measure(
        name="drift_kl_k3",
        reduction=SUM,
        exact=False,
        group=CAUSES,
        definition="exp(d) - 1 - d, k3 KL(trainer at sampling weights || trainer); nats",
        nonnegative=True,
    ),
    Measure(
        name="weight_lag",
        reduction=SUM,
        exact=False,
        group=STALENESS,
        definition="the weight-version lag of the token's datum (training version - sampling version); versions x tokens",
        nonnegative=True,
    ),
    Measure(name="log_ratio", reduction=MAX, exact=False, group=GAUGE, definition="the largest l; nats"),
    Measure(name="log_ratio", reduction=MIN, exact=False, group=GAUGE, definition="the smallest l; nats"),
    Measure(
        name="weight_lag",
        reduction=MAX,
        exact=False,
        group=STALENESS,
        definition="the largest weight-version lag of an eligible token; versions",
        nonnegative=True,
    ),
)
"""The built-in measures, in packed order within its part (sums first, then extremes)."""

_TOKENS = "loss_tokens:sum"
_BUILTIN_MEANS: tuple[Mean, ...] = (
    Mean(
        key="clip_fraction:mean",
        numerator="clipped_tokens:sum",
        denominator=_TOKENS,
        fraction=True,
        definition="clipped tokens per eligible token",
    ),
    Mean(
        key="dual_clip_fraction:mean",
        numerator="dual_clipped_tokens:sum",
        denominator=_TOKENS,
        fraction=True,
        definition="dual-clipped tokens per eligible token",
    ),
    Mean(
        key="abs_log_ratio:mean",
        numerator="abs_log_ratio:sum",
        denominator=_TOKENS,
        fraction=False,
        definition="mean |l| per eligible token; nats",
    ),
    Mean(
        key="kl_k3:mean",
        numerator="kl_k3:sum",
        denominator=_TOKENS,
        fraction=False,
        definition="mean k3 KL(sampler || trainer) per eligible token; nats",
    ),
    Mean(
        key="engine_abs_log_ratio:mean",
        numerator="engine_abs_log_ratio:sum",
        denominator=_TOKENS,
        fraction=False,
        definition="mean |e| per eligible token, the engine part; nats",
    ),
    Mean(
        key="engine_kl_k3:mean",
        numerator="engine_kl_k3:sum",
        denominator=_TOKENS,
        fraction=False,
        definition="mean k3 KL(sampler || trainer at sampling weights) per eligible token, the engine part; nats",
    ),
    Mean(
        key="drift_abs_log_ratio:mean",
        numerator="drift_abs_log_ratio:sum",
        denominator=_TOKENS,
        fraction=False,
        definition="mean |d| per eligible token, the drift part; nats",
    ),
    Mean(
        key="drift_kl_k3:mean",
        numerator="drift_kl_k3:sum",
        denominator=_TOKENS,
        fraction=False,
        definition="mean k3 KL(trainer at sampling weights || trainer) per eligible token, the drift part; nats",
    ),
    Mean(
        key="weight_lag:mean",
        numerator="weight_lag:sum",
        denominator=_TOKENS,
        fraction=False,
        definition="mean weight-version lag per eligible token; versions",
    ),
)
"""The built-in derived means, formed from merged sums."""

DEFAULT = Declaration(groups=_BUILTIN_GROUPS, measures=_BUILTIN_MEASURES, means=_BUILTIN_MEANS)
"""The default declaration: cliptrack's own measures. What every function taking a declaration
reads when none is given; extend it with :meth:`Declaration.extended`."""

MEASURES: tuple[Measure, ...] = DEFAULT.measures
"""Every measured field of :data:`DEFAULT`, in packed order within its part (sums first, then extremes)."""
MEANS: tuple[Mean, ...] = DEFAULT.means
"""Every derived mean of :data:`DEFAULT`, formed from merged sums."""
GROUPS: tuple[str, ...] = DEFAULT.group_names
"""Every group's name of :data:`DEFAULT`, in declaration order."""
OPTIONAL_GROUPS: tuple[str, ...] = DEFAULT.optional_groups
"""Groups a loss may or may not emit; each has a call counter in the packed vector."""
GROUP_LOSSES: dict[str, str] = DEFAULT.group_losses
"""Who emits each group, in words (for docs and error messages)."""
SUM_MEASURES: tuple[Measure, ...] = DEFAULT.sum_measures
"""Measures in the added part of the packed vector, in order."""
EXTREME_MEASURES: tuple[Measure, ...] = DEFAULT.extreme_measures
"""Measures in the max-combined part of the packed vector, in order."""
DATUM_MEASURES: tuple[Measure, ...] = DEFAULT.datum_measures
"""Measures carried as per-datum fields (every one but the loss)."""
CALL_COUNTERS: tuple[str, ...] = DEFAULT.call_counters
"""``calls`` (loss calls summed) and, per optional group, the calls that carry it:
``clipping_calls``, ``split_calls``, ``gauge_calls``, ... (an extended declaration adds its groups')."""
PACKED_ADDED: tuple[str, ...] = DEFAULT.packed_added
"""The added part of the packed vector of :data:`DEFAULT`."""
EXTREME_FIELDS: tuple[str, ...] = DEFAULT.extreme_fields
"""The max-combined part of the packed vector of :data:`DEFAULT` (a min negated)."""
PACKED_FIELDS: tuple[str, ...] = DEFAULT.packed_fields
"""The layout of a packed loss output under :data:`DEFAULT` (module docstring, "Packed layout";
another declaration's: its :attr:`Declaration.packed_fields`)."""

GAUGE_MEASURES: tuple[Measure, ...] = DEFAULT.members[GAUGE]
"""The on-policy gauge's measures (built-in: an added measure comes in a group of its own)."""
GAUGE_MEANS: tuple[Mean, ...] = tuple(m for m in _BUILTIN_MEANS if DEFAULT.by_key[m.numerator].group == GAUGE)
"""The gauge's derived means (``abs_log_ratio:mean``, ``kl_k3:mean``)."""
CAUSES_MEASURES: tuple[Measure, ...] = DEFAULT.members[CAUSES]
"""The gauge's split into engine and drift parts (sums)."""
STALENESS_MEASURES: tuple[Measure, ...] = DEFAULT.members[STALENESS]
"""The weight-version lag (sum and max)."""


def by_key(key: str, declaration: Declaration = DEFAULT) -> Measure:
    """The measure of a metric key in ``declaration``; KeyError naming it otherwise."""
    try:
        return declaration.by_key[key]
    except KeyError:
        raise KeyError(f"{key!r} is not a measured key (one of {sorted(declaration.by_key)})") from None


def by_field(field: str, declaration: Declaration = DEFAULT) -> Measure:
    """The measure of a per-datum field; KeyError naming it otherwise."""
    try:
        return declaration.by_field[field]
    except KeyError:
        raise KeyError(
            f"{field!r} is not a measured datum field (one of {sorted(declaration.by_field)})"
        ) from None


def group(name: str, declaration: Declaration = DEFAULT) -> Group:
    """The declared group ``name``; KeyError naming it otherwise."""
    try:
        return declaration.group_by_name[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a declared group (one of {declaration.group_names})") from None


def group_measures(name: str, declaration: Declaration = DEFAULT) -> tuple[Measure, ...]:
    """The measures of group ``name``, in declaration order."""
    return declaration.members.get(name, ())


def identity(measure: Measure) -> float:
    """The value of ``measure`` over no token: 0 for a sum, -inf for a max, +inf for a min."""
    return {SUM: 0.0, MAX: -math.inf, MIN: math.inf}[measure.reduction]


def combine(measure: Measure, values: Iterable[float | int]) -> float | int:
    """Merge values of ``measure`` from several terms: exact int sum for a count, ``math.fsum`` for
    a float sum, max / min for an extreme (the identity for no value)."""
    values = list(values)
    if measure.reduction == MAX:
        return max(values, default=-math.inf)
    if measure.reduction == MIN:
        return min(values, default=math.inf)
    if measure.exact:
        return sum(int(v) for v in values)
    return math.fsum(values)


def present_groups(
    keys: Iterable[str] | Mapping[str, object], declaration: Declaration = DEFAULT
) -> set[str]:
    """The optional groups whose sums are all among ``keys`` (a group without sums: never)."""
    have = set(keys)
    out = set()
    for g in declaration.groups:
        sums = [m.key for m in declaration.members[g.name] if m.reduction == SUM]
        if g.optional and sums and all(k in have for k in sums):
            out.add(g.name)
    return out


def mixed_groups_error(
    group: str, earlier: bool, now: bool, what: str = "this output", declaration: Declaration = DEFAULT
) -> ValueError:
    """The one error for merging terms that carry ``group`` with terms that do not."""
    if group == CLIP:
        return ValueError(
            f"{what} comes from a loss that {'clips' if now else 'never clips'} but earlier "
            f"outputs of the step come from one that {'clips' if earlier else 'never clips'}: their "
            "tokens cannot share one clip fraction (PPO and CISPO sum together; cross_entropy, "
            "importance_sampling and dro belong in steps of their own)"
        )
    has = {True: "carries", False: "does not carry"}
    have = {True: "carry", False: "do not carry"}
    means = (
        "/".join(m.key for m in declaration.means if by_key(m.numerator, declaration).group == group) or group
    )
    return ValueError(
        f"{what} {has[now]} the {group} measures but earlier outputs of the step {have[earlier]} them "
        f"(emitted by {declaration.group_losses.get(group, group)}): their tokens cannot share one "
        f"{means}; run such losses in steps of their own"
    )
