"""The background writer: the training thread only enqueues; threads here do all the I/O.

Path of a point::

    Tracker.log (training thread) -- bounded inbox --> writer thread
        every ``flush_interval_s`` (or as soon as ``max_batch_points`` are waiting): each batch of
        at most ``max_batch_points`` is appended to points.jsonl atomically and fsynced, then
        offered to each sink lane
    SinkLane (``cliptrack.log._pipeline.lane``; one thread per remote sink) -- batches in order --> sink.write
        on success: the journal offset it reached is the sink's acknowledgement (``cliptrack.log._pipeline.acks``)
        on failure: one warning, retry with exponential backoff; the unacknowledged points are the
        tail of points.jsonl, read back once the sink answers again

Bounds (together the documented memory bound, ``MEMORY_BOUND_BYTES``):

- *Crash window*: a batch is durable as soon as it is written, and the writer takes at most
  ``max_batch_points`` at a time, so the inbox is the only thing a crash can lose.
- *Backpressure, in seconds*: the writer times its writes (``cliptrack.log._pipeline.pace.DiskPace``: this
  disk's pace). ``log`` waits (and warns once) only while the writer is behind by more than the
  bound: the oldest queued point would reach the disk (once the batch being written is done and
  the queue written after it) more than ``flush_interval_s + LAG_GRACE_S`` after it was queued;
  or more than ``max_queued_points`` points or ``max_queued_values`` metric values are queued
  (memory). The writer also starts early when waiting for the end of the interval would pass
  the bound, and cuts a batch to about half the bound of writing (a smaller fsync unit on a slow
  disk), so on a slow disk it writes back to back and ``log`` runs at the disk's pace. A
  point is stamped when ``log`` accepts it (after any wait). So under any load, on any disk
  whose one write of a batch takes less than ``LAG_GRACE_S`` more than estimated, a crash loses
  at most the points accepted in the last ``flush_interval_s + CRASH_GRACE_S``, and the inbox's
  memory is bounded whatever the number of metrics per point.
- *Bounded waits*: one ``log`` call waits at most ``flush_interval_s + CRASH_GRACE_S``. A disk
  too slow for that (one write longer than the window, a stalled mount) is warned about once,
  with the larger window it then holds; ``log`` then takes one point per wait, so the inbox
  stays small and nothing is dropped.
- *Full disk*: while the local disk refuses writes (full, read-only) ``log`` does not wait: the
  writer encodes each batch and holds it in memory at its future journal offset
  (``cliptrack.log._pipeline.held.HeldTail``, at most ``max_held_bytes``), hands it to the lanes as usual (remote
  sinks keep receiving every point), and writes the held batches, in order, once the disk takes
  them again. Past ``max_held_bytes`` batches go to the lanes in memory only and are counted as
  missing from the journal (``not_journaled``); at close, points that reached neither the disk
  nor any backend are counted and reported (``lost_points``).
- *Lanes*: each holds at most ``max_buffered_points`` points and ``max_buffered_bytes`` bytes in
  memory; one that falls further behind (slow or dead backend) drops its in-memory copies, which
  are in the journal, and reads them back from there: nothing is discarded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cliptrack.log._pipeline.delivery import NO_OFFSET, Batch
from cliptrack.log._pipeline.held import HeldTail
from cliptrack.log._pipeline.lane import LaneState, SinkLane
from cliptrack.log._pipeline.pace import DiskPace
from cliptrack.store.records import RawPoint, printable
from cliptrack.store.spool import Journal, encode_points

LOG = logging.getLogger("cliptrack")

LAG_GRACE_S = 0.25
"""Seconds beyond ``flush_interval_s`` the oldest queued point may wait before ``log`` waits."""
CRASH_GRACE_S = 0.5
"""Seconds beyond ``flush_interval_s`` in the crash window: a crash (SIGKILL, power loss) loses at
most the points ``log`` accepted in the last ``flush_interval_s + CRASH_GRACE_S`` seconds."""
MAX_QUEUED_VALUES = 1_000_000
"""Default metric values ``log`` may queue ahead of the writer."""
VALUE_OBJECT_BYTES = 60
"""Bytes one queued metric value costs as Python objects (a float and its dict slot; 58 measured
with tracemalloc on CPython 3.11, 200 metrics per point)."""
POINT_OBJECT_BYTES = 340
"""Bytes one queued point costs besides its values (its tuple, dict and wall time; 337 measured
with one metric per point, value included)."""
MEMORY_BOUND_BYTES = 256 * 2**20
"""The documented bound (bytes) of what the tracker holds for points with one remote sink at the
defaults: the inbox (``max_queued_points`` x ``POINT_OBJECT_BYTES`` + ``MAX_QUEUED_VALUES`` x
``VALUE_OBJECT_BYTES``, ~65 MB), one lane's buffer (``MAX_BUFFERED_BYTES``) and the held tail
(``MAX_HELD_BYTES``); each further sink adds one lane."""


def memory_bound(
    max_queued_points: int, max_queued_values: int, lanes: int, max_buffered_bytes: int, max_held_bytes: int
) -> int:
    """Bytes the tracker may hold for points with these bounds (see ``MEMORY_BOUND_BYTES``)."""
    inbox = max_queued_points * POINT_OBJECT_BYTES + max_queued_values * VALUE_OBJECT_BYTES
    return inbox + lanes * max_buffered_bytes + max_held_bytes


__all__ = [
    "CRASH_GRACE_S",
    "LAG_GRACE_S",
    "MEMORY_BOUND_BYTES",
    "memory_bound",
    "BackgroundWriter",
    "Batch",
    "HeldTail",
    "LaneState",
    "SinkLane",
    "WriterClosed",
]


class WriterClosed(RuntimeError):
    """``submit`` after the writer stopped accepting points."""


@dataclass
class _Marker:
    """Set by the writer once the first ``target`` submitted points are in points.jsonl."""

    target: int
    done: threading.Event = field(default_factory=threading.Event)
    offset: int = 0
    durable: bool = False


class BackgroundWriter:
    """Moves points from the training thread to points.jsonl (or, while the disk refuses them, the
    held tail) and on to the sink lanes."""

    def __init__(
        self,
        journal: Journal,
        lanes: Sequence[SinkLane],
        *,
        flush_interval_s: float,
        max_batch_points: int,
        max_queued_points: int,
        max_queued_values: int = MAX_QUEUED_VALUES,
        held: HeldTail | None = None,
    ) -> None:
        if flush_interval_s <= 0:
            raise ValueError(f"flush_interval_s must be > 0 seconds, got {flush_interval_s!r}")
        if max_batch_points < 1:
            raise ValueError(f"max_batch_points must be >= 1, got {max_batch_points!r}")
        if max_queued_points < max_batch_points:
            raise ValueError(
                f"max_queued_points={max_queued_points} must be >= max_batch_points={max_batch_points}"
            )
        if max_queued_values < 1:
            raise ValueError(f"max_queued_values must be >= 1, got {max_queued_values!r}")
        self.journal = journal
        self.lanes = list(lanes)
        self.held = held if held is not None else HeldTail(journal)
        self.flush_interval_s = flush_interval_s
        self.max_batch_points = max_batch_points
        self.max_queued_points = max_queued_points
        self.max_queued_values = max_queued_values
        self._max_lag_s = flush_interval_s + LAG_GRACE_S
        self._max_wait_s = flush_interval_s + CRASH_GRACE_S
        self.pace = DiskPace(self._max_lag_s)
        self._flight_due = 0.0
        """Wall time the batch being written is expected on disk (0.0 when none)."""
        self._slow_warned = False
        self._inbox: deque[RawPoint] = deque()
        self._queued_values = 0
        self._lock = threading.RLock()  # orders submit against stop (reentrant: a signal handler may close)
        self._progress = threading.Condition()
        self._markers: list[_Marker] = []
        self._wake = threading.Event()
        self._accepting = True
        self._stopping = False
        self.submitted = 0
        self.points_journaled = 0
        self.values_journaled = 0
        self.not_journaled = 0
        """Points past the held bound: handed to the lanes from memory only, never in the journal."""
        self.waits = 0
        self.journal_error: str | None = None
        self.unwritten = 0
        """Points still in the inbox when the writer stopped (it was still writing at close)."""
        self._held_full_warned = False
        self._thread = threading.Thread(target=self._run, name="cliptrack-writer", daemon=True)

    def start(self) -> None:
        for lane in self.lanes:
            lane.start()
        self._thread.start()

    def submit(self, step: int, values: dict[str, float], stamp: Callable[[int], float]) -> None:
        """Enqueue the point ``(step, stamp(step), values)`` (training thread): O(1), no I/O; waits
        only while the writer is behind by more than the bound (see the module docstring), and then
        stamps the point again once it is accepted (``stamp``: unix seconds). Raises WriterClosed
        after ``stop``."""
        wall = stamp(step)
        inbox = self._inbox
        if inbox:
            queued, due = self._queued_values, self._flight_due
            lag = (due if due > wall else wall) - inbox[0][1] + self.pace.write_s(queued)
            if (
                lag > self._max_lag_s
                or len(inbox) >= self.max_queued_points
                or queued >= self.max_queued_values
            ):
                if self._wait_for_writer(wall):
                    wall = stamp(step)
            elif lag > self.flush_interval_s and not self._wake.is_set():
                self._wake.set()  # a slow disk: write now, not at the end of the interval
        with self._lock:
            if not self._accepting:
                raise WriterClosed("the writer is stopped")
            inbox.append((step, wall, values))
            self._queued_values += len(values)
            self.submitted += 1
        if len(inbox) >= self.max_batch_points:
            self._wake.set()

    def lag_s(self, now: float) -> float:
        """Seconds from when the oldest queued point was queued to when every point queued at
        ``now`` (unix seconds) is expected on disk: after the batch being written, in one more
        write; 0.0 when nothing is queued."""
        try:
            oldest = self._inbox[0][1]
        except IndexError:
            return 0.0
        return max(now, self._flight_due) - oldest + self.pace.write_s(self._queued_values)

    def _full(self) -> bool:
        return len(self._inbox) >= self.max_queued_points or self._queued_values >= self.max_queued_values

    def _behind(self, now: float) -> bool:
        if not self._inbox or not self._thread.is_alive():
            return False
        if self._full():
            return True
        return self.lag_s(now) > self._max_lag_s

    def _wait_for_writer(self, now: float) -> bool:
        """Wait while the writer is behind, at most ``_max_wait_s``; True when it waited."""
        if not self._behind(now):
            return False
        if self.waits == 0:
            LOG.warning(
                "log() is faster than points can be written to %s: it waits while the points not yet "
                "on disk span more than %.2f s (at this disk's pace), or more than %d points (or %d "
                "values) are queued (backpressure keeps the crash window and the memory bounded)",
                printable(self.journal.location),
                self._max_lag_s,
                self.max_queued_points,
                self.max_queued_values,
            )
        self.waits += 1
        give_up = time.monotonic() + self._max_wait_s
        while True:  # until the writer is within the bound again (each batch it writes wakes us)
            self._wake.set()
            with self._progress:
                self._progress.wait(0.05)
            if not self._behind(time.time()):
                return True
            if time.monotonic() >= give_up:
                self._warn_slow(self._max_wait_s, f"log() waited {self._max_wait_s:.1f} s for it")
                return True

    def _warn_slow(self, seconds: float, what: str) -> None:
        """Once: the disk is too slow for the crash window; the window it holds instead."""
        if self._slow_warned:
            return
        self._slow_warned = True
        LOG.warning(
            "%s is too slow for the crash window of %.1f s (flush_interval_s + %.1f s): %s; while "
            "it is this slow a crash may lose the points of about the last %.1f s",
            printable(self.journal.location),
            self._max_wait_s,
            CRASH_GRACE_S,
            what,
            seconds + self._max_lag_s,
        )

    def flush(self, timeout_s: float | None) -> bool:
        """Make every point submitted so far durable in points.jsonl, then wait (up to
        ``timeout_s`` seconds in all) for healthy sinks to acknowledge them. True if all did."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else float("inf"))
        with self._lock:
            marker = _Marker(self.submitted)
            self._markers.append(marker)
        self._wake.set()
        while not marker.done.wait(0.25):
            if not self._thread.is_alive() or time.monotonic() > deadline:
                return False
        if not marker.durable:  # the local disk refused the points: they are held in memory, retried
            return False
        return all(lane.wait_acked(marker.offset, deadline) for lane in self.lanes)

    def stop(self, timeout_s: float | None = None) -> bool:
        """Stop accepting points, drain the inbox into points.jsonl and stop the writer thread;
        True when it is still writing after ``timeout_s`` seconds."""
        with self._lock:
            self._accepting = False
        self._stopping = True
        self._wake.set()
        if self._thread.is_alive() or self._thread.ident is not None:
            self._thread.join(timeout_s)
        return self._thread.is_alive()

    def _run(self) -> None:
        while True:
            self._wake.wait(self._idle_s())
            self._wake.clear()
            self._write_pass(final=False)
            if self._stopping:
                self._write_pass(final=True)
                self.unwritten = len(self._inbox)
                return

    def _idle_s(self) -> float:
        """Seconds the writer may sleep: the flush interval, or less when the queued points would
        otherwise reach the disk later than a flush interval after the oldest (a slow disk)."""
        try:
            oldest = self._inbox[0][1]
        except IndexError:
            return self.flush_interval_s
        due = oldest + self.flush_interval_s - self.pace.write_s(self._queued_values) - time.time()
        return min(self.flush_interval_s, max(0.0, due))

    def _write_pass(self, *, final: bool) -> None:
        """Write what is queued now, one atomic batch at a time (points queued meanwhile wait for
        the next pass, so that one pass never outlasts the load); the held tail goes first."""
        inbox = self._inbox
        budget = len(inbox)
        failed = not self._drain_held()
        while inbox and (final or budget > 0):
            points: list[RawPoint] = []
            values, most = 0, self.pace.batch_values()  # about batch_s of writing at this disk's pace
            while inbox and len(points) < self.max_batch_points and (not points or values < most):
                point = inbox.popleft()
                points.append(point)
                values += len(point[2])
            budget -= len(points)
            with self._lock:
                self._queued_values -= values
            batch = None if failed else self._append(points, values)
            if batch is None:
                failed = True
                batch = self._hold(points, values)
            for lane in self.lanes:
                lane.offer(batch)
            self._resolve_markers(failed=False)
            with self._progress:
                self._progress.notify_all()
        self._resolve_markers(failed=failed)
        with self._progress:
            self._progress.notify_all()

    def _append(self, points: list[RawPoint], values: int) -> Batch | None:
        """``points`` appended to the journal as one batch; None when the disk refused them."""
        start, first = self.journal.offset, self.journal.points
        began = time.monotonic()
        self._flight_due = time.time() + self.pace.write_s(values)
        try:
            data = self.journal.append(points)
        except Exception as exc:  # noqa: BLE001 - disk trouble: the points are held, retried next pass
            self._disk_refused(exc)
            return None
        finally:
            self._flight_due = 0.0
        took = time.monotonic() - began
        self.pace.timed(took, values)
        if took > self._max_wait_s:
            self._warn_slow(took, f"one write of {len(points)} points took {took:.1f} s")
        self.points_journaled += len(points)
        self.values_journaled += values
        if self.journal_error is not None:
            LOG.warning("%s is writable again", printable(self.journal.location))
            self.journal_error = None
        return Batch(data, start, first, len(points))

    def _hold(self, points: list[RawPoint], values: int) -> Batch:
        """``points`` held at their future journal place, or, past the held bound, in memory only."""
        data = b"".join(encode_points(points))
        batch = self.held.add(data, len(points), values)
        if batch is not None:
            return batch
        self.not_journaled += len(points)
        if not self._held_full_warned:
            self._held_full_warned = True
            LOG.warning(
                "the points held for %s reached %d MB: later points go to the remote backends only and "
                "will be missing from the journal (counted at close)",
                printable(self.journal.location),
                self.held.max_bytes // 2**20,
            )
        return Batch(data, NO_OFFSET, 0, len(points))

    def _drain_held(self) -> bool:
        """Write the held tail to the journal; False while the disk still refuses it."""
        if not self.held:
            return True
        points, values, error = self.held.drain()
        self._journaled(points, values)
        if error is not None:
            self._disk_refused(error)
            return False
        LOG.warning(
            "%s is writable again; the points held in memory are in it", printable(self.journal.location)
        )
        self.journal_error = None
        return True

    def _journaled(self, points: int, values: int) -> None:
        if not points:
            return
        self.points_journaled += points
        self.values_journaled += values
        for lane in self.lanes:
            lane.journal_advanced()

    def _disk_refused(self, exc: BaseException) -> None:
        if self.journal_error is None:
            LOG.warning(
                "cannot write %s: %s; points are held in memory (up to %d MB) and delivered to the "
                "backends from there; the journal catches up when the disk takes them again",
                printable(self.journal.location),
                printable(exc),
                self.held.max_bytes // 2**20,
            )
        self.journal_error = str(exc)

    def _resolve_markers(self, *, failed: bool) -> None:
        if not self._markers:
            return
        written = self.points_journaled
        with self._lock:
            left = []
            for marker in self._markers:
                if marker.target <= written:
                    marker.offset, marker.durable = self.journal.offset, True
                    marker.done.set()
                elif failed:
                    marker.done.set()
                else:
                    left.append(marker)
            self._markers = left

    # ---- accounting at close -------------------------------------------------------------------
    def lost_points(self) -> int:
        """Points that reached neither the journal nor any backend (so far): held points past the
        furthest acknowledgement, plus in-memory-only points no lane sent."""
        held_end = self.held.end().points
        reached = max((lane.acked.points for lane in self.lanes), default=0)
        lost_held = max(0, held_end - max(reached, self.journal.points))
        sent = max((lane.sent_in_memory_only for lane in self.lanes), default=0)
        return lost_held + max(0, self.not_journaled - sent) + self.unwritten
