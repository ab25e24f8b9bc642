"""Stress figures of the tracker's promises (measured, not asserted; each row names its target).

- crash loss under overload: a tight loop of 10-metric steps (faster than the writer), SIGKILL
  after ``OVERLOAD_S`` seconds; loss = kill time - wall time of the last point on disk (seconds
  of logging lost). Target: <= flush interval (1 s, the default) + 0.5 s. Worst of ``REPEATS``.
- peak memory for 1M steps x 10 metrics in a tight loop (JSONL spool only): growth of the
  process's peak RSS (``VmHWM``) over its RSS before the tracker was created. Target: <= 150 MB.
- ``log()`` latency with a dead backend (an MLflow server that refuses connections, MLflow's
  default HTTP settings), 5 metrics per step, 50,000 steps paced at ~0.1 ms of other work:
  p50 / p99 / max, with ``freeze_gc=True``. Targets: p99 <= 50 µs, max <= 20 ms.
- SIGTERM exit time with a dead server under MLflow's default settings: from the signal to the
  process's end. Target: <= 10 s. Worst of ``REPEATS``.
- Inside a training job (the fork and signal workers of ``tests._tracking_worker``): journal
  points lost when a forked child ends with ``sys.exit(0)`` while the parent logs, and when
  ``Pool.terminate()`` ends hung fork workers (600 points logged; target 0); Ctrl-C (SIGINT) in a
  tight logging loop over ``CTRL_C_TRIES`` tries: the worst seconds from the signal to the
  process's end (target: every one <= 10 s) and the tries that left the run RUNNING (target 0).

- Delivery (``delivery_rows``): the spool on a full 2 MiB tmpfs (mounted when run as root) with a
  healthy sqlite MLflow, ``FULL_DISK_POINTS`` logged: points written nowhere (neither the journal
  nor MLflow; target 0), MLflow's rows while the disk is full (target: all) and the journal's lines
  once space returns (target: all); peak memory growth (``VmHWM`` over the RSS after imports) for
  ``WIDE_POINTS`` points x 200 metrics with a dead MLflow server, the spool on a healthy disk and on
  a full one. Target: <= the documented bound, ``cliptrack.log._pipeline.writer.MEMORY_BOUND_BYTES`` (256 MB).

Run: ``python benchmarks/stress.py``; ``run()`` returns the rows (``benchmarks/run_all.py``);
``python benchmarks/stress.py delivery`` runs the delivery section alone.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._timing import Row, markdown  # noqa: E402 - importable once ROOT is on sys.path
from tests._disk import fill  # noqa: E402

OVERLOAD_S = 8.0
REPEATS = 3
MEMORY_STEPS = 1_000_000
LATENCY_STEPS = 50_000
CTRL_C_TRIES = 50
FORK_POINTS = 600
FULL_DISK_POINTS = 20_000
WIDE_POINTS = 50_000


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in (
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
        "MLFLOW_HTTP_REQUEST_TIMEOUT",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
        "RANK",
    ):
        env.pop(name, None)
    return env


def _worker(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "worker", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(),
    )


def _wait_for(proc: subprocess.Popen[str], word: str) -> str:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker ended early ({proc.wait()})")
        head, _, value = line.strip().partition(" ")
        if head == word:
            return value


# ---- measurements (parent side) ------------------------------------------------------------------
def crash_loss(work: Path) -> float:
    """Worst seconds of logging lost to a SIGKILL under overload."""
    losses = []
    for i in range(REPEATS):
        spool = work / f"overload-{i}"
        proc = _worker("overload", str(spool))
        run_id = _wait_for(proc, "run")
        time.sleep(OVERLOAD_S)
        killed_at = time.time()
        proc.kill()
        proc.wait(30)
        with open(spool / run_id / "points.jsonl", "rb") as fh:  # only its tail: keep this process small
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 65536))
            last = json.loads(fh.read().splitlines()[-1])["wall_time"]
        losses.append(killed_at - last)
    return max(losses)


def peak_memory(work: Path) -> float:
    """Bytes of peak RSS growth for MEMORY_STEPS x 10 metrics in a tight loop."""
    proc = _worker("memory", str(work / "memory"))
    return float(_wait_for(proc, "growth"))


def latency(work: Path) -> dict[str, float]:
    """log() seconds: p50, p99, max with a dead MLflow backend."""
    proc = _worker("latency", str(work / "latency"))
    value = _wait_for(proc, "latency")
    proc.wait(120)
    p50, p99, worst = (float(v) for v in value.split(","))
    return {"p50": p50, "p99": p99, "max": worst}


def sigterm_exit(work: Path) -> float:
    """Worst seconds from SIGTERM to exit with a dead server (MLflow default settings)."""
    times = []
    for i in range(REPEATS):
        proc = _worker("sigterm", str(work / f"sigterm-{i}"))
        _wait_for(proc, "logging")
        time.sleep(2.0)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        times.append(time.monotonic() - sent)
    return max(times)


# ---- inside a training job: forks and Ctrl-C (tests._tracking_worker) ----------------------------
def _job_worker(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests._tracking_worker", *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(),
    )


def _journal_lines(spool: Path, run_id: str) -> int:
    from cliptrack.store import journal

    return len(journal.load_points(spool / run_id / "points.jsonl", strict=True))


def fork_loss(work: Path, scenario: str) -> int:
    """Journal points lost (of FORK_POINTS logged) with a fork child exiting / Pool.terminate()."""
    spool = work / f"fork-{scenario}"
    proc = _job_worker("fork", str(spool), "jsonl", scenario)
    run_id = _wait_for(proc, "run")
    if scenario == "child_exit":
        _wait_for(proc, "child")
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    _wait_for(proc, "closed")
    proc.wait(120)
    return FORK_POINTS - _journal_lines(spool, run_id)


def ctrl_c_exits(work: Path) -> tuple[float, int]:
    """Over CTRL_C_TRIES tries of Ctrl-C in a tight logging loop: the worst seconds from SIGINT to
    the process's end (a hang counts as 60 s), and the tries that left the run RUNNING."""
    worst, running = 0.0, 0
    for i in range(CTRL_C_TRIES):
        spool = work / f"ctrl-c-{i}"
        proc = _job_worker("signal", str(spool), "jsonl", "tight", str(work / "unused"))
        run_id = _wait_for(proc, "run")
        _wait_for(proc, "logged")
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
            took = time.monotonic() - sent
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
            took = 60.0
        worst = max(worst, took)
        meta = json.loads((spool / run_id / "run.json").read_text())
        running += meta.get("status") == "RUNNING"
    return worst, running


