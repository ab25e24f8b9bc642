"""Merging a step's clip sums and on-policy gauge across 4 gloo ranks: one collective vs one per key.

Four processes on 127.0.0.1 (gloo), each holding the reports of 4 micro-batches from
``cliptrack.adapters.megatron.make_loss_func``. Per step, interleaved round-robin in one run, median seconds
of the slowest rank (blocks of steps start from a barrier):

- anchor: sum each of the 5 keys (``loss:sum``, ``loss_tokens:sum``, ``clipped_tokens:sum``, low,
  high) over micro-batches and ``all_reduce`` each one (5 collectives);
- ``cliptrack.adapters.megatron.merged_sums``: all keys, the gauge's sums and extremes included, packed in one
  float64 vector, one collective (on gloo an ``all_to_all_single``, see
  ``cliptrack.adapters.megatron.merge_packed``; target with the gauge: ratio <= 0.5), and the same for
  reports without the gauge (the clip counts alone, as before the gauge);
- the gauge merged per key: 11 sums in one ``all_reduce`` each, max and min in one ``MAX`` each;
- the vector in one gloo ``all_reduce`` (sums only: what gloo would do without the all-to-all) and
  in one ``all_gather_into_tensor`` (the path of non-gloo backends), for the record;
- ``cliptrack.adapters.megatron.reduce_losses``: the same plus the host read-back and the output built.

Run: ``python benchmarks/merge.py``. ``run()`` returns the rows as dicts for ``run_all``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._timing import Row, markdown

WORLD = 4
MICRO_BATCHES = 4
TOKENS = 2048
"""Tokens per micro-batch (shape of the loss inputs)."""
BLOCK = 10
"""Steps per timed block: a block starts from a barrier and its time is divided by BLOCK, so the
skew of ranks leaving the barrier is not billed to one merge."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _reports(rank: int) -> list[dict]:
    import torch
    from cliptrack.adapters.megatron import make_loss_func

    gen = torch.Generator().manual_seed(rank)
    reports = []
    for _ in range(MICRO_BATCHES):
        logprobs = -torch.rand(TOKENS, generator=gen) * 3
        inputs = {
            "sampling_logprobs": logprobs + 0.3 * torch.randn(TOKENS, generator=gen),
            "advantages": torch.randn(TOKENS, generator=gen),
            "mask": (torch.rand(TOKENS, generator=gen) > 0.2).float(),
        }
        reports.append(make_loss_func("ppo", inputs)(logprobs)[2])
    return reports


def _worker(rank: int, port: int, repeats: int, block: int) -> None:
    """One rank: time the variants; rank 0 prints the medians as JSON."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    fns = _variants(_reports(rank), dist.group.WORLD)
    samples = _block_seconds(fns, repeats, block, dist.group.WORLD)
    medians = {name: float(samples[i].median()) for i, name in enumerate(fns)}
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(medians))


def _gauge_per_key(reports: list[dict], group: Any) -> Callable[[], None]:
    """The gauge merged key by key: each float sum in its own all_reduce, max and min in a MAX each."""
    import torch
    import torch.distributed as dist
    from cliptrack.core import keys, measures

    counts = [keys.LOSS_SUM, keys.LOSS_TOKENS, *keys.CLIP_COUNT_KEYS]
    gauge_sums = [m for m in measures.GAUGE_MEASURES if m.reduction == measures.SUM]
    gauge_extremes = [m for m in measures.GAUGE_MEASURES if m.reduction != measures.SUM]

    def merge() -> None:
        for key in counts:
            total = torch.stack([report[key].double() for report in reports]).sum()
            dist.all_reduce(total, group=group)
        for m in gauge_sums:
            total = torch.stack([report[m.key] for report in reports]).sum()
            dist.all_reduce(total, group=group)
        for m in gauge_extremes:  # a min as -max(-l)
            sign = -1.0 if m.reduction == measures.MIN else 1.0
            extreme = torch.stack([sign * report[m.key] for report in reports]).amax()
            dist.all_reduce(extreme, op=dist.ReduceOp.MAX, group=group)

    return merge


def _variants(reports: list[dict], group: Any) -> dict[str, Callable[[], None]]:
    """The timed ways to merge this rank's reports across ``group``, by name."""
    import torch
    import torch.distributed as dist
    from cliptrack.adapters.megatron import merged_sums, reduce_losses, sum_reports
    from cliptrack.core import keys

    clip_only = [{k: v for k, v in report.items() if k not in keys.GAUGE_MEASURED_KEYS} for report in reports]

    per_key = (
        keys.LOSS_SUM,
        keys.LOSS_TOKENS,
        keys.CLIPPED_TOKENS,
        keys.CLIPPED_LOW_TOKENS,
        keys.CLIPPED_HIGH_TOKENS,
    )

    def one_per_key() -> None:
        for key in per_key:
            total = torch.stack([report[key] for report in reports]).sum()
            dist.all_reduce(total, group=group)

    def one_collective() -> None:
        merged_sums(reports, group=group)

    def one_collective_clip_only() -> None:
        merged_sums(clip_only, group=group)

    def one_all_reduce() -> None:
        packed = sum_reports(reports)
        dist.all_reduce(packed, group=group)

    def one_all_gather() -> None:
        packed = sum_reports(reports)
        gathered = torch.empty(4 * packed.numel(), dtype=packed.dtype)
        dist.all_gather_into_tensor(gathered, packed, group=group)

    def whole_reduction() -> None:
        reduce_losses(reports, group=group)

    return {
        "per_key": one_per_key,
        "packed": one_collective,
        "packed_clip_only": one_collective_clip_only,
        "gauge_per_key": _gauge_per_key(reports, group),
        "all_reduce": one_all_reduce,
        "all_gather": one_all_gather,
        "reduce": whole_reduction,
    }


