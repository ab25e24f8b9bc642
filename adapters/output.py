"""``ForwardBackwardOutput`` in Tinker's form, merged with exact clip fractions.

``ForwardBackwardOutput`` is tinker's own frozen dataclass when ``tinker`` is installed and an
identical dataclass otherwise. Metrics are ``name:reduction`` -> float.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tracking import keys
from tracking.counts import ClipCounts, as_count, exact_clip_metrics, metrics_of, token_metrics

if TYPE_CHECKING:
    from adapters.losses import LossOutput

try:  # tinker's own type when available, so outputs pass through tinker's helpers unchanged
    from tinker.types import ForwardBackwardOutput
except ImportError:  # pragma: no cover - exercised only where tinker is absent

    @dataclass(frozen=True)
    class ForwardBackwardOutput:  # type: ignore[no-redef]
        """Same fields as ``tinker.types.ForwardBackwardOutput``."""

        loss_fn_output_type: str
        loss_fn_outputs: list[dict[str, Any]]
        metrics: dict[str, float] = field(default_factory=dict)


__all__ = [
    "ForwardBackwardOutput",
    "clip_counts",
    "loss_metrics",
    "merge_metrics",
    "merge_outputs",
    "metrics_of",
    "validate_metrics",
]


def clip_counts(output: object) -> ClipCounts | None:
    """Exact clip counts of an output (ours, tinker's, or its JSON dict); ``None`` if the loss never clips."""
    return ClipCounts.from_metrics(metrics_of(output))


def validate_metrics(metrics: Mapping[str, object]) -> dict[str, float]:
    """Return ``metrics`` as ``{str: float}``; raise ValueError naming a bad key or value."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        keys.split_key(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"metric {key!r} must be a number, got {type(value).__name__} {value!r}")
        out[key] = float(value)
    return exact_clip_metrics(out)


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
    """Merge chunk metrics with Tinker's reductions; ``clip_fraction:mean`` recomputed from the sums.

    ``weights`` are the chunks' datum counts (Tinker weights ``:mean`` by them). As in Tinker, a
    key missing from any chunk is dropped and ``:unique`` keeps every value under suffixed keys.
    Token counts are summed exactly.
    """
    if not chunks:
        return {}
    merged: dict[str, float] = {}
    for key in chunks[0]:
        _, reduction = keys.split_key(key)
        if not all(key in chunk for chunk in chunks):
            continue
        values = [float(chunk[key]) for chunk in chunks]
        if reduction == "unique":
            merged[key] = values[0]
            merged.update({f"{key}_{i + 1}": v for i, v in enumerate(values[1:])})
            continue
        if key in keys.TOKEN_COUNT_KEYS:
            merged[key] = float(sum(as_count(key, v) for v in values))
            continue
        value = _reduce(reduction, values, weights)
        if value is not None:
            merged[key] = value
    merged.pop(keys.CLIP_FRACTION, None)  # a merged ``:mean`` is datum-weighted: never the token fraction
    return exact_clip_metrics(merged)


def merge_outputs(chunks: Iterable[object]) -> ForwardBackwardOutput:
    """Merge the outputs of the chunks of one request, as tinker does, but with exact fractions."""
    chunks = list(chunks)
    if not chunks:
        return ForwardBackwardOutput(loss_fn_output_type="", loss_fn_outputs=[], metrics={})
    metrics = [metrics_of(c) for c in chunks]
    outputs = [_field(c, "loss_fn_outputs") for c in chunks]
    return ForwardBackwardOutput(
        loss_fn_output_type=_field(chunks[0], "loss_fn_output_type"),
        loss_fn_outputs=[o for chunk in outputs for o in chunk],
        metrics=merge_metrics(metrics, [len(o) for o in outputs]),
    )


def _field(output: object, name: str) -> Any:
    if isinstance(output, Mapping):
        return output.get(name, [] if name == "loss_fn_outputs" else "")
    return getattr(output, name)


def loss_metrics(*outputs: LossOutput) -> dict[str, float]:
    """Metrics of one or more ``adapters.losses.LossOutput`` (summed): ``loss:sum`` and the counts.

    Synchronises with the host once and raises ValueError for invalid loss inputs. A loss that
    never clips yields only ``loss:sum`` and ``loss_tokens:sum``.
    """
    import torch

    from adapters.losses import raise_invalid

    if not outputs:
        raise ValueError("loss_metrics needs at least one LossOutput")
    total = outputs[0]
    for other in outputs[1:]:
        total = total + other
    clip_fields = (total.clipped_tokens, total.clipped_low_tokens, total.clipped_high_tokens)
    fields = [total.loss.detach(), total.loss_tokens, *(f for f in clip_fields if f is not None)]
    values = torch.cat([torch.stack([f.double() for f in fields]), total.invalid.double()]).tolist()  # one sync
    raise_invalid([int(v) for v in values[len(fields):]], total.sources)
    counts = ClipCounts(*values[1:5]) if total.clips else None
    metrics = {keys.LOSS_SUM: values[0]}
    metrics.update(token_metrics(values[1], counts))
    return metrics
