"""The JSONL spool's runs as ``cliptrack runs`` lists them (``RunEntry``)."""

from __future__ import annotations

from typing import Any

from cliptrack.backends.catalog import RunEntry
from cliptrack.backends.jsonl import framework_logs
from cliptrack.backends.jsonl.directory import spool_directory
from cliptrack.store.spool import spool_runs


def spool_entry(run_dir: Any) -> RunEntry:
    """A spool run directory (``cliptrack.store.spool.RunDir``) as listed; steps are its points' lines."""
    info = run_dir.read_run()
    steps = run_dir.count_points()  # complete lines, counted in bounded chunks (a FIFO refused)
    return RunEntry(
        cliptrack_id=info.run_id,
        store_id=info.run_id,
        name=info.run_name,
        backend=info.backend_label or "",
        status=info.status,
        started=info.started,
        steps=steps,
        experiment=info.experiment,
    )


def spool_entries(directory: str) -> list[RunEntry]:
    """Every run of a JSONL spool directory, and every run verl's or TRL's own logger wrote there
    (:mod:`cliptrack.backends.jsonl.framework_logs`), as ``catalog.RunEntry``."""
    root = spool_directory(directory)
    return [spool_entry(run_dir) for run_dir in spool_runs(root)] + [
        framework_logs.entry(p) for p in framework_logs.find(root)
    ]


def list_runs(*, include_comparisons: bool = False, jsonl_dir: str) -> list[RunEntry]:
    """The registry's listing: ``spool_entries`` of ``jsonl_dir`` (a spool holds no comparison runs)."""
    return spool_entries(jsonl_dir)
