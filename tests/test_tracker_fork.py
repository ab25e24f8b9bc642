"""Fork children of a training process (helpers, multiprocessing pools, DataLoader-like workers):
real forks, real signals; points counted in the journal and in MLflow (sqlite)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cliptrack.core import keys
from cliptrack.log.tracker import Tracker
from mlflow import MlflowClient

from tests._journal import journal_steps

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "CLIPTRACK_RANK", "WANDB_SERVICE"):
        env.pop(name, None)
    return env


def _start(spool: Path, db: Path, scenario: str, **options: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests._tracking_worker", "fork", str(spool), f"sqlite:///{db}", scenario],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        **options,  # type: ignore[call-overload]
    )


def _read_until(proc: subprocess.Popen[str], word: str, at_least: int = 0) -> tuple[str, int]:
    """Read protocol lines until ``word N`` with N >= at_least; (run id, N)."""
    run_id = ""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line, f"worker ended early: {proc.wait()} {proc.stderr.read()[-3000:]}"  # type: ignore[union-attr]
        head, _, value = line.strip().partition(" ")
        if head == "run":
            run_id = value
        elif head == word and (not value.lstrip("-").isdigit() or int(value) >= at_least):
            return run_id, int(value) if value.lstrip("-").isdigit() else 0
    raise AssertionError("worker too slow")


def _status(spool: Path, run_id: str) -> str:
    return str(json.loads((spool / run_id / keys.RUN_META_FILE).read_text())["status"])


def _mlflow_steps(db: Path, run_id: str) -> list[int]:
    client = MlflowClient(f"sqlite:///{db}")
    (run,) = client.search_runs([client.get_experiment_by_name("cliptrack").experiment_id])
    assert run.data.tags[keys.TAG_RUN_ID] == run_id
    return sorted(m.step for m in client.get_metric_history(run.info.run_id, keys.LOSS_SUM))


def test_a_child_ending_with_sys_exit_leaves_the_parents_run_whole_open_and_locked(tmp_path):
    """The child's exit runs atexit and finalisation with the inherited tracker: the parent's
    journal must stay whole (it was cut to the fork-time size), run.json RUNNING (it said
    FINISHED), the lock held (a second process took the run and mixed both runs' points); the
    child's log() calls are warned about once, never silently lost."""
    spool, db = tmp_path / "spool", tmp_path / "mlflow.db"
    proc = _start(spool, db, "child_exit")
    try:
        run_id, code = _read_until(proc, "child")
        assert code == 0
        assert _status(spool, run_id) == "RUNNING"
        assert journal_steps(spool / run_id) == list(range(400))
        with pytest.raises(ValueError, match="being logged by another process"):
            Tracker(sinks=("jsonl",), spool_dir=spool, run_id=run_id, handle_signals=False)
        proc.stdin.write("go\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
        _read_until(proc, "closed")
        assert proc.wait(60) == 0
    finally:
        proc.kill()
    stderr = proc.stderr.read()  # type: ignore[union-attr]
    assert stderr.count("not logged (a forked child never writes its parent's run") == 1, stderr[-3000:]
    assert b"\0" not in (spool / run_id / keys.POINTS_FILE).read_bytes()
    assert journal_steps(spool / run_id) == list(range(600))
    assert _status(spool, run_id) == "FINISHED"
    assert _mlflow_steps(db, run_id) == list(range(600))


@pytest.mark.parametrize("scenario", ["pool_terminate", "pool_with"])
def test_hung_pool_workers_ended_by_terminate_lose_no_point(tmp_path, scenario):
    """Pool.terminate() (and leaving a ``with Pool`` block) SIGTERMs fork workers that inherited
    the tracker and its signal handler: 202/300 journal points were lost in 3 of 3 runs."""
    spool, db = tmp_path / "spool", tmp_path / "mlflow.db"
    proc = _start(spool, db, scenario)
    try:
        run_id, ready = _read_until(proc, "pool")
        _read_until(proc, "closed")
        assert proc.wait(60) == 0, proc.stderr.read()  # type: ignore[union-attr]
    finally:
        proc.kill()
    assert ready == 0  # the workers were hung, not done
    assert journal_steps(spool / run_id) == list(range(600))
    assert _status(spool, run_id) == "FINISHED"
    assert _mlflow_steps(db, run_id) == list(range(600))


def test_ctrl_c_with_fork_workers_loses_nothing(tmp_path):
    """Ctrl-C reaches the whole foreground process group: the parent and its DataLoader-like fork
    workers. The journal was cut to 50 of 350 points; now every flushed point is in the journal
    and in MLflow, and the run is KILLED."""
    spool, db = tmp_path / "spool", tmp_path / "mlflow.db"
    proc = _start(spool, db, "workers", start_new_session=True)
    try:
        run_id, flushed = _read_until(proc, "flushed", 600)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == -signal.SIGINT, proc.stderr.read()[-3000:]  # type: ignore[union-attr]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    steps = journal_steps(spool / run_id)
    assert steps == list(range(len(steps))) and len(steps) >= flushed
    assert _status(spool, run_id) == "KILLED"
    assert _mlflow_steps(db, run_id) == steps
