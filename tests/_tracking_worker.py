"""Subprocess training loops for the tracking tests (signals, crashes, torch.distributed).

usage:
  python -m tests._tracking_worker signal   SPOOL BACKEND {chain|default|ignore|tight} COUNT_FILE
  python -m tests._tracking_worker fork     SPOOL BACKEND {child_exit|pool_terminate|pool_with|workers}
  python -m tests._tracking_worker rank     SPOOL DB_URI [RUN_ID]
  python -m tests._tracking_worker newstore SPOOL DB_URI COUNT
  python -m tests._tracking_worker crash    SPOOL
  python -m tests._tracking_worker dist     SPOOL DB_URI RANK WORLD PORT
  python -m tests._tracking_worker resume   SPOOL DB_URI WANDB_DIR RUN_ID FIRST COUNT
  python -m tests._tracking_worker overload SPOOL
  python -m tests._tracking_worker slowdisk SPOOL CGROUP TIMES_FILE
  python -m tests._tracking_worker wandb    SPOOL WANDB_DIR
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from cliptrack import Limits
from cliptrack.core import keys
from cliptrack.log.tracker import Tracker


def _metrics(step: int) -> dict[str, float]:
    return {keys.LOSS_SUM: step * 0.25, keys.REWARD: (step % 11) / 10}


def signal_loop(spool: str, backend: str, mode: str, count_file: str) -> None:
    """Log until a signal; announce flushes (``flushed N``) or, in the tight mode, counts.

    - default: the application installs nothing (SIGTERM ends the process, Ctrl-C raises).
    - chain: the application's "finish the step, checkpoint, exit": its SIGTERM handler (installed
      before the tracker) and a caught ``KeyboardInterrupt`` set a flag; the loop then logs one
      more point (the checkpoint), writes how many points it logged to COUNT_FILE, exits 7.
    - ignore: SIGTERM and SIGINT are ignored (``SIG_IGN``); the loop ends cleanly once
      COUNT_FILE.stop exists, writing the count.
    - tight: Ctrl-C in a tight logging loop (no sleep, no flush), announcing ``logged N``.
    """
    stop = {"flag": False}
    if mode == "chain":
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.update(flag=True))
    elif mode == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    backends = ("jsonl",) if backend == "jsonl" else (backend, "jsonl")
    with Tracker(
        "sig", sinks=backends, spool_dir=spool, limits=Limits(flush_interval_s=0.2), backend_label="miles"
    ) as t:
        print(f"run {t.run_id}", flush=True)
        if mode == "tight":
            _tight(t)
        logged = _until_stopped(t, mode, stop, count_file)
        with open(count_file, "w") as fh:
            fh.write(str(logged))
        if mode == "chain":
            sys.exit(7)


def _tight(tracker: Tracker) -> None:
    step = 0
    while True:
        tracker.log(step, _metrics(step))
        step += 1
        if step % 1000 == 0:
            print(f"logged {step}", flush=True)


def _until_stopped(tracker: Tracker, mode: str, stop: dict[str, bool], count_file: str) -> int:
    """The loop of the signal worker; the number of points logged when it stopped."""
    step = 0
    while not stop["flag"]:
        try:
            tracker.log(step, _metrics(step))
            step += 1
            if step % 50 == 0:
                tracker.flush()
                print(f"flushed {step}", flush=True)
                if mode == "ignore" and os.path.exists(count_file + ".stop"):
                    break
            time.sleep(0.001)
        except KeyboardInterrupt:  # the application's own Ctrl-C handling: finish, then checkpoint
            if mode != "chain":
                raise
            stop["flag"] = True
    if mode == "chain":  # the checkpoint step: logging after a caught signal still works
        tracker.log(step, {keys.LOSS_SUM: -1.0})
        step += 1
        tracker.flush()
    return step


def _hang(_: int) -> None:  # a reward-model call that never returns
    time.sleep(3600)


def _produce(queue: Any, worker: int) -> None:  # a DataLoader-like fork worker
    for item in range(10**9):
        queue.put((worker, item))


def fork_run(spool: str, backend: str, scenario: str) -> None:
    """A parent logging while fork children come and go; see tests/test_tracker_fork.py."""
    import multiprocessing

    fork = multiprocessing.get_context("fork")
    backends = ("jsonl",) if backend == "jsonl" else (backend, "jsonl")
    with Tracker("fork", sinks=backends, spool_dir=spool, limits=Limits(flush_interval_s=0.1)) as tracker:
        print(f"run {tracker.run_id}", flush=True)
        _log_range(tracker, 0, 200)
        if scenario == "child_exit":
            _child_exits(tracker)
        elif scenario in ("pool_terminate", "pool_with"):
            _pool_ends(tracker, fork, scenario)
        elif scenario == "workers":
            _workers_until_interrupted(tracker, fork)
        _log_range(tracker, 400, 600)
    print(f"closed {tracker.status}", flush=True)


def _log_range(tracker: Tracker, first: int, end: int) -> None:
    for step in range(first, end):
        tracker.log(step, _metrics(step))
    tracker.flush()
    print(f"flushed {end}", flush=True)


def _child_exits(tracker: Tracker) -> None:
    """A forked helper that logs twice (warned once, not logged) and ends with sys.exit(0), running
    atexit and the interpreter's finalisation, while the parent logs 200 more points; then the
    parent waits for the test's go-ahead."""
    go, ready = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.read(go, 1)  # the parent has logged past the fork-time end of the journal
        tracker.log(10**6, _metrics(1))
        tracker.log(10**6 + 1, _metrics(2))
        sys.exit(0)
    _log_range(tracker, 200, 400)
    os.write(ready, b"x")
    _, status = os.waitpid(pid, 0)
    print(f"child {os.waitstatus_to_exitcode(status)}", flush=True)
    sys.stdin.readline()  # the test checks the run while the parent is alive


