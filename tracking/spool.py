"""The on-disk run directory: the JSONL log of every point, and how far each sink has got.

Layout (``root`` is the tracker's ``spool_dir``, or the directory named by a ``jsonl`` backend)::

    <root>/<run_id>/run.json           run metadata (keys.RUN_META_FILE) + sinks.<name> replay state
    <root>/<run_id>/points.jsonl       every point, append-only, in logging order (keys.POINTS_FILE)
    <root>/<run_id>/acked-<sink>.json  {"points": n, "offset": bytes}: the first n points (the first
                                       ``offset`` bytes of points.jsonl) are acknowledged by <sink>
    <root>/<run_id>/<sink>.lock        flock held while a process writes <sink> for this run

``points.jsonl`` is the spool: whatever a sink has not acknowledged is the tail of that file past
its ``acked`` offset, so nothing is stored twice and nothing needs to be discarded. ``cliptrack
replay`` pushes those tails. A line is ``{"step": int, "wall_time": float, "metrics": {...}}``;
non-finite values are written as the JSON extensions ``NaN``, ``Infinity``, ``-Infinity`` (what
Python's ``json`` reads back). A torn last line (a crash mid-write) is ignored by readers.
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from tracking import keys
from tracking.sinks.base import Point

try:  # POSIX advisory locks; where absent, replay cannot tell a live run and trusts the caller
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Ack:
    """How far a sink has got: ``points`` lines, ending ``offset`` bytes into points.jsonl."""

    points: int = 0
    offset: int = 0


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` via a temporary file and an atomic rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=1, sort_keys=True, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def encode_points(points: list[Point]) -> list[bytes]:
    """Each point as one JSONL line (bytes, newline-terminated)."""
    return [(json.dumps(p.to_json()) + "\n").encode() for p in points]


class RunDir:
    """One run's directory under ``root``; safe to share between the threads of one process."""

    def __init__(self, root: str | os.PathLike[str], run_id: str) -> None:
        self.root = Path(root)
        self.run_id = run_id
        self.path = self.root / run_id
        self.meta_path = self.path / keys.RUN_META_FILE
        self.points_path = self.path / keys.POINTS_FILE
        self._lock = threading.Lock()
        self._locks: dict[str, BinaryIO] = {}

    # ---- run.json ------------------------------------------------------------------------------
    def read_meta(self) -> dict[str, Any]:
        """The run's metadata; ``{}`` if run.json does not exist yet."""
        try:
            with open(self.meta_path, encoding="utf-8") as fh:
                return dict(json.load(fh))
        except FileNotFoundError:
            return {}

    def update_meta(self, **fields: Any) -> dict[str, Any]:
        """Merge ``fields`` into run.json (``sinks`` is merged per sink) and return the result."""
        with self._lock:
            meta = self.read_meta()
            sinks = fields.pop("sinks", None)
            meta.update(fields)
            if sinks:
                merged = dict(meta.get("sinks") or {})
                for name, state in sinks.items():
                    merged[name] = {**(merged.get(name) or {}), **state}
                meta["sinks"] = merged
            self.path.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.meta_path, meta)
            return meta

    # ---- acknowledgements ----------------------------------------------------------------------
    def ack_path(self, sink: str) -> Path:
        return self.path / f"acked-{sink}.json"

    def read_ack(self, sink: str) -> Ack:
        try:
            with open(self.ack_path(sink), encoding="utf-8") as fh:
                obj = json.load(fh)
            return Ack(int(obj["points"]), int(obj["offset"]))
        except FileNotFoundError:
            return Ack()

    def write_ack(self, sink: str, ack: Ack) -> None:
        write_json_atomic(self.ack_path(sink), {"points": ack.points, "offset": ack.offset})

    def journal_size(self) -> int:
        """Bytes in points.jsonl (0 when absent)."""
        try:
            return self.points_path.stat().st_size
        except FileNotFoundError:
            return 0

    # ---- reading points back -------------------------------------------------------------------
    def _lines(self, offset: int = 0) -> Iterator[tuple[bytes, int]]:
        """Yield ``(line, end_offset)`` for each line of points.jsonl from byte ``offset``; the last
        line may lack its newline (a torn tail)."""
        try:
            fh = open(self.points_path, "rb")
        except FileNotFoundError:
            return
        with fh:
            fh.seek(offset)
            position = offset
            for line in fh:
                position += len(line)
                yield line, position

    def read_points(self, offset: int = 0, end: int | None = None) -> Iterator[tuple[Point, int]]:
        """Yield ``(point, end_offset)`` for each complete line from byte ``offset`` up to ``end``.

        Stops silently at a line without its newline (a writer died mid-line, or is still writing).
        """
        for line, position in self._lines(offset):
            if not line.endswith(b"\n"):
                return  # torn tail: the writer died mid-line
            if end is not None and position > end:
                return
            yield Point.from_json(json.loads(line)), position

    def load_points(self) -> list[Point]:
        """Every point of points.jsonl, each line checked, for reading a run back whole.

        A last line that is not a point (a crash mid-write) is skipped with a warning; any other bad
        line raises ValueError naming ``<points.jsonl>:<line number>``. Blank lines are skipped.
        Metric values are kept as read (not converted to float), so that the caller can name one
        that is not a number.
        """
        lines = [line.decode("utf-8").removesuffix("\n").removesuffix("\r") for line, _ in self._lines()]
        points: list[Point] = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                point = Point(int(record["step"]), float(record["wall_time"]), dict(record["metrics"]))
            except (ValueError, KeyError, TypeError) as exc:
                if number == len(lines):
                    # A crash while writing leaves at most the last line incomplete; everything before it stands.
                    warnings.warn(f"{self.points_path}:{number}: incomplete last line skipped ({exc})",
                                  stacklevel=2)
                    continue
                raise ValueError(
                    f"{self.points_path}:{number}: not a cliptrack point "
                    '({"step": int, "wall_time": float, "metrics": {...}}): ' + f"{exc}"
                ) from exc
            points.append(point)
        return points

    # ---- live-writer locks ---------------------------------------------------------------------
    def lock_sink(self, sink: str) -> bool:
        """Take the per-sink write lock for this process; False if another process holds it."""
        if fcntl is None:
            return True
        self.path.mkdir(parents=True, exist_ok=True)
        fh = open(self.path / f"{sink}.lock", "wb")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            return False
        self._locks[sink] = fh
        return True

    def unlock_sink(self, sink: str) -> None:
        fh = self._locks.pop(sink, None)
        if fh is not None:
            if fcntl is not None:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
            fh.close()


