"""Clip counts as exact integer sums, and the fraction formed once from them.

``ClipCounts`` is the state that aggregates (it adds); the fraction is derived, never summed.
All counts are in tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tracking import keys

MAX_EXACT_COUNT = 2**53
"""Token counts carried as floats are exact below this; a float at or above it is ambiguous."""


def metrics_of(output: object) -> Mapping[str, Any]:
    """The metrics mapping of a ForwardBackwardOutput (cliptrack's or tinker's) or of its JSON dict."""
    if isinstance(output, Mapping):
        if "metrics" not in output:
            raise ValueError(f"output dict has no 'metrics' field (fields: {sorted(output)})")
        metrics = output["metrics"]
    else:
        metrics = getattr(output, "metrics", None)
    if not isinstance(metrics, Mapping):
        raise ValueError(
            f"expected a ForwardBackwardOutput (or its JSON dict) with a 'metrics' mapping, "
            f"got {type(output).__name__}"
        )
    return metrics


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


@dataclass(frozen=True)
class ClipCounts:
    """Exact clip counts of one or more micro-batches, datums, chunks or steps.

    Attributes are token counts. ``clipped_low_tokens + clipped_high_tokens == clipped_tokens``.
    """

    loss_tokens: int
    clipped_tokens: int
    clipped_low_tokens: int
    clipped_high_tokens: int

    def __post_init__(self) -> None:
        for field in ("loss_tokens", "clipped_tokens", "clipped_low_tokens", "clipped_high_tokens"):
            object.__setattr__(self, field, as_count(field, getattr(self, field)))
        if self.clipped_tokens > self.loss_tokens:
            raise ValueError(
                f"clipped_tokens={self.clipped_tokens} exceeds loss_tokens={self.loss_tokens}: "
                "a token can only be clipped if it is eligible"
            )
        if self.clipped_low_tokens + self.clipped_high_tokens != self.clipped_tokens:
            raise ValueError(
                f"clipped_low_tokens={self.clipped_low_tokens} + clipped_high_tokens="
                f"{self.clipped_high_tokens} != clipped_tokens={self.clipped_tokens}"
            )

    @property
    def fraction(self) -> float | None:
        """Token-weighted clip fraction in [0, 1]; ``None`` when no token was eligible."""
        if self.loss_tokens == 0:
            return None
        return self.clipped_tokens / self.loss_tokens

    def __add__(self, other: ClipCounts) -> ClipCounts:
        if not isinstance(other, ClipCounts):
            return NotImplemented
        return ClipCounts(
            self.loss_tokens + other.loss_tokens,
            self.clipped_tokens + other.clipped_tokens,
            self.clipped_low_tokens + other.clipped_low_tokens,
            self.clipped_high_tokens + other.clipped_high_tokens,
        )

    def to_metrics(self) -> dict[str, float]:
        """Metric dict in the SPEC's keys; ``clip_fraction:mean`` only when ``loss_tokens > 0``."""
        out = {
            keys.LOSS_TOKENS: float(self.loss_tokens),
            keys.CLIPPED_TOKENS: float(self.clipped_tokens),
            keys.CLIPPED_LOW_TOKENS: float(self.clipped_low_tokens),
            keys.CLIPPED_HIGH_TOKENS: float(self.clipped_high_tokens),
        }
        fraction = self.fraction
        if fraction is not None:
            out[keys.CLIP_FRACTION] = fraction
        return out

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, object]) -> ClipCounts | None:
        """Read counts from a metrics mapping; ``None`` when the loss does not clip.

        A loss clips exactly when ``clipped_tokens:sum`` is present. The low/high split is
        optional in the input (older producers); when absent it is reported as all-high only if
        nothing was clipped, otherwise a ValueError says the split is missing.
        """
        if keys.CLIPPED_TOKENS not in metrics:
            return None
        if keys.LOSS_TOKENS not in metrics:
            raise ValueError(f"metrics carry {keys.CLIPPED_TOKENS!r} but not {keys.LOSS_TOKENS!r}")
        clipped = as_count(keys.CLIPPED_TOKENS, metrics[keys.CLIPPED_TOKENS])
        has_low = keys.CLIPPED_LOW_TOKENS in metrics
        has_high = keys.CLIPPED_HIGH_TOKENS in metrics
        if has_low and has_high:
            low = as_count(keys.CLIPPED_LOW_TOKENS, metrics[keys.CLIPPED_LOW_TOKENS])
            high = as_count(keys.CLIPPED_HIGH_TOKENS, metrics[keys.CLIPPED_HIGH_TOKENS])
        elif has_low or has_high:
            present = keys.CLIPPED_LOW_TOKENS if has_low else keys.CLIPPED_HIGH_TOKENS
            raise ValueError(f"metrics carry {present!r} without its other side of the low/high split")
        elif clipped == 0:
            low = high = 0
        else:
            raise ValueError(
                f"metrics carry {keys.CLIPPED_TOKENS!r} but no low/high split "
                f"({keys.CLIPPED_LOW_TOKENS!r}, {keys.CLIPPED_HIGH_TOKENS!r})"
            )
        return cls(as_count(keys.LOSS_TOKENS, metrics[keys.LOSS_TOKENS]), clipped, low, high)


def exact_clip_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """A copy of ``metrics`` with its token counts checked and the clip fraction formed from them.

    Raises ValueError naming a bad count. When the metrics carry clip counts, any incoming
    ``clip_fraction:mean`` is replaced by ``clipped_tokens:sum / loss_tokens:sum`` (and dropped when
    no token was eligible: a fraction is never invented); without clip counts the metrics are
    returned unchanged.
    """
    out = dict(metrics)
    if keys.LOSS_TOKENS in out:
        as_count(keys.LOSS_TOKENS, out[keys.LOSS_TOKENS])
    counts = ClipCounts.from_metrics(out)
    if counts is not None:
        out.pop(keys.CLIP_FRACTION, None)
        out.update(counts.to_metrics())
    return out


def token_metrics(loss_tokens: int, counts: ClipCounts | None) -> dict[str, float]:
    """The token metrics of a step: the clip counts and fraction for a loss that clips
    (``counts``), else ``loss_tokens:sum`` alone — a loss that never clips emits no clip keys."""
    if counts is not None:
        return counts.to_metrics()
    return {keys.LOSS_TOKENS: float(as_count(keys.LOSS_TOKENS, loss_tokens))}
