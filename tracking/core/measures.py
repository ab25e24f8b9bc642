"""The one declaration of what a loss measures: every measured field, once (torch-free).

Everything that carries a measured value derives from :data:`MEASURES` and :data:`MEANS`: the loss
output's measured tensors, the packed vector and its collective, the metric keys, the per-datum
(wire) fields, the Miles log entries, the merge rules and the validation rules. Adding a measure is
one :class:`Measure` entry here (and its per-token term in the loss pass, ``cliptrack.adapters.losses.builtin``);
docs/ARCHITECTURE.md, "How to add a measure", walks through it with the gauge.

Shape of the declaration
------------------------
A :class:`Measure` is one per-token quantity reduced over the eligible tokens (``mask != 0``) of a
loss call:

- ``name``: the quantity (``"kl_k3"``); ``reduction``: :data:`SUM`, :data:`MAX` or :data:`MIN`;
  its metric key is ``name:reduction`` (``"kl_k3:sum"``, :attr:`Measure.key`);
- ``exact``: an integer count (summed exactly, carried as a whole float below 2**53) or a float
  (summed in float64; max/min exact);
- ``group``: which losses emit it (:data:`GROUPS`): :data:`EVERY` (every loss), :data:`CLIP`
  (losses that clip), :data:`SPLIT` (clipping losses that split the clipped tokens by side),
  :data:`GAUGE` (losses with sampling log-probs: PPO, CISPO, importance sampling, DRO; cross
  entropy has none). A group's measures come together: all present or all absent;
- ``definition``: the per-token term or predicate, in words (units included);
- ``nonnegative``: whether the value is >= 0 by definition (validation refuses a negative one);
- :attr:`Measure.field`: the per-datum field on the Miles/Tinker wire (``loss_fn_outputs[i]``) and
  in a Megatron report's Miles entries: ``name`` for a sum, ``name_max`` / ``name_min`` for an
  extreme; :attr:`Measure.miles_entry`: the entry of ``cliptrack.adapters.miles.custom_loss``'s log dict
  (Miles sums its log values over micro-batches and ranks, so only sums travel there; an extreme
  has none).

A :class:`Mean` is a derived ratio ``numerator / denominator`` of two merged sums, formed once
from the sums after every merge (never averaged itself), absent when the denominator is 0.

Merge rules (:func:`combine`): sums add (counts as exact ints, floats with ``math.fsum``), a max
takes the max and a min the min; a group present in some terms and absent in others cannot be
merged (:func:`mixed_groups_error`), except :data:`SPLIT`, dropped unless every term has it.

Packed layout (:data:`PACKED_FIELDS`): ``loss:sum``, then every sum measure in declaration order,
then the call counters (:data:`CALL_COUNTERS`: calls summed and, per optional group, the calls
that carry it), then the bad-input counts (``invalid[i]``), all added; then the extremes, all
combined by **max**: a max as itself, a min negated (``-min(l) == max(-l)``), so one
``amax`` (or the rows of one all-gather) combines them. A field of an absent group is 0 in the
added part and ``-inf`` (the identity of max) in the extremes. Every value is float64.

The gauge (:data:`GAUGE`): with ``l = logprobs - sampling_logprobs`` per eligible token, the policy
being trained against the policy that sampled, it measures staleness, sampler-trainer numerics and
the update's own drift within a step together (docs/CONTRACT.md, "The on-policy gauge").
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "CALL_COUNTERS",
    "CLIP",
    "DATUM_MEASURES",
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
    "SUM",
    "SUM_MEASURES",
    "Mean",
    "Measure",
    "by_field",
    "by_key",
    "combine",
    "group_measures",
    "identity",
    "mixed_groups_error",
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
GAUGE = "gauge"
"""Group: the on-policy gauge, measured by losses with sampling log-probs."""
GROUPS = (EVERY, CLIP, SPLIT, GAUGE)
OPTIONAL_GROUPS = (CLIP, SPLIT, GAUGE)
"""Groups a loss may or may not emit; each has a call counter in the packed vector."""
GROUP_LOSSES = {
    EVERY: "every loss",
    CLIP: "losses that clip (ppo, cispo)",
    SPLIT: "clipping losses that report the low/high split (ppo, cispo)",
    GAUGE: "losses with sampling log-probs (ppo, cispo, importance_sampling, dro)",
}
"""Who emits each group, in words (for docs and error messages)."""

RATIO_OUTSIDE_LOW = 0.5
"""Default lower ratio bound of ``ratio_outside_tokens:sum`` (a per-call option of every gauge loss)."""
RATIO_OUTSIDE_HIGH = 2.0
"""Default upper ratio bound of ``ratio_outside_tokens:sum``."""
RATIO_OUTSIDE_LOW_OPTION = "ratio_outside_low"
"""The loss keyword (Tinker ``loss_fn_config`` key) setting the lower bound, an absolute ratio."""
RATIO_OUTSIDE_HIGH_OPTION = "ratio_outside_high"
"""The loss keyword setting the upper bound, an absolute ratio."""


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
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"measure {self.name}: reduction {self.reduction!r} is not one of {REDUCTIONS}")
        if self.group not in GROUPS:
            raise ValueError(f"measure {self.name}: group {self.group!r} is not one of {GROUPS}")
        if self.exact and self.reduction != SUM:
            raise ValueError(f"measure {self.name}: an exact count is a sum")

    @property
    def key(self) -> str:
        """The metric key, ``name:reduction``."""
        return f"{self.name}:{self.reduction}"

    @property
    def field(self) -> str:
        """The per-datum (wire) field: ``name`` for a sum, ``name_max`` / ``name_min`` for an extreme."""
        return self.name if self.reduction == SUM else f"{self.name}_{self.reduction}"

    @property
    def miles_entry(self) -> str | None:
        """The Miles log-dict entry (sums only: Miles adds its log values), else ``None``."""
        return self.field if self.reduction == SUM else None

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
        return _BY_KEY[self.numerator].group


LOSS = Measure("loss", SUM, False, EVERY, "the per-token loss (Tinker's loss:sum; unchanged by cliptrack)")
"""The loss itself: packed and merged like a measure, but not a per-datum field."""

MEASURES: tuple[Measure, ...] = (
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
    Measure("log_ratio", MAX, False, GAUGE, "the largest l; nats"),
    Measure("log_ratio", MIN, False, GAUGE, "the smallest l; nats"),
)
"""Every measured field, in packed order within its part (sums first, then extremes)."""

_BY_KEY = {m.key: m for m in MEASURES}
assert len(_BY_KEY) == len(MEASURES), "measure keys must be unique"

_TOKENS = "loss_tokens:sum"
MEANS: tuple[Mean, ...] = (
    Mean("clip_fraction:mean", "clipped_tokens:sum", _TOKENS, True, "clipped tokens per eligible token"),
    Mean("abs_log_ratio:mean", "abs_log_ratio:sum", _TOKENS, False, "mean |l| per eligible token; nats"),
    Mean(
        "kl_k3:mean", "kl_k3:sum", _TOKENS, False, "mean k3 KL(sampler || trainer) per eligible token; nats"
    ),
)
"""Every derived mean, formed from merged sums."""

SUM_MEASURES = tuple(m for m in MEASURES if m.reduction == SUM)
"""Measures in the added part of the packed vector, in order."""
EXTREME_MEASURES = tuple(m for m in MEASURES if m.reduction != SUM)
"""Measures in the max-combined part of the packed vector, in order."""
GAUGE_MEASURES = tuple(m for m in MEASURES if m.group == GAUGE)
"""The on-policy gauge's measures."""
GAUGE_MEANS = tuple(m for m in MEANS if m.group == GAUGE)
"""The gauge's derived means (``abs_log_ratio:mean``, ``kl_k3:mean``)."""
DATUM_MEASURES = tuple(m for m in MEASURES if m is not LOSS)
"""Measures carried as per-datum fields (every one but the loss)."""
_BY_FIELD = {m.field: m for m in DATUM_MEASURES}
assert len(_BY_FIELD) == len(DATUM_MEASURES), "measure fields must be unique"

