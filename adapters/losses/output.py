"""``ForwardBackwardOutput`` in Tinker's form, merged with exact clip fractions and gauge means.

``ForwardBackwardOutput`` is tinker's own frozen dataclass when ``tinker`` is installed and an
identical dataclass otherwise (:mod:`cliptrack.adapters._compat.tinker`). Metrics are ``name:reduction`` ->
float. Outputs in any of their three forms (ours, tinker's, the JSON dict) are read through
:func:`cliptrack.core.outputs.read_output`; the low/high split is optional (docs/CONTRACT.md). The merge
rules are those of :mod:`cliptrack.core.measures`: sums add (counts exactly), ``:max`` / ``:min`` by
max / min, the means re-formed from the merged sums.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from cliptrack.adapters._compat.tinker import ForwardBackwardOutput
from cliptrack.core import keys, measures
from cliptrack.core.outputs import metrics_of, read_output
from cliptrack.core.sums import MeasuredSums, as_count, exact_measured_metrics
from cliptrack.core.validation import check_metrics

if TYPE_CHECKING:
    from cliptrack.adapters.losses.builtin import LossOutput


__all__ = [
    "ForwardBackwardOutput",
    "clip_counts",
    "loss_metrics",
    "merge_metrics",
    "measured_sums",
    "merge_outputs",
    "metrics_of",
    "validate_metrics",
]


def clip_counts(output: object) -> MeasuredSums | None:
    """Exact token counts of an output (ours, tinker's, or its JSON dict) when its loss clips:
    ``loss_tokens:sum``, ``clipped_tokens:sum`` and the low/high split when present (optional);
    ``None`` when it never clips (no ``clipped_tokens:sum``)."""
    counts = MeasuredSums.from_metrics(metrics_of(output))
    if counts is None or not counts.clips:
        return None
    clip = (measures.EVERY, measures.CLIP, measures.SPLIT)
    return counts.without(*(g for g in measures.GROUPS if g not in clip))


def measured_sums(output: object) -> MeasuredSums | None:
    """Everything an output (ours, tinker's, or its JSON dict) measured, the gauge included;
    ``None`` without ``loss_tokens:sum``. Raises ValueError naming a bad value."""
    return MeasuredSums.from_metrics(metrics_of(output))


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


def merge_metrics(chunks: Sequence[Mapping[str, float]], weights: Sequence[int]) -> dict[str, float]:
    """Merge chunk metrics with Tinker's reductions; the means re-formed from the merged sums.

    ``weights`` are the chunks' datum counts (Tinker weights ``:mean`` by them). As in Tinker, a
    key missing from any chunk is dropped and ``:unique`` keeps every value under suffixed keys;
    an extreme (``log_ratio:max`` / ``:min``) is also kept when only chunks without an eligible
    token lack it (it is absent there). Counts are summed exactly.
    """
    if not chunks:
        return {}
    merged: dict[str, float] = {}
    exact = {m.key for m in measures.MEASURES if m.exact}
    for key in chunks[0]:
        _, reduction = keys.split_key(key)
        if key in keys.EXTREME_KEYS or not all(key in chunk for chunk in chunks):
            continue
        values = [float(chunk[key]) for chunk in chunks]
        if reduction == "unique":
            merged[key] = values[0]
            merged.update({f"{key}_{i + 1}": v for i, v in enumerate(values[1:])})
            continue
        if key in exact:
            merged[key] = float(sum(as_count(key, v) for v in values))
            continue
        value = _reduce(reduction, values, weights)
        if value is not None:
            merged[key] = value
    merged.update(_merged_extremes(chunks))
    for mean in keys.MEAN_KEYS:  # a merged ``:mean`` is datum-weighted: never the token mean
        merged.pop(mean, None)
    return exact_measured_metrics(merged)


def _merged_extremes(chunks: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The extremes over the chunks that carry them, when every chunk with an eligible token does."""
    out: dict[str, float] = {}
    for key in keys.EXTREME_KEYS:
        present = [float(chunk[key]) for chunk in chunks if key in chunk]
        counted = all(key in chunk or float(chunk.get(keys.LOSS_TOKENS, 1)) == 0 for chunk in chunks)
        if present and counted:
            out[key] = float(measures.combine(measures.by_key(key), present))
    return out


def merge_outputs(chunks: Iterable[object]) -> ForwardBackwardOutput:
    """Merge the outputs of the chunks of one request, as tinker does, but with exact fractions."""
    parts = [read_output(c, f"chunks[{i}]") for i, c in enumerate(chunks)]
    if not parts:
        return ForwardBackwardOutput(loss_fn_output_type="", loss_fn_outputs=[], metrics={})
    return ForwardBackwardOutput(
        loss_fn_output_type=parts[0].loss_fn_output_type,
        loss_fn_outputs=[o for part in parts for o in part.loss_fn_outputs],
        metrics=merge_metrics([p.metrics for p in parts], [len(p.loss_fn_outputs) for p in parts]),
    )


def loss_metrics(*outputs: LossOutput) -> dict[str, float]:
    """Metrics of one or more ``cliptrack.adapters.losses.builtin.LossOutput`` (combined): ``loss:sum``, the counts,
    the gauge and the means formed from them.

    Synchronises with the host once and raises ValueError for invalid loss inputs. A loss that
    never clips yields no clip keys; a loss without sampling log-probs (cross entropy) no gauge.
    """
    from cliptrack.adapters.losses.builtin import pack, unpack

    if not outputs:
        raise ValueError("loss_metrics needs at least one LossOutput")
    total = outputs[0]
    for other in outputs[1:]:
        total = total + other
    values = pack(total).tolist()  # the one sync
    sums = unpack(values)
    sums.check(total.sources)
    return {keys.LOSS_SUM: sums.loss_sum, **sums.counts.to_metrics()}
