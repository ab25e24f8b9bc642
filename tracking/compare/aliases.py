"""Other trackers' metric names read as ours, through the one table :data:`cliptrack.core.keys.ALIASES`.

Runs logged by Miles' own tracker (``train/*`` against ``train/step``, ``:`` rewritten to ``_`` in
its MLflow backend; its mismatch metrics ``train_rollout_logprob_abs_diff`` and ``train_rollout_kl``)
and by verl (``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``, ``rollout_corr/k3_kl``,
``rollout_corr/kl``) load into the same frame as runs logged by cliptrack. A value that is a mean of per-sample or per-micro-batch
means (``approximate`` in the table) is kept under our key but flagged, per run, so that every
rendering can say the run's fraction is approximate, never exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from cliptrack.core import keys, measures
from cliptrack.core.verl_keys import as_ours, is_entry
from cliptrack.store.records import Point

__all__ = ["Canonical", "canonical_metrics", "canonical_points", "foreign_step", "needs_aliases"]

_SCALE = keys.SCALED_ALIASES_DIVISOR
_SCALED = dict(keys.SCALED_ALIASES)
"""``cliptrack.adapters.miles.custom_loss``'s entries as Miles' tracker logs them -> our key."""
_FOREIGN = frozenset(keys.ALIASES) | frozenset(_SCALED) | {_SCALE}
_EXACT_FIRST = sorted(keys.ALIASES.items(), key=lambda item: item[1].approximate)
_MEANS = {mean.key: mean for mean in measures.MEANS}


@dataclass(frozen=True)
class Canonical:
    """One point's metrics under our keys and the keys whose values are approximate."""

    metrics: dict[str, float]
    approximate: frozenset[str]


def canonical_metrics(metrics: Mapping[str, float]) -> Canonical:
    """Rename foreign keys to ours (see the module docstring); other keys are kept as they are.

    Order of precedence for one of our keys: our own spelling; the exact entries of
    ``cliptrack.adapters.miles.custom_loss`` (``train/<entry> / train/count_scale``: a count rounded to the
    token, a gauge sum as it is); a mean (``clip_fraction:mean``, ``abs_log_ratio:mean``,
    ``kl_k3:mean``) formed from those sums; an exact alias; an approximate alias. The entries of
    cliptrack's verl losses (``actor/cliptrack/<sum>``, :mod:`cliptrack.core.verl_keys`) are our sums.
    """
    metrics = as_ours(metrics)
    out = {k: v for k, v in metrics.items() if k not in keys.ALIASES and k not in _SCALED and k != _SCALE}
    out.update(_scaled_entries(metrics, out))
    approximate = _aliased(metrics, out)
    for key, mean in _MEANS.items():
        if key not in out and _formed_from_sums(key, out):
            out[key] = out[mean.numerator] / out[mean.denominator]
    return Canonical(out, frozenset(approximate))


def _aliased(metrics: Mapping[str, float], out: dict[str, float]) -> set[str]:
    """Our keys from their foreign aliases (exact ones first), into ``out`` where ours are missing and
    not formed from sums; returns the keys taken from an approximate alias."""
    approximate = set()
    for foreign, alias in _EXACT_FIRST:
        if foreign not in metrics or alias.key in out or _formed_from_sums(alias.key, out):
            continue
        out[alias.key] = float(metrics[foreign])
        if alias.approximate:
            approximate.add(alias.key)
    return approximate


def _scaled_entries(metrics: Mapping[str, float], ours: Mapping[str, float]) -> dict[str, float]:
    """Our sums from ``cliptrack.adapters.miles.custom_loss``'s entries, each divided by ``train/count_scale``;
    our own spelling wins. Without the scale the entries are not known to be ours (Miles divides
    every logged value by its count) and are kept under their own names; with a bad scale, dropped."""
    scale = metrics.get(_SCALE)
    if scale is None:
        return {k: float(v) for k, v in metrics.items() if k in _SCALED}
    out: dict[str, float] = {}
    if not (math.isfinite(scale) and scale > 0):
        return out
    for foreign, key in _SCALED.items():
        if foreign in metrics and key not in ours:
            value = metrics[foreign] / scale
            out[key] = float(round(value)) if measures.by_key(key).exact else value
    return out


def _formed_from_sums(key: str, metrics: Mapping[str, float]) -> bool:
    """Whether ``key`` is a mean whose numerator and (nonzero) denominator are both at hand."""
    mean = _MEANS.get(key)
    return mean is not None and mean.numerator in metrics and metrics.get(mean.denominator, 0) > 0


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
    """Whether a bulk-read run (``cliptrack.compare.frame.Columns``) has any foreign metric name."""
    names = getattr(columns, "metric", ())
    return any(
        str(name) in _FOREIGN or is_entry(name)
        for name in set(getattr(names, "tolist", lambda: list(names))())
    )