def process_rows(work: Path) -> list[Row]:
    """The rows of the training-job section (forks and Ctrl-C)."""
    child_lost = fork_loss(work, "child_exit")
    pool_lost = fork_loss(work, "pool_terminate")
    ctrl_c_worst, ctrl_c_running = ctrl_c_exits(work)
    return [
        Row(
            f"stress: journal points lost, fork child ends with sys.exit(0) ({FORK_POINTS} logged)",
            0.0,
            "0 points",
            float(child_lost),
            "0",
            shown=f"{child_lost} points",
        ),
        Row(
            f"stress: journal points lost, Pool.terminate() on hung fork workers ({FORK_POINTS} logged)",
            0.0,
            "0 points",
            float(pool_lost),
            "0",
            shown=f"{pool_lost} points",
        ),
        Row(
            f"stress: Ctrl-C to exit, tight logging loop, worst of {CTRL_C_TRIES} tries",
            ctrl_c_worst,
            "10 s",
            ctrl_c_worst / 10,
            "≤ 1.0× (≤ 10 s)",
        ),
        Row(
            f"stress: Ctrl-C tries that left the run RUNNING (of {CTRL_C_TRIES})",
            0.0,
            "0 runs",
            float(ctrl_c_running),
            "0",
            shown=f"{ctrl_c_running} runs",
        ),
    ]


# ---- delivery: a full disk, 200 metrics per point (workers below) --------------------------------
def _tmpfs(where: Path) -> bool:
    """Mount a 2 MiB tmpfs at ``where`` (root only); False when that is not permitted."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True)
    return done.returncode == 0


def _fields(proc: subprocess.Popen[str]) -> dict[str, float]:
    """The worker's ``name value`` lines up to ``done``."""
    out: dict[str, float] = {}
    while (line := _wait_line(proc)) != "done":
        name, _, value = line.partition(" ")
        out[name] = float(value)
    proc.wait(120)
    return out


def _wait_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"worker ended early ({proc.wait()})")
    return line.strip()


