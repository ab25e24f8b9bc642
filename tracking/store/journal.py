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

Hostile journals are read within bounds: only a regular file is opened (``cliptrack.store.files``:
a FIFO, a device or a symlink to one is refused, never read); a line longer than
``MAX_LINE_BYTES`` is skipped with a note and never held in memory whole; a line that parses but
is not a point the tracker could have written (nested too deeply for the parser, a step outside
0..``MAX_STEP``, a key longer than ``MAX_KEY_CHARS``) is a damaged line. The tracker refuses at
``log`` what would break these limits, so every line it writes is read back.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import warnings
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain, repeat
from pathlib import Path
from typing import Any

from cliptrack.core.text import printable
from cliptrack.core.validation import MAX_KEY_CHARS, MAX_STEP
from cliptrack.store.files import open_regular
from cliptrack.store.records import Point, RawPoint

_READ_CHUNK = 1 << 20
FINGERPRINT_BYTES = 4096
"""Bytes before a position that its fingerprint covers."""

MAX_LINE_BYTES = 16 * 2**20
"""Longest journal line (bytes, newline included) a reader takes: a point of 100,000 values under
100-character keys takes about 13 MB. ``log`` refuses a point whose line could be longer
(``line_bytes_bound``); a longer line in a journal is skipped with a note, read in bounded chunks."""

POINT_FRAME_BYTES = 96
"""Bytes of a line around its metrics, at most: ``{"step": `` + 19 digits + ``, "wall_time": `` + a
float (24) + ``, "metrics": {`` + ``}}`` and the newline (85)."""
VALUE_FRAME_BYTES = 28
"""Bytes of one metric's entry besides its key, at most: ``: `` + a float's repr (24) + ``, ``."""

PointErrors = (ValueError, KeyError, TypeError, AttributeError, RecursionError)
"""What parsing a line that is not a point raises (RecursionError: nested too deeply for ``json``)."""


def line_bytes_bound(values: int, key_bytes: int) -> int:
    """The most bytes a journal line of ``values`` metrics takes whose keys take ``key_bytes``
    bytes JSON-encoded (quotes included: ``encoded_key_bytes``)."""
    return POINT_FRAME_BYTES + values * VALUE_FRAME_BYTES + key_bytes


def encoded_key_bytes(key: str) -> int:
    """Bytes of ``key`` as the journal writes it (a JSON string, quotes included)."""
    return len(json.dumps(key))


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
    """The point of one journal line; ValueError / KeyError / TypeError when it is not one, or not
    one the tracker writes (``line_problem``)."""
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(_too_long(len(line)))
    try:
        record = json.loads(line)
    except RecursionError:
        raise ValueError("nested too deeply to parse") from None
    point = Point.from_json(record)
    problem = point_problem(point.step, point.metrics)
    if problem is not None:
        raise ValueError(problem)
    return point


def point_problem(step: int, metrics: Any, steps: tuple[int, int] = (0, MAX_STEP)) -> str | None:
    """Why a parsed point is not one the tracker writes (a step outside ``steps``, by default
    0..``MAX_STEP``; a key longer than ``MAX_KEY_CHARS``); None when it is one."""
    if not steps[0] <= step <= steps[1]:
        return f"step {step} is outside {steps[0]}..{steps[1]}"
    for key in metrics:
        if len(key) > MAX_KEY_CHARS:
            return f"a key of {len(key)} characters (at most {MAX_KEY_CHARS}): {printable(key[:40])}..."
    return None


