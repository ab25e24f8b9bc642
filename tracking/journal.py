"""points.jsonl, the journal of a run: the only code that writes or parses it.

A line is ``{"step": int, "wall_time": float, "metrics": {...}}`` ending in a newline; non-finite
values are written as the JSON extensions ``NaN``, ``Infinity``, ``-Infinity`` (what Python's
``json`` reads). A position in the journal is a ``Position``: ``points`` complete lines ending
``offset`` bytes into the file, with the ``fingerprint`` of the bytes just before it, so that a
position recorded by one process (an acknowledgement, run.json) can be checked against the file
another process finds: a journal that was shortened, replaced or rewritten no longer matches.

Writes (``Journal``) are atomic per batch: a batch is written at the journal's known end with
``pwrite`` and fsynced; if any part fails (a full disk), the file is cut back to the end it had,
and the batch is written again, whole, at that same offset later. A torn tail (a crash mid-write)
is cut off when the journal is opened again, so that a new line is never glued to a torn one. The
journal belongs to the process that opened it: in a forked child ``close`` only closes the
child's copy of the descriptor (never cuts the file) and ``append`` refuses.

Readers stop at a line without its newline (being written, or torn), and skip and report a damaged
complete line (``DamagedLine``, naming its byte offset or line number).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracking.records import Point, RawPoint

_READ_CHUNK = 1 << 20
FINGERPRINT_BYTES = 4096
"""Bytes before a position that its fingerprint covers."""

PointErrors = (ValueError, KeyError, TypeError, AttributeError)
"""What parsing a line that is not a point raises."""


class DamagedLine(UserWarning):
    """A journal line that is not a point (a torn or overwritten write); it is skipped."""


@dataclass(frozen=True)
class Position:
    """``points`` complete lines, ending ``offset`` bytes into points.jsonl; ``fingerprint``: the
    hash of the ``FINGERPRINT_BYTES`` before ``offset`` ("" when not recorded)."""

    points: int = 0
    offset: int = 0
    fingerprint: str = field(default="", compare=False)


# ---- one line ------------------------------------------------------------------------------------
def encode_points(points: Sequence[RawPoint] | Sequence[Point]) -> list[bytes]:
    """Each point as one journal line (bytes, newline-terminated)."""
    dumps = json.dumps
    return [
        (f'{{"step": {p[0]}, "wall_time": {dumps(p[1])}, "metrics": {dumps(p[2])}}}\n').encode()
        for p in points
    ]


def parse_line(line: bytes) -> Point:
    """The point of one journal line; ValueError / KeyError / TypeError when it is not one."""
    return Point.from_json(json.loads(line))


def decode(
    data: bytes, start: int, on_damaged: Callable[[int, BaseException], None]
) -> tuple[list[Point], list[int]]:
    """The points of ``data`` (whole lines read from journal byte ``start``) and the offset just past
    each; ``on_damaged(line start, error)`` is called for each line that is not a point."""
    points: list[Point] = []
    ends: list[int] = []
    position = start
    for line in data.splitlines(keepends=True):
        position += len(line)
        try:
            points.append(parse_line(line))
        except PointErrors as exc:
            on_damaged(position - len(line), exc)
            continue
        ends.append(position)
    return points, ends


# ---- reading -------------------------------------------------------------------------------------
def lines(path: Path, offset: int = 0) -> Iterator[tuple[int, bytes, int]]:
    """``(line number, line, end offset)`` from byte ``offset`` (numbers count from there); the
    last line may lack its newline."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return
    with fh:
        fh.seek(offset)
        position = offset
        for number, line in enumerate(fh, start=1):
            position += len(line)
            yield number, line, position


def read_points(
    path: Path, offset: int, end: int | None, on_damaged: Callable[[int, BaseException], None]
) -> Iterator[tuple[Point, int]]:
    """``(point, end offset)`` for each complete line from byte ``offset`` up to ``end``."""
    for _number, line, position in lines(path, offset):
        if not line.endswith(b"\n") or (end is not None and position > end):
            return
        try:
            point = parse_line(line)
        except PointErrors as exc:
            on_damaged(position - len(line), exc)
            continue
        yield point, position


def read_lines(path: Path, offset: int, end: int, limit: int) -> bytes:
    """The journal's bytes from ``offset`` up to ``end``: at most ``limit`` whole lines."""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return b""
    out: list[bytes] = []
    with fh:
        fh.seek(offset)
        left = max(0, end - offset)
        for line in fh:
            if len(line) > left or not line.endswith(b"\n"):
                break
            out.append(line)
            left -= len(line)
            if len(out) >= limit:
                break
    return b"".join(out)


def count_points(path: Path, offset: int = 0, end: int | None = None) -> int:
    """Complete lines between byte ``offset`` and ``end`` (fast: no parsing)."""
    try:
        fh = open(path, "rb")
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


def fingerprint(path: Path, offset: int) -> str:
    """The hash of the ``FINGERPRINT_BYTES`` of the journal before byte ``offset`` ("" at 0 or
    when the file is shorter than ``offset``)."""
    if offset <= 0:
        return ""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return ""
    try:
        start = max(0, offset - FINGERPRINT_BYTES)
        data = os.pread(fd, offset - start, start)
    finally:
        os.close(fd)
    if len(data) != offset - start:
        return ""
    return hashlib.sha256(data).hexdigest()[:32]