def delivery_rows(work: Path) -> list[Row]:
    """The rows of the delivery section (full disk, memory bound at 200 metrics per point)."""
    from cliptrack.log._pipeline.writer import MEMORY_BOUND_BYTES

    disk = work / "disk"
    mounted = _tmpfs(disk)
    rows: list[Row] = []
    try:
        if mounted:
            full = _fields(_worker("fulldisk", str(disk)))
            rows += [
                Row(
                    f"stress: points written nowhere, spool disk full, MLflow healthy ({FULL_DISK_POINTS} logged)",
                    0.0,
                    "0 points",
                    full["lost"],
                    "0",
                    shown=f"{full['lost']:.0f} points",
                ),
                Row(
                    "stress: MLflow rows while the spool disk is full",
                    0.0,
                    f"{FULL_DISK_POINTS} points",
                    full["mlflow"] / FULL_DISK_POINTS,
                    "1.0× (all)",
                    shown=f"{full['mlflow']:.0f} of {FULL_DISK_POINTS}",
                ),
                Row(
                    "stress: journal lines once space returns",
                    0.0,
                    f"{FULL_DISK_POINTS} points",
                    full["journal"] / FULL_DISK_POINTS,
                    "1.0× (all)",
                    shown=f"{full['journal']:.0f} of {FULL_DISK_POINTS}",
                ),
            ]
        for label, spool in (("healthy disk", work / "wide"), ("full disk", disk / "wide")):
            if spool.is_relative_to(disk) and not mounted:
                continue
            wide = _fields(_worker("wide", str(spool)))
            rows.append(
                Row(
                    f"stress: peak memory growth, {WIDE_POINTS} points x 200 metrics, dead MLflow server, {label}",
                    0.0,
                    f"{MEMORY_BOUND_BYTES / 2**20:.0f} MB",
                    wide["growth"] / MEMORY_BOUND_BYTES,
                    f"≤ 1.0× (≤ {MEMORY_BOUND_BYTES / 2**20:.0f} MB)",
                    shown=f"{wide['growth'] / 2**20:.0f} MB",
                )
            )
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(disk)], check=False)
    if not mounted:
        print("stress: delivery rows on a full disk skipped: cannot mount a tmpfs (needs root)")
    return rows


def _full_disk_worker(disk: str) -> None:
    """Spool on the tmpfs ``disk`` (filled after the first 1000 points), a healthy sqlite MLflow."""
    from cliptrack.log.tracker import Tracker
    from cliptrack.store import journal
    from mlflow import MlflowClient

    db = f"sqlite:///{Path(disk).parent / 'full-disk-mlflow.db'}"
    tracker = Tracker(
        "full-disk", sinks=[db], spool_dir=Path(disk) / "spool", experiment="full-disk", handle_signals=False
    )
    for step in range(1000):
        tracker.log(step, {"loss:sum": step * 0.5})
    tracker.flush(timeout_s=60)
    filler = fill(Path(disk))
    for step in range(1000, FULL_DISK_POINTS):
        tracker.log(step, {"loss:sum": step * 0.5})
    lane = tracker._lanes[0]
    deadline = time.monotonic() + 120
    while lane.acked_points < FULL_DISK_POINTS and time.monotonic() < deadline:
        time.sleep(0.1)
    client = MlflowClient(db)
    (found,) = client.search_runs([client.get_experiment_by_name("full-disk").experiment_id])
    print(f"mlflow {len(client.get_metric_history(found.info.run_id, 'loss:sum'))}", flush=True)
    print(f"lost {tracker._writer.lost_points()}", flush=True)
    filler.unlink(missing_ok=True)
    tracker.flush(timeout_s=60)
    tracker.close()
    points = journal.load_points(Path(disk) / "spool" / tracker.run_id / "points.jsonl")
    print(f"journal {len(points)}", flush=True)
    print("done", flush=True)


def _wide_worker(spool: str) -> None:
    """WIDE_POINTS x 200 metrics with a dead MLflow server; the spool's disk full when it is a tmpfs."""
    import mlflow.tracking  # noqa: F401 - imported before the baseline: the import is not the tracker's memory
    from cliptrack.backends.mlflow import sink as mlflow_sink  # noqa: F401
    from cliptrack.log.tracker import Tracker

    where = Path(spool)
    before = _rss_now()
    dead = f"http://127.0.0.1:{_closed_port()}"
    tracker = Tracker("wide", sinks=[dead], spool_dir=where, open_timeout_s=0, handle_signals=False)
    filler = fill(where.parent) if os.path.ismount(where.parent) else None  # run.json is written by now
    for step in range(WIDE_POINTS):
        tracker.log(step, {f"m{i}:mean": step + i / 1000 for i in range(200)})
    tracker.close(timeout_s=1)
    print(f"growth {_peak_rss() - before}", flush=True)
    if filler is not None:
        filler.unlink()
    print("done", flush=True)


DELIVERY_WORKERS = {"fulldisk": _full_disk_worker, "wide": _wide_worker}


