"""Our fused PPO with clip counting and the on-policy gauge, against Miles' policy loss with its metrics.

One CPU thread, [64, 2048] tokens, forward + backward over the log-probs, medians of interleaved
repeats in one process, steady state (every compiled function is called before timing starts).

Candidate: ``cliptrack.adapters.losses.builtin.ppo`` on the fused path (``CLIPTRACK_FUSED=1``): the loss, the clip
counts and split, and every gauge measure (``log_ratio``, ``abs_log_ratio``, ``kl_k3``, extremes,
``ratio_outside_tokens``, ``is_weight``, ``is_weight_sq``) in one compiled pass.

Anchor: what Miles' ``policy_loss_function`` computes per token for its loss, its clip fraction
and its two mismatch metrics, with Miles' own functions from the released ``miles-rl`` source
(``miles.utils.ppo_utils.compute_policy_loss`` and ``compute_approx_kl``, loaded as the tests load
it, :mod:`tests._miles_source`; Miles' published formula written out here when that source cannot
be obtained, which the output says):

- ``ppo_kl = old - new`` and the advantages, masked with ``torch.where(mask, nan_to_num(x), 0)``;
- ``compute_policy_loss(ppo_kl, A, eps_clip=0.2, eps_clip_high=0.2) -> (pg_loss, clipfrac)``;
- ``train_rollout_logprob_abs_diff``: ``|old - rollout|``, masked;
- ``train_rollout_kl``: ``compute_approx_kl(rollout, old, "low_var_kl")`` (k3, clamped to
  [-10, 10]), masked;
- each reduced by a masked token sum (per-token mode: ``sum_of_token``).

The anchor is compiled whole (``torch.compile(dynamic=True)``), reductions included, which is
cheaper than Miles itself: Miles reduces each metric with a Python loop over the micro-batch's
samples (``cp_utils.get_sum_of_sample_mean``); a second anchor row runs that reducer as Miles
does (eager, over 64 samples of 2048 tokens) after the compiled per-token part. Miles' inputs are
three log-prob tensors (current, the trainer's old log-probs and the rollout's), ours two (current
and the sampler's): each stack's own inputs for the same quantities.

Run: ``python benchmarks/miles_loss.py``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cliptrack.adapters.losses import builtin as losses
from cliptrack.adapters.losses import fused

from benchmarks._timing import Row, interleaved_medians, markdown

SHAPE = (64, 2048)
EPS_CLIP = 0.2


def _published_policy_loss(ppo_kl: Tensor, advantages: Tensor, eps_clip: float, eps_clip_high: float):
    """Miles' ``compute_policy_loss`` (release 0.0.2), written out: the fallback without its source."""
    ratio = (-ppo_kl).exp()
    pg_losses1 = -ratio * advantages
    pg_losses2 = -ratio.clamp(1 - eps_clip, 1 + eps_clip_high) * advantages
    return torch.maximum(pg_losses1, pg_losses2), torch.gt(pg_losses2, pg_losses1).float()


def _published_approx_kl(log_probs: Tensor, log_probs_base: Tensor, kl_loss_type: str) -> Tensor:
    """Miles' ``compute_approx_kl`` for ``low_var_kl`` (release 0.0.2), written out."""
    log_ratio = -(log_probs.float() - log_probs_base.float())
    return torch.clamp(log_ratio.exp() - 1 - log_ratio, min=-10, max=10)


def miles_functions() -> tuple[Callable[..., Any], Callable[..., Any], str]:
    """``(compute_policy_loss, compute_approx_kl, where they come from)``."""
    try:
        from tests._miles_source import VERSION, import_miles

        import_miles()
        from miles.utils import ppo_utils
    except (ImportError, RuntimeError) as exc:  # RuntimeError: tests._miles_source.MilesUnavailable
        return _published_policy_loss, _published_approx_kl, f"Miles' published formula ({exc})"
    return ppo_utils.compute_policy_loss, ppo_utils.compute_approx_kl, f"miles-rl {VERSION} source"


def _masked(x: Tensor, active: Tensor) -> Tensor:
    return torch.where(active, torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0), x.new_zeros(()))


def miles_per_token(policy_loss: Callable[..., Any], approx_kl: Callable[..., Any]) -> Callable[..., Any]:
    """Miles' per-token tensors of its loss, clip fraction and mismatch metrics (as in
    ``policy_loss_function``)."""

    def per_token(log_probs: Tensor, old: Tensor, rollout: Tensor, advantages: Tensor, mask: Tensor):
        active = mask.bool()
        ppo_kl = _masked(old - log_probs, active)
        advantages = _masked(advantages, active)
        pg_loss, clipfrac = policy_loss(ppo_kl, advantages, EPS_CLIP, EPS_CLIP)
        abs_diff = _masked((old - rollout).abs(), active)
        kl = _masked(approx_kl(rollout, old, kl_loss_type="low_var_kl"), active)
        return pg_loss, clipfrac, abs_diff, kl

    return per_token


