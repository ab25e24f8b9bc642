"""The measured sums of a loss (cliptrack.core.measures) on the host, and the means formed once from them.

:class:`MeasuredSums` is the one host state that aggregates (it adds); the means are derived,
never summed. It holds what any loss measured, by metric key (every key a measure of
:mod:`cliptrack.core.measures`, read by the declaration given, the default one unless another): ``loss_tokens`` always, the clip
counts only for a loss that clips, the low/high split only when the producer reports it (the stacks emit ``loss:sum``, ``loss_tokens:sum``, ``clipped_tokens:sum`` and
``clip_fraction:mean`` alone), and the on-policy gauge (``gauge``: sums and extremes of
``l = logprobs - sampling_logprobs``) only for a loss with sampling log-probs. Counts are exact
ints in tokens; float sums are float64 added with ``math.fsum``; extremes merge by max / min. See
docs/CONTRACT.md, "Metric keys", "Aggregation is a ratio of sums" and "The on-policy gauge".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cliptrack.core import keys, measures
from cliptrack.core.outputs import metrics_of

__all__ = [
    "CLIP_VALUE_KEYS",
    "GAUGE_EXTREME_KEYS",
    "GAUGE_SUM_KEYS",
    "MAX_EXACT_COUNT",
    "MEASURED_VALUE_KEYS",
    "MeasuredSums",
    "as_count",
    "check_fraction",
    "check_gauge",
    "check_mean",
    "check_sums",
    "exact_clip_metrics",
    "exact_measured_metrics",
    "metrics_of",
    "mixed_kinds_error",
    "sum_counts",
]

MAX_EXACT_COUNT = 2**53
"""Token counts carried as floats are exact below this; a float at or above it is ambiguous."""


def as_count(name: str, value: object) -> int:
    """Return ``value`` as an exact non-negative int, or raise ValueError naming ``name``."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a token count, got the boolean {value!r}")
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars (host boundary)
        value = value.item()
    if isinstance(value, int):
        number: float | int = value
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite token count, got {value!r}")
        if not value.is_integer():
            raise ValueError(f"{name} must be a whole number of tokens, got the fraction {value!r}")
        if abs(value) >= MAX_EXACT_COUNT:
            raise ValueError(f"{name}={value!r} reached 2**53 and is no longer exact as a float")
        number = int(value)
    else:
        raise ValueError(f"{name} must be a token count (int), got {type(value).__name__} {value!r}")
    if number < 0:
        raise ValueError(f"{name} must be >= 0 tokens, got {number}")
    return int(number)


def mixed_kinds_error(earlier_clips: bool, now_clips: bool, what: str = "this output") -> ValueError:
    """The one error for adding the counts of a clipping loss to those of a loss that never clips."""
    return measures.mixed_groups_error(measures.CLIP, earlier_clips, now_clips, what)


GAUGE_SUM_KEYS = tuple(m.key for m in measures.GAUGE_MEASURES if m.reduction == measures.SUM)
"""The gauge's sums, in declaration order (always present together)."""
GAUGE_EXTREME_KEYS = tuple(m.key for m in measures.GAUGE_MEASURES if m.reduction != measures.SUM)
"""The gauge's extremes: absent over no eligible token, and unknown (absent) when a merge lost them."""


def _real(name: str, value: object) -> float:
    """``value`` as a finite float, or ValueError naming ``name``."""
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars (host boundary)
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(
            f"{name} must be finite, got {number!r} (a non-finite log-ratio is a bad loss input)"
        )
    return number


def _value(measure: measures.Measure, value: object, name: str) -> float | int:
    """One measured value checked as its declaration says: a whole count, or a finite float (>= 0
    when ``nonnegative``)."""
    if measure.exact:
        return as_count(name, value)
    number = _real(name, value)
    if measure.nonnegative and number < 0:
        raise ValueError(f"{name} must be >= 0 (a sum of non-negative terms), got {number!r}")
    return number


