"""Runs read back from a CSV backend directory (``<dir>/<run_id>.csv``, ``csv.format``) for the
comparison and for ``cliptrack runs``: the same frame as from any other store.

A row that cannot be read (a torn last line after a crash, a value that is not a number) is skipped
with a warning naming the file and line; a file that is not a CSV run file (no header) is an error
naming it.
"""

from __future__ import annotations

import csv
import io
import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cliptrack.backends.catalog import RunEntry, choose_runs
from cliptrack.backends.csv.format import HEADER, RUN_PREFIX, run_files
from cliptrack.store.files import open_regular
from cliptrack.store.frame import LoadedRun, Point, RunSet
from cliptrack.store.records import RUNNING, RunInfo

__all__ = ["CsvRun", "read", "read_run_file"]


class DamagedRow(UserWarning):
    """A row of a CSV run file could not be read and was skipped."""


@dataclass
class CsvRun:
    """One run file read back: its ``RunInfo`` (``started``/``ended`` in unix seconds) and its
    points, one per step in the order logged."""

    path: Path
    run: RunInfo
    points: list[Point] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len({point.step for point in self.points})


def read_run_file(path: Path) -> CsvRun:
    """Read one run file (``csv.format``); ValueError naming it when it has no CSV run header."""
    with open_regular(path) as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")
        rows = csv.reader(text)
        header = next(rows, None)
        if header is None or tuple(header) != HEADER:
            raise ValueError(f"{str(path)!r} is not a CSV run file: its first row is not {','.join(HEADER)}")
        fields: dict[str, tuple[str, float]] = {}
        first_seen: dict[str, float] = {}
        points: list[Point] = []
        metrics: list[dict[str, float]] = []
        for line, row in enumerate(rows, start=2):
            parsed = _row(row)
            if parsed is None:
                warnings.warn(f"{path}:{line}: damaged row skipped: {row!r:.120}", DamagedRow, stacklevel=2)
                continue
            step, key, value, wall = parsed
            if step is None:
                fields[key] = (str(value), wall)
                first_seen.setdefault(key, wall)
            elif points and points[-1].step == step:  # the rows of one point follow each other
                metrics[-1][key] = float(value)
                points[-1] = Point(step, max(points[-1].wall_time, wall), metrics[-1])
            else:
                metrics.append({key: float(value)})
                points.append(Point(step, wall, metrics[-1]))
    return CsvRun(path, _run_info(path, fields, first_seen), points)


def _row(row: list[str]) -> tuple[int | None, str, str | float, float] | None:
    """(step or None for a run row, key, value, wall time), or None when the row is damaged."""
    if len(row) != len(HEADER):
        return None
    step_text, key, value_text, wall_text = row
    try:
        wall = float(wall_text)
        if step_text == "":
            return (None, key[len(RUN_PREFIX) :], value_text, wall) if key.startswith(RUN_PREFIX) else None
        step = int(step_text)
        value = float(value_text)
    except ValueError:
        return None
    if step < 0 or not key or math.isnan(wall):
        return None
    return step, key, value, wall


def _run_info(path: Path, fields: dict[str, tuple[str, float]], first_seen: dict[str, float]) -> RunInfo:
    def text(name: str, default: str = "") -> str:
        return fields[name][0] if name in fields else default

    try:
        config = json.loads(text("config", "{}"))
    except ValueError:
        config = {}
    status = text("status", RUNNING)
    return RunInfo(
        run_id=path.stem,
        run_name=text("name"),
        backend_label=text("backend") or None,
        config=config if isinstance(config, dict) else {},
        started=first_seen.get("name", 0.0),
        experiment=text("experiment") or "cliptrack",
        status=status,
        ended=fields["status"][1] if status != RUNNING and "status" in fields else None,
    )


def entry(found: CsvRun) -> RunEntry:
    """A run file as ``cliptrack runs`` lists it."""
    run = found.run
    return RunEntry(
        cliptrack_id=run.run_id,
        store_id=run.run_id,
        name=run.run_name,
        backend=run.backend_label or "",
        status=run.status,
        started=run.started,
        steps=found.steps,
        experiment=run.experiment,
    )


def _load_csv(refs: Sequence[str], directory: str | Path) -> RunSet:
    """Load runs from a CSV backend directory; ``refs`` are run ids or names (empty: every run).
    A name of several runs takes the latest FINISHED one, with a warning listing the others."""
    found = [read_run_file(path) for path in run_files(directory)]
    chosen = choose_runs(
        refs, [(run, run.run.run_id, run.run.run_name) for run in found], f"CSV dir {directory}", entry=entry
    )
    return RunSet.from_points(
        (LoadedRun(run.run, source="csv", location=str(directory)), run.points) for run in chosen
    )


def read(refs: Sequence[str], *, csv_dir: str | Path) -> RunSet:
    """The registry's reader: ``_load_csv`` of ``csv_dir``."""
    return _load_csv(refs, csv_dir)
