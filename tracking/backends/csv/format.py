"""The CSV backend's file: one file per run, ``<dir>/<run_id>.csv``, rows of ``step, key, value,
wall_time`` under that header.

A metric row has a step (an integer >= 0), the metric key, its value (``repr`` of the float: read
back exactly) and the wall time of its point (unix seconds). A run row has an empty step and a key
``run:<field>`` (``run:name``, ``run:backend``, ``run:experiment``, ``run:status``,
``run:config``: JSON), its value, and the wall time it was written; the last row of a field wins.
"""

from __future__ import annotations

import re
from pathlib import Path

HEADER = ("step", "key", "value", "wall_time")
"""The first row of every run file."""
RUN_PREFIX = "run:"
"""Keys of run rows (no step): ``run:name``, ``run:backend``, ``run:experiment``, ``run:status``,
``run:config``."""
SUFFIX = ".csv"
DEFAULT_DIR = "cliptrack-csv"
"""The directory of ``"csv"`` with no argument and no ``dir`` option (relative to the working
directory at start)."""

_RUN_ID = re.compile(r"[A-Za-z0-9_-]+")


def run_file(directory: str | Path, run_id: str) -> Path:
    """The file of run ``run_id`` in ``directory``; ValueError naming the id when it is not a
    cliptrack run id (letters, digits, ``_``, ``-``: it becomes a file name)."""
    if not _RUN_ID.fullmatch(run_id):
        raise ValueError(f"run id {run_id!r} cannot name a CSV file (letters, digits, '_', '-' only)")
    return Path(directory) / f"{run_id}{SUFFIX}"


def run_files(directory: str | Path) -> list[Path]:
    """The run files of ``directory``, by name; FileNotFoundError naming it when it is no directory."""
    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"CSV run directory {str(root)!r} does not exist")
    return sorted(p for p in root.iterdir() if p.suffix == SUFFIX and _RUN_ID.fullmatch(p.stem))