def _too_long(size: int) -> str:
    return f"a line of {size} bytes, longer than the {MAX_LINE_BYTES}-byte limit of a journal line"


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
    last line may lack its newline. A line longer than ``MAX_LINE_BYTES`` is never read whole: it
    comes as ``b""`` (``end offset`` still past it; ``oversized`` says how long it was)."""
    try:
        fh = open_regular(path)
    except FileNotFoundError:
        return
    with fh:
        fh.seek(offset)
        position = offset
        number = 0
        while line := fh.readline(MAX_LINE_BYTES + 1):
            number += 1
            if len(line) > MAX_LINE_BYTES:
                length = len(line) + _skip_line(fh)
                position += length
                yield number, b"", position
                continue
            position += len(line)
            yield number, line, position


def _skip_line(fh: Any) -> int:
    """Read past the rest of the current line in bounded chunks; the bytes skipped."""
    skipped = 0
    while part := fh.readline(_READ_CHUNK):
        skipped += len(part)
        if part.endswith(b"\n"):
            break
    return skipped


def oversized(line: bytes, start: int, end: int) -> bool:
    """True for a line ``lines`` stood in for with ``b""`` (longer than ``MAX_LINE_BYTES``)."""
    return not line and end > start


def read_points(
    path: Path, offset: int, end: int | None, on_damaged: Callable[[int, BaseException], None]
) -> Iterator[tuple[Point, int]]:
    """``(point, end offset)`` for each complete line from byte ``offset`` up to ``end``."""
    start = offset
    for _number, line, position in lines(path, offset):
        line_start, start = start, position
        if end is not None and position > end:
            return
        if oversized(line, line_start, position):
            on_damaged(line_start, ValueError(_too_long(position - line_start)))
            continue
        if not line.endswith(b"\n"):
            return
        try:
            point = parse_line(line)
        except PointErrors as exc:
            on_damaged(line_start, exc)
            continue
        yield point, position


def read_lines(path: Path, offset: int, end: int, limit: int) -> bytes:
    """The journal's bytes from ``offset`` up to ``end``: at most ``limit`` whole lines."""
    try:
        fh = open_regular(path)
    except FileNotFoundError:
        return b""
    out: list[bytes] = []
    with fh:
        fh.seek(offset)
        left = max(0, end - offset)
        while line := fh.readline(min(left, MAX_LINE_BYTES) + 1):
            if len(line) > MAX_LINE_BYTES:  # not a line the tracker writes: alone, so that it is
                if out:  # reported and stepped over (``parse_line``) without the lines around it
                    break
                line += fh.readline(left - len(line) + 1)
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
        fh = open_regular(path)
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
        fh = open_regular(path)
    except FileNotFoundError:
        return ""
    with fh:
        start = max(0, offset - FINGERPRINT_BYTES)
        data = os.pread(fh.fileno(), offset - start, start)
    if len(data) != offset - start:
        return ""
    return hashlib.sha256(data).hexdigest()[:32]


