"""Token counts of a loss as exact integer sums, and the clip fraction formed once from them.

:class:`TokenCounts` is the one state that aggregates (it adds); the fraction is derived, never
summed. It holds the counts of any loss: ``loss_tokens`` always, the clip counts only for a loss
that clips, and the low/high split only when the producer reports it (the split is optional:
the stacks emit ``loss:sum``, ``loss_tokens:sum``, ``clipped_tokens:sum`` and
``clip_fraction:mean`` alone). All counts are in tokens. See docs/CONTRACT.md, "Metric keys" and
"Aggregation is a ratio of sums".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tracking import keys
from tracking.outputs import metrics_of

__all__ = [
    "CLIP_VALUE_KEYS",
    "MAX_EXACT_COUNT",
    "ClipCounts",
    "TokenCounts",
    "as_count",
    "check_fraction",
    "exact_clip_metrics",
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
    return ValueError(
        f"{what} comes from a loss that {'clips' if now_clips else 'never clips'} but earlier "
        f"outputs of the step come from one that {'clips' if earlier_clips else 'never clips'}: their "
        "tokens cannot share one clip fraction (PPO and CISPO sum together; cross_entropy, "
        "importance_sampling and dro belong in steps of their own)"
    )


@dataclass(frozen=True)
class TokenCounts:
    """Exact token counts of one or more micro-batches, datums, chunks or steps of one loss kind.

    ``loss_tokens``: eligible tokens (``mask != 0``). ``clipped_tokens``: eligible tokens where
    clipping changed the update; ``None`` for a loss that never clips. ``clipped_low_tokens`` /
    ``clipped_high_tokens``: the split by side of the band, both or neither, ``None`` when the
    producer does not report it. Invariants (ValueError otherwise): every count is a whole number
    >= 0, ``clipped_tokens <= loss_tokens``, ``low + high == clipped`` when the split is present.

    Addition is exact; adding a clipping loss's counts to a non-clipping loss's raises ValueError
    (:func:`mixed_kinds_error`); a sum keeps the split only when both terms carry it.
    """

    loss_tokens: int
    clipped_tokens: int | None = None
    clipped_low_tokens: int | None = None
    clipped_high_tokens: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "loss_tokens", as_count("loss_tokens", self.loss_tokens))
        for name in ("clipped_tokens", "clipped_low_tokens", "clipped_high_tokens"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, as_count(name, value))
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
    def fraction(self) -> float | None:
        """Token-weighted clip fraction in [0, 1]; ``None`` when no token was eligible or the loss
        never clips."""
        if self.clipped_tokens is None or self.loss_tokens == 0:
            return None
        return self.clipped_tokens / self.loss_tokens

    def __add__(self, other: TokenCounts) -> TokenCounts:
        if not isinstance(other, TokenCounts):
            return NotImplemented
        if self.clips != other.clips:
            raise mixed_kinds_error(self.clips, other.clips)
        if self.clipped_tokens is None or other.clipped_tokens is None:
            return TokenCounts(self.loss_tokens + other.loss_tokens)
        low = high = None
        if self.clipped_low_tokens is not None and other.clipped_low_tokens is not None:
            assert self.clipped_high_tokens is not None and other.clipped_high_tokens is not None
            low = self.clipped_low_tokens + other.clipped_low_tokens
            high = self.clipped_high_tokens + other.clipped_high_tokens
        return TokenCounts(
            self.loss_tokens + other.loss_tokens, self.clipped_tokens + other.clipped_tokens, low, high
        )

    def to_metrics(self) -> dict[str, float]:
        """The metric keys of docs/CONTRACT.md: ``loss_tokens:sum`` always; for a loss that clips,
        ``clipped_tokens:sum``, the split keys when known, and ``clip_fraction:mean`` when
        ``loss_tokens > 0`` (a fraction is never invented)."""
        out = {keys.LOSS_TOKENS: float(self.loss_tokens)}
        if self.clipped_tokens is None:
            return out
        out[keys.CLIPPED_TOKENS] = float(self.clipped_tokens)
        if self.clipped_low_tokens is not None and self.clipped_high_tokens is not None:
            out[keys.CLIPPED_LOW_TOKENS] = float(self.clipped_low_tokens)
            out[keys.CLIPPED_HIGH_TOKENS] = float(self.clipped_high_tokens)
        fraction = self.fraction
        if fraction is not None:
            out[keys.CLIP_FRACTION] = fraction
        return out

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, object]) -> TokenCounts | None:
        """Read the counts of a metrics mapping; ``None`` when it carries no ``loss_tokens:sum``
        (and no clip count). Raises ValueError naming a bad count or an inconsistent set of keys.

        A loss clips exactly when ``clipped_tokens:sum`` is present; the split keys are optional
        but come together and need ``clipped_tokens:sum``.
        """
        present = [key for key in keys.TOKEN_COUNT_KEYS if key in metrics]
        if not present:
            return None
        counts = {key: as_count(key, metrics[key]) for key in present}
        if keys.LOSS_TOKENS not in counts:
            raise ValueError(f"metrics carry {present} but not {keys.LOSS_TOKENS!r}")
        has_low, has_high = keys.CLIPPED_LOW_TOKENS in counts, keys.CLIPPED_HIGH_TOKENS in counts
        if has_low != has_high:
            side = keys.CLIPPED_LOW_TOKENS if has_low else keys.CLIPPED_HIGH_TOKENS
            raise ValueError(f"metrics carry {side!r} without its other side of the low/high split")
        if has_low and keys.CLIPPED_TOKENS not in counts:
            raise ValueError(
                f"metrics carry the low/high split but not {keys.CLIPPED_TOKENS!r}, the count it splits"
            )
        return cls(
            counts[keys.LOSS_TOKENS],
            counts.get(keys.CLIPPED_TOKENS),
            counts.get(keys.CLIPPED_LOW_TOKENS),
            counts.get(keys.CLIPPED_HIGH_TOKENS),
        )


ClipCounts = TokenCounts
"""Former name of :class:`TokenCounts` (same type)."""


def sum_counts(terms: Iterable[TokenCounts | None]) -> TokenCounts | None:
    """Exact sum of :class:`TokenCounts` (``None`` terms skipped); ``None`` when there are none."""
    total: TokenCounts | None = None
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


CLIP_VALUE_KEYS = frozenset({*keys.TOKEN_COUNT_KEYS, keys.CLIP_FRACTION})
"""Keys whose values :func:`exact_clip_metrics` checks (counts and the fraction)."""


def exact_clip_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """A copy of ``metrics`` with its token counts checked and the clip fraction formed from them.

    Raises ValueError naming a bad count, an inconsistent set of count keys, or a
    ``clip_fraction:mean`` outside [0, 1]. When ``clipped_tokens:sum`` is present, any incoming
    ``clip_fraction:mean`` is replaced by ``clipped_tokens:sum / loss_tokens:sum`` (dropped when no
    token was eligible: a fraction is never invented); a fraction without counts is kept once it
    is checked. Metrics without count or fraction keys are returned unchanged.
    """
    out = dict(metrics)
    if CLIP_VALUE_KEYS.isdisjoint(out):
        return out
    counts = TokenCounts.from_metrics(out)
    if counts is not None and counts.clips:
        out.pop(keys.CLIP_FRACTION, None)
        out.update(counts.to_metrics())
    elif keys.CLIP_FRACTION in out:
        out[keys.CLIP_FRACTION] = check_fraction(out[keys.CLIP_FRACTION])
    return out
