"""The losses: Tinker's built-in objectives that count the tokens where clipping bites and measure
the sampler–trainer gauge, and ``ForwardBackwardOutput`` merged from exact sums.

Parts: ``formulas`` (each loss written once), ``builtin`` (the eager losses and ``LossOutput``),
``fused`` (one compiled computation per call), ``output`` (Tinker's output form and its merge).
Every name here imports torch.
"""

from cliptrack.adapters.losses.builtin import (
    LOSSES,
    LossOutput,
    LossSpec,
    cispo,
    cross_entropy,
    dro,
    importance_sampling,
    ppo,
    register_loss,
    unregister_loss,
)
from cliptrack.adapters.losses.output import (
    ForwardBackwardOutput,
    clip_counts,
    loss_metrics,
    measured_sums,
    merge_metrics,
    merge_outputs,
    validate_metrics,
)

__all__ = [
    "LOSSES",
    "ForwardBackwardOutput",
    "LossOutput",
    "LossSpec",
    "cispo",
    "clip_counts",
    "cross_entropy",
    "dro",
    "importance_sampling",
    "loss_metrics",
    "measured_sums",
    "merge_metrics",
    "merge_outputs",
    "ppo",
    "register_loss",
    "unregister_loss",
    "validate_metrics",
]
