"""Reading a run's journal (points.jsonl) back in the fault tests, as the spool does after a crash."""

from __future__ import annotations

import json
from pathlib import Path

from tracking import keys


def journal_steps(run_dir: Path) -> list[int]:
    """Steps of every complete journal line. A SIGKILL may leave the last line torn (no newline),
    which the spool cuts on reopen; every complete line must parse: none torn or glued mid-file."""
    lines = (run_dir / keys.POINTS_FILE).read_bytes().split(b"\n")
    return [json.loads(line)["step"] for line in lines[:-1]]  # after the last newline: torn or empty