def _pool_ends(tracker: Tracker, fork: Any, scenario: str) -> None:
    """Hung fork workers, ended by Pool.terminate() (their SIGTERM) or by leaving a with block."""
    if scenario == "pool_terminate":
        pool = fork.Pool(2)
        results = [pool.apply_async(_hang, (i,)) for i in range(2)]
        _log_range(tracker, 200, 400)  # past the journal's end when the workers were forked
        pool.terminate()
        pool.join()
    else:
        with fork.Pool(2) as pool:
            results = [pool.apply_async(_hang, (i,)) for i in range(2)]
            _log_range(tracker, 200, 400)
    print(f"pool {sum(r.ready() for r in results)}", flush=True)


def _workers_until_interrupted(tracker: Tracker, fork: Any) -> None:
    """Two fork workers feed the loop until Ctrl-C (SIGINT to the whole process group)."""
    queue = fork.Queue(maxsize=64)
    workers = [fork.Process(target=_produce, args=(queue, i), daemon=True) for i in range(2)]
    for worker in workers:
        worker.start()
    step = 200
    while True:  # never reaches 400 points before the test's Ctrl-C
        queue.get()
        tracker.log(step, _metrics(step))
        step += 1
        if step % 100 == 0:
            tracker.flush()
            print(f"flushed {step}", flush=True)
        time.sleep(0.001)


def rank_run(spool: str, db_uri: str, run_id: str | None = None) -> None:
    """One launcher-started process: log 5 steps under a fixed or fresh run id; report the rank."""
    with Tracker("ranks", sinks=(db_uri, "jsonl"), spool_dir=spool, run_id=run_id) as tracker:
        for step in range(5):
            tracker.log(step, {keys.LOSS_SUM: float(step)})
        print(f"rank {tracker.rank} active={tracker.active} run_id={tracker.run_id}", flush=True)


def new_store_run(spool: str, db_uri: str, count: int) -> None:
    """One of several processes starting together on a store that does not exist yet: COUNT steps of
    two keys; close waits for the store (created by one of them, however loaded the machine)."""
    with Tracker("new-store", sinks=(db_uri, "jsonl"), spool_dir=spool, close_timeout_s=600) as tracker:
        print(f"run {tracker.run_id}", flush=True)
        for step in range(count):
            tracker.log(step, _metrics(step))
    print(tracker.summary(), flush=True)


