"""Step and metric-value validation, shared by the tracker and the Miles client (torch-free).

- steps: the trainer's own, non-negative integers (numpy's too, never ``bool``) up to
  :data:`MAX_STEP`;
- metric keys: ``name:reduction`` with exactly one colon (:func:`cliptrack.core.keys.split_key`), at most
  :data:`MAX_KEY_CHARS` characters (:func:`check_key_size`);
- metric values: real numbers (int, float, numpy scalars); NaN and +/-inf are values like any
  other (a diverging loss must be visible);
- token counts and the clip fraction: :func:`cliptrack.core.sums.exact_clip_metrics` (whole
  non-negative counts, consistent keys, a fraction in [0, 1] or formed from the counts).

Errors are ValueError naming the input and what is wrong (docs/CONTRACT.md, "Bad input").
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping

from cliptrack.core import keys
from cliptrack.core.sums import exact_clip_metrics

__all__ = ["MAX_KEY_CHARS", "MAX_STEP", "check_key_size", "check_metrics", "check_step", "metric_value"]

MAX_STEP = 2**63 - 1
"""Largest step every sink stores (MLflow: a signed 64-bit integer)."""

MAX_KEY_CHARS = 65_536
"""Longest metric key the tracker logs and a reader takes back, in characters: far above any
backend's own limit (MLflow: 250) yet small enough that a key cannot exhaust a reader's memory (a
journal line holding a longer key, which no tracker writes, is skipped with a note)."""


def check_key_size(key: str) -> None:
    """ValueError naming the key (its start) when it is longer than :data:`MAX_KEY_CHARS`."""
    if len(key) > MAX_KEY_CHARS:
        raise ValueError(
            f"metric key {key[:40]!r}... is {len(key)} characters long; at most {MAX_KEY_CHARS} are logged"
        )


def check_step(step: object) -> int:
    """``step`` as an int; ValueError unless an integer (numpy's too, not a bool) in [0, MAX_STEP]."""
    if isinstance(step, bool) or not isinstance(step, numbers.Integral):
        raise ValueError(f"step must be a non-negative int, got {type(step).__name__} {step!r}")
    value = int(step)
    if value < 0:
        raise ValueError(f"step must be >= 0, got {value}")
    if value > MAX_STEP:
        raise ValueError(f"step {value} does not fit a signed 64-bit integer")
    return value


def metric_value(key: str, value: object) -> float:
    """``value`` as a float; ValueError unless a real number (``bool``, strings, arrays refused)."""
    if type(value) is float:
        return value  # type: ignore[return-value]
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise ValueError(
            f"metric {key!r} must be a real number, got {type(value).__name__} {value!r}"
            + (" (call .item() on tensors)" if hasattr(value, "item") else "")
        )
    try:
        return float(value)
    except OverflowError:
        raise ValueError(
            f"metric {key!r}: {type(value).__name__} value too large for a 64-bit float"
        ) from None


def check_metrics(metrics: Mapping[str, object]) -> dict[str, float]:
    """``metrics`` as ``{str: float}`` with counts checked and the fraction formed from them.

    Raises ValueError naming a bad key, value, count or fraction.
    """
    if not isinstance(metrics, Mapping):
        raise ValueError(
            f"metrics must be a mapping of 'name:reduction' -> number, got {type(metrics).__name__}"
        )
    out: dict[str, float] = {}
    for key, value in metrics.items():
        keys.split_key(key)
        check_key_size(key)
        out[key] = metric_value(key, value)
    return exact_clip_metrics(out)