INVALID_SLOTS = 3
"""Bad-input counters per loss output: non-finite values, mask entries not 0/1, bad thresholds
(messages: ``cliptrack.adapters.losses.builtin.INPUT_CHECKS``, in this order)."""
CALL_COUNTERS = ("calls", *(f"{'clipping' if g == CLIP else g}_calls" for g in OPTIONAL_GROUPS))
"""``calls`` (loss calls summed) and, per optional group, the calls that carry it:
``clipping_calls``, ``split_calls``, ``gauge_calls``."""
PACKED_ADDED: tuple[str, ...] = (
    *(m.key for m in SUM_MEASURES),
    *CALL_COUNTERS,
    *(f"invalid[{i}]" for i in range(INVALID_SLOTS)),
)
"""The added part of the packed vector."""
EXTREME_FIELDS: tuple[str, ...] = tuple(m.packed for m in EXTREME_MEASURES)
"""The max-combined part of the packed vector (a min negated)."""
PACKED_FIELDS: tuple[str, ...] = (*PACKED_ADDED, *EXTREME_FIELDS)
"""The layout of a packed loss output (module docstring, "Packed layout")."""


def by_key(key: str) -> Measure:
    """The measure of a metric key; KeyError naming it otherwise."""
    try:
        return _BY_KEY[key]
    except KeyError:
        raise KeyError(f"{key!r} is not a measured key (one of {sorted(_BY_KEY)})") from None


def by_field(field: str) -> Measure:
    """The measure of a per-datum field; KeyError naming it otherwise."""
    try:
        return _BY_FIELD[field]
    except KeyError:
        raise KeyError(f"{field!r} is not a measured datum field (one of {sorted(_BY_FIELD)})") from None


def group_measures(group: str) -> tuple[Measure, ...]:
    """The measures of ``group``, in declaration order."""
    return tuple(m for m in MEASURES if m.group == group)


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
    return ValueError(
        f"{what} {has[now]} the {group} measures but earlier outputs of the step {have[earlier]} them "
        f"(emitted by {GROUP_LOSSES[group]}): their tokens cannot share one "
        f"{'/'.join(m.key for m in MEANS if m.group == group) or group}; run such losses in steps of their own"
    )