def _block_seconds(fns: dict[str, Callable[[], None]], repeats: int, block: int, group: Any) -> Any:
    """Seconds per call, a ``[len(fns), repeats]`` float64 tensor: after a warm-up, interleaved blocks
    of ``block`` calls, each starting from a barrier; the maximum over ranks (a step lasts until its
    slowest rank)."""
    import torch
    import torch.distributed as dist

    samples = torch.zeros(len(fns), repeats, dtype=torch.float64)
    for _ in range(10):  # warm-up
        for fn in fns.values():
            fn()
    for rep in range(repeats):  # interleaved blocks, each starting from a barrier
        for i, fn in enumerate(fns.values()):
            dist.barrier(group=group)
            start = time.perf_counter()
            for _ in range(block):
                fn()
            samples[i, rep] = (time.perf_counter() - start) / block
    dist.all_reduce(samples, op=dist.ReduceOp.MAX, group=group)  # a step lasts until its slowest rank
    return samples


def run(repeats: int = 60, block: int = BLOCK) -> list[dict]:
    """Rows (``name``, ``median_s``, ``anchor``, ``ratio`` = median / anchor's median, ``target``)."""
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker"]
    procs = [
        subprocess.Popen(
            [*cmd, str(rank), str(port), str(repeats), str(block)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(WORLD)
    ]
    outputs = [proc.communicate(timeout=600) for proc in procs]
    failed = [
        f"rank {r} exited {p.returncode}: {err[-1500:]}"
        for r, (p, (_, err)) in enumerate(zip(procs, outputs, strict=True))
        if p.returncode != 0
    ]
    if failed:
        raise RuntimeError("merge benchmark: " + "\n".join(failed))
    medians = json.loads(outputs[0][0].strip().splitlines()[-1])
    anchor = f"one all_reduce per key (5 keys), {WORLD} gloo ranks"
    rows = [
        Row(anchor, medians["per_key"], anchor, 1.0),
        Row(
            f"merged_sums with the gauge: every key in one collective (all_to_all on gloo), {WORLD} gloo ranks",
            medians["packed"],
            anchor,
            medians["packed"] / medians["per_key"],
            "≤ 0.5",
        ),
        Row(
            "merged_sums, clip counts only (reports without the gauge)",
            medians["packed_clip_only"],
            anchor,
            medians["packed_clip_only"] / medians["per_key"],
        ),
        Row(
            "every key with the gauge merged per key (11 sum all_reduces + 2 MAX all_reduces)",
            medians["gauge_per_key"],
            anchor,
            medians["gauge_per_key"] / medians["per_key"],
        ),
        Row(
            "the same packed vector in one all_reduce (gloo ring, sums only; not used on gloo)",
            medians["all_reduce"],
            anchor,
            medians["all_reduce"] / medians["per_key"],
        ),
        Row(
            "the same packed vector in one all_gather_into_tensor (the non-gloo path)",
            medians["all_gather"],
            anchor,
            medians["all_gather"] / medians["per_key"],
        ),
        Row(
            "reduce_losses with the gauge: one collective + host read-back + output",
            medians["reduce"],
            anchor,
            medians["reduce"] / medians["per_key"],
        ),
    ]
    return [row.as_dict() for row in rows]


def table(rows: list[dict]) -> str:
    """The rows as a markdown table."""
    return markdown([Row(**row) for row in rows])


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(*(int(arg) for arg in sys.argv[2:6]))
        sys.exit(0)
    print(f"{MICRO_BATCHES} micro-batches of {TOKENS} tokens per rank; medians of interleaved steps\n")
    print(table(run()))