def _check_split(values: Mapping[str, float | int]) -> None:
    """The clip counts: the split comes as a pair, beside ``clipped_tokens``, and adds up to it."""
    low, high = values.get(keys.CLIPPED_LOW_TOKENS), values.get(keys.CLIPPED_HIGH_TOKENS)
    clipped, tokens = values.get(keys.CLIPPED_TOKENS), values[keys.LOSS_TOKENS]
    if (low is None) != (high is None):
        raise ValueError(
            "clipped_low_tokens and clipped_high_tokens come together: one is given without the other"
        )
    if clipped is None:
        if low is not None:
            raise ValueError("a low/high split was given without clipped_tokens")
        return
    if clipped > tokens:
        raise ValueError(
            f"clipped_tokens={clipped} exceeds loss_tokens={tokens}: a token can only be clipped if it is eligible"
        )
    if low is not None and high is not None and low + high != clipped:
        raise ValueError(f"clipped_low_tokens={low} + clipped_high_tokens={high} != clipped_tokens={clipped}")


def _group_label(group: str) -> str:
    return "the gauge" if group == measures.GAUGE else f"the {group} measures"


def check_sums(
    values: Mapping[str, object], where: str = "", declaration: measures.Declaration = measures.DEFAULT
) -> dict[str, float | int]:
    """Measured sums by metric key, checked against ``declaration``; the checked copy.

    Every key a declared measure but ``loss:sum``; ``loss_tokens:sum`` present; each value as its
    measure says (:func:`as_count` for a count, finite and ``nonnegative`` for a float); a group
    all or none (its extremes optional: a merge may lose them), a refining group only beside the
    group it refines; clip counts consistent (``low + high == clipped <= loss_tokens``); every
    count at most ``loss_tokens`` (only eligible tokens are measured); over no eligible token
    every sum 0 and no extreme; a min at most its max. ``where`` is appended to a bad key's name.
    Raises ValueError naming the key.
    """
    unknown = [k for k in values if k not in declaration.by_key or k == keys.LOSS_SUM]
    if unknown:
        raise ValueError(f"{unknown} are not measured sums (declared: {sorted(declaration.by_key)})")
    if keys.LOSS_TOKENS not in values:
        raise ValueError(f"measured sums{where} lack {keys.LOSS_TOKENS!r}")
    given = {
        key: _value(
            declaration.by_key[key],
            value,
            f"{key}{where}" if key != keys.LOSS_TOKENS else f"loss_tokens{where}",
        )
        for key, value in values.items()
    }
    out = {m.key: given[m.key] for m in declaration.measures if m.key in given}  # declaration order
    _check_split(out)
    _check_groups(declaration, out, where)
    _check_bounds(declaration, out, where)
    return out


def _check_groups(declaration: measures.Declaration, out: Mapping[str, float | int], where: str) -> None:
    """Each group all or none (its sums; extremes optional), a refining group beside its base."""
    for group in declaration.groups:
        members = [m for m in declaration.members[group.name] if m.key != keys.LOSS_SUM]
        if group.name == measures.SPLIT or not any(m.key in out for m in members):
            continue
        missing = [m.key for m in members if m.reduction == measures.SUM and m.key not in out]
        if missing:
            raise ValueError(f"{_group_label(group.name)}{where} lacks {missing} (its sums come together)")
        if group.within is not None and not any(m.key in out for m in declaration.members[group.within]):
            raise ValueError(
                f"{_group_label(group.name)}{where} is given without the {group.within} measures"
            )


def _check_bounds(declaration: measures.Declaration, out: Mapping[str, float | int], where: str) -> None:
    """Counts at most ``loss_tokens``; nothing over no token; a min at most its max."""
    tokens = out[keys.LOSS_TOKENS]
    for key, value in out.items():
        if declaration.by_key[key].exact and key != keys.LOSS_TOKENS and value > tokens:
            raise ValueError(
                f"{key}{where}={value} exceeds loss_tokens={tokens}: only eligible tokens are measured"
            )
    if tokens == 0:
        nonzero = [key for key, value in out.items() if key != keys.LOSS_TOKENS and value != 0]
        if nonzero:
            label = _group_label(declaration.by_key[nonzero[0]].group)
            raise ValueError(f"{label}{where} has {nonzero} nonzero or present over no eligible token")
    for measure in declaration.extreme_measures:
        high, low = out.get(f"{measure.name}:{measures.MAX}"), out.get(measure.key)
        if measure.reduction == measures.MIN and high is not None and low is not None and low > high:
            raise ValueError(f"{measure.key}{where}={low!r} is above {measure.name}:{measures.MAX}={high!r}")


