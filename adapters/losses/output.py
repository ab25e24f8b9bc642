"""A loss call's output (:class:`LossOutput`: the loss sum and everything it measured, on device)
and ``ForwardBackwardOutput`` in Tinker's form, merged with exact clip fractions and gauge means.

``ForwardBackwardOutput`` and its merge (:func:`merge_outputs`, :func:`merge_metrics`,
:func:`measured_sums`, :func:`clip_counts`) are every stack's, in
:mod:`cliptrack.adapters.shared.merge`; they are named here too, beside :func:`loss_metrics`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from cliptrack.adapters.shared.merge import (
    ForwardBackwardOutput,
    clip_counts,
    measured_sums,
    merge_metrics,
    merge_outputs,
    validate_metrics,
)
from cliptrack.adapters.shared.packing import Sources, pack, raise_invalid, unpack
from cliptrack.core import keys, measures
from cliptrack.core.outputs import metrics_of
from cliptrack.core.sums import MeasuredSums
from torch import Tensor

__all__ = [
    "ForwardBackwardOutput",
    "LossOutput",
    "clip_counts",
    "loss_metrics",
    "measured_sums",
    "merge_metrics",
    "merge_outputs",
    "metrics_of",
    "validate_metrics",
]


@dataclass(frozen=True)
class LossOutput:
    """The loss of one micro-batch (or a sum of several) and everything it measured.

    ``loss``: 0-dim, sum of per-token losses over eligible tokens (differentiable for one call;
    detached in a sum). ``measured``: every measure the loss emits under its metric key
    (:mod:`cliptrack.core.measures`: ``loss_tokens:sum`` always, the clip counts for a loss that
    clips, the low/high split when it reports it, the on-policy gauge for a loss with sampling
    log-probs, the measures its declaration was extended with), detached 0-dim tensors on the loss's device: counts int64 in
    tokens, the gauge float64 (``log_ratio:max`` / ``:min``: ``-inf`` / ``+inf`` over no eligible
    token). ``invalid``: int64 vector, the number of bad entries per input of
    :data:`cliptrack.adapters.shared.packing.INPUT_CHECKS`. Moved to the host through one packing
    (:func:`cliptrack.adapters.shared.packing.pack`, laid out as ``declaration.packed_fields``).
    ``declaration``: what the loss measures (:data:`cliptrack.core.measures.DEFAULT` unless the
    loss was given another); outputs of different declarations do not add.
    """

    loss: Tensor
    measured: Mapping[str, Tensor]
    invalid: Tensor
    sources: Sources = ()
    calls: int = 1
    """Number of loss calls summed in this output."""
    declaration: measures.Declaration = field(default=measures.DEFAULT, kw_only=True, repr=False)

    @property
    def loss_tokens(self) -> Tensor:
        """Eligible tokens (``mask != 0``), int64 0-dim."""
        return self.measured[keys.LOSS_TOKENS]

    def get(self, key: str) -> Tensor | None:
        """The measured value of ``key`` (a metric key), ``None`` when this loss does not emit it."""
        return self.measured.get(key)

    def has(self, group: str) -> bool:
        """Whether this output carries the measures of ``group`` (:mod:`cliptrack.core.measures`)."""
        return any(m.key in self.measured for m in measures.group_measures(group, self.declaration))

    @property
    def clips(self) -> bool:
        """Whether this loss clips (and so carries clip counts)."""
        return self.has(measures.CLIP)

    @property
    def has_gauge(self) -> bool:
        """Whether this loss measures the on-policy gauge (it has sampling log-probs)."""
        return self.has(measures.GAUGE)

    def metric_tensors(self) -> dict[str, Tensor]:
        """Every measured value under its metric key, as 0-dim device tensors (no sync):
        ``loss:sum`` and :attr:`measured`."""
        return {keys.LOSS_SUM: self.loss.detach(), **self.measured}

    def __add__(self, other: LossOutput) -> LossOutput:
        """Sum two outputs on device (no host sync); the summed ``loss`` is detached. A measure
        combines by its reduction; a group carried by one side only is refused
        (:func:`cliptrack.core.measures.mixed_groups_error`) or, when declared
        ``dropped_when_mixed`` (the split), dropped."""
        if not isinstance(other, LossOutput):
            return NotImplemented
        declaration = self.declaration
        if other.declaration is not declaration:
            raise ValueError(
                "these LossOutputs come from losses given different declarations (cliptrack.core."
                "measures.Declaration): sum outputs of one declaration only"
            )
        out: dict[str, Tensor] = {}
        for group in declaration.groups:
            mine, theirs = self.has(group.name), other.has(group.name)
            if mine != theirs and not group.dropped_when_mixed:
                raise measures.mixed_groups_error(group.name, mine, theirs, "this LossOutput", declaration)
            if not (mine and theirs):
                continue
            for measure in declaration.members[group.name]:
                a, b = self.measured.get(measure.key), other.measured.get(measure.key)
                if a is None or b is None:
                    continue
                if measure.reduction == measures.SUM:
                    out[measure.key] = a + b
                elif measure.reduction == measures.MAX:
                    out[measure.key] = torch.maximum(a, b)
                else:
                    out[measure.key] = torch.minimum(a, b)
        return LossOutput(
            loss=self.loss.detach() + other.loss.detach(),
            measured=out,
            invalid=self.invalid + other.invalid,
            sources=self.sources + other.sources,
            calls=self.calls + other.calls,
            declaration=declaration,
        )

    def check(self) -> None:
        """Raise ValueError naming every input with bad entries. Synchronises with the host."""
        raise_invalid(self.invalid, self.sources)

    def token_counts(self) -> MeasuredSums:
        """Exact host-side measured sums, the gauge included (synchronises once); raises ValueError
        for invalid loss inputs."""
        sums = unpack(pack(self).tolist(), declaration=self.declaration)
        sums.check(self.sources)
        return sums.counts

    def clip_counts(self) -> MeasuredSums | None:
        """Exact host-side clip counts (``loss_tokens`` and the clip groups; synchronises once);
        ``None`` when the loss never clips."""
        counts = self.token_counts()
        if not counts.clips:
            return None
        clip = (measures.EVERY, measures.CLIP, measures.SPLIT, measures.DUAL_CLIP)
        return counts.without(*(g for g in self.declaration.group_names if g not in clip))


def loss_metrics(*outputs: LossOutput) -> dict[str, float]:
    """Metrics of one or more :class:`LossOutput` (combined): ``loss:sum``, the counts,
    the gauge and the means formed from them.

    Synchronises with the host once and raises ValueError for invalid loss inputs. A loss that
    never clips yields no clip keys; a loss without sampling log-probs (cross entropy) no gauge.
    """
    if not outputs:
        raise ValueError("loss_metrics needs at least one LossOutput")
    total = outputs[0]
    for other in outputs[1:]:
        total = total + other
    values = pack(total).tolist()  # the one sync
    sums = unpack(values, declaration=total.declaration)
    sums.check(total.sources)
    return {keys.LOSS_SUM: sums.loss_sum, **sums.counts.to_metrics()}
