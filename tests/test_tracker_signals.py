"""Signals and crashes of a real training subprocess: what was logged is on disk, the run says how it ended."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests._journal import journal_steps
from tracking import keys

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests._tracking_worker", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _read_until(proc: subprocess.Popen, word: str, at_least: int) -> tuple[str, list[tuple[str, int, float]]]:
    """Read the worker's lines until ``word N`` with N >= at_least; return its run id and the lines."""
    run_id, seen = "", []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"worker ended early: {proc.wait()} {proc.stderr.read()[-3000:]}")
        head, _, value = line.strip().partition(" ")
        if head == "run":
            run_id = value
            continue
        seen.append((head, int(value), time.monotonic()))
        if head == word and int(value) >= at_least:
            return run_id, seen
    raise AssertionError("worker too slow")


def _steps(spool: Path, run_id: str) -> list[int]:
    return journal_steps(spool / run_id)


def _status(spool: Path, run_id: str) -> str:
    return json.loads((spool / run_id / keys.RUN_META_FILE).read_text())["status"]


def test_sigterm_drains_everything_then_chains_to_the_previous_handler(tmp_path):
    spool, count_file = tmp_path / "spool", tmp_path / "count"
    proc = _start("signal", str(spool), "jsonl", "chain", str(count_file))
    try:
        run_id, seen = _read_until(proc, "flushed", 300)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 7, proc.stderr.read()  # the application's own handler ran after the drain
    finally:
        proc.kill()
    logged = int(count_file.read_text())
    steps = _steps(spool, run_id)
    # every log() that returned before the signal is on disk (one more if the signal hit inside log())
    assert steps == list(range(len(steps))) and len(steps) in (logged, logged + 1)
    assert len(steps) >= max(n for word, n, _ in seen if word == "flushed")
    assert _status(spool, run_id) == "KILLED"
    assert "SIGTERM received" in proc.stderr.read()


@pytest.mark.parametrize(
    ("signum", "returncode"), [(signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, -signal.SIGINT)]
)
def test_signal_marks_the_mlflow_run_killed_and_the_process_still_dies_of_it(tmp_path, signum, returncode):
    spool, db = tmp_path / "spool", tmp_path / "mlflow.db"
    proc = _start("signal", str(spool), f"sqlite:///{db}", "default", str(tmp_path / "unused"))
    try:
        run_id, seen = _read_until(proc, "flushed", 200)
        proc.send_signal(signum)
        assert proc.wait(60) == returncode, proc.stderr.read()
    finally:
        proc.kill()
    steps = _steps(spool, run_id)
    assert steps == list(range(len(steps))) and len(steps) >= max(n for w, n, _ in seen if w == "flushed")
    assert _status(spool, run_id) == "KILLED"
    client = MlflowClient(f"sqlite:///{db}")
    (run,) = client.search_runs([client.get_experiment_by_name("cliptrack").experiment_id])
    assert run.info.status == "KILLED" and run.data.tags[keys.TAG_RUN_ID] == run_id
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, keys.LOSS_SUM)) == steps


def test_a_hard_kill_loses_at_most_the_last_flush_interval(tmp_path):
    """SIGKILL cannot be handled: what the writer flushed (every 0.2 s) must survive, and the spool
    must stay readable; replay then records that the run died (FAILED)."""
    spool = tmp_path / "spool"
    proc = _start("crash", str(spool))
    try:
        run_id, seen = _read_until(proc, "flushed", 1000)
        time.sleep(1.5)
        killed_at = time.monotonic()
        proc.kill()
        proc.wait(30)
    finally:
        proc.kill()
    while True:  # lines the worker wrote before dying, with the time we read them (no later than written)
        line = proc.stdout.readline()
        if not line:
            break
        head, _, value = line.strip().partition(" ")
        seen.append((head, int(value), time.monotonic()))
    steps = _steps(spool, run_id)
    assert steps == list(range(len(steps)))  # a prefix, no gap, no torn line
    assert len(steps) >= max(n for word, n, _ in seen if word == "flushed")
    # logged more than a flush interval (0.2 s) plus scheduling slack (0.8 s) before the kill => on disk
    old = [n for word, n, t in seen if word == "logged" and t < killed_at - 1.0]
    assert old and len(steps) >= max(old)
    assert _status(spool, run_id) == "RUNNING"
    replay = subprocess.run(
        [sys.executable, "-m", "tracking.cli", "replay", str(spool)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert replay.returncode == 0, replay.stderr
    assert _status(spool, run_id) == "FAILED"