def check_gauge(values: Mapping[str, object], loss_tokens: int, where: str = "") -> dict[str, float | int]:
    """The gauge of ``loss_tokens`` eligible tokens, checked as :func:`check_sums` checks it (its
    sums present, counts whole and at most ``loss_tokens``, non-negative sums >= 0, finite, nothing
    over no token, ``log_ratio:min <= log_ratio:max``). Raises ValueError."""
    missing = [key for key in GAUGE_SUM_KEYS if key not in values]
    if missing:
        raise ValueError(f"the gauge{where} lacks {missing} (its sums come together)")
    checked = check_sums({keys.LOSS_TOKENS: loss_tokens, **values}, where)
    return {key: checked[key] for key in keys.GAUGE_MEASURED_KEYS if key in checked}


@dataclass(frozen=True)
class MeasuredSums:
    """Exact measured sums of one or more micro-batches, datums, chunks or steps of one loss kind.

    ``values``: metric key -> value for every measure present (``loss:sum`` excepted), read and
    checked by ``declaration`` (:func:`check_sums`; :data:`cliptrack.core.measures.DEFAULT` unless
    given): ``loss_tokens:sum`` (eligible
    tokens, ``mask != 0``) always; each optional group (clip counts, their low/high split, the
    on-policy gauge, a group a declaration was extended with) all or none, its extremes when known. Counts are exact
    ints in tokens, float sums float64, extremes floats.

    Addition (:meth:`__add__`) follows :func:`cliptrack.core.measures.combine` per key: exact for
    counts, ``math.fsum`` for float sums, max / min for extremes (kept when both terms know them or
    one has no token); adding terms of which one carries a group the other lacks raises ValueError
    (:func:`cliptrack.core.measures.mixed_groups_error`), except a group ``dropped_when_mixed``
    (the split), which the sum then lacks.
    """

    values: Mapping[str, float | int]
    declaration: measures.Declaration = field(default=measures.DEFAULT, kw_only=True, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.values, Mapping):
            raise TypeError(
                f"MeasuredSums takes a mapping of metric key -> value, got {type(self.values).__name__}"
            )
        object.__setattr__(self, "values", check_sums(self.values, declaration=self.declaration))

    @property
    def loss_tokens(self) -> int:
        """Eligible tokens (``mask != 0``)."""
        return int(self.values[keys.LOSS_TOKENS])

    def __getitem__(self, key: str) -> float | int:
        try:
            return self.values[key]
        except KeyError:
            raise KeyError(f"these sums carry no {key!r} (they carry {sorted(self.values)})") from None

    def __contains__(self, key: object) -> bool:
        return key in self.values

    def get(self, key: str) -> float | int | None:
        """The value of ``key``, ``None`` when absent."""
        return self.values.get(key)

    def has(self, group: str) -> bool:
        """Whether these carry the measures of ``group`` (:data:`cliptrack.core.measures.EVERY`: always)."""
        members = measures.group_measures(group, self.declaration)
        return group == measures.EVERY or any(m.key in self.values for m in members)

    def group_values(self, group: str) -> dict[str, float | int] | None:
        """The values of ``group``'s measures present, by key; ``None`` when the group is absent."""
        members = measures.group_measures(group, self.declaration)
        found = {m.key: self.values[m.key] for m in members if m.key in self.values}
        return found or None

    @property
    def clips(self) -> bool:
        """Whether these are the counts of a loss that clips."""
        return self.has(measures.CLIP)

    @property
    def has_split(self) -> bool:
        """Whether the low/high split is known."""
        return self.has(measures.SPLIT)

    @property
    def has_gauge(self) -> bool:
        """Whether these carry the on-policy gauge (a loss with sampling log-probs)."""
        return self.has(measures.GAUGE)

    @property
    def fraction(self) -> float | None:
        """Token-weighted clip fraction in [0, 1]; ``None`` when no token was eligible or the loss
        never clips."""
        clipped = self.values.get(keys.CLIPPED_TOKENS)
        if clipped is None or self.loss_tokens == 0:
            return None
        return clipped / self.loss_tokens

    def without(self, *groups: str) -> MeasuredSums:
        """The same sums without the measures of ``groups`` (and of the groups refining them)."""
        drop = set(groups)
        drop |= {g.name for g in self.declaration.groups if g.within in drop}
        kept = {k: v for k, v in self.values.items() if self.declaration.by_key[k].group not in drop}
        return MeasuredSums(kept, declaration=self.declaration)

    def __add__(self, other: MeasuredSums) -> MeasuredSums:
        if not isinstance(other, MeasuredSums):
            return NotImplemented
        declaration = self.declaration
        if other.declaration is not declaration:
            raise ValueError(
                "these measured sums were read by different declarations (cliptrack.core.measures."
                "Declaration): add sums of one declaration only"
            )
        out: dict[str, float | int] = {}
        for group in declaration.groups:
            mine, theirs = self.has(group.name), other.has(group.name)
            if mine != theirs and not group.dropped_when_mixed:
                raise measures.mixed_groups_error(group.name, mine, theirs, declaration=declaration)
            if mine and theirs:
                out.update(_add_group(declaration.members[group.name], self, other))
        return MeasuredSums(out, declaration=declaration)

    def to_metrics(self) -> dict[str, float]:
        """The metric keys of docs/CONTRACT.md: every measured value present (``loss_tokens:sum``
        always; a loss's clip counts, split, gauge and a declaration's added measures when it has them), and
        every mean whose sums are present when its denominator is > 0 (a mean is never invented)."""
        out = {key: float(value) for key, value in self.values.items()}
        for mean in self.declaration.means:
            if mean.numerator in out and out.get(mean.denominator):
                out[mean.key] = out[mean.numerator] / out[mean.denominator]
        return out

    @classmethod
    def from_metrics(
        cls, metrics: Mapping[str, object], declaration: measures.Declaration = measures.DEFAULT
    ) -> MeasuredSums | None:
        """Read the measured sums of a metrics mapping; ``None`` when it carries no measured key
        (``loss:sum`` aside). Raises ValueError naming a bad value or an inconsistent set of keys.

        A loss clips exactly when ``clipped_tokens:sum`` is present; the split keys are optional
        but come together and need ``clipped_tokens:sum``; the gauge (and an added group of ``declaration``) is
        present exactly when one of its sums is (then all of them), its extremes optional.
        """
        declared = declaration.by_key
        present = [key for key in metrics if key in declared and key != keys.LOSS_SUM]
        if not present:
            return None
        # each value first: a bad one is named before what is missing
        values = {key: _value(declared[key], metrics[key], key) for key in present}
        if keys.LOSS_TOKENS not in metrics:
            raise ValueError(f"metrics carry {present} but not {keys.LOSS_TOKENS!r}")
        _check_split_keys(present)
        return cls(values, declaration=declaration)