def crash_loop(spool: str) -> None:
    """Log forever; report flushes and, separately, how many points were logged at what time."""
    tracker = Tracker(
        "crash", sinks=("jsonl",), spool_dir=spool, limits=Limits(flush_interval_s=0.2), handle_signals=False
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
            sinks=(db_uri, "jsonl"),
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
        sinks=(db_uri, "wandb"),
        spool_dir=spool,
        sink_options={"wandb": {"dir": wandb_dir, "mode": "offline"}},
        run_id=run_id,
        limits=Limits(flush_interval_s=0.05, max_batch_points=100),
    ) as tracker:
        for step in range(first, first + count):
            tracker.log(step, _metrics(step))
    print(tracker.summary(), flush=True)


def overload_loop(spool: str) -> None:
    """Log 10-metric steps in a tight loop (faster than they can be written); report the count."""
    tracker = Tracker(
        "overload",
        sinks=("jsonl",),
        spool_dir=spool,
        limits=Limits(flush_interval_s=0.2),
        handle_signals=False,
    )
    print(f"run {tracker.run_id}", flush=True)
    step = 0
    while True:
        tracker.log(step, {f"m{i}:mean": step + i / 10 for i in range(10)})
        step += 1
        if step % 2000 == 0:
            print(f"logged {step}", flush=True)


def slow_disk_loop(spool: str, cgroup: str, times_file: str) -> None:
    """Join the blkio cgroup CGROUP (the spool's disk is throttled for it), then log 10-metric steps
    in a tight loop at the default flush interval until killed. Step n's call and return times
    (unix seconds) are the doubles 2n and 2n+1 of TIMES_FILE (on another disk), appended every
    50 ms and after any call slower than 10 ms, so that a kill loses at most 50 ms of them."""
    from array import array

    with open(os.path.join(cgroup, "cgroup.procs"), "w") as fh:
        fh.write(f"{os.getpid()}\n")
    tracker = Tracker("slow-disk", sinks=("jsonl",), spool_dir=spool, handle_signals=False)
    print(f"run {tracker.run_id}", flush=True)
    fd = os.open(times_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    clock, times = time.time, array("d")
    saved = clock()
    step = 0
    while True:
        called = clock()
        tracker.log(step, {f"m{i}:mean": step + i / 10 for i in range(10)})
        returned = clock()
        times.append(called)
        times.append(returned)
        step += 1
        if returned - saved > 0.05 or returned - called > 0.01:
            os.write(fd, times.tobytes())
            del times[:]
            saved = returned


def wandb_loop(spool: str, wandb_dir: str) -> None:
    """Log to W&B offline (and the spool) until killed; report flushes."""
    tracker = Tracker(
        "wb-crash",
        sinks=("wandb",),
        spool_dir=spool,
        sink_options={"wandb": {"dir": wandb_dir, "mode": "offline"}},
        limits=Limits(flush_interval_s=0.05, max_batch_points=50),
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


def _as_from_a_terminal() -> None:
    """A non-interactive shell starts its background jobs with SIGINT ignored, and children inherit
    that; these workers model programs started from a terminal, where Ctrl-C raises
    ``KeyboardInterrupt`` (the ``ignore`` mode then ignores it itself)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


if __name__ == "__main__":
    _as_from_a_terminal()
    command, *rest = sys.argv[1:]
    if command == "signal":
        signal_loop(*rest)
    elif command == "fork":
        fork_run(*rest)
    elif command == "rank":
        rank_run(*rest)
    elif command == "newstore":
        new_store_run(rest[0], rest[1], int(rest[2]))
    elif command == "crash":
        crash_loop(*rest)
    elif command == "dist":
        dist_run(rest[0], rest[1], int(rest[2]), int(rest[3]), int(rest[4]))
    elif command == "slowdisk":
        slow_disk_loop(*rest)
    elif command == "resume":
        resume_run(rest[0], rest[1], rest[2], rest[3], int(rest[4]), int(rest[5]))
    elif command == "overload":
        overload_loop(*rest)
    elif command == "wandb":
        wandb_loop(*rest)
    else:
        raise SystemExit(f"unknown command {command!r}")
