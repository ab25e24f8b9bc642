"""Other trackers' metric names read as ours, through the one table :data:`cliptrack.core.frameworks.ALIASES`
(cliptrack's keys as Miles' tracker spells them, and the field's metrics with their reductions).

Runs logged by Miles' own tracker (``train/*`` against ``train/step``, ``:`` rewritten to ``_`` in
its MLflow backend; its mismatch metrics ``train_rollout_logprob_abs_diff`` and ``train_rollout_kl``)
and by verl (``actor/pg_clipfrac``, ``actor/pg_clipfrac_lower``, ``rollout_corr/k3_kl``,
``rollout_corr/kl``) load into the same frame as runs logged by cliptrack. A value that is a mean of per-sample or per-micro-batch
means (``approximate`` in the table) is kept under our key but flagged, per run, so that every
rendering can say the run's fraction is approximate, never exact. A framework's own value of a key
the point also holds exactly (our own spelling, or a mean formed from our sums) is kept under its
own name beside ours and recorded (``audited``), so that the comparison shows both and the gap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from cliptrack.core import frameworks, keys, measures
from cliptrack.core.verl_keys import as_ours, is_entry
from cliptrack.store.records import Point

if TYPE_CHECKING:
    from cliptrack.store.frame import LoadedRun

__all__ = [
    "AsLogged",
    "Canonical",
    "as_logged",
    "canonical_metrics",
    "canonical_points",
    "foreign_step",
    "needs_aliases",
]

_SCALE = keys.SCALED_ALIASES_DIVISOR
_SCALED = dict(keys.SCALED_ALIASES)
"""``cliptrack.adapters.miles.custom_loss``'s entries as Miles' tracker logs them -> our key."""
_ALIASES = frameworks.ALIASES
_FOREIGN = frozenset(_ALIASES) | frozenset(frameworks.BY_FOREIGN) | frozenset(_SCALED) | {_SCALE}
_EXACT_FIRST = sorted(_ALIASES.items(), key=lambda item: item[1].approximate)
_MEANS = {mean.key: mean for mean in measures.MEANS}


@dataclass(frozen=True)
class Canonical:
    """One point's metrics under our keys and the keys whose values are approximate.

    ``audited``: (our key, foreign name) pairs where the point holds a framework's own value beside
    our exact one (the foreign value kept under its name); ``per_step``: our keys read from a
    framework's exact per-step value (a ratio of sums within the step, without our counts)."""

    metrics: dict[str, float]
    approximate: frozenset[str]
    audited: frozenset[tuple[str, str]] = frozenset()
    per_step: frozenset[str] = frozenset()


def canonical_metrics(metrics: Mapping[str, float]) -> Canonical:
    """Rename foreign keys to ours (see the module docstring); other keys are kept as they are.

    Order of precedence for one of our keys: our own spelling; the exact entries of
    ``cliptrack.adapters.miles.custom_loss`` (``train/<entry> / train/count_scale``: a count rounded to the
    token, a gauge sum as it is); a mean (``clip_fraction:mean``, ``abs_log_ratio:mean``,
    ``kl_k3:mean``) formed from those sums; an exact alias; an approximate alias. The entries of
    cliptrack's verl losses (``actor/cliptrack/<sum>``, :mod:`cliptrack.core.verl_keys`) are our sums.
    """
    metrics = as_ours(metrics)
    out = {k: v for k, v in metrics.items() if k not in _ALIASES and k not in _SCALED and k != _SCALE}
    out.update(_scaled_entries(metrics, out))
    taken = _aliased(metrics, out)
    own = {k: v for k, v in out.items() if k not in taken or taken[k].source == _OURS}  # cliptrack's numbers
    _form_means(out)
    audited = _beside_ours(metrics, own, out)
    approximate = {key for key, alias in taken.items() if alias.approximate}
    per_step = {key for key, alias in taken.items() if not alias.approximate and alias.key not in _SUMS}
    return Canonical(out, frozenset(approximate), frozenset(audited), frozenset(per_step))


def _form_means(out: dict[str, float]) -> None:
    """Each mean of ours not in ``out`` whose sums are there, formed once from them, into ``out``."""
    for key, mean in _MEANS.items():
        if key not in out and _formed_from_sums(key, out):
            out[key] = out[mean.numerator] / out[mean.denominator]


