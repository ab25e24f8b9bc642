"""The one declaration of what a loss measures: every measured field, once (torch-free).

Everything that carries a measured value derives from the declaration (:data:`MEASURES`,
:data:`MEANS`, their :class:`Group` s): the loss output's measured tensors, the packed vector and
its collective, the metric keys, the per-datum (wire) fields, the merge rules and the validation
rules, every one read by name. Adding a measure is one :class:`Measure` entry here (and its
per-token term, ``cliptrack.adapters.losses.formulas``); at run time the same entry goes through
:func:`register_measure` (docs/ARCHITECTURE.md, "Adding a measure"). The declaration is read
live: :func:`declared`, or the module names below (``MEASURES``, ``PACKED_FIELDS``, ...), which
always reflect it (take them as ``measures.NAME`` at the time of use, never copied at import).

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
  gauge loss given it), or a group registered with the measure. A group's measures come together:
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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

__all__ = [
    "CALL_COUNTERS",
    "CAUSES",
    "CAUSES_MEASURES",
    "CLIP",
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
    "declared",
    "group",
    "group_measures",
    "identity",
    "mixed_groups_error",
    "register_measure",
    "unregister_measure",
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


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Measure:
    """One per-token quantity reduced over the eligible tokens of a loss call (module docstring)."""

    name: str
    reduction: str
    exact: bool
    group: str
    definition: str
    nonnegative: bool = False

    def __post_init__(self) -> None:
        if not self.name or ":" in self.name:
            raise ValueError(f"measure name {self.name!r} must be non-empty and without ':'")
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"measure {self.name}: reduction {self.reduction!r} is not one of {REDUCTIONS}")
        if self.exact and self.reduction != SUM:
            raise ValueError(f"measure {self.name}: an exact count is a sum")

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


@dataclass(frozen=True)
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

    @property
    def group(self) -> str:
        """The group of its numerator (the mean exists exactly when that group does)."""
        return by_key(self.numerator).group


@dataclass(frozen=True, eq=False)
class Declaration:
    """The groups, measures and means in force, and every layout derived from them (cached).

    Checked when built (ValueError naming the entry): keys and fields unique, every measure's
    group declared, a mean's terms declared sums, ``loss_tokens:sum`` an exact count of
    :data:`EVERY`.
    """

    groups: tuple[Group, ...]
    measures: tuple[Measure, ...]
    means: tuple[Mean, ...]
    version: int = field(default=0)

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


_BUILTIN_GROUPS = (
    Group(EVERY, "every loss", optional=False),
    Group(CLIP, "losses that clip (ppo, cispo)", counter="clipping_calls"),
    Group(
        SPLIT,
        "clipping losses that report the low/high split (ppo, cispo)",
        within=CLIP,
        dropped_when_mixed=True,
    ),
    Group(
        DUAL_CLIP,
        "ppo with a dual clip (dual_clip, verl's clip_ratio_c)",
        within=CLIP,
        dropped_when_mixed=True,
    ),
    Group(GAUGE, "losses with sampling log-probs (ppo, cispo, importance_sampling, dro)"),
    Group(
        CAUSES,
        "losses with sampling log-probs given the trainer's log-probs at the sampling weights (old_logprobs)",
        within=GAUGE,
        dropped_when_mixed=True,
    ),
    Group(
        STALENESS,
        "losses with sampling log-probs given each token's weight-version lag (weight_lag)",
        within=GAUGE,
        dropped_when_mixed=True,
    ),
)

LOSS = Measure("loss", SUM, False, EVERY, "the per-token loss (Tinker's loss:sum; unchanged by cliptrack)")
"""The loss itself: packed and merged like a measure, but not a per-datum field."""

_BUILTIN_MEASURES: tuple[Measure, ...] = (
    LOSS,
    Measure("loss_tokens", SUM, True, EVERY, "1 for every eligible token (mask != 0); tokens", True),
    Measure(
        "clipped_tokens",
        SUM,
        True,
        CLIP,
        "1 where clipping changes the update: PPO clamp(r)*A < r*A, CISPO clamp(r) != r; tokens",
        True,
    ),
    Measure("clipped_low_tokens", SUM, True, SPLIT, "1 where clipped with r below the band; tokens", True),
    Measure("clipped_high_tokens", SUM, True, SPLIT, "1 where clipped with r above the band; tokens", True),
    Measure(
        "dual_clipped_tokens",
        SUM,
        True,
        DUAL_CLIP,
        "1 where A < 0 and the dual bound -A*c lies strictly below PPO's per-token loss (the loss is then "
        "-A*c; verl's pg_clipfrac_lower); counted apart from clipped_tokens; tokens",
        True,
    ),
    Measure("log_ratio", SUM, False, GAUGE, "l = logprobs - sampling_logprobs; nats"),
    Measure("abs_log_ratio", SUM, False, GAUGE, "|l|; nats", True),
    Measure(
        "kl_k3",
        SUM,
        False,
        GAUGE,
        "exp(l) - 1 - l, the k3 estimator of KL(sampler || trainer), without cancellation; nats",
        True,
    ),
    Measure(
        "ratio_outside_tokens",
        SUM,
        True,
        GAUGE,
        "1 where r = exp(l) < ratio_outside_low or r > ratio_outside_high (default [1/2, 2]); tokens",
        True,
    ),
    Measure("is_weight", SUM, False, GAUGE, "the importance weight w = exp(l); dimensionless", True),
    Measure("is_weight_sq", SUM, False, GAUGE, "w**2 = exp(2 l) (ESS = (sum w)**2 / (n sum w**2))", True),
    Measure(
        "engine_log_ratio",
        SUM,
        False,
        CAUSES,
        "e = old_logprobs - sampling_logprobs, the trainer at the sampling weights against the sampler "
        "(engine numerics, truncation); nats",
    ),
    Measure("engine_abs_log_ratio", SUM, False, CAUSES, "|e|; nats", True),
    Measure(
        "engine_kl_k3",
        SUM,
        False,
        CAUSES,
        "exp(e) - 1 - e, k3 KL(sampler || trainer at sampling weights); nats",
        True,
    ),
    Measure(
        "drift_log_ratio",
        SUM,
        False,
        CAUSES,
        "d = l - e (= logprobs - old_logprobs to the rounding of l), the policy trained against itself at "
        "the sampling weights (staleness, the update's own drift); l = e + d per token; nats",
    ),
    Measure("drift_abs_log_ratio", SUM, False, CAUSES, "|d|; nats", True),
    Measure(
        "drift_kl_k3",
        SUM,
        False,
        CAUSES,
        "exp(d) - 1 - d, k3 KL(trainer at sampling weights || trainer); nats",
        True,
    ),
    Measure(
        "weight_lag",
        SUM,
        False,
        STALENESS,
        "the weight-version lag of the token's datum (training version - sampling version); versions x tokens",
        True,
    ),
    Measure("log_ratio", MAX, False, GAUGE, "the largest l; nats"),
    Measure("log_ratio", MIN, False, GAUGE, "the smallest l; nats"),
    Measure(
        "weight_lag",
        MAX,
        False,
        STALENESS,
        "the largest weight-version lag of an eligible token; versions",
        True,
    ),
)
"""The built-in measures, in packed order within its part (sums first, then extremes)."""

_TOKENS = "loss_tokens:sum"
_BUILTIN_MEANS: tuple[Mean, ...] = (
    Mean("clip_fraction:mean", "clipped_tokens:sum", _TOKENS, True, "clipped tokens per eligible token"),
    Mean(
        "dual_clip_fraction:mean",
        "dual_clipped_tokens:sum",
        _TOKENS,
        True,
        "dual-clipped tokens per eligible token",
    ),
    Mean("abs_log_ratio:mean", "abs_log_ratio:sum", _TOKENS, False, "mean |l| per eligible token; nats"),
    Mean(
        "kl_k3:mean", "kl_k3:sum", _TOKENS, False, "mean k3 KL(sampler || trainer) per eligible token; nats"
    ),
    Mean(
        "engine_abs_log_ratio:mean",
        "engine_abs_log_ratio:sum",
        _TOKENS,
        False,
        "mean |e| per eligible token, the engine part; nats",
    ),
    Mean(
        "engine_kl_k3:mean",
        "engine_kl_k3:sum",
        _TOKENS,
        False,
        "mean k3 KL(sampler || trainer at sampling weights) per eligible token, the engine part; nats",
    ),
    Mean(
        "drift_abs_log_ratio:mean",
        "drift_abs_log_ratio:sum",
        _TOKENS,
        False,
        "mean |d| per eligible token, the drift part; nats",
    ),
    Mean(
        "drift_kl_k3:mean",
        "drift_kl_k3:sum",
        _TOKENS,
        False,
        "mean k3 KL(trainer at sampling weights || trainer) per eligible token, the drift part; nats",
    ),
    Mean(
        "weight_lag:mean",
        "weight_lag:sum",
        _TOKENS,
        False,
        "mean weight-version lag per eligible token; versions",
    ),
)
"""The built-in derived means, formed from merged sums."""

BUILTIN = Declaration(_BUILTIN_GROUPS, _BUILTIN_MEASURES, _BUILTIN_MEANS)
"""The declaration of cliptrack's own measures (what :func:`declared` returns until a registration)."""
_current: Declaration = BUILTIN


