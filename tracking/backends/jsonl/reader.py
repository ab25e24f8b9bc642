"""Runs read back from the JSONL spool (``<dir>/<run_id>/run.json`` + ``points.jsonl``) for the
comparison: the same frame as from any other store."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from cliptrack.backends.catalog import RunEntry, choose_runs
from cliptrack.backends.jsonl import framework_logs
from cliptrack.backends.jsonl.directory import spool_directory
from cliptrack.backends.jsonl.listing import spool_entry
from cliptrack.core.worst import Worst
from cliptrack.store import journal
from cliptrack.store import worst as worst_store
from cliptrack.store.frame import Columns, LoadedRun, MetricCodes, RunSet
from cliptrack.store.spool import RunDir, spool_runs

__all__ = ["read", "read_worst"]


def _jsonl_runs(directory: Path) -> list[RunDir]:
    """The run directories of the spool ``directory``, by name (the first is the comparison's reference)."""
    return spool_runs(spool_directory(directory))


def _load_jsonl(refs: Sequence[str], directory: str | Path) -> RunSet:
    """Load runs from a JSONL spool directory (``<dir>/<run_id>/run.json`` + ``points.jsonl``), and the
    runs verl's own file or console logger and TRL's trainer state wrote there
    (:mod:`cliptrack.backends.jsonl.framework_logs`).

    ``refs`` are run ids or run names; an empty ``refs`` loads every run in the directory. Points are
    read by ``journal.load_columns``: a damaged line (torn, not JSON, over the reader's limits) is
    skipped with a warning naming the file and line; a line that is not a point raises ValueError
    naming it. A run id claimed by two directories is refused (``spool.DuplicateRunId``).
    """
    root = Path(directory)
    found = []
    for run_dir in _jsonl_runs(root):
        info = LoadedRun(run_dir.read_run(), source="jsonl", location=str(root))  # the run.json mapping
        found.append((info, run_dir))
    by_id = {info.run.run_id: run_dir for info, run_dir in found}
    logged = {
        info.run.run_id: (info, points)
        for info, points in map(framework_logs.read, framework_logs.find(root))
    }
    chosen = choose_runs(
        refs,
        [(info, info.run.run_id, info.run.run_name) for info, _ in found + list(logged.values())],
        f"JSONL dir {root}",
        entry=lambda info: _entry(info, by_id),
    )
    return RunSet.from_points(
        logged[info.run.run_id]
        if info.run.run_id in logged
        else (info, _spool_columns(by_id[info.run.run_id]))
        for info in chosen
    )


def _entry(info: LoadedRun, by_id: dict[str, RunDir]) -> RunEntry:
    """A chosen run as listed: a spool run by its directory, a framework's own log by its file."""
    run_dir = by_id.get(info.run.run_id)
    return spool_entry(run_dir) if run_dir is not None else framework_logs.entry(Path(info.location))


def _spool_columns(run_dir: RunDir) -> Columns:
    """A run's points.jsonl as ``Columns``, streamed by ``journal.load_columns`` into compact
    arrays (no point objects): a bad line is skipped with a warning naming the file and line, a
    line that is not a point or holds a non-numeric value raises ValueError naming it, a FIFO or a
    device is refused (``SpecialFileError``)."""
    cols = journal.load_columns(run_dir.points_path)
    return Columns(
        np.frombuffer(cols.step, dtype=np.int64),
        np.frombuffer(cols.wall_time, dtype=np.float64),
        MetricCodes(np.frombuffer(cols.code, dtype=np.int32), np.asarray(cols.names, dtype=object)),
        np.frombuffer(cols.value, dtype=np.float64),
    )


def read_worst(run: LoadedRun) -> list[Worst]:
    """A spool run's worst-sequence tables (its ``worst.jsonl``), one per step (the last logged),
    by step; ``[]`` when it logged none."""
    run_dir = RunDir(run.location, run.run.run_id)
    return worst_store.latest_per_step(worst_store.read_worst_file(run_dir.path))


def read(refs: Sequence[str], *, jsonl_dir: str | Path) -> RunSet:
    """The registry's reader: ``_load_jsonl`` of the spool ``jsonl_dir``."""
    return _load_jsonl(refs, jsonl_dir)
