"""The losses: Tinker's built-in objectives that count the tokens where clipping bites and measure
the sampler–trainer gauge, and ``ForwardBackwardOutput`` merged from exact sums.

Parts: ``output`` (``LossOutput``, ``loss_metrics``), ``objectives`` (the losses), ``inputs``
(their checks), ``registry``, ``formulas`` (each loss written once), ``fused`` (one compiled
computation per call) and ``builtin`` (all of them in one import). The packing and Tinker's output
form with its merge are every stack's (:mod:`cliptrack.adapters.shared`). Every name here imports
torch.
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
