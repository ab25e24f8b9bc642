"""What a stack is, in code: a loss hook, a reduction and a read-back.

A stack (Megatron-Core, the Miles runtime, tinker clients, and the next ones) runs cliptrack's
loss inside its own update and hands the step's exact sums back to the log. Each does three
things, and :class:`Stack` names them:

- ``loss_hook``: one loss call (a micro-batch, a request, a chunk) in the stack's own form: its
  differentiable loss (what the stack back-propagates) and what the call reports to the reduction;
- ``reduce``: a step's reports combined into one ``ForwardBackwardOutput``, counts summed exactly
  and fractions formed once from the sums (the packing and the one collective of
  :mod:`cliptrack.adapters.shared.packing` / :mod:`cliptrack.adapters.shared.collective`, the
  per-datum wire form of :mod:`cliptrack.adapters.shared.datums` or the host-side merge of
  :mod:`cliptrack.adapters.shared.merge`);
- ``read_back``: the step's exact measured sums from what the stack returned or logged.

:func:`run_step` drives any stack through one step; a new stack is a class with these three
methods (``tests/test_stacks.py`` writes a toy one), importing :mod:`cliptrack.adapters.shared`
and never another stack.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from cliptrack.adapters.shared.merge import ForwardBackwardOutput
from cliptrack.core.sums import MeasuredSums
from torch import Tensor


@dataclass(frozen=True)
class StackCall:
    """One loss call through a stack's hook: ``loss``, the differentiable 0-dim sum of per-token
    losses over eligible tokens (what the stack back-propagates), and ``report``, what the call
    hands to the stack's reduction (Megatron's report dict, a Miles output, a tinker output)."""

    loss: Tensor
    report: Any


@runtime_checkable
class Stack(Protocol):
    """One integration of cliptrack into a training stack (see the module's docstring)."""

    @property
    def name(self) -> str:
        """The stack's name, as runs record it."""
        ...

    def loss_hook(
        self, loss_fn: str, logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, Any]
    ) -> StackCall:
        """One call of registered loss ``loss_fn`` on per-token ``logprobs`` (with grad) and its
        other per-token ``inputs`` (``sampling_logprobs``, ``advantages``, ``mask``, ...), with
        keyword options ``config``, in the stack's own form."""
        ...

    def reduce(self, reports: Sequence[Any]) -> ForwardBackwardOutput:
        """A step's reports (in call order) as one output, its counts exact."""
        ...

    def read_back(self, output: object) -> MeasuredSums | None:
        """The exact measured sums of a step's output (``None`` without ``loss_tokens:sum``)."""
        ...


@dataclass(frozen=True)
class StepResult:
    """A step driven by :func:`run_step`: each call's differentiable ``losses``, the reduced
    ``output`` and its read-back ``sums``."""

    losses: list[Tensor]
    output: ForwardBackwardOutput
    sums: MeasuredSums | None


def run_step(
    stack: Stack,
    loss_fn: str,
    calls: Sequence[tuple[Tensor, Mapping[str, Tensor]]],
    config: Mapping[str, Any] | None = None,
) -> StepResult:
    """One step of ``stack``: each ``(logprobs, inputs)`` of ``calls`` through its loss hook, the
    reports reduced, the output read back. TypeError when ``stack`` lacks a part of :class:`Stack`."""
    if not isinstance(stack, Stack):
        missing = [part for part in ("name", "loss_hook", "reduce", "read_back") if not hasattr(stack, part)]
        raise TypeError(f"{type(stack).__name__} is not a Stack: it lacks {missing}")
    hooked = [stack.loss_hook(loss_fn, logprobs, inputs, dict(config or {})) for logprobs, inputs in calls]
    output = stack.reduce([call.report for call in hooked])
    return StepResult([call.loss for call in hooked], output, stack.read_back(output))