def declared() -> Declaration:
    """The declaration in force (the built-in one plus every :func:`register_measure`)."""
    return _current


def register_measure(
    measure: Measure, *, group: Group | None = None, means: Iterable[Mean] = ()
) -> Declaration:
    """Add ``measure`` to the declaration in force (and ``group``, when it is a new group; and
    ``means`` formed from it); returns the new declaration. Every reader of the declaration sees
    it from then on: the packed layout, merges, validation, keys and wire fields. Its per-token
    term goes to ``cliptrack.adapters.losses.formulas.register_term``. ValueError naming the entry
    when the key is taken or the group unknown; the declaration is then unchanged."""
    global _current
    if not isinstance(measure, Measure):
        raise TypeError(f"register_measure takes a Measure, got {type(measure).__name__}")
    groups = _current.groups
    if group is not None and group.name not in _current.group_names:
        groups = (*groups, group)
    elif group is not None and _current.group_by_name[group.name] != group:
        raise ValueError(f"group {group.name!r} is already declared differently")
    if measure.key in _current.by_key:
        raise ValueError(f"measure {measure.key!r} is already declared")
    if measure.group in BUILTIN.group_names:
        raise ValueError(
            f"measure {measure.key}: a registered measure comes in a group of its own (pass group=), "
            f"not the built-in {measure.group!r}, whose producers (stack logs, older runs) lack it"
        )
    _current = Declaration(
        groups, (*_current.measures, measure), (*_current.means, *means), _current.version + 1
    )
    return _current