def _add_group(
    members: Iterable[measures.Measure], left: MeasuredSums, right: MeasuredSums
) -> dict[str, float | int]:
    """The sum of one group that both terms carry, by metric key (``loss:sum`` excepted): each sum
    combined (exact ints in tokens, float sums by ``math.fsum``); each extreme by max / min when
    every term with an eligible token knows it, else left out."""
    out: dict[str, float | int] = {}
    for measure in members:
        key = measure.key
        if key == keys.LOSS_SUM:
            continue
        if measure.reduction == measures.SUM:
            out[key] = measures.combine(measure, (left.values[key], right.values[key]))
            continue
        extreme = _add_extreme(measure, left, right)
        if extreme is not None:
            out[key] = extreme
    return out


def _add_extreme(measure: measures.Measure, left: MeasuredSums, right: MeasuredSums) -> float | int | None:
    """One extreme of two terms (max / min of those that know it); ``None`` when neither knows it or
    a term with an eligible token (``loss_tokens > 0``) lacks it."""
    key = measure.key
    sides = ((left, left.loss_tokens), (right, right.loss_tokens))
    known = [side.values[key] for side, _ in sides if key in side.values]
    if known and all(key in side.values or not tokens for side, tokens in sides):
        return measures.combine(measure, known)
    return None