def spool_runs(root: str | os.PathLike[str]) -> list[RunDir]:
    """The run directories directly under the spool directory ``root`` (those holding a run.json),
    sorted by name (the run id); ``[]`` when ``root`` is not a directory."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = [RunDir(base, p.name) for p in base.iterdir() if (p / keys.RUN_META_FILE).is_file()]
    return sorted(found, key=lambda r: r.run_id)


def run_dirs(root: str | os.PathLike[str]) -> list[RunDir]:
    """Every run directory under ``root`` (those holding a run.json; ``root`` itself if it is one),
    oldest first."""
    base = Path(root)
    if (base / keys.RUN_META_FILE).is_file():  # root is itself a run directory
        return [RunDir(base.parent, base.name)]
    return sorted(spool_runs(base), key=lambda r: (r.read_meta().get("started") or 0, r.run_id))


def pending(run: RunDir, sink: str) -> tuple[int, int]:
    """``(points, bytes)`` of points.jsonl that ``sink`` has not acknowledged."""
    ack = run.read_ack(sink)
    count = sum(1 for _ in run.read_points(ack.offset))
    return count, max(0, run.journal_size() - ack.offset)


def sink_states(meta: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``run.json``'s per-sink replay states (``{}`` when none)."""
    return {name: dict(state) for name, state in (meta.get("sinks") or {}).items()}
