"""Subprocess training loops for the tracking tests (signals, crashes, torch.distributed).

usage:
  python -m tests._tracking_worker signal   SPOOL BACKEND {chain|default} COUNT_FILE
  python -m tests._tracking_worker crash    SPOOL
  python -m tests._tracking_worker dist     SPOOL DB_URI RANK WORLD PORT
  python -m tests._tracking_worker resume   SPOOL DB_URI WANDB_DIR RUN_ID FIRST COUNT
  python -m tests._tracking_worker overload SPOOL
  python -m tests._tracking_worker wandb    SPOOL WANDB_DIR
"""

from __future__ import annotations

import os
import signal
import sys
import time

from tracking import keys
from tracking.tracker import Tracker


def _metrics(step: int) -> dict[str, float]:
    return {keys.LOSS_SUM: step * 0.25, keys.REWARD: (step % 11) / 10}


def signal_loop(spool: str, backend: str, mode: str, count_file: str) -> None:
    """Log forever; announce flushes; on SIGTERM the tracker drains, then the previous handler runs."""
    logged = 0
    if mode == "chain":

        def previous(signum: int, frame: object) -> None:  # the application's own handler
            with open(count_file, "w") as fh:
                fh.write(str(logged))
            os._exit(7)

        signal.signal(signal.SIGTERM, previous)
    backends = ("jsonl",) if backend == "jsonl" else (backend, "jsonl")
    tracker = Tracker("sig", backends=backends, spool_dir=spool, flush_interval_s=0.2, backend_label="miles")
    print(f"run {tracker.run_id}", flush=True)
    step = 0
    while True:
        tracker.log(step, _metrics(step))
        logged += 1
        step += 1
        if step % 50 == 0:
            tracker.flush()
            print(f"flushed {logged}", flush=True)
        time.sleep(0.001)


def crash_loop(spool: str) -> None:
    """Log forever; report flushes and, separately, how many points were logged at what time."""
    tracker = Tracker(
        "crash", backends=("jsonl",), spool_dir=spool, flush_interval_s=0.2, handle_signals=False
    )
    print(f"run {tracker.run_id}", flush=True)
    step = 0
    while True:
        tracker.log(step, _metrics(step))
        step += 1
        if step % 100 == 0:
            print(f"logged {step}", flush=True)
        if step % 500 == 0:
            tracker.flush()
            print(f"flushed {step}", flush=True)
        time.sleep(0.0005)


def dist_run(spool: str, db_uri: str, rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    os.environ.pop("RANK", None)  # the rank must come from the initialised process group
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        with Tracker(
            f"dist-{world}",
            backends=(db_uri, "jsonl"),
            spool_dir=spool,
            backend_label="megatron",
            config={"world_size": world},
        ) as tracker:
            for step in range(5):
                tracker.log(step, {keys.LOSS_SUM: float(rank * 100 + step)})
            print(f"rank {rank} active={tracker.active} run_id={tracker.run_id}", flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def resume_run(spool: str, db_uri: str, wandb_dir: str, run_id: str, first: int, count: int) -> None:
    """One process's share of a run: steps FIRST .. FIRST+COUNT-1 under RUN_ID, to MLflow and W&B."""
    with Tracker(
        "resumed",
        backends=(db_uri, "wandb"),
        spool_dir=spool,
        wandb_dir=wandb_dir,
        wandb_mode="offline",
        run_id=run_id,
        flush_interval_s=0.05,
        max_batch_points=100,
    ) as tracker:
        for step in range(first, first + count):
            tracker.log(step, _metrics(step))
    print(tracker.summary(), flush=True)


def overload_loop(spool: str) -> None:
    """Log 10-metric steps in a tight loop (faster than they can be written); report the count."""
    tracker = Tracker(
        "overload", backends=("jsonl",), spool_dir=spool, flush_interval_s=0.2, handle_signals=False
    )
    print(f"run {tracker.run_id}", flush=True)
    step = 0
    while True:
        tracker.log(step, {f"m{i}:mean": step + i / 10 for i in range(10)})
        step += 1
        if step % 2000 == 0:
            print(f"logged {step}", flush=True)


def wandb_loop(spool: str, wandb_dir: str) -> None:
    """Log to W&B offline (and the spool) until killed; report flushes."""
    tracker = Tracker(
        "wb-crash",
        backends=("wandb",),
        spool_dir=spool,
        wandb_dir=wandb_dir,
        wandb_mode="offline",
        flush_interval_s=0.05,
        max_batch_points=50,
        handle_signals=False,
    )
    print(f"run {tracker.run_id}", flush=True)
    step = 0
    while True:
        tracker.log(step, _metrics(step))
        step += 1
        if step % 200 == 0:
            tracker.flush()
            print(f"flushed {step}", flush=True)
        time.sleep(0.0002)


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command == "signal":
        signal_loop(*rest)
    elif command == "crash":
        crash_loop(*rest)
    elif command == "dist":
        dist_run(rest[0], rest[1], int(rest[2]), int(rest[3]), int(rest[4]))
    elif command == "resume":
        resume_run(rest[0], rest[1], rest[2], rest[3], int(rest[4]), int(rest[5]))
    elif command == "overload":
        overload_loop(*rest)
    elif command == "wandb":
        wandb_loop(*rest)
    else:
        raise SystemExit(f"unknown command {command!r}")
