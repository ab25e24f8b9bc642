"""What a sink lane sends: batches of journal bytes, and the keys a sink refuses.

- ``Batch``: whole journal lines (bytes) from a known journal offset; the form in which points wait
  for a lagging sink (one bytes object per batch: small, invisible to the garbage collector). A
  batch the local disk refused is held in memory at the offset it will have in the journal
  (``cliptrack.log._pipeline.writer.HeldTail``); a batch past the held tail's bound has no journal offset at all
  (``start == NO_OFFSET``): it exists only in memory.
- ``Refusals``: the keys one sink refuses (its ``check_key``), found once per key, reported once
  (run, first step, key, why) and left out of that sink's points only; every other value and every
  other sink is unaffected. A point a sink refuses whole (a refusal ``check_key`` did not predict)
  is isolated by the lane and skipped the same way (``Refusals.skip_point``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cliptrack.backends.base import PartialWrite, Sink, SinkRejected
from cliptrack.core.text import printable
from cliptrack.store import journal
from cliptrack.store.records import Point

LOG = logging.getLogger("cliptrack")

NO_OFFSET = -1
"""``Batch.start`` of a batch that is in no journal (the local disk refused it past the held bound)."""


@dataclass(frozen=True)
class Batch:
    """Journal bytes ``data`` (whole lines) from byte ``start`` of points.jsonl, whose first line is
    line number ``first``; ``lines`` counts them. ``start == NO_OFFSET``: in memory only.

    Points wait for a lagging sink in this encoded form: a bytes object is one allocation, about a
    fifth of the memory of the points as Python objects, and invisible to the garbage collector
    (tens of thousands of buffered point objects made full collections stall ``log()``).
    """

    data: bytes
    start: int
    first: int
    lines: int

    @property
    def end(self) -> int:
        return self.start + len(self.data)

    @property
    def journaled(self) -> bool:
        """True when the batch has a place in the journal (on disk, or held for it)."""
        return self.start != NO_OFFSET

    def tail(self, offset: int) -> Batch:
        """The part of this batch past journal byte ``offset`` (a line boundary)."""
        if offset <= self.start or not self.journaled:
            return self
        cut = offset - self.start
        return Batch(
            self.data[cut:],
            offset,
            self.first + self.data.count(b"\n", 0, cut),
            self.lines - self.data.count(b"\n", 0, cut),
        )

    def decode(self, report_damaged: Callable[[int, BaseException], None]) -> tuple[list[Point], list[int]]:
        """The batch's points and the journal offset just past each (``cliptrack.store.journal.decode``);
        damaged lines are reported (``report_damaged(byte offset, error)``) and skipped."""
        return journal.decode(self.data, self.start, report_damaged)


@dataclass
class Refusal:
    """A key one sink refuses: ``why`` (the sink's words), the first ``step`` it was seen at, and
    ``values`` left out so far."""

    key: str
    why: str
    step: int
    values: int = 0


class Refusals:
    """The keys sink ``sink_name`` refuses for run ``run_id``, found with ``check_key`` (which
    raises ValueError for a refused key), each reported once."""

    def __init__(self, sink_name: str, run_id: str, check_key: Callable[[str], Any]) -> None:
        self.sink_name = sink_name
        self.run_id = run_id
        self._check_key = check_key
        self._accepted: set[str] = set()
        self.refused: dict[str, Refusal] = {}
        self.points_skipped = 0
        """Whole points the sink refused (isolated by the lane), each skipped for this sink only."""
        self.new = False
        """True when a key was refused since the flag was last cleared (the lane records it)."""

    @property
    def values_refused(self) -> int:
        """Values of refused keys left out so far."""
        return sum(r.values for r in self.refused.values())

    def filter(self, points: Sequence[Point]) -> list[Point]:
        """``points`` without the values of refused keys (a point whose every key is refused keeps
        its place, with no metrics, so that acknowledgements still count it)."""
        accepted, refused = self._accepted, self.refused
        out: list[Point] = []
        for point in points:
            if not accepted.issuperset(point.metrics):
                for key in point.metrics:
                    if key not in accepted and key not in refused:
                        self._check(key, point.step)
            if refused and not refused.keys().isdisjoint(point.metrics):
                kept = {}
                for key, value in point.metrics.items():
                    if key in refused:
                        refused[key].values += 1
                    else:
                        kept[key] = value
                point = Point(point.step, point.wall_time, kept)
            out.append(point)
        return out

    def _check(self, key: str, step: int) -> None:
        try:
            self._check_key(key)
        except ValueError as exc:
            self.refused[key] = Refusal(key, str(exc), step)
            self.new = True
            LOG.warning(
                "%s refuses the key %r of run %s (first at step %d): %s; its values are left out for "
                "%s only, every other value is delivered",
                self.sink_name,
                printable(key),
                self.run_id,
                step,
                printable(exc),
                self.sink_name,
            )
        else:
            self._accepted.add(key)

    def skip_point(self, point: Point, why: str) -> None:
        """Report (once per point) a point the sink refused whole; the lane steps over it."""
        self.points_skipped += 1
        LOG.warning(
            "%s refuses the point of run %s at step %d (keys %s): %s; it is skipped for %s only",
            self.sink_name,
            self.run_id,
            point.step,
            printable(sorted(point.metrics)),
            printable(why),
            self.sink_name,
        )

    def summary(self) -> str:
        """``""`` when nothing was refused, else e.g. ``"400 values refused (1 key: 'a b:mean')"``."""
        if not self.refused and not self.points_skipped:
            return ""
        parts = []
        if self.refused:
            names = ", ".join(repr(printable(k)) for k in sorted(self.refused))
            count = len(self.refused)
            parts.append(
                f"{self.values_refused} values refused ({count} key{'s' if count != 1 else ''}: {names})"
            )
        if self.points_skipped:
            parts.append(f"{self.points_skipped} points refused whole")
        return ", ".join(parts)

    def record(self) -> dict[str, Any]:
        """What run.json keeps of the refusals (``sinks.<name>.refused``): key -> why, first step."""
        return {r.key: {"why": r.why, "step": r.step} for r in self.refused.values()}


def rejected(exc: BaseException) -> bool:
    """True when ``exc`` says the backend refused the data itself (retrying cannot help)."""
    return isinstance(exc, SinkRejected) or (
        isinstance(exc, PartialWrite) and isinstance(exc.cause, SinkRejected)
    )


@dataclass(frozen=True)
class Sent:
    """What one ``Sender.send`` did: the batch's first ``taken`` points are done (in the sink, or
    skipped as refused); ``error`` is why it stopped short (None: the whole batch is done)."""

    taken: int
    error: BaseException | None = None


class Sender:
    """Sends batches of points to one sink: refused keys left out (``Refusals.filter``); a batch the
    backend refuses is sent again one point at a time and each point it still refuses is skipped
    and reported, provided it takes at least one of them (a backend that refuses every point
    refuses the run, not a point)."""

    def __init__(self, sink: Sink, refusals: Refusals) -> None:
        self.sink = sink
        self.refusals = refusals

    def send(self, points: Sequence[Point]) -> Sent:
        sent = self.refusals.filter(points)
        try:
            self.sink.write(sent)
        except Exception as exc:  # noqa: BLE001 - a sink's failure is the caller's to record and retry
            written = exc.written if isinstance(exc, PartialWrite) else 0
            isolated = self._isolate(sent, written) if rejected(exc) else None
            return isolated if isolated is not None else Sent(written, exc)
        return Sent(len(points))

    def _isolate(self, points: Sequence[Point], start: int) -> Sent | None:
        """Points ``start..`` one at a time; None when the backend took none of them."""
        if len(points) - start < 2:
            return None
        taken = 0
        skipped: list[tuple[Point, BaseException]] = []
        for index in range(start, len(points)):
            try:
                self.sink.write([points[index]])
            except Exception as one:  # noqa: BLE001 - classified below
                if not rejected(one):  # a transient failure: what came before is done
                    return self._skipped(skipped, Sent(index, one)) if taken else None
                skipped.append((points[index], one))
            else:
                taken += 1
        return self._skipped(skipped, Sent(len(points))) if taken else None

    def _skipped(self, skipped: list[tuple[Point, BaseException]], outcome: Sent) -> Sent:
        for point, why in skipped:
            self.refusals.skip_point(point, str(why))
        return outcome


class Backlog:
    """The batches a lane holds in memory for its sink, in order, bounded in points and bytes; not
    thread-safe (the lane holds its lock). ``lost`` counts points of batches in no journal that
    were dropped (the lane fell behind): nowhere to read them back from."""

    def __init__(self, max_points: int, max_bytes: int) -> None:
        self.max_points = max_points
        self.max_bytes = max_bytes
        self._batches: deque[Batch] = deque()
        self.points = 0
        self.bytes = 0
        self.lost = 0

    def __bool__(self) -> bool:
        return bool(self._batches)

    def fits(self, batch: Batch) -> bool:
        return self.points + batch.lines <= self.max_points and self.bytes + len(batch.data) <= self.max_bytes

    def push(self, batch: Batch) -> None:
        self._batches.append(batch)
        self.points += batch.lines
        self.bytes += len(batch.data)

    def first(self) -> Batch:
        return self._batches[0]

    def pop(self, batch: Batch | None = None) -> None:
        """Drop the first batch (only if it is ``batch``, when given)."""
        if not self._batches or (batch is not None and self._batches[0] is not batch):
            return
        first = self._batches.popleft()
        self.points -= first.lines
        self.bytes -= len(first.data)

    def drop_acknowledged(self, offset: int) -> None:
        """Drop the leading journaled batches wholly before journal byte ``offset``."""
        while self._batches and self._batches[0].journaled and self._batches[0].end <= offset:
            self.pop()

    def clear(self) -> None:
        """Drop every batch (the lane reads back from the journal); those in no journal are lost."""
        self.lost += sum(b.lines for b in self._batches if not b.journaled)
        self._batches.clear()
        self.points = self.bytes = 0

    def memory_only(self) -> bool:
        """True while a batch in no journal waits here."""
        return any(not b.journaled for b in self._batches)