# ---- workers (child side) ------------------------------------------------------------------------
def _quiet() -> None:
    import logging

    for name in ("cliptrack", "mlflow", "urllib3"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _ten(step: int) -> dict[str, float]:
    return {f"m{i}:mean": step + i / 10 for i in range(10)}


def worker(kind: str, spool: str) -> None:
    _quiet()
    from cliptrack.log.tracker import Tracker

    if kind == "overload":
        tracker = Tracker("overload", sinks=("jsonl",), spool_dir=spool, handle_signals=False)
        print(f"run {tracker.run_id}", flush=True)
        step = 0
        while True:
            tracker.log(step, _ten(step))
            step += 1
    if kind == "memory":
        before = _rss_now()
        with Tracker("memory", sinks=("jsonl",), spool_dir=spool, handle_signals=False) as tracker:
            for step in range(MEMORY_STEPS):
                tracker.log(step, _ten(step))
        print(f"growth {_peak_rss() - before}", flush=True)
        return
    if kind == "latency":
        dead = f"http://127.0.0.1:{_closed_port()}"
        tracker = Tracker(
            "latency",
            sinks=(dead,),
            spool_dir=spool,
            open_timeout_s=0,
            handle_signals=False,
            freeze_gc=True,  # opt-in since it is process-wide; the figures below are measured with it
        )
        clock = time.perf_counter
        samples = []
        for step in range(LATENCY_STEPS):
            metrics = {
                "loss:sum": step * 0.5,
                "reward:mean": 0.1,
                "kl:mean": 1e-3,
                "lr:mean": 1e-6,
                "throughput:mean": 1e4,
            }
            start = clock()
            tracker.log(step, metrics)
            samples.append(clock() - start)
            time.sleep(0.0001)
        tracker.close(timeout_s=1)
        samples.sort()
        p50 = statistics.median(samples)
        p99 = samples[int(0.99 * (len(samples) - 1))]
        print(f"latency {p50},{p99},{samples[-1]}", flush=True)
        return
    if kind in DELIVERY_WORKERS:
        DELIVERY_WORKERS[kind](spool)
        return
    if kind == "sigterm":
        dead = f"http://127.0.0.1:{_closed_port()}"
        tracker = Tracker("sigterm", sinks=(dead,), spool_dir=spool, open_timeout_s=0)
        print("logging 1", flush=True)
        step = 0
        while True:
            tracker.log(step, _ten(step))
            step += 1
            time.sleep(0.0005)
    raise SystemExit(f"unknown worker {kind!r}")


def _rss_now() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss() -> int:
    """This process's peak RSS in bytes (``VmHWM``: unlike ``ru_maxrss``, not inherited from the
    parent that forked it)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run() -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="cliptrack-stress-") as tmp:
        work = Path(tmp)
        loss = crash_loss(work)
        memory = peak_memory(work)
        lat = latency(work)
        exit_s = sigterm_exit(work)
        job_rows = process_rows(work)
        delivery = delivery_rows(work)
    rows = [
        Row(
            "stress: crash loss, SIGKILL under overload (10-metric tight loop, flush 1 s)",
            loss,
            "flush interval + 0.5 s",
            loss / 1.5,
            "≤ 1.0× (≤ 1.5 s)",
        ),
        Row(
            "stress: log() p50, dead MLflow backend (default MLflow settings)",
            lat["p50"],
            "50 µs",
            lat["p50"] / 50e-6,
        ),
        Row(
            "stress: log() p99, dead MLflow backend",
            lat["p99"],
            "50 µs",
            lat["p99"] / 50e-6,
            "≤ 1.0× (≤ 50 µs)",
        ),
        Row(
            "stress: log() max, dead MLflow backend",
            lat["max"],
            "20 ms",
            lat["max"] / 20e-3,
            "≤ 1.0× (≤ 20 ms)",
        ),
        Row(
            "stress: SIGTERM to exit, dead MLflow server (default MLflow settings)",
            exit_s,
            "10 s",
            exit_s / 10,
            "≤ 1.0× (≤ 10 s)",
        ),
        Row(
            "stress: peak memory growth, 1M steps x 10 metrics, tight loop",
            0.0,
            "150 MB",
            memory / 150e6,
            "≤ 1.0× (≤ 150 MB)",
            shown=f"{memory / 1e6:.0f} MB",
        ),
    ]
    rows += job_rows + delivery
    print(markdown(rows))
    return rows


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "delivery":  # only the delivery section
        with tempfile.TemporaryDirectory(prefix="cliptrack-stress-") as tmp:
            print(markdown(delivery_rows(Path(tmp))))
    elif len(sys.argv) > 1 and sys.argv[1] == "job":  # only the training-job section
        with tempfile.TemporaryDirectory(prefix="cliptrack-stress-") as tmp:
            print(markdown(process_rows(Path(tmp))))
    else:
        run()
