"""The spool: each run's directory on disk, its journal of points and how far each sink has got.

Layout (``root`` is the tracker's ``spool_dir``, or the directory named by a ``jsonl`` backend)::

    <root>/<run_id>/run.json           run metadata (``RunInfo.to_meta``) + sinks.<name> replay state
    <root>/<run_id>/points.jsonl       the journal: every point, append-only, in logging order
    <root>/<run_id>/acked-<sink>.json  {"points": n, "offset": bytes}: the journal up to byte
                                       ``offset`` (its first n lines) is acknowledged by <sink>
    <root>/<run_id>/<sink>.lock        flock held while a process writes <sink> for this run

The journal is the only copy of a point that is not yet in a backend: what a sink has not
acknowledged is the tail of points.jsonl past its ``acked`` offset. Acknowledgements are byte
offsets into the journal, so they stay true across processes (a resumed run appends to the same
file). A line is ``{"step": int, "wall_time": float, "metrics": {...}}``; non-finite values are
written as the JSON extensions ``NaN``, ``Infinity``, ``-Infinity`` (what Python's ``json`` reads).

Writes are atomic per batch: a batch is written at the journal's known end with ``pwrite`` and
fsynced; if any part fails (a full disk), the file is cut back to the end it had, and the batch is
written again, whole, at that same offset later. A torn tail (a crash mid-write) is cut off when the
run is opened again, so a new line is never glued to a torn one. Readers skip and report a damaged
line (``path:N``) and go on.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from tracking import keys
from tracking.records import Point, RawPoint, RunInfo, check_run_id

try:  # POSIX advisory locks; where absent, replay cannot tell a live run and trusts the caller
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

_READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class Ack:
    """How far a sink has got: ``points`` lines, ending ``offset`` bytes into points.jsonl."""

    points: int = 0
    offset: int = 0


class DamagedLine(UserWarning):
    """A journal line that is not a point (a torn or overwritten write); it is skipped."""


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` via a temporary file and an atomic rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=1, sort_keys=True, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def encode_points(points: Sequence[RawPoint] | Sequence[Point]) -> list[bytes]:
    """Each point as one JSONL line (bytes, newline-terminated)."""
    dumps = json.dumps
    return [
        (f'{{"step": {p[0]}, "wall_time": {dumps(p[1])}, "metrics": {dumps(p[2])}}}\n').encode()
        for p in points
    ]


def parse_line(line: bytes) -> Point:
    """The point of one journal line; ValueError / KeyError / TypeError when it is not one."""
    return Point.from_json(json.loads(line))


class RunDir:
    """One run's directory under ``root``; safe to share between the threads of one process."""

    def __init__(self, root: str | os.PathLike[str], run_id: str) -> None:
        self.root = Path(root)
        self.run_id = check_run_id(run_id)
        self.path = self.root / run_id
        self.meta_path = self.path / keys.RUN_META_FILE
        self.points_path = self.path / keys.POINTS_FILE
        self._lock = threading.RLock()  # reentrant: a signal handler may update run.json mid-update
        self._locks: dict[str, BinaryIO] = {}
        self._reported: set[int] = set()

    # ---- run.json ------------------------------------------------------------------------------
    def read_meta(self) -> dict[str, Any]:
        """The run's metadata; ``{}`` if run.json does not exist yet."""
        try:
            with open(self.meta_path, encoding="utf-8") as fh:
                return dict(json.load(fh))
        except FileNotFoundError:
            return {}

    def read_run(self) -> RunInfo:
        """The run run.json describes (the directory name fills in a missing id)."""
        return RunInfo.from_meta(self.read_meta(), self.run_id)

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

    def sink_states(self) -> dict[str, dict[str, Any]]:
        """run.json's per-sink replay states (``{}`` when none)."""
        return sink_states(self.read_meta())

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
        except (ValueError, KeyError, TypeError):
            warnings.warn(
                f"{self.ack_path(sink)} is damaged; {sink} starts over from the journal's start",
                DamagedLine,
                stacklevel=2,
            )
            return Ack()

    def write_ack(self, sink: str, ack: Ack) -> None:
        write_json_atomic(self.ack_path(sink), {"points": ack.points, "offset": ack.offset})

    def journal_size(self) -> int:
        """Bytes in points.jsonl (0 when absent)."""
        try:
            return self.points_path.stat().st_size
        except FileNotFoundError:
            return 0

    def journal_end(self) -> Ack:
        """Complete lines of points.jsonl and the byte offset just past the last one (a torn
        tail left by a crash is not part of the journal)."""
        try:
            fd = os.open(self.points_path, os.O_RDONLY)
        except FileNotFoundError:
            return Ack()
        try:
            end = _last_newline_end(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        return Ack(self.count_points(0, end), end)

    # ---- reading points back -------------------------------------------------------------------
    def _lines(self, offset: int = 0) -> Iterator[tuple[int, bytes, int]]:
        """Yield ``(line number, line, end offset)`` from byte ``offset`` (line numbers count from
        there); the last line may lack its newline (a torn tail, or a line being written)."""
        try:
            fh = open(self.points_path, "rb")
        except FileNotFoundError:
            return
        with fh:
            fh.seek(offset)
            position = offset
            for number, line in enumerate(fh, start=1):
                position += len(line)
                yield number, line, position

    def read_points(self, offset: int = 0, end: int | None = None) -> Iterator[tuple[Point, int]]:
        """Yield ``(point, end_offset)`` for each complete line from byte ``offset`` up to ``end``.

        Stops at a line without its newline (being written, or torn by a crash); a damaged
        complete line is skipped with one ``DamagedLine`` warning naming its byte offset.
        """
        for _number, line, position in self._lines(offset):
            if not line.endswith(b"\n"):
                return
            if end is not None and position > end:
                return
            try:
                point = parse_line(line)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                self.report_damaged(position - len(line), exc)
                continue
            yield point, position

    def read_lines(self, offset: int, end: int, limit: int) -> bytes:
        """The journal's bytes from ``offset`` up to ``end``: at most ``limit`` whole lines."""
        try:
            fh = open(self.points_path, "rb")
        except FileNotFoundError:
            return b""
        out: list[bytes] = []
        count = 0
        with fh:
            fh.seek(offset)
            left = max(0, end - offset)
            for line in fh:
                if len(line) > left or not line.endswith(b"\n"):
                    break
                out.append(line)
                left -= len(line)
                count += 1
                if count >= limit:
                    break
        return b"".join(out)

    def report_damaged(self, start: int, exc: BaseException) -> None:
        """Warn once (``DamagedLine``) about the damaged line at byte ``start``."""
        if start in self._reported:
            return
        self._reported.add(start)
        warnings.warn(
            f"{self.points_path} at byte {start}: damaged line skipped ({exc})", DamagedLine, stacklevel=3
        )

    def count_points(self, offset: int = 0, end: int | None = None) -> int:
        """Complete lines of points.jsonl between byte ``offset`` and ``end`` (fast: no parsing)."""
        try:
            fh = open(self.points_path, "rb")
        except FileNotFoundError:
            return 0
        count = 0
        with fh:
            fh.seek(offset)
            left = None if end is None else max(0, end - offset)
            while left is None or left > 0:
                chunk = fh.read(_READ_CHUNK if left is None else min(_READ_CHUNK, left))
                if not chunk:
                    break
                count += chunk.count(b"\n")
                if left is not None:
                    left -= len(chunk)
        return count

    def load_points(self) -> list[Point]:
        """Every point of points.jsonl, each line checked, for reading a run back whole.

        A line that is not JSON (torn by a crash or a full disk) is skipped with a warning naming
        ``<points.jsonl>:<line number>``; a JSON line that is not a cliptrack point raises ValueError
        naming it (the file is not a cliptrack journal). Blank lines are skipped. Metric values are
        kept as read (not converted to float), so that the caller can name one that is not a number.
        """
        points: list[Point] = []
        for number, raw, _end in self._lines():
            line = raw.decode("utf-8", errors="replace").removesuffix("\n").removesuffix("\r")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                what = "incomplete last line" if not raw.endswith(b"\n") else "damaged line"
                warnings.warn(f"{self.points_path}:{number}: {what} skipped ({exc})", stacklevel=2)
                continue
            try:
                point = Point(int(record["step"]), float(record["wall_time"]), dict(record["metrics"]))
            except (ValueError, KeyError, TypeError) as exc:
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


class Journal:
    """The append side of points.jsonl, for the one process that holds the run's ``jsonl`` lock.

    ``append`` writes a whole batch at the journal's end or nothing: on failure the file is cut
    back, and the next ``append`` writes at the same offset. ``fsync=True`` (default) makes every
    batch durable before ``append`` returns (a power loss keeps it too).
    """

    def __init__(self, run_dir: RunDir, *, fsync: bool = True) -> None:
        self.run_dir = run_dir
        self.fsync = fsync
        self.points = 0
        """Points in the journal (all processes' lines, counted at open)."""
        self.offset = 0
        """Bytes of whole lines in the journal: where the next batch goes."""
        self._fd: int | None = None

    @property
    def location(self) -> str:
        return str(self.run_dir.points_path)

    def open(self) -> None:
        """Open (creating) points.jsonl; cut off a torn last line left by a crash."""
        self.run_dir.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.run_dir.points_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            good = _last_newline_end(fd, size)
            if good != size:
                os.ftruncate(fd, good)
                os.fsync(fd)
                warnings.warn(
                    f"{self.run_dir.points_path}: a torn last line ({size - good} bytes) was cut off",
                    DamagedLine,
                    stacklevel=2,
                )
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.offset = good
        self.points = self.run_dir.count_points(0, good)

    def append(self, points: Sequence[RawPoint] | Sequence[Point]) -> bytes:
        """Write ``points`` as one batch at the journal's end; return the bytes written. Raises
        OSError with the journal unchanged (as far as the disk lets it be cut back) when the batch
        cannot be written whole."""
        data = b"".join(encode_points(points))
        self.append_encoded(data, len(points))
        return data

    def append_encoded(self, data: bytes, lines: int) -> None:
        """Write ``data`` (``lines`` whole encoded lines) as one batch at the journal's end, as
        ``append`` does (the writer holds batches the disk refused in this encoded form)."""
        if self._fd is None:
            raise RuntimeError("Journal.append before open()")
        start = self.offset
        try:
            written = 0
            view = memoryview(data)
            while written < len(data):
                count = _pwrite(self._fd, view[written:], start + written)
                if count <= 0:
                    raise OSError(errno.EIO, "short write")
                written += count
            if self.fsync:
                os.fsync(self._fd)
        except BaseException:
            self._cut_back(start)
            raise
        self.offset = start + len(data)
        self.points += lines

    def _cut_back(self, end: int) -> None:
        try:
            assert self._fd is not None
            os.ftruncate(self._fd, end)
        except OSError:
            pass  # the next append overwrites from ``end`` anyway, then truncates past itself

    def close(self) -> None:
        if self._fd is not None:
            try:
                if os.fstat(self._fd).st_size > self.offset:  # garbage left by a failed cut-back
                    os.ftruncate(self._fd, self.offset)
            except OSError:
                pass
            os.close(self._fd)
            self._fd = None


def _pwrite(fd: int, data: memoryview, offset: int) -> int:
    """``os.pwrite``, one call (a seam for fault-injection tests)."""
    return os.pwrite(fd, data, offset)


def _last_newline_end(fd: int, size: int) -> int:
    """Bytes of ``fd`` up to and including its last newline (0 when there is none)."""
    position = size
    while position > 0:
        start = max(0, position - 65536)
        chunk = os.pread(fd, position - start, start)
        index = chunk.rfind(b"\n")
        if index >= 0:
            return start + index + 1
        position = start
    return 0


def spool_runs(root: str | os.PathLike[str]) -> list[RunDir]:
    """The run directories directly under the spool directory ``root`` (those holding a run.json),
    sorted by name (the run id); ``[]`` when ``root`` is not a directory."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = []
    for p in base.iterdir():
        if (p / keys.RUN_META_FILE).is_file():
            try:
                found.append(RunDir(base, p.name))
            except ValueError:
                continue  # not a name the tracker writes
    return sorted(found, key=lambda r: r.run_id)


def run_dirs(root: str | os.PathLike[str]) -> list[RunDir]:
    """Every run directory under ``root`` (those holding a run.json; ``root`` itself if it is one),
    oldest first."""
    base = Path(root)
    if (base / keys.RUN_META_FILE).is_file():  # root is itself a run directory
        return [RunDir(base.parent, base.name)]

    def started(run: RunDir) -> float:
        try:
            return float(run.read_meta().get("started") or 0)
        except (ValueError, TypeError):
            return 0.0

    return sorted(spool_runs(base), key=lambda r: (started(r), r.run_id))


def pending(run: RunDir, sink: str) -> tuple[int, int]:
    """``(points, bytes)`` of points.jsonl that ``sink`` has not acknowledged."""
    ack = run.read_ack(sink)
    return run.count_points(ack.offset), max(0, run.journal_size() - ack.offset)


def sink_states(meta: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``run.json``'s per-sink replay states (``{}`` when none)."""
    return {name: dict(state) for name, state in (meta.get("sinks") or {}).items()}
