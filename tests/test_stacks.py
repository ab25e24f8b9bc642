"""A stack is a protocol in code (cliptrack.adapters.shared.stack): a loss hook, a reduction and a
read-back. The three integrations are written against it, and so is a toy stack here, built from
the shared parts alone; every one of them gives a step's exact counts and its loss."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from cliptrack.adapters import megatron, tinker
from cliptrack.adapters.losses.registry import loss_spec
from cliptrack.adapters.miles import runtime
from cliptrack.adapters.shared import (
    ForwardBackwardOutput,
    Stack,
    StackCall,
    combine_packed,
    measured_sums,
    pack,
    run_step,
    unpack,
)
from cliptrack.core import keys
from cliptrack.core.sums import MeasuredSums
from torch import Tensor

from tests.reference import per_token_ppo


@dataclass(frozen=True)
class ToyStack:
    """A stack of the shared parts alone: each call packed on device, the step's vectors combined
    and read once, the output's metrics formed from the sums."""

    name: str = "toy"

    def loss_hook(
        self, loss_fn: str, logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, Any]
    ) -> StackCall:
        spec = loss_spec(loss_fn)
        assert spec is not None
        out = spec.fn(logprobs, **inputs, **config)
        return StackCall(out.loss, pack(out))

    def reduce(self, reports: Sequence[Any]) -> ForwardBackwardOutput:
        sums = unpack(combine_packed(torch.stack(list(reports))).tolist())
        sums.check()
        metrics = {keys.LOSS_SUM: sums.loss_sum, **sums.counts.to_metrics()}
        return ForwardBackwardOutput(loss_fn_output_type="", loss_fn_outputs=[], metrics=metrics)

    def read_back(self, output: object) -> MeasuredSums | None:
        return measured_sums(output)


STACKS = {"toy": ToyStack(), "megatron": megatron.STACK, "miles": runtime.STACK, "tinker": tinker.STACK}


def _calls(seed: int, shapes: Sequence[tuple[int, int]]) -> list[tuple[Tensor, dict[str, Tensor]]]:
    generator = torch.Generator().manual_seed(seed)
    calls = []
    for rows, tokens in shapes:
        slp = -torch.rand(rows, tokens, generator=generator, dtype=torch.float64) * 3
        lp = (
            slp + 0.4 * torch.randn(rows, tokens, generator=generator, dtype=torch.float64)
        ).requires_grad_()
        adv = torch.randn(rows, tokens, generator=generator, dtype=torch.float64)
        mask = (torch.rand(rows, tokens, generator=generator) < 0.8).to(torch.float64)
        calls.append((lp, {"sampling_logprobs": slp, "advantages": adv, "mask": mask}))
    return calls


def test_the_three_integrations_and_the_toy_are_stacks():
    for name, stack in STACKS.items():
        assert isinstance(stack, Stack), name
        assert stack.name == name
    with pytest.raises(TypeError, match="is not a Stack: it lacks"):
        run_step(object(), "ppo", [])  # type: ignore[arg-type]


@pytest.mark.parametrize("name", list(STACKS))
def test_every_stack_gives_the_steps_exact_counts_and_its_loss(name):
    calls = _calls(7, [(2, 9), (1, 4), (3, 5)])
    result = run_step(STACKS[name], "ppo", calls, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
    expected = [
        per_token_ppo(lp, i["sampling_logprobs"], i["advantages"], i["mask"], 0.8, 1.2) for lp, i in calls
    ]
    sums = result.sums
    assert sums is not None
    assert sums.loss_tokens == sum(e.loss_tokens for e in expected)
    assert sums[keys.CLIPPED_TOKENS] == sum(e.clipped for e in expected)
    assert sums[keys.CLIPPED_LOW_TOKENS] == sum(e.low for e in expected)
    assert sums[keys.CLIPPED_HIGH_TOKENS] == sum(e.high for e in expected)
    assert sums.loss_tokens > 0 and sums[keys.CLIPPED_TOKENS] > 0  # the example clips
    fraction = result.output.metrics[keys.CLIP_FRACTION]
    assert fraction == sums[keys.CLIPPED_TOKENS] / sums.loss_tokens
    loss = torch.stack(result.losses).sum()
    assert float(loss.detach()) == pytest.approx(sum(e.loss for e in expected), rel=1e-12, abs=1e-12)
    loss.backward()  # the hooks' losses are differentiable
    assert all(lp.grad is not None for lp, _ in calls)