def _beside_ours(
    metrics: Mapping[str, float], own: Mapping[str, float], out: dict[str, float]
) -> set[tuple[str, str]]:
    """A framework's own numbers of keys ``own`` holds exactly, into ``out`` under their own names;
    returns the (our key, foreign name) pairs."""
    audited = set()
    for foreign in sorted(_AUDITABLE.keys() & metrics.keys()):
        key = _AUDITABLE[foreign].key
        if _held_exactly(key, own):
            out[foreign] = float(metrics[foreign])
            audited.add((key, foreign))
    return audited


_AUDITABLE = {name: alias for name, alias in _ALIASES.items() if name in frameworks.BY_FOREIGN}
"""The frameworks' own names read as a key of ours (or a labelled one): kept beside ours when both are logged."""


_SUMS = frozenset(m.key for m in measures.MEASURES)
_OURS = next(iter(keys.TRACKER_ALIASES.values())).source
"""The source of :data:`cliptrack.core.keys.TRACKER_ALIASES`: our own numbers under a tracker's spelling."""


def _held_exactly(key: str, ours: Mapping[str, float]) -> bool:
    """Whether ``key`` is in ``ours`` (our own spelling) or a mean formed from sums there."""
    return key in ours or _formed_from_sums(key, ours)


def _aliased(metrics: Mapping[str, float], out: dict[str, float]) -> dict[str, keys.Alias]:
    """Our keys from their foreign aliases (exact ones first), into ``out`` where ours are missing and
    not formed from sums; returns each key taken with the alias it was taken from."""
    taken = {}
    for foreign, alias in _EXACT_FIRST:
        if foreign not in metrics or alias.key in out or _formed_from_sums(alias.key, out):
            continue
        out[alias.key] = float(metrics[foreign])
        taken[alias.key] = alias
    return taken


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


@dataclass(frozen=True)
class AsLogged:
    """A run's points read through the table, and what the reading found about the run.

    ``approximate``: our keys read from a mean of means (sorted); ``audited``: (our key, foreign
    name) pairs held both ways at some step (sorted); ``per_step``: our keys read from a framework's
    exact per-step value without our counts (sorted); ``framework``: the framework whose own
    metric names the run holds (``frameworks.detect``; "" for none)."""

    points: list[Point]
    approximate: tuple[str, ...] = ()
    audited: tuple[tuple[str, str], ...] = ()
    per_step: tuple[str, ...] = ()
    framework: str = ""


def canonical_points(points: list[Point]) -> AsLogged:
    """A run's points with :func:`canonical_metrics` applied, and what was found (:class:`AsLogged`)."""
    approximate: set[str] = set()
    audited: set[tuple[str, str]] = set()
    per_step: set[str] = set()
    names: set[str] = set()
    out = []
    for point in points:
        canonical = canonical_metrics(point.metrics)
        approximate |= canonical.approximate
        audited |= canonical.audited
        per_step |= canonical.per_step
        names.update(point.metrics)
        out.append(Point(point.step, point.wall_time, canonical.metrics))
    found = frameworks.detect(names)
    return AsLogged(
        out,
        tuple(sorted(approximate)),
        tuple(sorted(audited)),
        tuple(sorted(per_step - approximate)),
        "" if found is None else found.name,
    )


def needs_aliases(columns: object) -> bool:
    """Whether a bulk-read run (``cliptrack.store.frame.Columns``) has any foreign metric name."""
    names = getattr(columns, "metric", ())
    return any(
        str(name) in _FOREIGN or is_entry(name)
        for name in set(getattr(names, "tolist", lambda: list(names))())
    )


def as_logged(info: LoadedRun, read: AsLogged) -> LoadedRun:
    """``info`` with what reading its points found: approximate, audited and per-step keys, the
    framework; a run with no backend label of its own takes the framework's name as its stack."""
    run = info.run
    if read.framework and not run.backend_label:
        run = replace(run, backend_label=read.framework)
    return replace(
        info,
        run=run,
        approximate=read.approximate,
        audited=read.audited,
        per_step=read.per_step,
        framework=read.framework,
    )