def unregister_measure(key: str) -> Measure:
    """Remove a measure added by :func:`register_measure` (its means, and its group when no other
    measure is in it); the built-in measures stay. Returns the measure removed."""
    global _current
    if key in BUILTIN.by_key:
        raise ValueError(f"{key!r} is a built-in measure; only registered ones can be removed")
    measure = by_key(key)
    rest = tuple(m for m in _current.measures if m.key != key)
    groups = tuple(
        g for g in _current.groups if g.name in BUILTIN.group_names or any(m.group == g.name for m in rest)
    )
    means = tuple(m for m in _current.means if key not in (m.numerator, m.denominator))
    _current = Declaration(groups, rest, means, _current.version + 1)
    return measure


_LIVE = {
    "MEASURES": "measures",
    "MEANS": "means",
    "GROUPS": "group_names",
    "OPTIONAL_GROUPS": "optional_groups",
    "GROUP_LOSSES": "group_losses",
    "SUM_MEASURES": "sum_measures",
    "EXTREME_MEASURES": "extreme_measures",
    "DATUM_MEASURES": "datum_measures",
    "CALL_COUNTERS": "call_counters",
    "PACKED_ADDED": "packed_added",
    "EXTREME_FIELDS": "extreme_fields",
    "PACKED_FIELDS": "packed_fields",
}

