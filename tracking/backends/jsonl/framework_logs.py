"""The runs frameworks logged with their own loggers, read beside a spool's runs (``--jsonl DIR``):
verl's file and console logs (:mod:`cliptrack.backends.jsonl.verl_log`) and TRL's trainer state
(:mod:`cliptrack.backends.jsonl.trl_state`). Each file found is one run."""

from __future__ import annotations

from pathlib import Path

from cliptrack.backends.catalog import RunEntry
from cliptrack.backends.jsonl import trl_state, verl_log
from cliptrack.store.frame import LoadedRun
from cliptrack.store.records import Point

__all__ = ["entry", "find", "read"]


def find(directory: Path) -> list[Path]:
    """verl's log files, then TRL's state files, of ``directory`` (each reader's own search)."""
    return verl_log.find_logs(directory) + trl_state.find_states(directory)


def _is_trl(path: Path) -> bool:
    return path.name == trl_state.STATE_FILE


def read(path: Path) -> tuple[LoadedRun, list[Point]]:
    """The run of one file :func:`find` gave, and its points."""
    return trl_state.read_state(path) if _is_trl(path) else verl_log.read_log(path)


def entry(path: Path) -> RunEntry:
    """The run of one file :func:`find` gave, as ``cliptrack runs`` lists it (its steps: the
    points read)."""
    info, points = read(path)
    return RunEntry(
        cliptrack_id=info.run.run_id,
        store_id=str(path),
        name=info.run.run_name,
        backend=info.run.backend_label or "",
        status=info.run.status,
        started=info.run.started,
        steps=len(points),
        experiment=info.run.experiment,
    )
