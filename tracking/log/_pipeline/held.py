"""The journal's tail in memory: batches the local disk refused (full, read-only), held until it
takes them again, bounded in bytes.

Each held batch is placed at the offset it will have in points.jsonl: the journal is append-only,
written by one process, and a refused batch leaves it unchanged (``Journal.append_encoded`` cuts a
partial write back), so the held batches are written later, in order, exactly where they were
placed. Sink lanes read the journal through ``HeldTail.read``: from the file up to its end on disk,
from memory past it. So remote sinks keep receiving every point while the disk refuses them, and
their acknowledgements stay journal offsets.

Past ``max_bytes`` of held batches, further batches are not held (``add`` returns None): the
writer hands them to the lanes in memory only, and counts them (missing from the journal).
"""

from __future__ import annotations

import threading
from collections import deque

from cliptrack.log._pipeline.delivery import Batch
from cliptrack.store import journal as journal_file
from cliptrack.store.journal import Journal
from cliptrack.store.spool import Ack

MAX_HELD_BYTES = 64 * 2**20
"""Default bytes of encoded points held while the local disk refuses them."""


class HeldTail:
    """The batches the disk refused, for the one ``journal``; safe across threads."""

    def __init__(self, journal: Journal, max_bytes: int = MAX_HELD_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_held_bytes must be >= 0 bytes, got {max_bytes!r}")
        self.journal = journal
        self.max_bytes = max_bytes
        self._batches: deque[tuple[Batch, int]] = deque()  # (batch, values in it)
        self._lock = threading.Lock()
        self.bytes = 0
        self.points = 0

    def __bool__(self) -> bool:
        return bool(self._batches)

    def end(self) -> Ack:
        """Where the journal will end once every held batch is written."""
        with self._lock:
            return Ack(self.journal.points + self.points, self.journal.offset + self.bytes)

    def durable(self) -> int:
        """The journal's end on disk (bytes)."""
        return self.journal.offset

    def add(self, data: bytes, lines: int, values: int) -> Batch | None:
        """Hold ``data`` (``lines`` encoded points, ``values`` metric values) after the held batches;
        the batch at its journal place, or None when holding it would pass ``max_bytes``."""
        with self._lock:
            if self.bytes + len(data) > self.max_bytes:
                return None
            batch = Batch(data, self.journal.offset + self.bytes, self.journal.points + self.points, lines)
            self._batches.append((batch, values))
            self.bytes += len(data)
            self.points += lines
            return batch

    def drain(self) -> tuple[int, int, OSError | None]:
        """Write the held batches to the journal, in order, until the disk refuses one:
        ``(points, values)`` written and the refusal (None when every held batch is written)."""
        points = values = 0
        while True:
            with self._lock:
                if not self._batches:
                    return points, values, None
                batch, count = self._batches[0]
            try:
                self.journal.append_encoded(batch.data, batch.lines)
            except OSError as exc:  # stays held, at the same place
                return points, values, exc
            with self._lock:
                self._batches.popleft()
                self.bytes -= len(batch.data)
                self.points -= batch.lines
            points += batch.lines
            values += count

    def read(self, offset: int, end: int, limit: int) -> bytes:
        """At most ``limit`` whole journal lines between byte ``offset`` and ``end``: from the file
        below its end on disk, from the held batches past it."""
        with self._lock:
            durable = self.journal.offset
            if offset < durable:
                held = None
            else:
                held = next((b for b, _ in self._batches if b.start <= offset < b.end), None)
        if held is None:
            return journal_file.read_lines(self.journal.path, offset, min(end, durable), limit)
        data = held.data[offset - held.start : max(0, end - held.start)]
        cut = 0
        for _ in range(limit):
            index = data.find(b"\n", cut)
            if index < 0:
                break
            cut = index + 1
        return data[:cut]
