"""The demo's paired probe: one batch, at one checkpoint, through both paths' losses.

A batch is sampled with the weights a run's last step sampled with (its ``sampler`` state, one step
or more behind the checkpoint, so clipping bites on some tokens), and both paths compute their
log-probs at the same checkpoint's weights and run their loss on the same datums (full rows of the
task's ``length`` tokens with their mask), forward only:

* the Megatron path: :func:`cliptrack.adapters.megatron.make_loss_func` per micro-batch (micro-batches
  of unequal sizes, ``probe=True``), reduced by :func:`cliptrack.adapters.megatron.reduce_losses`;
* the Miles path: :func:`cliptrack.adapters.miles.forward_backward_loss` per chunk of datums
  (``probe=True``), each reply over JSON as a REST frontend sends it, the chunks' outputs merged.

``bfloat16`` plants a numeric change in one path (its policy's forward in bfloat16), for the tests
that the probe sees it. :func:`cliptrack.compare.probe.compare_outputs` compares the two outputs;
:func:`write_inputs` writes them as the files ``cliptrack probe`` reads.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from cliptrack.adapters.demo.task import Policy, Rollout, rollout
from cliptrack.adapters.demo.train import PATHS, RunConfig, _loss_inputs, _micro_batch_bounds
from cliptrack.adapters.losses.output import ForwardBackwardOutput, merge_outputs
from cliptrack.adapters.megatron import make_loss_func, reduce_losses
from cliptrack.adapters.miles import forward_backward_loss, output_from_json, output_to_json
from torch import Tensor

PROBE_SEQUENCES = 256
"""Datums in the demo's probe batch (about 1,500 eligible tokens of the default task)."""
PROBE_SEED = 27
"""Seed of the probe batch's sampling."""


@dataclass(frozen=True)
class ProbeOutputs:
    """Both paths' outputs of the same batch at the same weights, with per-datum outputs."""

    megatron: ForwardBackwardOutput
    miles: ForwardBackwardOutput
    batch: Rollout


def _logprobs(policy: Policy, prompts: Tensor, tokens: Tensor, bfloat16: bool) -> Tensor:
    """Per-token log-probs ``[n, length]`` at the policy's weights, float32 (computed in bfloat16
    and widened back when ``bfloat16``)."""
    if not bfloat16:
        return policy(prompts, tokens)
    low = copy.deepcopy(policy).to(torch.bfloat16)
    return low(prompts, tokens).float()


def _megatron(policy: Policy, batch: Rollout, run: RunConfig, bfloat16: bool) -> ForwardBackwardOutput:
    reports = []
    for lo, hi in _micro_batch_bounds(batch.sequences, run.micro_batches):
        loss_func = make_loss_func(run.loss, _loss_inputs(batch, lo, hi), probe=True)
        reports.append(loss_func(_logprobs(policy, batch.prompts[lo:hi], batch.tokens[lo:hi], bfloat16))[2])
    output = reduce_losses(reports, group=None)
    assert output is not None
    return output


def _miles(policy: Policy, batch: Rollout, run: RunConfig, bfloat16: bool) -> ForwardBackwardOutput:
    replies = []
    for lo in range(0, batch.sequences, run.datums_per_chunk):
        hi = min(lo + run.datums_per_chunk, batch.sequences)
        current = _logprobs(policy, batch.prompts[lo:hi], batch.tokens[lo:hi], bfloat16)
        datums = [
            {
                "target_tokens": batch.tokens[i],
                "logprobs": batch.sampling_logprobs[i],
                "advantages": batch.advantages[i],
                "mask": batch.mask[i],
            }
            for i in range(lo, hi)
        ]
        result = forward_backward_loss(datums, list(current), run.loss, probe=True)
        replies.append(output_from_json(output_to_json(result.output)))  # over the wire, as over HTTP
    return merge_outputs(replies)


def probe(
    checkpoint: dict[str, Tensor],
    sampler: dict[str, Tensor],
    run: RunConfig,
    *,
    sequences: int = PROBE_SEQUENCES,
    seed: int = PROBE_SEED,
    bfloat16: str | None = None,
) -> ProbeOutputs:
    """Both paths' outputs of one batch of ``sequences`` datums sampled with ``sampler``'s weights,
    at ``checkpoint``'s weights (state dicts of the task's :class:`Policy`), forward only.

    ``run``: the loss, micro-batches and chunk size (its ``path`` is not used). ``bfloat16``: a
    path (``"megatron"`` or ``"miles"``) whose log-probs are computed in bfloat16 (a planted
    numeric change), or ``None``.
    """
    if bfloat16 is not None and bfloat16 not in PATHS:
        raise ValueError(f"bfloat16 must be one of {PATHS} or None, got {bfloat16!r}")
    if sequences < 1:
        raise ValueError(f"sequences must be >= 1, got {sequences}")
    policy, sampling = Policy(run.task), Policy(run.task)
    policy.load_state_dict(checkpoint)
    sampling.load_state_dict(sampler)
    generator = torch.Generator().manual_seed(seed)
    groups = max(1, sequences // run.group_size)
    batch = rollout(sampling, run.task, groups, run.group_size, generator)
    with torch.no_grad():
        megatron = _megatron(policy, batch, run, bfloat16 == "megatron")
        miles = _miles(policy, batch, run, bfloat16 == "miles")
    return ProbeOutputs(megatron, miles, batch)


def write_inputs(outputs: ProbeOutputs, folder: Path) -> tuple[Path, Path]:
    """Write both paths' outputs of the probe batch as ``folder/megatron.json`` and
    ``folder/miles.json`` (the folder made if needed): each one ``ForwardBackwardOutput`` as JSON
    (:func:`cliptrack.adapters.miles.output_to_json`: per datum its float32 log-probs, one per
    token, its token counts, clip sides and gauge sums), the inputs of ``cliptrack probe A B``.
    Returns the two paths, Megatron's first."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, output in (("megatron", outputs.megatron), ("miles", outputs.miles)):
        path = folder / f"{name}.json"
        partial = folder / f".{name}.json.partial"
        partial.write_text(json.dumps(output_to_json(output)), encoding="utf-8")
        partial.replace(path)
        written.append(path)
    return written[0], written[1]