# The names below are read live from the declaration in force (module ``__getattr__``):
MEASURES: tuple[Measure, ...]
"""Every measured field, in packed order within its part (sums first, then extremes)."""
MEANS: tuple[Mean, ...]
"""Every derived mean, formed from merged sums."""
GROUPS: tuple[str, ...]
"""Every group's name, in declaration order."""
OPTIONAL_GROUPS: tuple[str, ...]
"""Groups a loss may or may not emit; each has a call counter in the packed vector."""
GROUP_LOSSES: dict[str, str]
"""Who emits each group, in words (for docs and error messages)."""
SUM_MEASURES: tuple[Measure, ...]
"""Measures in the added part of the packed vector, in order."""
EXTREME_MEASURES: tuple[Measure, ...]
"""Measures in the max-combined part of the packed vector, in order."""
DATUM_MEASURES: tuple[Measure, ...]
"""Measures carried as per-datum fields (every one but the loss)."""
CALL_COUNTERS: tuple[str, ...]
"""``calls`` (loss calls summed) and, per optional group, the calls that carry it:
``clipping_calls``, ``split_calls``, ``gauge_calls``, then registered groups'."""
PACKED_ADDED: tuple[str, ...]
"""The added part of the packed vector."""
EXTREME_FIELDS: tuple[str, ...]
"""The max-combined part of the packed vector (a min negated)."""
PACKED_FIELDS: tuple[str, ...]
"""The layout of a packed loss output (module docstring, "Packed layout")."""

GAUGE_MEASURES: tuple[Measure, ...] = BUILTIN.members[GAUGE]
"""The on-policy gauge's measures (built-in: a registered measure joins a group of its own)."""
GAUGE_MEANS: tuple[Mean, ...] = tuple(m for m in _BUILTIN_MEANS if BUILTIN.by_key[m.numerator].group == GAUGE)
"""The gauge's derived means (``abs_log_ratio:mean``, ``kl_k3:mean``)."""
CAUSES_MEASURES: tuple[Measure, ...] = BUILTIN.members[CAUSES]
"""The gauge's split into engine and drift parts (sums)."""
STALENESS_MEASURES: tuple[Measure, ...] = BUILTIN.members[STALENESS]
"""The weight-version lag (sum and max)."""


def __getattr__(name: str) -> Any:
    if name in _LIVE:
        return getattr(_current, _LIVE[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def by_key(key: str) -> Measure:
    """The measure of a metric key; KeyError naming it otherwise."""
    try:
        return _current.by_key[key]
    except KeyError:
        raise KeyError(f"{key!r} is not a measured key (one of {sorted(_current.by_key)})") from None


def by_field(field: str) -> Measure:
    """The measure of a per-datum field; KeyError naming it otherwise."""
    try:
        return _current.by_field[field]
    except KeyError:
        raise KeyError(
            f"{field!r} is not a measured datum field (one of {sorted(_current.by_field)})"
        ) from None


def group(name: str) -> Group:
    """The declared group ``name``; KeyError naming it otherwise."""
    try:
        return _current.group_by_name[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a declared group (one of {_current.group_names})") from None


def group_measures(name: str) -> tuple[Measure, ...]:
    """The measures of group ``name``, in declaration order."""
    return _current.members.get(name, ())


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


def present_groups(keys: Iterable[str] | Mapping[str, object]) -> set[str]:
    """The optional groups whose sums are all among ``keys`` (a group without sums: never)."""
    have = set(keys)
    out = set()
    for g in _current.groups:
        sums = [m.key for m in _current.members[g.name] if m.reduction == SUM]
        if g.optional and sums and all(k in have for k in sums):
            out.add(g.name)
    return out


def mixed_groups_error(group: str, earlier: bool, now: bool, what: str = "this output") -> ValueError:
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
    means = "/".join(m.key for m in _current.means if by_key(m.numerator).group == group) or group
    return ValueError(
        f"{what} {has[now]} the {group} measures but earlier outputs of the step {have[earlier]} them "
        f"(emitted by {_current.group_losses.get(group, group)}): their tokens cannot share one "
        f"{means}; run such losses in steps of their own"
    )
