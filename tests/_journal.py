"""Reading a run's journal (points.jsonl) back in the fault tests, through the journal's own reader."""

from __future__ import annotations

from pathlib import Path

from cliptrack.core import keys
from cliptrack.store import journal


def journal_steps(run_dir: Path) -> list[int]:
    """Steps of every complete journal line. A SIGKILL may leave the last line torn (no newline),
    which the spool cuts on reopen; every complete line must parse: none torn or glued mid-file."""
    return [point.step for point in journal.load_points(run_dir / keys.POINTS_FILE, strict=True)]


def run_summary(caplog, run_id: str) -> str:
    """The closing summary of run ``run_id`` as logged by ``Tracker.close``: the newest record that
    names the run and its final status. Another test's lane thread may log after it, so the last
    record is not necessarily this run's."""
    for record in reversed(caplog.records):
        message = record.getMessage()
        if message.startswith(f"run {run_id} ") and " points " in message:
            return message
    raise AssertionError(f"no closing summary of run {run_id} in {[r.getMessage() for r in caplog.records]}")
