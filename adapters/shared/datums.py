"""The per-datum wire form, written and read by every stack: one sequence's measured fields.

A datum's output (``ForwardBackwardOutput.loss_fn_outputs[i]``) carries its ``logprobs`` and its
measured fields (:data:`cliptrack.core.keys.DATUM_MEASURE_FIELDS`: ``loss_tokens``, the clip
counts, and the on-policy gauge's per-sequence sums and extremes) as wire values
(:mod:`cliptrack.adapters.shared.wire`). :func:`datum_outputs` writes them from packed sums (the
Miles runtime's and the Megatron path's one form); :func:`datum_counts` reads one back, and
:func:`sum_datums` / :func:`count_datums` add datums exactly (counts as Python ints, float sums
with one ``math.fsum``, extremes by max / min: :class:`cliptrack.core.sums.MeasuredSums`), so no
chunking or order of arrival changes a bit of the result.

The low/high split is optional per datum (the seed runtimes return ``loss_tokens`` and
``clipped_tokens`` alone); a sum carries it only when every datum does. So are the gauge's
extremes (a sum keeps them only when every datum with tokens has them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from cliptrack.adapters.shared.packing import PackedSums
from cliptrack.adapters.shared.wire import (
    count_data,
    float_data,
    read_array,
    read_count,
    read_float,
    tensor_data,
)
from cliptrack.core import keys, measures
from cliptrack.core.sums import MeasuredSums
from cliptrack.core.worst import SequenceGauge


def datum_outputs(
    shapes: Sequence[tuple[int, ...]],
    sums: Sequence[PackedSums],
    flat_logprobs: np.ndarray,
    flat_sides: np.ndarray | None = None,
    *,
    probe: bool = False,
) -> list[dict[str, Any]]:
    """Each datum's ``loss_fn_outputs`` entry, the one form of every path (the Miles runtime's and
    the Megatron path's, :func:`cliptrack.adapters.megatron.make_loss_func` ``datum_outputs``):
    its ``logprobs`` (float32, of shape ``shapes[i]``, cut from ``flat_logprobs`` in datum order)
    and its measured fields (:func:`datum_fields`); with ``probe``, its ``loss`` (``loss:sum`` as a
    float32 ``[hi, lo]`` pair) and, given ``flat_sides`` (laid out as ``flat_logprobs``), its
    per-token ``clip_sides`` (int64). ValueError when the flat arrays do not hold ``shapes``."""
    sizes = [math.prod(shape) for shape in shapes]
    if len(shapes) != len(sums) or flat_logprobs.size != sum(sizes):
        raise ValueError(
            f"{len(shapes)} datum shapes ({sum(sizes)} tokens), {len(sums)} datum sums and "
            f"{flat_logprobs.size} log-probs do not describe the same datums"
        )
    if flat_sides is not None and flat_sides.size != flat_logprobs.size:
        raise ValueError(
            f"{flat_sides.size} clip sides for {flat_logprobs.size} log-probs: one per token is needed"
        )
    loss_fn_outputs: list[dict[str, Any]] = []
    offset = 0
    for i, (shape, size, datum) in enumerate(zip(shapes, sizes, sums, strict=True)):
        where = f"datum {i}"
        datum_out: dict[str, Any] = {
            keys.DATUM_LOGPROBS: tensor_data(
                np.ascontiguousarray(flat_logprobs[offset : offset + size], dtype=np.float32).reshape(shape)
            )
        }
        datum_out.update(datum_fields(datum.counts, where))
        if probe:
            datum_out[keys.DATUM_LOSS] = float_data(datum.loss_sum, f"{where} {keys.DATUM_LOSS}")
            if flat_sides is not None:
                datum_out[keys.DATUM_CLIP_SIDES] = tensor_data(
                    np.ascontiguousarray(flat_sides[offset : offset + size], dtype=np.int64).reshape(shape)
                )
        offset += size
        loss_fn_outputs.append(datum_out)
    return loss_fn_outputs


def datum_fields(counts: MeasuredSums, where: str = "datum") -> dict[str, Any]:
    """A datum's measured fields on the wire (:data:`cliptrack.core.keys.DATUM_MEASURE_FIELDS`, in that
    order): ``loss_tokens``; for a loss that clips, ``clipped_tokens`` and the low/high split when
    known; for a loss with sampling log-probs, the gauge of the datum's sequence. Counts are int64
    TensorData of shape ``[1]``, float measures float32 ``[hi, lo]`` pairs
    (:func:`cliptrack.adapters.shared.wire.float_data`). A datum with no eligible token has no extreme: its
    ``log_ratio_max`` / ``log_ratio_min`` are 0 on the wire and ignored by the reader (JSON has no
    infinity, and protobuf needs the same fields in every datum)."""
    values = counts.to_metrics()
    fields: dict[str, Any] = {}
    for measure in counts.declaration.datum_measures:
        if measure.key in values:
            value = values[measure.key]
        elif measure.reduction != measures.SUM and counts.has(measure.group) and counts.loss_tokens == 0:
            value = 0.0  # an extreme over no token: a placeholder the reader ignores
        else:
            continue
        fields[measure.field] = (
            count_data(int(value)) if measure.exact else float_data(value, f"{where} {measure.field}")
        )
    return fields


def datum_counts(
    datum: object, where: str = "datum", declaration: measures.Declaration = measures.DEFAULT
) -> MeasuredSums:
    """The measured sums of one per-datum output (one sequence), validated.

    ``loss_tokens`` is required; ``clipped_tokens`` marks a loss that clips; the low/high split
    (``clipped_low_tokens``, ``clipped_high_tokens``) is optional and comes as a pair. The gauge's
    fields (:data:`cliptrack.core.keys.DATUM_GAUGE_FIELDS`) mark a loss with sampling log-probs: its sums
    come together, its extremes are optional (and ignored for a datum with no eligible token, which
    has none). Counts are int64, float measures float32 ``[hi, lo]`` pairs or single floats.
    """
    if not isinstance(datum, Mapping):
        raise TypeError(f"{where} must be a dict of field -> TensorData, got {type(datum).__name__}")
    if keys.DATUM_LOSS_TOKENS not in datum:
        raise ValueError(
            f"{where} has no {keys.DATUM_LOSS_TOKENS!r} field (fields: {sorted(datum)}); the runtime must "
            "return per-datum token counts"
        )
    present = [name for name in keys.DATUM_CLIP_FIELDS if name in datum]
    split = [
        name for name in (keys.DATUM_CLIPPED_LOW_TOKENS, keys.DATUM_CLIPPED_HIGH_TOKENS) if name in datum
    ]
    if (present and keys.DATUM_CLIPPED_TOKENS not in datum) or len(split) == 1:
        absent = [name for name in keys.DATUM_CLIP_FIELDS if name not in datum]
        raise ValueError(f"{where} carries {present} but not {absent}: the clip counts come together")
    loss_tokens = read_count(datum[keys.DATUM_LOSS_TOKENS], f"{where}[{keys.DATUM_LOSS_TOKENS!r}]")
    values: dict[str, float | int] = {keys.LOSS_TOKENS: loss_tokens}
    for group in declaration.groups:
        values.update(_datum_group(datum, where, loss_tokens, declaration.members[group.name], group.name))
    try:
        return MeasuredSums(values, declaration=declaration)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def _datum_group(
    datum: Mapping[str, Any],
    where: str,
    loss_tokens: int,
    group_measures: Sequence[measures.Measure],
    group: str,
) -> dict[str, float | int]:
    """The fields of ``group``'s measures one datum carries, under their metric keys (none: {});
    its sums come together, its extremes are optional and ignored over no eligible token (the
    wire's placeholder)."""
    members = [m for m in group_measures if m.key not in (keys.LOSS_SUM, keys.LOSS_TOKENS)]
    fields = [m for m in members if m.field in datum]
    if not fields:
        return {}
    _check_group_sums(datum, where, group, members, fields)
    return _read_group_fields(datum, where, loss_tokens, fields)


def _check_group_sums(
    datum: Mapping[str, Any],
    where: str,
    group: str,
    members: Sequence[measures.Measure],
    fields: Sequence[measures.Measure],
) -> None:
    """ValueError when a datum carries some of ``group``'s fields (``fields``) but not all its sums
    (the clip counts and their split are checked by :func:`datum_counts`, in their own words)."""
    missing = [m.field for m in members if m.reduction == measures.SUM and m.field not in datum]
    if missing and group not in (measures.CLIP, measures.SPLIT):  # checked above, in their words
        what = "the gauge's sums" if group == measures.GAUGE else f"the {group} measures"
        raise ValueError(
            f"{where} carries {[m.field for m in fields]} but not {missing}: {what} come together"
        )


def _read_group_fields(
    datum: Mapping[str, Any], where: str, loss_tokens: int, fields: Sequence[measures.Measure]
) -> dict[str, float | int]:
    """Each of ``fields`` read from the datum, under its metric key: counts as exact ints (tokens),
    float measures as floats. Every field is read (and checked); an extreme over no eligible token
    (``loss_tokens == 0``) is then dropped."""
    values: dict[str, float | int] = {}
    for m in fields:
        name = f"{where}[{m.field!r}]"
        value = read_count(datum[m.field], name) if m.exact else read_float(datum[m.field], name)
        if m.reduction != measures.SUM and loss_tokens == 0:
            continue  # no eligible token, no extreme: the wire's placeholder is ignored
        values[m.key] = value
    return values


def count_datums(
    datums: Iterable[object],
    where: str = "loss_fn_outputs",
    declaration: measures.Declaration = measures.DEFAULT,
) -> MeasuredSums | None:
    """Exact sums over per-datum outputs (``None`` when there are none); ValueError if datums of
    losses that measure different things mix (a clipping loss and one that never clips, a loss with
    the gauge and one without). Float sums are the correctly rounded sum of every datum's value."""
    per_datum = [datum_counts(d, f"{where}[{i}]", declaration) for i, d in enumerate(datums)]
    return exact_floats(*total_and_terms(per_datum, where, declaration))


def float_sums(declaration: measures.Declaration = measures.DEFAULT) -> tuple[str, ...]:
    """The float sums of ``declaration`` (the gauge's, an added one's): summed once over every datum's value
    (``math.fsum`` of all of them), so no chunking or order of arrival changes a bit of the result."""
    return tuple(m.key for m in declaration.datum_measures if m.reduction == measures.SUM and not m.exact)


def total_and_terms(
    per_datum: Sequence[MeasuredSums], where: str, declaration: measures.Declaration = measures.DEFAULT
) -> tuple[MeasuredSums | None, dict[str, list[float]]]:
    """``(total, terms)``: the datums' sum by addition, and each datum's float sums (of ``declaration``)."""
    total: MeasuredSums | None = None
    terms: dict[str, list[float]] = {key: [] for key in float_sums(declaration)}
    for i, counts in enumerate(per_datum):
        total = added(total, counts, f"{where}[{i}]: ")
        for key, values in terms.items():
            if key in counts:
                values.append(float(counts[key]))
    return total, terms


def sum_datums(
    per_datum: Sequence[MeasuredSums],
    where: str = "datums",
    declaration: measures.Declaration = measures.DEFAULT,
) -> MeasuredSums | None:
    """The exact sum of datums' measured sums (``None`` for none): counts as ints, extremes by
    max / min, float sums by one ``math.fsum`` over every datum (independent of order)."""
    return exact_floats(*total_and_terms(per_datum, where, declaration))


def exact_floats(total: MeasuredSums | None, terms: Mapping[str, Sequence[float]]) -> MeasuredSums | None:
    """``total`` with its float sums replaced by ``math.fsum`` of every term at once (addition
    rounds at each step, so its result depends on the grouping; one fsum does not)."""
    if total is None:
        return total
    exact = {key: math.fsum(terms[key]) for key in float_sums(total.declaration) if key in total}
    return MeasuredSums({**total.values, **exact}, declaration=total.declaration) if exact else total


def added(total: MeasuredSums | None, counts: MeasuredSums | None, where: str) -> MeasuredSums | None:
    """``total + counts`` (``None`` is no datums); the one mixing error prefixed with ``where``."""
    if total is None or counts is None:
        return counts if total is None else total
    try:
        return total + counts
    except ValueError as exc:
        raise ValueError(f"{where}{exc}") from exc


def datum_sequence(
    datum: object, where: str = "datum", counts: MeasuredSums | None = None
) -> SequenceGauge | None:
    """One datum's sequence gauge (:class:`cliptrack.core.worst.SequenceGauge`) from its output
    fields, when it carries an id (``datum_id``, with ``worst_token``) and the gauge; else ``None``.
    Its largest ``|l|`` is the larger of ``|log_ratio_max|`` and ``|log_ratio_min|``. ``counts``:
    the datum's :func:`datum_counts`, when already read."""
    if not isinstance(datum, Mapping) or keys.DATUM_ID not in datum:
        return None
    if counts is None:
        counts = datum_counts(datum, where)
    if not counts.has_gauge or keys.DATUM_WORST_TOKEN not in datum:
        raise ValueError(
            f"{where} has a {keys.DATUM_ID!r} but no gauge and {keys.DATUM_WORST_TOKEN!r} to rank it by"
        )
    tokens = counts.loss_tokens
    largest = (
        max(abs(float(counts[keys.LOG_RATIO_MAX])), abs(float(counts[keys.LOG_RATIO_MIN]))) if tokens else 0.0
    )
    return SequenceGauge(
        datum=read_count(datum[keys.DATUM_ID], f"{where}[{keys.DATUM_ID!r}]"),
        tokens=tokens,
        log_ratio=float(counts[keys.LOG_RATIO_SUM]),
        abs_log_ratio=float(counts[keys.ABS_LOG_RATIO_SUM]),
        kl_k3=float(counts[keys.KL_K3_SUM]),
        max_abs_log_ratio=largest,
        worst_token=_position(datum[keys.DATUM_WORST_TOKEN], f"{where}[{keys.DATUM_WORST_TOKEN!r}]"),
    )


def _position(value: object, where: str) -> int:
    """A worst token's position: a count, or -1 (no eligible token)."""
    try:
        return read_count(value, where)
    except ValueError:
        array, _ = read_array(value, where)
        if list(array) == [-1]:
            return -1
        raise
