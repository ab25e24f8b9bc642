"""One rank of verl's real update, twice from the same weights: once with a cliptrack mode (through a
recording loss), once with verl's own mode. Writes ``rank<r>.pt`` under the output folder: the
recorded calls, both runs' reduced metrics (rank 0) and parameters after the step.

Usage: ``python -m tests._verl_update_worker OUT MODEL RANK WORLD PORT MODE [weights]``, with MODE a
key of :data:`MODES`; ``weights`` gives the batch plain token-level rollout weights and declares
them so (``CLIPTRACK_VERL_ENGINE=weights``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from tests import _verl_harness as harness

MODES = {"vanilla": ("cliptrack_vanilla", "vanilla"), "cispo": ("cliptrack_cispo", "cispo")}
"""Test mode -> (cliptrack's mode, verl's own mode)."""

LENGTHS = {1: [8, 7, 2, 3], 2: [8, 7, 2, 3, 1, 8, 5, 5]}
"""Response lengths of the step's batch by world size: micro-batches of two sequences hold 15 and 5
tokens on rank 0, 9 and 10 on rank 1."""
MICRO = 2


def main(out: Path, model: Path, rank: int, world: int, port: int, mode: str, weights: bool) -> None:
    harness.use_cpu_platform()
    harness.init_gloo(rank, world, port)
    if weights:
        os.environ["CLIPTRACK_VERL_ENGINE"] = "weights"
    import cliptrack.adapters.verl  # noqa: F401  (registers the twins)

    ours, theirs = MODES[mode]
    recorder = harness.Recorder(f"recording_{ours}", ours)
    lengths = LENGTHS[world]
    batch = harness.random_batch(lengths, seed=1, weights=weights)
    share = len(lengths) // world
    rows = slice(rank * share, (rank + 1) * share)
    result: dict[str, object] = {"rank": rank}
    for label, loss_mode in (("ours", f"recording_{ours}"), ("theirs", theirs)):
        setup = harness.Setup(
            loss_mode=loss_mode, mini_batch_size=len(lengths), micro_batch_size_per_gpu=MICRO
        )
        worker = harness.make_worker(model, setup)
        result[f"{label}_metrics"] = harness.update(worker, harness.tensordict(batch, setup, rows))
        result[f"{label}_parameters"] = harness.parameters(worker)
        del worker
    result["calls"] = recorder.calls
    torch.save(result, out / f"rank{rank}.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        Path(args[0]),
        Path(args[1]),
        int(args[2]),
        int(args[3]),
        int(args[4]),
        args[5],
        args[6:] == ["weights"],
    )
