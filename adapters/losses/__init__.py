"""The losses: Tinker's built-in objectives that count the tokens where clipping bites and measure
the sampler–trainer gauge, and ``ForwardBackwardOutput`` merged from exact sums.

Parts: ``output`` (``LossOutput``, ``loss_metrics``), ``objectives`` (the losses), ``inputs``
(their checks), ``registry``, ``formulas`` (each loss written once), ``fused`` (one compiled
computation per call) and ``builtin`` (all of them in one import). The packing and Tinker's output
form with its merge are every stack's (:mod:`cliptrack.adapters.shared`). Every name here imports
torch.
"""

from cliptrack.adapters.losses.builtin import (
    LossOutput,
    LossSpec,
    cispo,
    cross_entropy,
    dro,
    importance_sampling,
    ppo,
    register_loss,
)
from cliptrack.adapters.losses.output import ForwardBackwardOutput, loss_metrics

__all__ = [
    "ForwardBackwardOutput",
    "LossOutput",
    "LossSpec",
    "cispo",
    "cross_entropy",
    "dro",
    "importance_sampling",
    "loss_metrics",
    "ppo",
    "register_loss",
]
