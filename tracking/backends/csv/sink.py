"""The CSV sink: every point of a run appended to ``<dir>/<run_id>.csv`` (``csv.format``).

Local and small: a batch is appended in one write and flushed to disk; the run rows (name,
backend label, experiment, config, status) are appended on open, on a config update and on close.
A resumed run (a later process, ``cliptrack replay``) appends to the same file.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cliptrack.backends.base import Sink, SinkError
from cliptrack.backends.csv.format import DEFAULT_DIR, HEADER, RUN_PREFIX, run_file
from cliptrack.core import secrets
from cliptrack.store.records import Point, RunInfo


class CsvSink(Sink):
    """Writes one CSV file per run in ``dir`` (default ``cliptrack-csv`` in the working directory,
    made absolute at construction so that replay finds the same place)."""

    name = "csv"

    def __init__(self, dir: str | os.PathLike[str] | None = None) -> None:
        self.dir = str(Path(os.path.expanduser(dir or DEFAULT_DIR)).resolve())
        self.path: Path | None = None

    @classmethod
    def from_spec(cls, argument: str | None, options: Mapping[str, Any]) -> CsvSink:
        """``"csv"`` (the ``dir`` option, else ``cliptrack-csv``) or ``"csv:<dir>"``."""
        return cls(argument or options.get("dir"))

    @classmethod
    def from_state(cls, state: Mapping[str, Any], **overrides: Any) -> CsvSink:
        """Rebuilt for replay: ``overrides["dir"]`` (``--csv-dir``) or the recorded directory."""
        return cls(overrides.get("dir") or state["dir"])

    @property
    def location(self) -> str:
        return f"csv {self.path or self.dir}"

    def settings(self) -> dict[str, Any]:
        return {"dir": self.dir}

    def open(self, run: RunInfo, state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        path = run_file(self.dir, run.run_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fresh = not path.exists() or path.stat().st_size == 0
            rows: list[Sequence[Any]] = [HEADER] if fresh else []
            rows += [("", RUN_PREFIX + field, value, run.started) for field, value in _run_fields(run)]
            self.path = path
            self._append(rows)
        except OSError as exc:
            raise SinkError(f"cannot open CSV file {str(path)!r}: {exc}") from exc
        return self.settings()

    def write(self, points: Sequence[Point]) -> None:
        self._append(
            (point.step, key, repr(float(value)), repr(float(point.wall_time)))
            for point in points
            for key, value in point.metrics.items()
        )

    def log_config(self, config: Mapping[str, Any]) -> None:
        self._append([("", RUN_PREFIX + "config", _config_text(config), repr(time.time()))])

    def close(self, status: str) -> None:
        self._append([("", RUN_PREFIX + "status", status, repr(time.time()))])

    def _append(self, rows: Iterable[Sequence[Any]]) -> None:
        """``rows`` appended in one write, flushed to disk; SinkError when the file cannot take them."""
        if self.path is None:
            raise SinkError("the CSV run file is not open")
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(rows)
        try:
            with open(self.path, "a", encoding="utf-8", newline="") as fh:
                fh.write(text.getvalue())
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            raise SinkError(f"cannot write CSV file {str(self.path)!r}: {exc}") from exc


def _config_text(config: Mapping[str, Any]) -> str:
    """The config as JSON, credentials in it redacted (``cliptrack.core.secrets``)."""
    return secrets.redact(json.dumps(config, sort_keys=True, default=str))


def _run_fields(run: RunInfo) -> list[tuple[str, str]]:
    return [
        ("name", run.run_name),
        ("backend", run.backend_label or ""),
        ("experiment", run.experiment),
        ("config", _config_text(run.config)),
        ("status", run.status),
    ]