def end(path: Path) -> Position:
    """The journal's complete lines and the offset just past the last one (a torn tail is not
    part of the journal), with its fingerprint."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return Position()
    try:
        stop = last_newline_end(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    return Position(count_points(path, 0, stop), stop, fingerprint(path, stop))


def mismatch(path: Path, recorded: Position) -> str | None:
    """Why ``recorded`` (a position saved by some process) is not a position of the journal at
    ``path`` now; None when it is."""
    if recorded.offset == 0:
        return None if recorded.points == 0 else f"{recorded.points} points recorded at byte 0"
    found = end(path)
    if recorded.offset > found.offset:
        return (
            f"recorded up to byte {recorded.offset} ({recorded.points} points), but the journal ends "
            f"at byte {found.offset} ({found.points} points): it was shortened or replaced"
        )
    if recorded.fingerprint and recorded.fingerprint != fingerprint(path, recorded.offset):
        return f"the journal's bytes before byte {recorded.offset} changed: it was replaced or rewritten"
    lines_there = count_points(path, 0, recorded.offset)
    if lines_there != recorded.points:
        return (
            f"recorded {recorded.points} points up to byte {recorded.offset}, but the journal holds "
            f"{lines_there} lines there"
        )
    return None


def load_points(path: Path, *, strict: bool = False) -> list[Point]:
    """Every point of the journal, each line checked, for reading a run back whole.

    A line that is not JSON is skipped with a ``DamagedLine`` warning naming ``<path>:<line>``
    (``strict``: only a last line without its newline, torn by a crash, is; any other raises
    ValueError). A JSON line that is not a cliptrack point raises ValueError naming it. Blank lines
    are skipped. Metric values are kept as read (not converted), so that the caller can name one
    that is not a number.
    """
    points: list[Point] = []
    for number, raw, _end in lines(path):
        line = raw.decode("utf-8", errors="replace").removesuffix("\n").removesuffix("\r")
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            torn = not raw.endswith(b"\n")
            if strict and not torn:
                raise ValueError(f"{path}:{number}: damaged line ({exc})") from exc
            what = "incomplete last line" if torn else "damaged line"
            warnings.warn(f"{path}:{number}: {what} skipped ({exc})", DamagedLine, stacklevel=2)
            continue
        points.append(_checked_point(path, number, record))
    return points


def _checked_point(path: Path, number: int, record: Any) -> Point:
    try:
        return Point(int(record["step"]), float(record["wall_time"]), dict(record["metrics"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{path}:{number}: not a cliptrack point "
            '({"step": int, "wall_time": float, "metrics": {...}}): ' + f"{exc}"
        ) from exc


def load_records(path: Path) -> list[dict[str, Any]] | None:
    """Every line of a well-formed journal as its JSON object, parsed in one ``json.loads`` (fast);
    None when the file is not well-formed that way (read it with ``load_points``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    rows = [line for line in text.splitlines() if line.strip()]
    try:
        records = json.loads("[" + ",".join(rows) + "]")
    except ValueError:
        return None
    if len(records) != len(rows) or not all(isinstance(r, dict) for r in records):
        return None
    return records


# ---- writing -------------------------------------------------------------------------------------
class Journal:
    """The append side of points.jsonl, for the one process that holds the run's ``jsonl`` lock.

    ``append`` writes a whole batch at the journal's end or nothing: on failure the file is cut
    back, and the next ``append`` writes at the same offset. ``fsync=True`` (default) makes every
    batch durable before ``append`` returns (a power loss keeps it too).
    """

    def __init__(self, target: Path | Any, *, fsync: bool = True) -> None:
        """``target``: the journal's path, or a run directory (its ``points_path``)."""
        self.path = Path(getattr(target, "points_path", target))
        self.fsync = fsync
        self.points = 0
        """Points in the journal (all processes' lines, counted at open)."""
        self.offset = 0
        """Bytes of whole lines in the journal: where the next batch goes."""
        self._fd: int | None = None
        self._pid = os.getpid()

    @property
    def location(self) -> str:
        return str(self.path)

    def position(self) -> Position:
        """Where the journal ends now (with its fingerprint)."""
        return Position(self.points, self.offset, fingerprint(self.path, self.offset))

    def open(self) -> None:
        """Open (creating) points.jsonl; cut off a torn last line left by a crash."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            good = last_newline_end(fd, size)
            if good != size:
                os.ftruncate(fd, good)
                os.fsync(fd)
                warnings.warn(
                    f"{self.path}: a torn last line ({size - good} bytes) was cut off",
                    DamagedLine,
                    stacklevel=2,
                )
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._pid = fd, os.getpid()
        self.offset = good
        self.points = count_points(self.path, 0, good)

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
        if os.getpid() != self._pid:
            raise RuntimeError(f"{self.path} belongs to process {self._pid}: a forked child never writes it")
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
        """Close the journal; in its owner process, first cut off garbage a failed cut-back left."""
        if self._fd is None:
            return
        try:
            if os.getpid() == self._pid and os.fstat(self._fd).st_size > self.offset:
                os.ftruncate(self._fd, self.offset)
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None


def _pwrite(fd: int, data: memoryview, offset: int) -> int:
    """``os.pwrite``, one call (a seam for fault-injection tests)."""
    return os.pwrite(fd, data, offset)


def last_newline_end(fd: int, size: int) -> int:
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
