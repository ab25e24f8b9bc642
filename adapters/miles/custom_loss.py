"""A ready Miles loss: Miles' own PPO policy loss plus exact clip-count entries in its log dict.

Use it from Miles' command line (the module must be importable on every training worker)::

    --loss-type custom_loss \\
    --custom-loss-function-path cliptrack.adapters.miles.custom_loss.policy_loss_with_clip_counts

:func:`policy_loss_with_clip_counts` has Miles' custom-loss signature ``(args, batch, logits,
sum_of_sample_mean) -> (loss, log_dict)``. It calls Miles' ``policy_loss_function`` with the same
arguments and returns its loss unchanged (same value, same autograd graph, so the same gradients)
and its log dict plus :data:`COUNT_ENTRIES` and :data:`cliptrack.adapters.miles.keys.COUNT_SCALE`.

How the entries survive Miles' aggregation exactly
--------------------------------------------------
Miles' ``loss_function`` turns each micro-batch's log dict into ``values = [count, *entries]``
(``count``: the micro-batch's samples, or with ``--calculate-per-token-loss`` the sum over its
samples of ``max(loss_mask.sum(), 1)``), and ``aggregate_train_losses`` sums ``values`` over the
micro-batches and the DP x CP group, then reports ``entry * cp_size / N`` with ``N`` the summed
``count``. Every reported value is therefore divided by ``N``, which the loss cannot know (it
depends on every rank's masks), so no entry can come out as a token count by itself. What the
loss does know is ``G``, the samples of the optimizer step (``args.global_batch_size``, or the
batch's ``dynamic_global_batch_size``; Miles scales its own loss by it). So, per micro-batch:

- each count entry is ``(tokens on this rank's CP slice) * G``: the slices of the CP ranks add up
  to the sample's tokens, and the sum over the step is ``tokens * G``;
- :data:`~cliptrack.adapters.miles.keys.COUNT_SCALE` is the micro-batch's number of samples on CP rank
  0 and 0 on the other CP ranks: the sum over the step is ``G``.

Both are divided by the same ``N / cp_size``, so ``entry / count_scale`` is the exact token sum in
every form of the log: the summed dict before Miles' division, the dict ``aggregate_train_losses``
returns, and the ``train/*`` values Miles' tracker logs. In per-sample-mean mode (Miles' default)
``N = cp_size * G`` and ``count_scale`` comes out as exactly 1, so the logged entries *are* the
token counts. All values are whole numbers held in float64, exact while ``tokens * G < 2**53``:
Miles builds its values tensor with ``torch.tensor([count, *log.values()])``, which becomes float64
with these entries, so Miles' own entries are then summed in float64 too (they agree with a stock
run's float32 sums to float32 precision). :func:`cliptrack.adapters.miles.read_train_log` reads them.

``loss_tokens`` counts the eligible tokens (``loss_mask != 0``) without Miles' ``max(., 1)``;
``clipped_tokens`` the tokens where clipping bites, taken from Miles' own clip decision
(``compute_policy_loss``'s ``clipfrac``, the same tokens as its ``pg_clipfrac``);
``clipped_low_tokens`` those with a negative advantage (ratio below ``1 - eps_clip``),
``clipped_high_tokens`` those with a positive one (ratio above ``1 + eps_clip_high``).

The on-policy gauge (:data:`GAUGE_ENTRIES`: ``log_ratio``, ``abs_log_ratio``, ``kl_k3``,
``ratio_outside_tokens``, ``is_weight``, ``is_weight_sq``) is scaled the same way, from
``l = -ppo_kl = log_probs - old_log_probs`` per eligible token (Miles' PPO ratio's own log;
``old_log_probs`` is the rollout's with ``--use-rollout-logprobs``, else the trainer's
recomputation), with :func:`cliptrack.adapters.losses.builtin.gauge_of`, the formula of cliptrack's losses, bounds
[1/2, 2] for ``ratio_outside_tokens``. ``entry / count_scale`` is the exact count or the float64
sum (to a few roundings). Its extremes have no entry: Miles adds log values over micro-batches and
ranks, which a max or min does not survive, so a step read back from Miles' log has no
``log_ratio:max`` / ``log_ratio:min``.

Miles' per-token tensors are only visible inside ``policy_loss_function``; this module observes
its call of ``compute_policy_loss`` through the Miles seam (:mod:`cliptrack.adapters._compat.miles`: swapped
for a recording wrapper in the module that defines ``policy_loss_function`` for the duration of
the call, restored after) and recomputes nothing. Counting adds a few integer reductions on device and no
host synchronisation.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable, Mapping
from typing import Any

import torch
from cliptrack.adapters._compat import miles as miles_seam
from cliptrack.adapters.losses import builtin as losses
from cliptrack.adapters.miles.keys import COUNT_ENTRIES, COUNT_SCALE, ENTRIES, GAUGE_ENTRIES, GAUGE_KEYS
from cliptrack.core import keys
from torch import Tensor

__all__ = ["policy_loss_with_clip_counts"]


def policy_loss_with_clip_counts(
    args: Namespace,
    batch: Mapping[str, Any],
    logits: Tensor,
    sum_of_sample_mean: Callable[[Tensor], Tensor],
) -> tuple[Tensor, dict[str, Tensor]]:
    """Miles' ``policy_loss_function`` (unchanged loss and gradients) plus exact count entries.

    Arguments are Miles' custom-loss arguments, passed through as they are. Returns Miles'
    ``(loss, log)`` with :data:`COUNT_ENTRIES`, :data:`GAUGE_ENTRIES` and ``count_scale`` added to ``log`` (0-dim float64
    tensors on the logits' device, see the module docstring for their encoding).
    """
    policy_loss_function, namespace = miles_seam.policy_loss()
    with miles_seam.recording_clip_decisions(namespace) as calls:
        loss, log = policy_loss_function(args, batch, logits, sum_of_sample_mean)
    if not calls:
        raise RuntimeError(
            "Miles' policy_loss_function did not call compute_policy_loss: no clip decision to count"
        )
    ppo_kl, advantages, clipfrac = calls[-1]
    clash = [k for k in (*COUNT_ENTRIES, *GAUGE_ENTRIES, COUNT_SCALE) if k in log]
    if clash:
        raise ValueError(
            f"Miles' log dict already has {clash}; cliptrack's count entries would overwrite them"
        )
    log.update(clip_count_entries(args, batch, advantages, clipfrac, namespace, ppo_kl=ppo_kl))
    return loss, log


def clip_count_entries(
    args: Namespace,
    batch: Mapping[str, Any],
    advantages: Tensor,
    clipfrac: Tensor,
    miles_loss_namespace: Mapping[str, Any],
    *,
    ppo_kl: Tensor | None = None,
) -> dict[str, Tensor]:
    """The count entries of one micro-batch from Miles' per-token clip decision on this rank, and
    with ``ppo_kl`` the gauge's entries.

    ``advantages``, ``clipfrac`` and ``ppo_kl``: the per-token tensors of this rank's CP slice,
    concatenated over the micro-batch's samples, as ``compute_policy_loss`` received and returned
    them. ``miles_loss_namespace``: the globals of Miles' loss module (its ``get_parallel_state``
    and ``get_local_response_loss_masks``).
    """
    state = miles_loss_namespace["get_parallel_state"]()
    local_masks = miles_loss_namespace["get_local_response_loss_masks"](
        batch["total_lengths"],
        batch["response_lengths"],
        batch["loss_masks"],
        args.qkv_format,
        batch.get("max_seq_lens", None),
    )
    device = clipfrac.device
    eligible = torch.cat([m.reshape(-1) for m in local_masks]).to(device) != 0
    if eligible.shape != clipfrac.shape:
        raise ValueError(
            f"Miles' clip decision covers {clipfrac.numel()} tokens but this rank's loss masks {eligible.numel()}"
        )
    with torch.no_grad():
        clipped = (clipfrac != 0) & eligible
        counts = {
            keys.LOSS_TOKENS: torch.count_nonzero(eligible),
            keys.CLIPPED_TOKENS: torch.count_nonzero(clipped),
            # clipping bites below 1 - eps only where A < 0
            keys.CLIPPED_LOW_TOKENS: torch.count_nonzero(clipped & (advantages < 0)),
            keys.CLIPPED_HIGH_TOKENS: torch.count_nonzero(clipped & (advantages > 0)),
        }
    step_samples = int(batch.get("dynamic_global_batch_size", args.global_batch_size))
    samples = len(batch["response_lengths"]) if state.cp.rank == 0 else 0
    entries = {ENTRIES[key]: value.double() * step_samples for key, value in counts.items()}
    if ppo_kl is not None:  # l = log_probs - old_log_probs = -ppo_kl, the gauge's one formula
        log_ratio = -ppo_kl.detach()
        gauge = losses.gauge_of(log_ratio, torch.exp(log_ratio), eligible)
        entries.update({ENTRIES[key]: gauge[key] * step_samples for key in GAUGE_KEYS})
    entries[COUNT_SCALE] = torch.tensor(float(samples), dtype=torch.float64, device=device)
    return entries
