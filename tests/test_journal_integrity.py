"""The journal's integrity is checked, not assumed: recorded positions (acknowledgements, run.json)
that the journal on disk no longer matches are reported, and delivery starts over from what the
sink really holds. Real MLflow (sqlite), real files, the real replay command."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from cliptrack import Limits
from cliptrack.core import keys
from cliptrack.log.tracker import Tracker
from cliptrack.store import journal
from cliptrack.store.journal import Position
from cliptrack.store.spool import JournalMismatch, RunDir
from mlflow import MlflowClient

REPO = Path(__file__).resolve().parents[1]


def _log(spool: Path, db: Path, steps: range, run_id: str | None = None, value: float = 0.25) -> Tracker:
    tracker = Tracker(
        sinks=(f"sqlite:///{db}",),
        spool_dir=spool,
        run_id=run_id,
        handle_signals=False,
        limits=Limits(flush_interval_s=0.05),
    )
    for step in steps:
        tracker.log(step, {keys.LOSS_SUM: step * value})
    return tracker


def _mlflow_points(db: Path) -> Counter[tuple[int, float, int]]:
    client = MlflowClient(f"sqlite:///{db}")
    (run,) = client.search_runs([client.get_experiment_by_name("cliptrack").experiment_id])
    return Counter(
        (m.step, m.value, m.timestamp) for m in client.get_metric_history(run.info.run_id, keys.LOSS_SUM)
    )


def _journal_points(spool: Path, run_id: str) -> Counter[tuple[int, float, int]]:
    points = journal.load_points(spool / run_id / keys.POINTS_FILE, strict=True)
    return Counter((p.step, float(p.metrics[keys.LOSS_SUM]), int(p.wall_time * 1000)) for p in points)


def _cut(spool: Path, run_id: str, keep: int) -> None:
    """Cut the journal back to its first ``keep`` lines (what a forked child's close did)."""
    path = spool / run_id / keys.POINTS_FILE
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:keep]))


def test_mismatch_names_a_shortened_replaced_or_recounted_journal(tmp_path):
    path = tmp_path / keys.POINTS_FILE
    first = journal.Journal(path, fsync=False)
    first.open()
    first.append([(step, 1.0, {"a:mean": float(step)}) for step in range(10)])
    recorded = first.position()
    first.close()
    assert journal.mismatch(path, recorded) is None and journal.end(path) == recorded
    assert journal.mismatch(path, Position(recorded.points - 1, recorded.offset)) is not None  # recounted
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert "shortened or replaced" in (journal.mismatch(path, recorded) or "")
    path.write_bytes(data.replace(b'"a:mean": 9.0', b'"a:mean": 8.0'))  # same size, other bytes
    assert "replaced or rewritten" in (journal.mismatch(path, recorded) or "")


def test_resuming_after_a_cut_delivers_every_point_and_flush_tells_the_truth(tmp_path, caplog):
    """The acknowledgement lay past the cut journal's end: 299 of 350 new points were never sent
    while flush() returned True and the summary said "all written"."""
    spool, db = tmp_path / "spool", tmp_path / "mlflow.db"
    first = _log(spool, db, range(350))
    first.close()
    _cut(spool, first.run_id, 50)
    caplog.set_level(logging.WARNING, logger="cliptrack")
    with pytest.warns(JournalMismatch):
        second = _log(spool, db, range(350, 700), run_id=first.run_id)
    assert second.flush(timeout_s=60) is True
    second.close()
    assert "mlflow: all written" in second.summary()
    reported = [r.getMessage() for r in caplog.records if "does not match" in r.getMessage()]
    assert any("mlflow's acknowledgement" in line and "shortened or replaced" in line for line in reported)
    assert any("run.json" in line for line in reported)  # the journal end it recorded at close
    held = _mlflow_points(db)
    in_journal = _journal_points(spool, first.run_id)
    assert sum(in_journal.values()) == 400
    assert all(held[point] == 1 for point in in_journal), "a journal point missing or doubled in MLflow"
    assert sorted(step for step, _, _ in held) == list(range(700))  # the cut 300 stay where they were


@pytest.mark.slow
def test_replay_of_a_replaced_journal_reports_it_and_starts_over(tmp_path):
    spool, db = tmp_path / "spool", tmp_path / "mlflow.db"
    tracker = _log(spool, db, range(100))
    tracker.close()
    run_dir = RunDir(spool, tracker.run_id)
    # another journal in its place (longer than the acknowledged offset, other bytes there)
    path = run_dir.points_path
    path.write_bytes(
        b"".join(journal.encode_points([(1000 + i, 1.0, {keys.LOSS_SUM: -1.0 * i}) for i in range(150)]))
    )
    run_dir.update_meta(sinks={"mlflow": {"closed": False}})
    done = subprocess.run(
        [sys.executable, "-m", "cliptrack.cli.main", "replay", str(spool)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "replaced or rewritten" in done.stdout + done.stderr
    assert "150 points pushed" in done.stdout, done.stdout
    held = _mlflow_points(db)
    assert sorted(step for step, _, _ in held) == list(range(100)) + list(range(1000, 1150))
    assert json.loads(run_dir.ack_path("mlflow").read_text())["points"] == 150
