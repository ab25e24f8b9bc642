"""The host-side merge of every stack: ``ForwardBackwardOutput``s (tinker's form) merged with
exact clip fractions and gauge means, from their metrics or from their per-datum sums.

``ForwardBackwardOutput`` is tinker's own frozen dataclass when ``tinker`` is installed and an
identical dataclass otherwise (:mod:`cliptrack.adapters._compat.tinker`). Metrics are
``name:reduction`` -> float. Outputs in any of their three forms (ours, tinker's, the JSON dict)
are read through :func:`cliptrack.core.outputs.read_output`; the low/high split is optional
(docs/CONTRACT.md). The merge rules are those of :mod:`cliptrack.core.measures`: sums add (counts
exactly), ``:max`` / ``:min`` by max / min, the means re-formed from the merged sums.

Mixed losses: the counts of PPO and CISPO mean the same thing (eligible tokens whose update
clipping changed), so outputs of either sum together. A loss that never clips carries no clip
fields, a loss without sampling log-probs (cross entropy) no gauge; mixing such outputs with
others within one request or step leaves a fraction or mean with no meaning, so it is refused
with the one mixing error (:func:`cliptrack.core.measures.mixed_groups_error`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cliptrack.adapters._compat.tinker import ForwardBackwardOutput
from cliptrack.adapters.shared.datums import (
    added,
    datum_counts,
    datum_sequence,
    exact_floats,
    float_sums,
    total_and_terms,
)
from cliptrack.core import keys, measures
from cliptrack.core.outputs import is_output, metrics_of, read_output
from cliptrack.core.sums import MeasuredSums, as_count, exact_measured_metrics
from cliptrack.core.validation import check_metrics
from cliptrack.core.worst import DEFAULT_K, SequenceGauge, Worst, worst_of


def clip_counts(output: object, declaration: measures.Declaration = measures.DEFAULT) -> MeasuredSums | None:
    """Exact token counts of an output (ours, tinker's, or its JSON dict) when its loss clips:
    ``loss_tokens:sum``, ``clipped_tokens:sum``, the low/high split and the dual-clip count when
    present (optional);
    ``None`` when it never clips (no ``clipped_tokens:sum``)."""
    counts = MeasuredSums.from_metrics(metrics_of(output), declaration)
    if counts is None or not counts.clips:
        return None
    clip = (measures.EVERY, measures.CLIP, measures.SPLIT, measures.DUAL_CLIP)
    return counts.without(*(g for g in declaration.group_names if g not in clip))


def measured_sums(
    output: object, declaration: measures.Declaration = measures.DEFAULT
) -> MeasuredSums | None:
    """Everything an output (ours, tinker's, or its JSON dict) measured, the gauge included;
    ``None`` without ``loss_tokens:sum``. Raises ValueError naming a bad value."""
    return MeasuredSums.from_metrics(metrics_of(output), declaration)


def validate_metrics(metrics: Mapping[str, object]) -> dict[str, float]:
    """Return ``metrics`` as ``{str: float}``; raise ValueError naming a bad key, value or count
    (:func:`cliptrack.core.validation.check_metrics`)."""
    return check_metrics(metrics)


def _reduce(reduction: str, values: Sequence[float], weights: Sequence[int]) -> float | None:
    if reduction == "sum":
        return math.fsum(values)
    if reduction == "mean":
        total = sum(weights)
        if total == 0:
            return math.fsum(values) / len(values)
        return math.fsum(v * w for v, w in zip(values, weights, strict=True)) / total
    if reduction == "min":
        return min(values)
    if reduction == "max":
        return max(values)
    if reduction == "slack":
        mean = _reduce("mean", values, weights)
        assert mean is not None
        return max(values) - mean
    if reduction == "hash2":
        return float(sum(int(v) & 0xFFFF_FFFF_FFFF_FFFF for v in values) & 0xFFFF_FFFF_FFFF_FFFF)
    return None


def merge_metrics(
    chunks: Sequence[Mapping[str, float]],
    weights: Sequence[int],
    declaration: measures.Declaration = measures.DEFAULT,
) -> dict[str, float]:
    """Merge chunk metrics with Tinker's reductions; the means re-formed from the merged sums.

    ``weights`` are the chunks' datum counts (Tinker weights ``:mean`` by them). As in Tinker, a
    key missing from any chunk is dropped and ``:unique`` keeps every value under suffixed keys;
    an extreme (``log_ratio:max`` / ``:min``) is also kept when only chunks without an eligible
    token lack it (it is absent there). Counts are summed exactly. The measured keys are
    ``declaration``'s.
    """
    if not chunks:
        return {}
    merged: dict[str, float] = {}
    exact = {m.key for m in declaration.measures if m.exact}
    extremes = {m.key for m in declaration.extreme_measures}
    for key in chunks[0]:
        if key not in extremes and all(key in chunk for chunk in chunks):
            merged.update(_merged_key(key, [float(chunk[key]) for chunk in chunks], weights, key in exact))
    merged.update(_merged_extremes(chunks, declaration))
    for mean in declaration.means:  # a merged ``:mean`` is datum-weighted: never the token mean
        merged.pop(mean.key, None)
    return exact_measured_metrics(merged, declaration)


def _merged_key(key: str, values: list[float], weights: Sequence[int], exact: bool) -> dict[str, float]:
    """One key every chunk carries, merged by its reduction: ``:unique`` keeps every value (the
    second on under suffixed keys), an exact count is summed as ints, the rest by :func:`_reduce`
    (an unknown reduction: dropped)."""
    _, reduction = keys.split_key(key)
    if reduction == "unique":
        return {key: values[0], **{f"{key}_{i + 1}": v for i, v in enumerate(values[1:])}}
    if exact:
        return {key: float(sum(as_count(key, v) for v in values))}
    value = _reduce(reduction, values, weights)
    return {} if value is None else {key: value}


def _merged_extremes(
    chunks: Sequence[Mapping[str, float]], declaration: measures.Declaration
) -> dict[str, float]:
    """The extremes over the chunks that carry them, when every chunk with an eligible token does."""
    out: dict[str, float] = {}
    for measure in declaration.extreme_measures:
        key = measure.key
        present = [float(chunk[key]) for chunk in chunks if key in chunk]
        counted = all(key in chunk or float(chunk.get(keys.LOSS_TOKENS, 1)) == 0 for chunk in chunks)
        if present and counted:
            out[key] = float(measures.combine(measure, present))
    return out


def merge_outputs(
    chunks: Iterable[object], declaration: measures.Declaration = measures.DEFAULT
) -> ForwardBackwardOutput:
    """Merge the outputs of the chunks of one request, as tinker does, but with exact fractions
    (the measured keys: ``declaration``'s)."""
    parts = [read_output(c, f"chunks[{i}]") for i, c in enumerate(chunks)]
    if not parts:
        return ForwardBackwardOutput(loss_fn_output_type="", loss_fn_outputs=[], metrics={})
    return ForwardBackwardOutput(
        loss_fn_output_type=parts[0].loss_fn_output_type,
        loss_fn_outputs=[o for part in parts for o in part.loss_fn_outputs],
        metrics=merge_metrics(
            [p.metrics for p in parts], [len(p.loss_fn_outputs) for p in parts], declaration
        ),
    )


def _from_datums(declaration: measures.Declaration) -> tuple[str, ...]:
    """Metric keys always formed from the per-datum sums (never from a chunk's own metrics)."""
    return (*(m.key for m in declaration.datum_measures), *(m.key for m in declaration.means))


MAX_CHUNK_DATUMS = 1024
"""Most datums in one chunk of a Tinker forward_backward request."""


@dataclass(frozen=True)
class Chunk:
    """One validated output: its datums' summed measures (``None`` without datums), each datum's
    float sums (``terms``: key -> one value per datum, for the exact sum), its number of datums,
    its checked metrics, its per-datum outputs (kept on request) and output type."""

    counts: MeasuredSums | None
    terms: dict[str, list[float]]
    datums: int
    metrics: dict[str, float]
    datum_outputs: list[Any]
    output_type: str
    sequences: tuple[SequenceGauge, ...] = ()
    """The gauge of each datum that carries an id (:func:`datum_sequence`), for the worst sequences."""


def aggregate_datums(
    outputs: object, declaration: measures.Declaration = measures.DEFAULT
) -> dict[str, float]:
    """The step's metrics from per-datum outputs, with counts summed exactly.

    ``outputs``: one ForwardBackwardOutput (ours or tinker's, including tinker's
    ``combine_fwd_bwd_output_results`` of chunks) or its JSON dict; a sequence of those (chunks, in
    any order); or a sequence of per-datum outputs (``{field: TensorData}``). Other metrics of the
    outputs are merged with Tinker's reductions (a key missing from any output that holds datums is
    dropped, as in Tinker, rather than summed over part of the step); ``loss_tokens:sum``, the clip
    counts and ``clip_fraction:mean`` always come from the per-datum sums (a loss that never clips
    yields no clip keys; the low/high split only when every datum carries it). Raises ValueError for
    bad or inconsistent counts and for mixed loss kinds. The measures read: ``declaration``'s.
    """
    chunks = [read_chunk(o, f"outputs[{i}]", declaration) for i, o in enumerate(_as_outputs(outputs))]
    total: MeasuredSums | None = None
    for i, chunk in enumerate(chunks):
        total = added(total, chunk.counts, f"outputs[{i}]: ")
    return step_metrics(chunks, total, declaration)


def _as_outputs(outputs: object) -> list[object]:
    if is_output(outputs):
        return [outputs]
    if isinstance(outputs, (str, bytes)) or not isinstance(outputs, Iterable):
        raise TypeError(
            f"expected a ForwardBackwardOutput, its JSON dict, or a list of them or of per-datum "
            f"outputs; got {type(outputs).__name__}"
        )
    items = list(outputs)
    kinds = {is_output(item) for item in items}
    if kinds == {True}:
        return items
    if kinds == {False}:  # bare per-datum outputs: one request without metrics
        return [ForwardBackwardOutput(loss_fn_output_type="", loss_fn_outputs=items, metrics={})]
    if not items:
        return []
    raise TypeError("outputs mixes ForwardBackwardOutputs with bare per-datum outputs")


def read_chunk(output: object, where: str, declaration: measures.Declaration = measures.DEFAULT) -> Chunk:
    """Validate one output completely (nothing is summed anywhere until this returns); its
    per-datum measures are ``declaration``'s."""
    parts = read_output(output, where)
    datums_where = f"{where}.loss_fn_outputs"
    per_datum = [
        datum_counts(d, f"{datums_where}[{i}]", declaration) for i, d in enumerate(parts.loss_fn_outputs)
    ]
    total, terms = total_and_terms(per_datum, datums_where, declaration)
    counts = exact_floats(total, terms)
    try:
        checked = check_metrics(parts.metrics) if parts.metrics else {}
    except ValueError as exc:
        raise ValueError(f"{where}.metrics: {exc}") from exc
    _check_metrics_agree(checked, counts, where, declaration)
    return Chunk(
        counts,
        terms,
        len(parts.loss_fn_outputs),
        checked,
        list(parts.loss_fn_outputs),
        parts.loss_fn_output_type,
        _sequences(parts.loss_fn_outputs, per_datum, datums_where),
    )


def _sequences(
    datums: Sequence[object], counts: Sequence[MeasuredSums], where: str
) -> tuple[SequenceGauge, ...]:
    """The datums' sequence gauges (those with ids). A datum whose ranking fields are bad (an id
    without ``worst_token`` or the gauge, a bad id) leaves the chunk's sequences out, with a warning
    naming it: a diagnostic never costs the chunk's counts, which are already checked."""
    try:
        return tuple(
            s
            for i, (d, c) in enumerate(zip(datums, counts, strict=True))
            if (s := datum_sequence(d, f"{where}[{i}]", c)) is not None
        )
    except ValueError as exc:
        warnings.warn(
            f"{exc}: the chunk's worst sequences are left out, its counts kept", RuntimeWarning, stacklevel=3
        )
        return ()


def worst_of_outputs(outputs: object, step: int, k: int = DEFAULT_K) -> Worst | None:
    """The worst sequences among the datums of ``outputs`` (one output, or several: a request's
    chunks, tinker's merge of them, a step's requests) that carry ids; ``None`` when none does.
    Exact in any chunking and order (:func:`cliptrack.core.worst.worst_of`)."""
    sequences = [
        s for i, o in enumerate(_as_outputs(outputs)) for s in read_chunk(o, f"outputs[{i}]").sequences
    ]
    if not sequences:
        return None
    return Worst(step, k, worst_of(sequences, k))


def _check_metrics_agree(
    metrics: Mapping[str, float], counts: MeasuredSums | None, where: str, declaration: measures.Declaration
) -> None:
    """Measured keys an output's metrics carry must agree with its per-datum sums: every count
    equal, and no clip or gauge key for datums without them (float sums and extremes are taken
    from the datums; the output's own are not compared, the wire rounds them)."""
    expected = counts.to_metrics() if counts is not None else {}
    for key in (m.key for m in declaration.datum_measures if m.exact):  # they must equal the datums' sums
        if key not in metrics:
            continue
        if counts is None:
            if metrics[key] != 0:
                raise ValueError(
                    f"{where}.metrics[{key!r}] = {metrics[key]:.0f} but the output has no per-datum "
                    "outputs to take exact counts from"
                )
            continue
        if key not in expected:
            raise ValueError(f"{where}.metrics carry {key!r} but its datums {_lacking(key, counts)}")
        if metrics[key] != expected[key]:
            raise ValueError(
                f"{where}.metrics[{key!r}] = {metrics[key]:.0f} but its datums sum to {expected[key]:.0f}"
            )
    if counts is not None and not counts.has_gauge:
        stray = [key for key in keys.GAUGE_KEYS if key in metrics]
        if stray:
            raise ValueError(f"{where}.metrics carry {stray} but its datums {_lacking(stray[0], counts)}")


def _lacking(key: str, counts: MeasuredSums) -> str:
    """What the datums lack that ``key`` needs, in words."""
    if key in keys.GAUGE_KEYS:
        return "carry no gauge: a loss without sampling log-probs must emit no gauge keys"
    if counts.clips:
        return "carry no low/high split"
    return "carry no clip counts: a loss that never clips must emit no clip keys"


def step_metrics(
    chunks: Sequence[Chunk], total: MeasuredSums | None, declaration: measures.Declaration = measures.DEFAULT
) -> dict[str, float]:
    """The step's metrics: the chunks' metrics merged, the token metrics from ``total`` (their sum)."""
    # Tinker's rule: a key missing from any output that holds datums is dropped (an output without
    # metrics among ones with ``loss:sum`` would otherwise leave a sum over part of the step).
    with_metrics = [c for c in chunks if c.metrics or c.datums]
    merged = merge_metrics([c.metrics for c in with_metrics], [c.datums for c in with_metrics], declaration)
    for key in _from_datums(declaration):
        merged.pop(key, None)
    terms = {key: [v for c in chunks for v in c.terms.get(key, ())] for key in float_sums(declaration)}
    none = MeasuredSums({keys.LOSS_TOKENS: 0}, declaration=declaration)
    merged.update((exact_floats(total, terms) or none).to_metrics())
    return merged