def miles_whole(per_token: Callable[..., Any]) -> Callable[..., Any]:
    """The per-token part and its masked token sums in one function (compiled whole)."""

    def whole(log_probs: Tensor, old: Tensor, rollout: Tensor, advantages: Tensor, mask: Tensor):
        pg_loss, clipfrac, abs_diff, kl = per_token(log_probs, old, rollout, advantages, mask)
        return (
            (pg_loss * mask).sum(),
            (clipfrac * mask).sum(),
            (abs_diff * mask).sum(),
            (kl * mask).sum(),
        )

    return whole


def sum_of_token(lengths: list[int], masks: list[Tensor]) -> Callable[[Tensor], Tensor]:
    """Miles' per-token-mode reducer (``cp_utils.get_sum_of_sample_mean`` at CP size 1)."""

    def reduce(x: Tensor) -> Tensor:
        return sum(  # type: ignore[return-value]
            [(x_i * m_i).sum() for x_i, m_i in zip(x.split(lengths, dim=0), masks, strict=True)]
        )

    return reduce


def _inputs(seed: int = 0) -> dict[str, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lp = -torch.rand(SHAPE, generator=gen) * 4
    slp = lp + 0.3 * torch.randn(SHAPE, generator=gen)
    return {
        "lp": lp,
        "slp": slp,
        "rollout": slp + 0.05 * torch.randn(SHAPE, generator=gen),
        "adv": torch.randn(SHAPE, generator=gen),
        "mask": (torch.rand(SHAPE, generator=gen) > 0.1).float(),
    }


def run(repeats: int = 100) -> list[Row]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    saved = os.environ.get(fused.ENV_VAR)
    os.environ[fused.ENV_VAR] = "1"
    try:
        return _run(repeats)
    finally:
        torch.set_num_threads(threads)
        if saved is None:
            os.environ.pop(fused.ENV_VAR, None)
        else:
            os.environ[fused.ENV_VAR] = saved


def _run(repeats: int) -> list[Row]:
    t = _inputs()
    policy_loss, approx_kl, source = miles_functions()
    print(f"Miles' functions: {source}", flush=True)
    per_token = miles_per_token(policy_loss, approx_kl)
    whole = torch.compile(miles_whole(per_token), dynamic=True)
    per_token_compiled = torch.compile(per_token, dynamic=True)
    flat = {k: v.reshape(-1) for k, v in t.items()}
    reducer = sum_of_token([SHAPE[1]] * SHAPE[0], list(t["mask"]))

    def step(fn: Callable[[Tensor], Tensor]) -> Callable[[], None]:
        def call() -> None:
            x = t["lp"].clone().requires_grad_(True)
            fn(x).backward()

        return call

    def ours(x: Tensor) -> Tensor:
        out = losses.ppo(x, t["slp"], t["adv"], t["mask"])
        return out.loss

    def miles_compiled(x: Tensor) -> Tensor:
        loss, _clipped, _abs_diff, _kl = whole(
            x.reshape(-1), flat["slp"], flat["rollout"], flat["adv"], flat["mask"]
        )
        return loss

    def miles_own_reducer(x: Tensor) -> Tensor:
        pg_loss, clipfrac, abs_diff, kl = per_token_compiled(
            x.reshape(-1), flat["slp"], flat["rollout"], flat["adv"], flat["mask"]
        )
        for metric in (clipfrac, abs_diff, kl):
            reducer(metric)
        return reducer(pg_loss)

    fns = {"ours": ours, "miles": miles_compiled, "miles reducer": miles_own_reducer}
    for fn in fns.values():  # compile before timing
        step(fn)()
    served = fused.compiled_calls["ppo"]
    step(ours)()
    if fused.compiled_calls["ppo"] != served + 1:
        raise RuntimeError("the fused path did not serve the PPO call: the candidate would be eager")
    medians = interleaved_medians({name: step(fn) for name, fn in fns.items()}, repeats)
    tag = f"{SHAPE[0]}x{SHAPE[1]} tokens, fwd+bwd, 1 thread"
    return [
        Row(
            f"ppo fused with clip counting + gauge, {tag}",
            medians["ours"],
            "Miles' policy loss + clip fraction + logprob_abs_diff + k3 KL, compiled whole",
            medians["ours"] / medians["miles"],
            "≤ 0.5",
        ),
        Row(
            "ppo fused with clip counting + gauge",
            medians["ours"],
            "the same Miles loss, per-token part compiled, reduced by Miles' per-sample loop",
            medians["ours"] / medians["miles reducer"],
        ),
    ]


if __name__ == "__main__":
    print(markdown(run()))
