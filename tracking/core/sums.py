"""The measured sums of a loss (cliptrack.core.measures) on the host, and the means formed once from them.

:class:`MeasuredSums` (also named :class:`TokenCounts`) is the one host state that aggregates (it
adds); the means are derived, never summed. It holds what any loss measured: ``loss_tokens``
always, the clip counts only for a loss that clips, the low/high split only when the producer
reports it (the stacks emit ``loss:sum``, ``loss_tokens:sum``, ``clipped_tokens:sum`` and
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
    "ClipCounts",
    "MeasuredSums",
    "TokenCounts",
    "add_gauge",
    "as_count",
    "check_fraction",
    "check_gauge",
    "check_mean",
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


def _gauge_value(measure: measures.Measure, value: object, where: str) -> float | int:
    name = f"{measure.key}{where}"
    if measure.exact:
        return as_count(name, value)
    number = _real(name, value)
    if measure.nonnegative and number < 0:
        raise ValueError(f"{name} must be >= 0 (a sum of non-negative terms), got {number!r}")
    return number


def check_gauge(values: Mapping[str, object], loss_tokens: int, where: str = "") -> dict[str, float | int]:
    """The gauge of ``loss_tokens`` eligible tokens, checked: every sum present, counts whole and
    at most ``loss_tokens``, non-negative sums >= 0, every value finite, all sums 0 and no extreme
    over no token, ``log_ratio:min <= log_ratio:max``. ``where`` is appended to a bad key's name.
    Extremes are optional (a merge that lost them keeps the sums). Raises ValueError."""
    missing = [key for key in GAUGE_SUM_KEYS if key not in values]
    if missing:
        raise ValueError(f"the gauge{where} lacks {missing} (its sums come together)")
    out: dict[str, float | int] = {}
    for measure in measures.GAUGE_MEASURES:
        if measure.key in values:
            out[measure.key] = _gauge_value(measure, values[measure.key], where)
    if out[keys.RATIO_OUTSIDE_TOKENS] > loss_tokens:
        raise ValueError(
            f"{keys.RATIO_OUTSIDE_TOKENS}{where}={out[keys.RATIO_OUTSIDE_TOKENS]} exceeds "
            f"loss_tokens={loss_tokens}: only eligible tokens are measured"
        )
    if loss_tokens == 0:
        nonzero = [key for key in out if out[key] != 0]
        if nonzero:
            raise ValueError(f"the gauge{where} has {nonzero} nonzero or present over no eligible token")
    high, low = out.get(keys.LOG_RATIO_MAX), out.get(keys.LOG_RATIO_MIN)
    if high is not None and low is not None and low > high:
        raise ValueError(f"{keys.LOG_RATIO_MIN}{where}={low!r} is above {keys.LOG_RATIO_MAX}={high!r}")
    return out


def add_gauge(
    a: Mapping[str, float | int], a_tokens: int, b: Mapping[str, float | int], b_tokens: int
) -> dict[str, float | int]:
    """The gauge of two disjoint sets of tokens: sums add, extremes merge by max / min. An extreme
    is kept when both sides know it or one side has no token (its extreme is the identity)."""
    out: dict[str, float | int] = {}
    sides = ((a, a_tokens), (b, b_tokens))
    for measure in measures.GAUGE_MEASURES:
        key = measure.key
        if measure.reduction == measures.SUM:
            out[key] = measures.combine(measure, (a[key], b[key]))
            continue
        known = [side[key] for side, _ in sides if key in side]
        if known and all(key in side or not tokens for side, tokens in sides):
            out[key] = measures.combine(measure, known)
    return out


@dataclass(frozen=True)
class MeasuredSums:
    """Exact measured sums of one or more micro-batches, datums, chunks or steps of one loss kind.

    ``loss_tokens``: eligible tokens (``mask != 0``). ``clipped_tokens``: eligible tokens where
    clipping changed the update; ``None`` for a loss that never clips. ``clipped_low_tokens`` /
    ``clipped_high_tokens``: the split by side of the band, both or neither, ``None`` when the
    producer does not report it. ``gauge``: the on-policy gauge, metric key -> value for every
    sum of :data:`GAUGE_SUM_KEYS` and the extremes when known (:func:`check_gauge`); ``None`` for
    a loss without sampling log-probs. Invariants (ValueError otherwise): every count is a whole
    number >= 0, ``clipped_tokens <= loss_tokens``, ``low + high == clipped`` when the split is
    present, and those of :func:`check_gauge`.

    Addition is exact for counts, ``math.fsum`` for float sums, max / min for extremes; adding a
    clipping loss's sums to a non-clipping loss's, or a gauge to none, raises ValueError
    (:func:`cliptrack.core.measures.mixed_groups_error`); a sum keeps the split only when both terms
    carry it.
    """

    loss_tokens: int
    clipped_tokens: int | None = None
    clipped_low_tokens: int | None = None
    clipped_high_tokens: int | None = None
    gauge: Mapping[str, float | int] | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "loss_tokens", as_count("loss_tokens", self.loss_tokens))
        for name in ("clipped_tokens", "clipped_low_tokens", "clipped_high_tokens"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, as_count(name, value))
        if self.gauge is not None:
            object.__setattr__(self, "gauge", check_gauge(self.gauge, self.loss_tokens))
        self._check_clip_counts()

    def _check_clip_counts(self) -> None:
        low, high, clipped = self.clipped_low_tokens, self.clipped_high_tokens, self.clipped_tokens
        if (low is None) != (high is None):
            raise ValueError(
                "clipped_low_tokens and clipped_high_tokens come together: one is given without the other"
            )
        if clipped is None:
            if low is not None:
                raise ValueError("a low/high split was given without clipped_tokens")
            return
        if clipped > self.loss_tokens:
            raise ValueError(
                f"clipped_tokens={clipped} exceeds loss_tokens={self.loss_tokens}: "
                "a token can only be clipped if it is eligible"
            )
        if low is not None and high is not None and low + high != clipped:
            raise ValueError(
                f"clipped_low_tokens={low} + clipped_high_tokens={high} != clipped_tokens={clipped}"
            )

    @property
    def clips(self) -> bool:
        """Whether these are the counts of a loss that clips."""
        return self.clipped_tokens is not None

    @property
    def has_split(self) -> bool:
        """Whether the low/high split is known."""
        return self.clipped_low_tokens is not None

    @property
    def has_gauge(self) -> bool:
        """Whether these carry the on-policy gauge (a loss with sampling log-probs)."""
        return self.gauge is not None

    @property
    def fraction(self) -> float | None:
        """Token-weighted clip fraction in [0, 1]; ``None`` when no token was eligible or the loss
        never clips."""
        if self.clipped_tokens is None or self.loss_tokens == 0:
            return None
        return self.clipped_tokens / self.loss_tokens

    def without_gauge(self) -> MeasuredSums:
        """The same counts without the gauge."""
        return MeasuredSums(
            self.loss_tokens, self.clipped_tokens, self.clipped_low_tokens, self.clipped_high_tokens
        )

    def __add__(self, other: MeasuredSums) -> MeasuredSums:
        if not isinstance(other, MeasuredSums):
            return NotImplemented
        if self.clips != other.clips:
            raise mixed_kinds_error(self.clips, other.clips)
        if self.has_gauge != other.has_gauge:
            raise measures.mixed_groups_error(measures.GAUGE, self.has_gauge, other.has_gauge)
        gauge = None
        if self.gauge is not None and other.gauge is not None:
            gauge = add_gauge(self.gauge, self.loss_tokens, other.gauge, other.loss_tokens)
        tokens = self.loss_tokens + other.loss_tokens
        if self.clipped_tokens is None or other.clipped_tokens is None:
            return MeasuredSums(tokens, gauge=gauge)
        low = high = None
        if self.clipped_low_tokens is not None and other.clipped_low_tokens is not None:
            assert self.clipped_high_tokens is not None and other.clipped_high_tokens is not None
            low = self.clipped_low_tokens + other.clipped_low_tokens
            high = self.clipped_high_tokens + other.clipped_high_tokens
        return MeasuredSums(tokens, self.clipped_tokens + other.clipped_tokens, low, high, gauge=gauge)

    def to_metrics(self) -> dict[str, float]:
        """The metric keys of docs/CONTRACT.md: ``loss_tokens:sum`` always; for a loss that clips,
        ``clipped_tokens:sum``, the split keys when known, and ``clip_fraction:mean`` when
        ``loss_tokens > 0``; with the gauge, its sums, its extremes when known and its means when
        ``loss_tokens > 0`` (a mean is never invented)."""
        out = {keys.LOSS_TOKENS: float(self.loss_tokens)}
        if self.clipped_tokens is not None:
            out[keys.CLIPPED_TOKENS] = float(self.clipped_tokens)
            if self.clipped_low_tokens is not None and self.clipped_high_tokens is not None:
                out[keys.CLIPPED_LOW_TOKENS] = float(self.clipped_low_tokens)
                out[keys.CLIPPED_HIGH_TOKENS] = float(self.clipped_high_tokens)
        if self.gauge is not None:
            out.update((key, float(value)) for key, value in self.gauge.items())
        if self.loss_tokens:
            for mean in measures.MEANS:
                if mean.numerator in out:
                    out[mean.key] = out[mean.numerator] / self.loss_tokens
        return out

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, object]) -> MeasuredSums | None:
        """Read the measured sums of a metrics mapping; ``None`` when it carries no
        ``loss_tokens:sum`` (and no other measured key). Raises ValueError naming a bad value or an
        inconsistent set of keys.

        A loss clips exactly when ``clipped_tokens:sum`` is present; the split keys are optional
        but come together and need ``clipped_tokens:sum``; the gauge is present exactly when one
        of its sums is (then all of them), its extremes optional.
        """
        present = [key for key in keys.TOKEN_COUNT_KEYS if key in metrics]
        gauge_present = [key for key in keys.GAUGE_MEASURED_KEYS if key in metrics]
        if not present and not gauge_present:
            return None
        counts = {key: as_count(key, metrics[key]) for key in present}
        if keys.LOSS_TOKENS not in counts:
            raise ValueError(f"metrics carry {present + gauge_present} but not {keys.LOSS_TOKENS!r}")
        _check_split_keys(counts)
        gauge = None
        if gauge_present:
            gauge = check_gauge({k: metrics[k] for k in gauge_present}, counts[keys.LOSS_TOKENS])
        return cls(
            counts[keys.LOSS_TOKENS],
            counts.get(keys.CLIPPED_TOKENS),
            counts.get(keys.CLIPPED_LOW_TOKENS),
            counts.get(keys.CLIPPED_HIGH_TOKENS),
            gauge=gauge,
        )


def _check_split_keys(counts: Mapping[str, int]) -> None:
    has_low, has_high = keys.CLIPPED_LOW_TOKENS in counts, keys.CLIPPED_HIGH_TOKENS in counts
    if has_low != has_high:
        side = keys.CLIPPED_LOW_TOKENS if has_low else keys.CLIPPED_HIGH_TOKENS
        raise ValueError(f"metrics carry {side!r} without its other side of the low/high split")
    if has_low and keys.CLIPPED_TOKENS not in counts:
        raise ValueError(
            f"metrics carry the low/high split but not {keys.CLIPPED_TOKENS!r}, the count it splits"
        )


TokenCounts = MeasuredSums
"""The name of :class:`MeasuredSums` from before the gauge (same type)."""
ClipCounts = MeasuredSums
"""Former name of :class:`MeasuredSums` (same type)."""


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


def exact_measured_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """A copy of ``metrics`` with its measured values checked and the means formed from the sums.

    Raises ValueError naming a bad count or gauge value, an inconsistent set of measured keys, or a
    mean out of range. A mean whose sums are present is replaced by ``numerator / loss_tokens:sum``
    (dropped when no token was eligible: a mean is never invented); a mean without its sums is
    kept once it is checked (:func:`check_mean`). Metrics without measured keys are returned
    unchanged.
    """
    out = dict(metrics)
    if MEASURED_VALUE_KEYS.isdisjoint(out):
        return out
    sums = MeasuredSums.from_metrics(out)
    formed = sums.to_metrics() if sums is not None else {}
    for mean in measures.MEANS:
        if mean.numerator in formed:
            out.pop(mean.key, None)
        elif mean.key in out:
            out[mean.key] = check_mean(mean.key, out[mean.key])
    out.update(formed)
    return out


exact_clip_metrics = exact_measured_metrics
"""The name of :func:`exact_measured_metrics` from before the gauge."""