def end(path: Path) -> Position:
    """The journal's complete lines and the offset just past the last one (a torn tail is not
    part of the journal), with its fingerprint."""
    try:
        fh = open_regular(path)
    except FileNotFoundError:
        return Position()
    with fh:
        stop = last_newline_end(fh.fileno(), os.fstat(fh.fileno()).st_size)
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

    A line that is not JSON, or not one the tracker writes (longer than ``MAX_LINE_BYTES``, nested
    too deeply, a step outside 0..``MAX_STEP``, a key longer than ``MAX_KEY_CHARS``), is skipped
    with a ``DamagedLine`` warning naming ``<path>:<line>`` and what is wrong (``strict``: only a
    last line without its newline, torn by a crash, is; any other raises ValueError). A JSON line
    that is not a cliptrack point raises ValueError naming it. Blank lines are skipped. Metric
    values are kept as read (not converted), so that the caller can name one that is not a number.
    """
    points: list[Point] = []
    start = 0
    for number, raw, end in lines(path):
        line_start, start = start, end
        point = _line_point(path, number, raw, end - line_start, strict, (0, MAX_STEP))
        if point is not None:
            points.append(point)
    return points


_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?|NaN|-?Infinity")
"""A JSON number, or one of the non-finite values the tracker writes (what ``json.loads`` reads)."""
_METRICS = b'"metrics": {'


def load_series(path: Path, key: str) -> tuple[array, array]:
    """The ``(steps, values)`` of one metric key through the journal (int64 and float64 arrays, in
    journal order), for a reference run read without the rest of its points: 16 bytes a value.

    A line the tracker wrote is read by its key's entry alone (``"<key>": <number>``, the key as the
    tracker encodes it, after ``"metrics": {``), a few string searches and no JSON parse: the other
    entries are not decoded, nor checked. Any other line (a key in another encoding, a non-number,
    the entry twice, an incomplete, damaged or oversized line) is read as ``load_points`` reads it:
    skipped with a ``DamagedLine`` warning when it is not a point, ValueError naming the line when
    the key's value is not a number. A key that does not start with a letter, a digit or ``_`` is
    read from every line that way."""
    encoded = json.dumps(key)
    needle = encoded.encode() + b": "
    fast = (key[:1].isalnum() or key[:1] == "_") and "\\" not in encoded[1:-1]
    steps, values = array("q"), array("d")
    add_step, add_value, read = steps.append, values.append, _fast_entry
    start = 0
    for number, raw, end in lines(path):
        line_start, start = start, end
        entry = read(raw, needle) if fast else None
        if entry is None:
            entry = _parsed_entry(path, number, raw, end - line_start, key)
        if isinstance(entry, tuple):
            add_step(entry[0])
            add_value(entry[1])
    return steps, values


def _fast_entry(raw: bytes, needle: bytes) -> tuple[int, float] | bool | None:
    """``(step, value)`` of a line the tracker wrote holding the key's entry once; False for one
    holding no entry of the key in any encoding; None for a line to parse."""
    if not raw.startswith(b'{"step": ') or not raw.endswith(b"}}\n"):
        return None
    metrics = raw.find(_METRICS)
    if metrics < 0:
        return None
    at = raw.find(needle, metrics + len(_METRICS) - 1)
    if at < 0:
        return False if raw.isascii() and b"\\u" not in raw else None
    if raw[at - 1] not in b"{ " or raw.find(needle, at + len(needle)) >= 0:
        return None
    begin = at + len(needle)
    stop = raw.find(b",", begin)
    close = raw.find(b"}", begin)
    stop = close if stop < 0 or 0 <= close < stop else stop
    step_end = raw.find(b",", 9)
    token, step_text = raw[begin:stop], raw[9:step_end]
    if len(token) > 32 or not _NUMBER.fullmatch(token) or not step_text.isdigit():
        return None
    step = int(step_text)
    if step > MAX_STEP:
        return None
    return step, float(token)


def _parsed_entry(path: Path, number: int, raw: bytes, size: int, key: str) -> tuple[int, float] | bool:
    """``(step, value)`` of line ``number`` parsed as ``load_points`` parses it; False when it has
    no entry of ``key`` or is skipped (reported); ValueError when the value is not a number."""
    point = _line_point(path, number, raw, size, False, (0, MAX_STEP))
    if point is None or key not in point.metrics:
        return False
    value = point.metrics[key]
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (type(value) is int and abs(value) > _FLOAT_MAX)
    ):
        raise ValueError(
            f"{printable(path)}:{number}: step {point.step}: metric {printable(repr(key))} has "
            f"non-numeric value {printable(repr(value)[:80])}"
        )
    return point.step, float(value)


INT64 = (-(2**63), 2**63 - 1)
"""The steps a comparison reads back (a store other than the journal may hold negative ones)."""


def _line_point(
    path: Path, number: int, raw: bytes, size: int, strict: bool, steps: tuple[int, int]
) -> Point | None:
    """The point of line ``number`` (``raw``, ``size`` bytes long: ``b""`` for an oversized one);
    None for a blank or skipped line (reported), ValueError for a line that is not a point."""
    torn = not raw.endswith(b"\n")
    if (not raw and size) or len(raw) > MAX_LINE_BYTES:
        return _damaged(path, number, _too_long(size), strict, torn=False)
    line = raw.decode("utf-8", errors="replace").removesuffix("\n").removesuffix("\r")
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except RecursionError:
        return _damaged(path, number, "nested too deeply to parse", strict, torn=False)
    except ValueError as exc:
        return _damaged(path, number, str(exc), strict, torn)
    point = _checked_point(path, number, record)
    problem = point_problem(point.step, point.metrics, steps)
    if problem is not None:
        return _damaged(path, number, problem, strict, torn=False)
    return point


def _damaged(path: Path, number: int, why: str, strict: bool, torn: bool) -> Point | None:
    """Report line ``number`` as skipped (a ``DamagedLine`` warning); ValueError when ``strict``
    and the line is not a torn last line."""
    if strict and not torn:
        raise ValueError(f"{printable(path)}:{number}: damaged line ({printable(why)})")
    what = "incomplete last line" if torn else "damaged line"
    warnings.warn(f"{printable(path)}:{number}: {what} skipped ({printable(why)})", DamagedLine, stacklevel=3)
    return None


def _checked_point(path: Path, number: int, record: Any) -> Point:
    try:
        step = record["step"]
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"step {step!r} is not an integer")
        return Point(step, float(record["wall_time"]), dict(record["metrics"]))
    except (ValueError, KeyError, TypeError, OverflowError) as exc:
        raise ValueError(
            f"{printable(path)}:{number}: not a cliptrack point "
            '({"step": int, "wall_time": float, "metrics": {...}}): ' + printable(exc)
        ) from exc


@dataclass
class JournalColumns:
    """A journal as compact columns, one entry per (point, metric) value in journal order:
    ``step`` (int64), ``wall_time`` (float64, unix seconds), ``code`` (int32, an index into
    ``names``: the metric keys in order of first appearance) and ``value`` (float64). A point
    without metrics has one entry, key ``""``, value NaN (it still carries its step's wall time).
    About 28 bytes an entry, where the journal spends about 40 on it."""

    step: array = field(default_factory=lambda: array("q"))
    wall_time: array = field(default_factory=lambda: array("d"))
    code: array = field(default_factory=lambda: array("i"))
    value: array = field(default_factory=lambda: array("d"))
    names: list[str] = field(default_factory=list)


_FLOAT_MAX = 1.7976931348623157e308

MAX_NOTES = 10
"""Skipped lines ``load_columns`` names one by one; the rest are counted in one more note."""


class _Codes(dict):  # type: ignore[type-arg]
    """Metric key -> code, a new key getting the next code (refused: one over ``MAX_KEY_CHARS``)."""

    def __init__(self, names: list[str]) -> None:
        super().__init__()
        self.names = names

    def __missing__(self, key: str) -> int:
        if len(key) > MAX_KEY_CHARS:
            raise _SlowPath
        code = self[key] = len(self.names)
        self.names.append(key)
        return code


class _SlowPath(Exception):
    """A chunk of lines the fast path does not take whole: read line by line."""


def load_columns(path: Path) -> JournalColumns:
    """The journal at ``path`` as ``JournalColumns``, for a comparison: read in chunks of about
    1 MiB, each parsed by one ``json.loads`` straight into the columns (no point objects kept), so
    that memory stays within the columns plus a chunk.

    Lines are checked as ``load_points(strict=False)`` checks them, except that steps may be any
    signed 64-bit integer (other stores hold negative ones): a bad line is skipped with a
    ``DamagedLine`` warning naming ``<path>:<line>`` and what is wrong (the first ``MAX_NOTES``,
    then one count), a line longer than ``MAX_LINE_BYTES`` is skipped without being read whole; a
    JSON line that is not a point, or one with a non-numeric value, raises ValueError naming it.
    ``SpecialFileError`` for a FIFO or a device (never read); an absent file has no entries.
    """
    out = JournalColumns()
    codes = _Codes(out.names)
    try:
        fh = open_regular(path)
    except FileNotFoundError:
        return out
    with warnings.catch_warnings(record=True) as caught, fh:
        warnings.simplefilter("always", DamagedLine)
        number = 0  # lines before the chunk
        carry = b""
        skipping = 0  # bytes of an oversized line read so far
        while block := fh.read(_READ_CHUNK):
            if skipping:
                cut = block.find(b"\n")
                if cut < 0:
                    skipping += len(block)
                    continue
                number += 1
                _line_point(path, number, b"", skipping + cut + 1, False, INT64)
                skipping, block = 0, block[cut + 1 :]
            data = carry + block if carry else block
            first = data.find(b"\n", len(carry)) + 1 if carry else 0
            if first > MAX_LINE_BYTES:  # only a line begun in an earlier block can be this long
                number += 1
                _line_point(path, number, b"", first, False, INT64)
                data, carry = data[first:], b""
            cut = data.rfind(b"\n") + 1
            carry = data[cut:]
            if cut:
                number = _chunk(path, data[:cut] if cut < len(data) else data, number, out, codes)
            if len(carry) > MAX_LINE_BYTES:
                skipping, carry = len(carry), b""
        if skipping:
            _line_point(path, number + 1, b"", skipping, False, INT64)
        elif carry:
            _slow_chunk(path, carry, number, out, codes)
    _renote(caught)
    return out


def _renote(caught: list[warnings.WarningMessage]) -> None:
    """Warn again the first ``MAX_NOTES`` of the ``caught`` notes, then one count of the rest."""
    damaged = [w for w in caught if issubclass(w.category, DamagedLine)]
    for w in damaged[:MAX_NOTES]:
        warnings.warn(w.message, w.category, stacklevel=3)
    if len(damaged) > MAX_NOTES:
        warnings.warn(
            f"{len(damaged) - MAX_NOTES} more damaged lines skipped (the first {MAX_NOTES} are named above)",
            DamagedLine,
            stacklevel=3,
        )
    for w in caught:
        if not issubclass(w.category, DamagedLine):
            warnings.warn(w.message, w.category, stacklevel=3)


def _chunk(path: Path, data: bytes, number: int, out: JournalColumns, codes: _Codes) -> int:
    """Whole lines ``data`` (after line ``number``) into ``out``; the line number after them."""
    rows = data.split(b"\n")
    rows.pop()  # data ends with a newline
    try:
        if b"" in rows:
            raise _SlowPath
        records = json.loads(b"[" + b",".join(rows) + b"]")
        if len(records) != len(rows):
            raise _SlowPath
        steps = [r["step"] for r in records]
        walls = [r["wall_time"] for r in records]
        metrics = [r["metrics"] for r in records]
        if not set(map(type, metrics)) <= {dict} or not set(map(type, steps)) <= {int}:
            raise _SlowPath
        if not set(map(type, walls)) <= {float, int} or min(steps) < INT64[0] or max(steps) > INT64[1]:
            raise _SlowPath
        counts = list(map(len, metrics))
        if 0 in counts:
            raise _SlowPath
        names = list(chain.from_iterable(metrics))
        values = list(chain.from_iterable(m.values() for m in metrics))
        if not set(map(type, values)) <= {float, int}:
            raise _SlowPath
        floats = array("d", values)
        code = array("i", map(codes.__getitem__, names))
        wall_times = array("d", walls)
    except (_SlowPath, ValueError, KeyError, TypeError, AttributeError, RecursionError, OverflowError):
        return _slow_chunk(path, data, number, out, codes)
    out.step.extend(chain.from_iterable(map(repeat, steps, counts)))
    out.wall_time.extend(chain.from_iterable(map(repeat, wall_times, counts)))
    out.code.extend(code)
    out.value.extend(floats)
    return number + len(rows)


def _slow_chunk(path: Path, data: bytes, number: int, out: JournalColumns, codes: _Codes) -> int:
    """``data`` line by line (bad lines reported and skipped); the line number after them."""
    for raw in data.splitlines(keepends=True):
        number += 1
        point = _line_point(path, number, raw, len(raw), False, INT64)
        if point is None:
            continue
        metrics = point.metrics or {"": math.nan}
        for key, value in metrics.items():
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or (type(value) is int and abs(value) > _FLOAT_MAX)
            ):
                raise ValueError(
                    f"{printable(path)}:{number}: step {point.step}: metric {printable(repr(key))} has "
                    f"non-numeric value {printable(repr(value)[:80])}"
                )
        n = len(metrics)
        out.step.extend(repeat(point.step, n))
        out.wall_time.extend(repeat(point.wall_time, n))
        out.code.extend(map(codes.__getitem__, metrics))
        out.value.extend(map(float, metrics.values()))
    return number


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
