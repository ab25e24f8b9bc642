"""One optimizer step through Miles' real ``loss_function`` and ``aggregate_train_losses``.

Used in process by ``test_miles_custom_loss.py`` and, as ``python _miles_loss_case.py OUT DP CP``
(environment ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), as one gloo rank of a
DP x CP layout; the rank writes ``OUT/rank<RANK>.json``.

The model is a logits table ``W [VOCAB, VOCAB]``: the logits at a position are ``W[token]``.
A step is ``G = DP * sum(MICRO_SIZES)`` samples (prompt + response) in DP-rank order, each DP
rank running micro-batches of ``MICRO_SIZES`` samples; every CP rank gets its zigzag slice,
cut by Miles' own ``slice_with_cp`` / ``slice_log_prob_with_cp``. Old log-probs are the model's
minus a per-token log-ratio far from the clip band, so float rounding never moves a token across
it. Some samples have an all-zero loss mask (Miles counts each as one token).
"""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from argparse import Namespace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VOCAB = 11
MICRO_SIZES = (1, 3, 2)
"""Samples per micro-batch on each DP rank (unequal on purpose)."""
EPS_CLIP, EPS_CLIP_HIGH = 0.2, 0.28
DELTAS = (-0.9, -0.6, -0.4, -0.1, 0.0, 0.1, 0.4, 0.6, 0.9)
"""Per-token log-ratios log(new / old): ratios 0.41 .. 2.46 around the band [0.8, 1.28] and, for
the gauge's ``ratio_outside_tokens``, beyond [1/2, 2] (far from every edge)."""
ALL_MASKED = (1, 7)
"""Samples (global index) whose loss mask is all zero."""
CUSTOM_LOSS = "cliptrack.adapters.miles.custom_loss.policy_loss_with_clip_counts"


def _fields(sums: Any) -> dict[str, Any]:
    """A read-back's counts by wire field (``loss_tokens``, ``clipped_tokens``, ...) and its gauge
    by metric key under ``"gauge"`` (JSON-ready, for a rank's report)."""
    from cliptrack.core import measures

    out: dict[str, Any] = {
        measures.by_key(key).field: value for key, value in sums.values.items() if measures.by_key(key).exact
    }
    out["gauge"] = sums.group_values(measures.GAUGE)
    return out


def weights() -> torch.Tensor:
    return torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(5))


def samples(dp: int) -> list[dict[str, torch.Tensor]]:
    """The step's samples, full length: tokens, response mask, advantages, log-ratio deltas."""
    gen = torch.Generator().manual_seed(17)
    out = []
    for i in range(dp * sum(MICRO_SIZES)):
        prompt = int(torch.randint(2, 5, (), generator=gen))
        response = int(torch.randint(3, 10, (), generator=gen))
        tokens = torch.randint(0, VOCAB, (prompt + response,), generator=gen)
        mask = (torch.rand(response, generator=gen) < 0.75).int()
        if i in ALL_MASKED:
            mask.zero_()
        advantages = torch.tensor([-1.0, -0.5, 0.5, 1.0])[torch.randint(0, 4, (response,), generator=gen)]
        deltas = torch.tensor(DELTAS)[torch.randint(0, len(DELTAS), (response,), generator=gen)]
        out.append(
            {"tokens": tokens, "mask": mask, "advantages": advantages, "deltas": deltas, "response": response}
        )
    return out


def model_logprobs(w: torch.Tensor, tokens: torch.Tensor, response: int) -> torch.Tensor:
    """Plain-torch log-probs of the response tokens under ``W``."""
    logits = w[tokens[:-1]]  # position p predicts token p + 1
    lp = torch.log_softmax(logits.double(), dim=-1).gather(-1, tokens[1:, None]).squeeze(-1)
    return lp[-response:].float()


def reference_counts(dp: int) -> dict[str, int]:
    """The SPEC's counts over the whole step, from the log-ratios (no Miles code)."""
    low_edge, high_edge = math.log(1 - EPS_CLIP), math.log(1 + EPS_CLIP_HIGH)
    totals = {
        "loss_tokens": 0,
        "clipped_tokens": 0,
        "clipped_low_tokens": 0,
        "clipped_high_tokens": 0,
        "miles_count": 0,
    }
    for s in samples(dp):
        eligible = s["mask"] != 0
        low = eligible & (s["advantages"] < 0) & (s["deltas"] < low_edge)
        high = eligible & (s["advantages"] > 0) & (s["deltas"] > high_edge)
        totals["loss_tokens"] += int(eligible.sum())
        totals["clipped_low_tokens"] += int(low.sum())
        totals["clipped_high_tokens"] += int(high.sum())
        totals["clipped_tokens"] += int((low | high).sum())
        totals["miles_count"] += max(int(eligible.sum()), 1)
    return totals


def reference_gauge(dp: int) -> dict[str, float]:
    """The gauge's sums over the whole step from the log-ratios, in float64 (no Miles code)."""
    ls = [float(d) for s in samples(dp) for d, m in zip(s["deltas"], s["mask"], strict=True) if m != 0]
    return {
        "log_ratio:sum": math.fsum(ls),
        "abs_log_ratio:sum": math.fsum(abs(x) for x in ls),
        "kl_k3:sum": math.fsum(math.expm1(x) - x for x in ls),
        "ratio_outside_tokens:sum": sum(1 for x in ls if not 0.5 <= math.exp(x) <= 2.0),
        "is_weight:sum": math.fsum(math.exp(x) for x in ls),
        "is_weight_sq:sum": math.fsum(math.exp(2 * x) for x in ls),
    }