def _check_split_keys(present: Iterable[str]) -> None:
    counts = set(present)
    has_low, has_high = keys.CLIPPED_LOW_TOKENS in counts, keys.CLIPPED_HIGH_TOKENS in counts
    if has_low != has_high:
        side = keys.CLIPPED_LOW_TOKENS if has_low else keys.CLIPPED_HIGH_TOKENS
        raise ValueError(f"metrics carry {side!r} without its other side of the low/high split")
    if has_low and keys.CLIPPED_TOKENS not in counts:
        raise ValueError(
            f"metrics carry the low/high split but not {keys.CLIPPED_TOKENS!r}, the count it splits"
        )


def sum_counts(terms: Iterable[MeasuredSums | None]) -> MeasuredSums | None:
    """Exact sum of :class:`MeasuredSums` (``None`` terms skipped); ``None`` when there are none."""
    total: MeasuredSums | None = None
    for term in terms:
        if term is None:
            continue
        total = term if total is None else total + term
    return total


def check_fraction(value: object) -> float:
    """A ``clip_fraction:mean`` given without counts: a real number in [0, 1], else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(
            f"{keys.CLIP_FRACTION} must be a number in [0, 1], got {type(value).__name__} {value!r}"
        )
    number = float(value)
    if not 0.0 <= number <= 1.0:  # NaN fails too
        raise ValueError(f"{keys.CLIP_FRACTION} must be a fraction of tokens in [0, 1], got {number!r}")
    return number


def check_mean(key: str, value: object) -> float:
    """A derived mean given without its sums: a fraction in [0, 1] (``clip_fraction:mean``) or a
    finite number >= 0 (the gauge's means), else ValueError naming ``key``."""
    if key == keys.CLIP_FRACTION:
        return check_fraction(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be a number >= 0, got {type(value).__name__} {value!r}")
    number = float(value)
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"{key} must be a finite mean >= 0 over eligible tokens, got {number!r}")
    return number


MEASURED_VALUE_KEYS = frozenset({*(k for k in keys.MEASURED_KEYS if k != keys.LOSS_SUM), *keys.MEAN_KEYS})
"""Keys whose values :func:`exact_measured_metrics` checks (every measured key but ``loss:sum``, and
the means)."""
CLIP_VALUE_KEYS = MEASURED_VALUE_KEYS
"""The name of :data:`MEASURED_VALUE_KEYS` from before the gauge."""


def exact_measured_metrics(
    metrics: Mapping[str, float], declaration: measures.Declaration = measures.DEFAULT
) -> dict[str, float]:
    """A copy of ``metrics`` with its measured values checked and the means formed from the sums.

    Raises ValueError naming a bad count or gauge value, an inconsistent set of measured keys, or a
    mean out of range. A mean whose sums are present is replaced by ``numerator / loss_tokens:sum``
    (dropped when no token was eligible: a mean is never invented); a mean without its sums is
    kept once it is checked (:func:`check_mean`). Metrics without measured keys are returned
    unchanged. The measured keys and means are ``declaration``'s.
    """
    out = dict(metrics)
    measured = {*(m.key for m in declaration.datum_measures), *(m.key for m in declaration.means)}
    if measured.isdisjoint(out):
        return out
    sums = MeasuredSums.from_metrics(out, declaration)
    formed = sums.to_metrics() if sums is not None else {}
    for mean in declaration.means:
        if mean.numerator in formed:
            out.pop(mean.key, None)
        elif mean.key in out:
            out[mean.key] = check_mean(mean.key, out[mean.key])
    out.update(formed)
    return out


exact_clip_metrics = exact_measured_metrics
"""The name of :func:`exact_measured_metrics` from before the gauge."""
