"""Counting adds no host synchronisation, on the eager and the fused path: every tensor-to-host\nconversion raises while the losses run."""

from __future__ import annotations

import pytest
import torch
from cliptrack.adapters.losses import builtin as losses
from cliptrack.adapters.losses import fused

from tests._harness import host_sync_forbidden


def test_the_guard_catches_a_sync():
    with host_sync_forbidden(), pytest.raises(AssertionError, match="host synchronisation"):
        torch.ones(2).sum().item()


NAMES = ["ppo", "cispo", "importance_sampling", "dro", "cross_entropy"]
CASES = [(name, False) for name in NAMES] + [(name, True) for name in NAMES if name in losses.CLIPPING_LOSSES]
"""(loss, thresholds as tensors): only a clipping loss takes thresholds, so only it has the second case."""


@pytest.mark.parametrize("path", ["eager", "fused"])
@pytest.mark.parametrize(("name", "tensor_thresholds"), CASES)
def test_loss_forward_backward_and_accumulation_never_sync(name, tensor_thresholds, path, monkeypatch):
    """Both paths: eager (``CLIPTRACK_FUSED=0``) and fused (``=1``, compiled once outside the guard;
    every other shape reuses the graph, so each guarded call runs the compiled computation)."""
    monkeypatch.setenv(fused.ENV_VAR, "1" if path == "fused" else "0")
    torch.manual_seed(1)
    policy = torch.nn.Linear(8, 1)
    micro_batches = []
    for rows, cols in [(2, 5), (1, 17), (3, 4)]:
        features = torch.randn(rows, cols, 8)
        sampling = torch.randn(rows, cols) * 0.1 - 1.0
        micro_batches.append(
            (features, sampling, torch.randn(rows, cols), (torch.rand(rows, cols) > 0.2).float())
        )
    kwargs = {"beta": 0.1} if name == "dro" else {}
    if tensor_thresholds:
        kwargs = {"clip_low_threshold": torch.tensor(0.8), "clip_high_threshold": torch.tensor(1.2)}

    def step(features, sampling, adv, mask):
        logprobs = -torch.nn.functional.softplus(policy(features).squeeze(-1))
        if name == "cross_entropy":
            return losses.cross_entropy(logprobs, mask)
        return losses.LOSSES[name](logprobs, sampling, adv, mask, **kwargs)

    if path == "fused":
        step(*micro_batches[0]).loss.backward()  # compiles (host work) before the guard
    before = fused.compiled_calls[name]
    total = None
    with host_sync_forbidden():
        for batch in micro_batches:
            out = step(*batch)
            out.loss.backward()
            total = out if total is None else total + out
    assert fused.compiled_calls[name] - before == (len(micro_batches) if path == "fused" else 0)
    assert fused.failure() is None, fused.failure()
    assert total is not None
    assert int(total.loss_tokens) == sum(int((m != 0).sum()) for *_, m in micro_batches)
    assert policy.weight.grad is not None