def miles_args(*, custom: bool, per_token: bool, dp: int) -> Namespace:
    """The Miles arguments the policy loss path reads (release 0.0.2 names)."""
    return Namespace(
        loss_type="custom_loss" if custom else "policy_loss",
        custom_loss_function_path=CUSTOM_LOSS if custom else None,
        calculate_per_token_loss=per_token,
        global_batch_size=dp * sum(MICRO_SIZES),
        use_dynamic_global_batch_size=False,
        qkv_format="thd",
        rollout_temperature=1.0,
        true_on_policy_mode=False,
        allgather_cp=False,
        log_probs_chunk_size=-1,
        use_rollout_logprobs=False,
        entropy_coef=0.0,
        use_opsm=False,
        advantage_estimator="grpo",
        eps_clip=EPS_CLIP,
        eps_clip_high=EPS_CLIP_HIGH,
        get_mismatch_metrics=False,
        use_tis=False,
        use_kl_loss=False,
        recompute_loss_function=False,
    )


def set_parallel_state(miles: Any, dp: int, cp: int) -> None:
    """Miles' ParallelState over the current gloo world (rank = dp_rank * cp + cp_rank)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == dp * cp
    singles = [dist.new_group([r]) for r in range(world)]  # every rank creates every group, in order
    cp_groups = [dist.new_group([d * cp + c for c in range(cp)]) for d in range(dp)]
    dp_groups = [dist.new_group([d * cp + c for d in range(dp)]) for c in range(cp)]
    world_group = dist.new_group(list(range(world)))
    dp_rank, cp_rank = divmod(rank, cp)
    info = miles.parallel.GroupInfo
    one = info(0, 1, singles[rank])
    miles.parallel.set_parallel_state(
        miles.parallel.ParallelState(
            intra_dp=info(dp_rank, dp, dp_groups[cp_rank]),
            intra_dp_cp=info(rank, world, world_group),
            cp=info(cp_rank, cp, cp_groups[dp_rank]),
            tp=one,
            pp=one,
            ep=one,
            etp=one,
        )
    )


def micro_batches(
    miles: Any, w: torch.Tensor, dp: int, dp_rank: int
) -> list[tuple[dict[str, Any], torch.Tensor]]:
    """This rank's micro-batches as Miles' loss_function receives them: ``(batch, logits)``."""
    cp = miles.cp_utils
    step = samples(dp)
    start = dp_rank * sum(MICRO_SIZES)
    out = []
    for size in MICRO_SIZES:
        chosen = step[start : start + size]
        start += size
        total_lengths = [len(s["tokens"]) for s in chosen]
        response_lengths = [s["response"] for s in chosen]
        old = [model_logprobs(w.detach(), s["tokens"], s["response"]) - s["deltas"] for s in chosen]
        batch = {
            "unconcat_tokens": [s["tokens"] for s in chosen],
            "total_lengths": total_lengths,
            "response_lengths": response_lengths,
            "loss_masks": [s["mask"] for s in chosen],
            "advantages": [
                cp.slice_log_prob_with_cp(s["advantages"], t, r)
                for s, t, r in zip(chosen, total_lengths, response_lengths, strict=True)
            ],
            "log_probs": [
                cp.slice_log_prob_with_cp(o, t, r)
                for o, t, r in zip(old, total_lengths, response_lengths, strict=True)
            ],
        }
        logits = torch.cat([cp.slice_with_cp(w[s["tokens"]], 0.0) for s in chosen]).unsqueeze(0)
        out.append((batch, logits))
    return out


def run_step(miles: Any, *, custom: bool, per_token: bool, dp: int, dp_rank: int) -> dict[str, Any]:
    """One step on this rank: per micro-batch loss and log dict, the aggregate, W's gradient."""
    w = weights().requires_grad_(True)
    args = miles_args(custom=custom, per_token=per_token, dp=dp)
    losses, logs = [], []
    for batch, logits in micro_batches(miles, w, dp, dp_rank):
        loss, _, log = miles.loss.loss_function(
            args, batch, len(MICRO_SIZES), logits, apply_megatron_loss_scaling=True
        )
        loss.backward()
        losses.append(loss.detach())
        logs.append(log)
    aggregated = miles.log_utils.aggregate_train_losses(logs)
    logged = miles.log_utils.log_train_step(
        args, aggregated, grad_norm=0.0, rollout_id=0, step_id=0, num_steps_per_rollout=1, should_log=False
    )
    assert w.grad is not None
    return {"losses": losses, "logs": logs, "aggregated": aggregated, "logged": logged, "grad": w.grad}


def main() -> int:
    out, dp, cp = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    import torch.distributed as dist
    from cliptrack.adapters.miles import read_train_log

    from tests._miles_source import import_miles

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    miles = import_miles()
    set_parallel_state(miles, dp, cp)
    result: dict[str, Any] = {"rank": rank}
    for per_token in (False, True):
        mode = "per_token" if per_token else "per_sample"
        ours = run_step(miles, custom=True, per_token=per_token, dp=dp, dp_rank=rank // cp)
        stock = run_step(miles, custom=False, per_token=per_token, dp=dp, dp_rank=rank // cp)
        result[mode] = {
            "aggregated": ours["aggregated"],
            "counts": _fields(read_train_log(ours["aggregated"])),
            "counts_logged": _fields(read_train_log(ours["logged"])),
            "same_losses": all(
                torch.equal(a, b) for a, b in zip(ours["losses"], stock["losses"], strict=True)
            ),
            "same_grad": bool(torch.equal(ours["grad"], stock["grad"])),
            "stock_aggregated": stock["aggregated"],
        }
    dist.barrier()
    dist.destroy_process_group()
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
