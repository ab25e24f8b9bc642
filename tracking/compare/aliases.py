"""Other trackers' metric names read as ours, through the one table :data:`tracking.keys.ALIASES`.

Runs logged by Miles' own tracker (``train/*`` against ``train/step``, ``:`` rewritten to ``_`` in
its MLflow backend) and by verl (``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``) load into
the same frame as runs logged by cliptrack. A value that is a mean of per-sample or per-micro-batch
means (``approximate`` in the table) is kept under our key but flagged, per run, so that every
rendering can say the run's fraction is approximate, never exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from tracking import keys
from tracking.sinks.base import Point

__all__ = ["Canonical", "canonical_metrics", "canonical_points", "foreign_step", "needs_aliases"]

_SCALE = f"train/{keys.MILES_COUNT_SCALE}"
_FOREIGN = frozenset(keys.ALIASES) | frozenset(keys.MILES_SCALED_COUNTS) | {_SCALE}
_EXACT_FIRST = sorted(keys.ALIASES.items(), key=lambda item: item[1].approximate)


@dataclass(frozen=True)
class Canonical:
    """One point's metrics under our keys and the keys whose values are approximate."""

    metrics: dict[str, float]
    approximate: frozenset[str]


def canonical_metrics(metrics: Mapping[str, float]) -> Canonical:
    """Rename foreign keys to ours (see the module docstring); other keys are kept as they are.

    Order of precedence for one of our keys: our own spelling; the exact count entries of
    ``adapters.miles.custom_loss`` (``train/<count> / train/count_scale``, rounded to the token);
    ``clip_fraction:mean`` formed from exact counts; an exact alias; an approximate alias.
    """
    out = {
        k: v
        for k, v in metrics.items()
        if k not in keys.ALIASES and k not in keys.MILES_SCALED_COUNTS and k != _SCALE
    }
    scale = metrics.get(_SCALE)
    if scale is not None and math.isfinite(scale) and scale > 0:
        for foreign, key in keys.MILES_SCALED_COUNTS.items():
            if foreign in metrics and key not in out:
                out[key] = float(round(metrics[foreign] / scale))
    elif scale is None:
        out.update({k: v for k, v in metrics.items() if k in keys.MILES_SCALED_COUNTS})
    approximate = set()
    for foreign, alias in _EXACT_FIRST:
        if foreign not in metrics or alias.key in out:
            continue
        if alias.key == keys.CLIP_FRACTION and keys.CLIPPED_TOKENS in out and keys.LOSS_TOKENS in out:
            continue  # formed from the counts below, exactly
        out[alias.key] = float(metrics[foreign])
        if alias.approximate:
            approximate.add(alias.key)
    if keys.CLIP_FRACTION not in out and keys.CLIPPED_TOKENS in out and out.get(keys.LOSS_TOKENS, 0) > 0:
        out[keys.CLIP_FRACTION] = out[keys.CLIPPED_TOKENS] / out[keys.LOSS_TOKENS]
    return Canonical(out, frozenset(approximate))


def foreign_step(row: Mapping[str, object]) -> float | None:
    """The step of a W&B history row logged by another tracker (``train/step``, else ``_step``)."""
    for column in keys.FOREIGN_STEP_COLUMNS:
        value = row.get(column)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def canonical_points(points: list[Point]) -> tuple[list[Point], tuple[str, ...]]:
    """A run's points with :func:`canonical_metrics` applied, and the run's approximate keys (sorted)."""
    approximate: set[str] = set()
    out = []
    for point in points:
        canonical = canonical_metrics(point.metrics)
        approximate |= canonical.approximate
        out.append(Point(point.step, point.wall_time, canonical.metrics))
    return out, tuple(sorted(approximate))


def needs_aliases(columns: object) -> bool:
    """Whether a bulk-read run (``tracking.compare.frame.Columns``) has any foreign metric name."""
    names = getattr(columns, "metric", ())
    return any(str(name) in _FOREIGN for name in set(getattr(names, "tolist", lambda: list(names))()))
