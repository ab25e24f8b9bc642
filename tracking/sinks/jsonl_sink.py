"""JSONL sink: an append-only local file per run, self-describing; also the tracker's spool.

``<root>/<run_id>/run.json`` holds ``{"run_id", "run_name", "backend", "config", "started",
"status"}`` (plus ``experiment``, ``ended`` and per-sink replay state under ``sinks``) and
``<root>/<run_id>/points.jsonl`` one line per point. See ``tracking.spool`` for the full layout.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from tracking.sinks.base import RUNNING, Point, RunInfo
from tracking.spool import RunDir, encode_points


class JsonlSink:
    """Appends points to ``<root>/<run_id>/points.jsonl``; ``flush`` makes them durable.

    ``fsync=True`` (default) fsyncs on every ``flush`` (once per flush interval), so a power
    loss, not only a process crash, keeps everything flushed.
    """

    name = "jsonl"

    def __init__(self, root: str | os.PathLike[str] = ".cliptrack", *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self.run_dir: RunDir | None = None
        self._fh: BinaryIO | None = None
        self._offset = 0
        self.points_written = 0

    @property
    def location(self) -> str:
        where = self.run_dir.path if self.run_dir is not None else self.root
        return f"jsonl {where}"

    @property
    def offset(self) -> int:
        """Bytes of points.jsonl written so far (including any from before ``open``)."""
        return self._offset

    def check_key(self, key: str) -> None:
        return None

    def open(self, run: RunInfo, state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        self.run_dir = RunDir(self.root, run.run_id)
        self.run_dir.path.mkdir(parents=True, exist_ok=True)
        self.run_dir.update_meta(
            run_id=run.run_id,
            run_name=run.run_name,
            backend=run.backend_label,
            config=run.config,
            started=run.started,
            status=RUNNING,
            experiment=run.experiment,
        )
        self._fh = open(self.run_dir.points_path, "ab")
        self._offset = self._fh.tell()
        return {"root": str(self.root.resolve())}

    def append(self, points: Sequence[Point]) -> list[int]:
        """Append ``points``; return the byte offset just past each one's line."""
        if self._fh is None:
            raise RuntimeError("JsonlSink.append before open()")
        lines = encode_points(list(points))
        ends = []
        offset = self._offset
        for line in lines:
            offset += len(line)
            ends.append(offset)
        self._fh.write(b"".join(lines))
        self._offset = offset
        self.points_written += len(lines)
        return ends

    def write(self, points: Sequence[Point]) -> None:
        self.append(points)
        self.flush()

    def flush(self) -> None:
        """Hand buffered lines to the OS, and fsync them when ``fsync`` is set."""
        if self._fh is not None:
            self._fh.flush()
            if self.fsync:
                os.fsync(self._fh.fileno())

    def close(self, status: str) -> None:
        if self._fh is not None:
            self.flush()
            self._fh.close()
            self._fh = None
        if self.run_dir is not None:
            self.run_dir.update_meta(status=status, ended=time.time())
