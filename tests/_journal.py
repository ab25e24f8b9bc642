"""Reading a run's journal (points.jsonl) back in the fault tests, through the journal's own reader."""

from __future__ import annotations

from pathlib import Path

from tracking import journal, keys


def journal_steps(run_dir: Path) -> list[int]:
    """Steps of every complete journal line. A SIGKILL may leave the last line torn (no newline),
    which the spool cuts on reopen; every complete line must parse: none torn or glued mid-file."""
    return [point.step for point in journal.load_points(run_dir / keys.POINTS_FILE, strict=True)]
