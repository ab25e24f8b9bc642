"""How cliptrack's verl policy losses spell their sums and recipe in verl's metrics (torch-free).

The losses of :mod:`cliptrack.adapters.verl` add, to verl's own metrics of each micro-batch, one
entry per measured sum (``cliptrack/<measure name>``, e.g. ``cliptrack/clipped_tokens``) and the
recipe they counted under; verl's ``update_actor`` logs them as ``actor/cliptrack/...``
(:data:`LOGGED_PREFIX`). No entry name contains ``max`` or ``min``: verl reduces such keys by
``np.max`` / ``np.min`` instead of its mean (:func:`check_entry`).

verl averages every loss metric over the micro-batches and data-parallel ranks of a mini-batch,
then over the step's mini-batches (and PPO epochs). Each sum entry of a micro-batch is written
multiplied by the number of micro-batches of its mini-batch over all ranks, so every logged sum is
the exact sum over one optimizer step (one mini-batch), averaged over the step's optimizer steps:
the step's exact total when it has one, and in every case a ratio of two logged sums (the clip
fraction, the gauge's means) is the exact ratio of the step's sums, to float rounding.

Recipe entries: the clip band and dual clip as numbers (``cliptrack/clip_low``, ``clip_high``,
``dual_clip``: absolute ratio bounds, Tinker style), and text fields as marker keys worth 1
(``cliptrack/loss/<mode>``, ``cliptrack/aggregation/<loss_agg_mode>``,
``cliptrack/clip_reference/<reference>``): verl's file and console loggers keep metrics only.
``cliptrack/engine_gauge`` is 1 where the gauge against the sampler and its engine part were
measured (the batch's rollout log-probs reached the loss), 0 where only the drift part was.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from cliptrack.core import measures

__all__ = [
    "ENGINE_GAUGE",
    "LOGGED_PREFIX",
    "as_ours",
    "is_entry",
    "NUMBER_FIELDS",
    "PREFIX",
    "TEXT_FIELDS",
    "check_entry",
    "entry",
    "logged_recipe",
    "logged_sums",
    "marker",
]

PREFIX = "cliptrack/"
"""Prefix of every entry in the metrics a cliptrack verl loss returns."""
LOGGED_PREFIX = "actor/" + PREFIX
"""The same entries as verl's trainer logs them (``update_actor`` prefixes ``actor/``)."""
ENGINE_GAUGE = "engine_gauge"
"""Entry: 1 where the gauge against the sampler (and its engine part) was measured, 0 where the
batch's rollout log-probs did not reach the loss (only the drift part is then logged)."""
NUMBER_FIELDS = ("clip_low", "clip_high", "dual_clip")
"""Recipe fields logged as numbers (absolute ratio bounds)."""
TEXT_FIELDS = ("loss", "aggregation", "clip_reference")
"""Recipe fields logged as marker keys ``<field>/<value>`` worth 1."""


def check_entry(name: str) -> str:
    """``name`` if verl reduces it by its mean; ValueError for a name containing ``max``/``min``."""
    if "max" in name or "min" in name:
        raise ValueError(
            f"verl entry {name!r} contains 'max' or 'min': verl would reduce it by np.max / np.min"
        )
    return name


def entry(name: str) -> str:
    """The metric key of entry ``name`` in a cliptrack verl loss's metrics."""
    return PREFIX + check_entry(name)


def marker(field: str, value: str) -> str:
    """The marker entry (worth 1) of recipe text field ``field`` = ``value``."""
    if field not in TEXT_FIELDS:
        raise ValueError(f"recipe field {field!r} is not one of {TEXT_FIELDS}")
    return entry(f"{field}/{value}")


def _sum_names(declaration: measures.Declaration) -> dict[str, str]:
    """Entry name -> our metric key, for every sum measure of ``declaration`` but the loss."""
    return {
        m.name: m.key
        for m in declaration.measures
        if m.reduction == measures.SUM and m.key != measures.LOSS.key
    }


def logged_sums(
    metrics: Mapping[str, Any],
    prefix: str = LOGGED_PREFIX,
    declaration: measures.Declaration = measures.DEFAULT,
) -> dict[str, float]:
    """Our sum keys (``clipped_tokens:sum``, ...) from the entries in one logged step's ``metrics``
    (``prefix``: :data:`LOGGED_PREFIX` for what verl's trainer logs, :data:`PREFIX` for a loss's own
    metrics). A count within 1e-9 (relative) of a whole number is rounded to it (verl's means over
    ranks and micro-batches may leave the last bit off); the others are kept as they are. The sums
    read: ``declaration``'s."""
    out: dict[str, float] = {}
    for name, key in _sum_names(declaration).items():
        value = metrics.get(prefix + name)
        if value is None or isinstance(value, bool):
            continue
        number = float(value)
        if not math.isfinite(number):
            continue
        if declaration.by_key[key].exact and abs(number - round(number)) <= 1e-9 * max(1.0, abs(number)):
            number = float(round(number))
        out[key] = number
    return out


def logged_recipe(metrics: Mapping[str, Any], prefix: str = LOGGED_PREFIX) -> dict[str, Any]:
    """The recipe fields found in one logged step's ``metrics`` (see the module's docstring): numbers
    rounded to 12 significant digits (verl's mean of a constant), text fields from their markers."""
    out: dict[str, Any] = {}
    for name in NUMBER_FIELDS:
        value = metrics.get(prefix + name)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = float(f"{float(value):.12g}")
    for name in TEXT_FIELDS:
        head = f"{prefix}{name}/"
        found = [k[len(head) :] for k, v in metrics.items() if k.startswith(head) and v]
        if len(found) == 1:
            out[name] = found[0]
    return out


def is_entry(name: object) -> bool:
    """Whether ``name`` is one of these entries as verl's trainer logs them."""
    return str(name).startswith(LOGGED_PREFIX)


def as_ours(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """One logged step's ``metrics`` with the entries read as ours: each sum under our key (unless the
    step already holds our own spelling of it), the recipe and marker entries dropped (a reader
    records the recipe in the run's config, :func:`logged_recipe`); other metrics as they are."""
    out = {k: v for k, v in metrics.items() if not is_entry(k)}
    if len(out) == len(metrics):
        return out
    for key, value in logged_sums(metrics).items():
        out.setdefault(key, value)
    return out
