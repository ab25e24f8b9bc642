"""A CSV backend directory's runs as ``cliptrack runs`` lists them (``RunEntry``)."""

from __future__ import annotations

from pathlib import Path

from cliptrack.backends.catalog import RunEntry
from cliptrack.backends.csv.format import run_files
from cliptrack.backends.csv.reader import entry, read_run_file


def csv_entries(directory: str | Path) -> list[RunEntry]:
    """Every run of a CSV backend directory."""
    return [entry(read_run_file(path)) for path in run_files(directory)]


def list_runs(*, include_comparisons: bool = False, csv_dir: str | Path) -> list[RunEntry]:
    """The registry's listing: ``csv_entries`` of ``csv_dir`` (a CSV directory holds no comparison runs)."""
    return csv_entries(csv_dir)
