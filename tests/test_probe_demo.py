"""The paired probe on real runs of the demo trainer: the two paths' numerics agree (equivalent),
a planted numeric change (one path's log-probs in bfloat16) is found (different), and the Megatron
path's per-datum outputs are the Miles runtime's, field for field."""

from __future__ import annotations

import pytest
import torch
from cliptrack.adapters.demo.probe import probe
from cliptrack.adapters.demo.train import RunConfig, train
from cliptrack.adapters.megatron import make_loss_func, reduce_losses
from cliptrack.adapters.miles import forward_backward_loss, output_to_json
from cliptrack.compare.probe import compare_outputs
from cliptrack.compare.stats.estimate import DIFFERENT, EQUIVALENT


@pytest.fixture(scope="module")
def checkpoint() -> tuple[dict, dict, RunConfig]:
    config = RunConfig(path="megatron", steps=6, prompts_per_step=8)
    last = list(train(config, use_schedule=False))[-1]
    assert last.checkpoint is not None and last.sampler is not None
    return last.checkpoint, last.sampler, config


def test_demo_paths_agree_on_the_same_batch(checkpoint: tuple[dict, dict, RunConfig]) -> None:
    weights, sampler, config = checkpoint
    outputs = probe(weights, sampler, config, sequences=96)
    result = compare_outputs(outputs.megatron, outputs.miles, labels=("megatron", "miles"))
    assert result.verdict == EQUIVALENT, result.summary()
    assert result.quantities["clip_fraction"].value_a > 0  # clipping bites on the probe batch
    assert result.quantities["clip_fraction"].clip_test is not None


@pytest.mark.parametrize("path", ["megatron", "miles"])
def test_planted_bfloat16_is_different(checkpoint: tuple[dict, dict, RunConfig], path: str) -> None:
    weights, sampler, config = checkpoint
    outputs = probe(weights, sampler, config, sequences=96, bfloat16=path)
    result = compare_outputs(outputs.megatron, outputs.miles)
    assert result.verdict == DIFFERENT, result.summary()
    assert result.quantities["logprob_gap"].verdict == DIFFERENT


@pytest.mark.parametrize("loss", ["ppo", "cispo", "importance_sampling"])
def test_megatron_datum_outputs_are_the_miles_form(loss: str) -> None:
    g = torch.Generator().manual_seed(5)
    rows, length = 7, 9
    slp = -torch.rand(rows, length, generator=g)
    adv = torch.randn(rows, 1, generator=g).expand(rows, length).contiguous()
    mask = (torch.rand(rows, length, generator=g) > 0.25).float()
    lp = slp + 0.4 * torch.randn(rows, length, generator=g)
    reports = []
    for lo, hi in ((0, 2), (2, 7)):
        inputs = {"sampling_logprobs": slp[lo:hi], "advantages": adv[lo:hi], "mask": mask[lo:hi]}
        reports.append(make_loss_func(loss, inputs, probe=True)(lp[lo:hi].clone().requires_grad_())[2])
    megatron = output_to_json(reduce_losses(reports, group=None))
    datums = [{"logprobs": slp[i], "advantages": adv[i], "mask": mask[i]} for i in range(rows)]
    miles = output_to_json(forward_backward_loss(datums, list(lp), loss, probe=True).output)
    assert megatron["loss_fn_outputs"] == miles["loss_fn_outputs"]
    plain = reduce_losses(
        [make_loss_func(loss, {"sampling_logprobs": slp, "advantages": adv, "mask": mask})(lp)[2]], group=None
    )
    assert plain is not None and plain.loss_fn_outputs == []  # off by default


def test_datum_outputs_need_rows() -> None:
    loss_func = make_loss_func(
        "ppo", {"sampling_logprobs": torch.zeros(5), "advantages": torch.ones(5)}, datum_outputs=True
    )
    with pytest.raises(ValueError, match=r"\[sequences, tokens\]"):
        loss_func(torch.zeros(5))
