"""The background writer: the training thread only enqueues; threads here do all the I/O.

Path of a point::

    Tracker.log (training thread) -- deque.append --> writer thread
        every ``flush_interval_s`` (or as soon as ``max_batch_points`` are waiting):
        append the batch to points.jsonl, flush (+fsync) it, then offer it to each sink lane
    SinkLane (one thread per remote sink) -- batches in order --> sink.write
        on success: record the acknowledged offset in acked-<sink>.json
        on failure: one warning, retry with exponential backoff; the unacknowledged points are the
        tail of points.jsonl, read back from disk once the sink answers again

Memory bound: the inbox holds at most what one flush interval brings (the writer is woken early at
``max_batch_points``); each lane holds at most ``max_buffered_points`` points in memory. A lane
that falls further behind (slow or dead backend) drops its in-memory copies, which are already on
disk, and reads the tail of points.jsonl instead: nothing is discarded, and memory stays bounded
by ``flush interval's points + lanes x max_buffered_points`` (the inbox can only grow past one
interval if the local disk itself stalls). A process crash loses at most the
points of the last, unflushed interval; ``close`` drains everything.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tracking.sinks.base import PartialWrite, Point, RunInfo, SinkError, SinkRejected
from tracking.sinks.jsonl_sink import JsonlSink
from tracking.spool import Ack, RunDir

LOG = logging.getLogger("cliptrack")


@dataclass(frozen=True)
class Batch:
    """Points ``first .. first+len(points)-1`` of points.jsonl; ``ends[i]`` is the byte offset
    just past point ``i``'s line."""

    points: Sequence[Point]
    first: int
    ends: Sequence[int]

    def tail(self, start: int) -> Batch:
        """The part of this batch from journal point ``start`` on."""
        skip = max(0, start - self.first)
        return Batch(self.points[skip:], self.first + skip, self.ends[skip:])


class _Marker:
    """Put in the inbox by ``flush``; set once everything before it is in points.jsonl."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.journal_points = 0
        self.durable = False


class SinkLane:
    """Feeds one sink from its own thread; acknowledges progress in the run directory."""

    def __init__(
        self,
        sink: Any,
        run_dir: RunDir,
        run: RunInfo,
        *,
        max_buffered_points: int,
        max_batch_points: int,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        state: dict[str, Any] | None = None,
        from_disk: bool = False,
    ) -> None:
        self.sink = sink
        self.name: str = sink.name
        self.run_dir = run_dir
        self.run = run
        self.max_buffered_points = max_buffered_points
        self.max_batch_points = max_batch_points
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._resume_state = state
        self.state = "opening"  # opening | ok | failing | rejected | closed
        self.error: str | None = None
        self.failures = 0
        self.opened = threading.Event()
        self.closed_cleanly = False
        self._cond = threading.Condition()
        self._queue: deque[Batch] = deque()
        self._buffered = 0
        self._from_journal = False
        self._ack = run_dir.read_ack(self.name)
        self._journal_end = self._ack
        self._stopping = False
        self._deadline = float("inf")
        self._status: str | None = None
        self._warned = False
        self._configs: deque[dict[str, Any]] = deque()
        if self._ack.points or from_disk:
            self._from_journal = True  # resuming: the unacknowledged tail is on disk
        settings = getattr(sink, "settings", None)
        if state is None and callable(settings):  # so that replay can reach a sink that never opened
            run_dir.update_meta(sinks={self.name: {**settings(), "closed": False}})
        self._thread = threading.Thread(target=self._run, name=f"cliptrack-{self.name}", daemon=True)

    # ---- writer-thread side --------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def set_journal_end(self, end: Ack) -> None:
        """Tell the lane how far points.jsonl reaches (used when resuming from disk only)."""
        with self._cond:
            self._journal_end = end
            self._cond.notify()

    def offer(self, batch: Batch) -> None:
        """Hand a batch already durable in points.jsonl to this lane (never blocks on the sink)."""
        with self._cond:
            self._journal_end = Ack(batch.first + len(batch.points), batch.ends[-1])
            if not self._from_journal:
                if self._buffered + len(batch.points) > self.max_buffered_points:
                    self._from_journal = True
                    self._queue.clear()
                    self._buffered = 0
                    LOG.info(
                        "%s is more than %d points behind; it will read them back from %s",
                        self.name, self.max_buffered_points, self.run_dir.points_path,
                    )
                else:
                    self._queue.append(batch)
                    self._buffered += len(batch.points)
            self._cond.notify()

    def offer_config(self, config: dict[str, Any]) -> None:
        """Queue a config update; applied on the lane thread before the next batch."""
        with self._cond:
            self._configs.append(config)
            self._cond.notify()

    def _apply_configs(self) -> None:
        update = getattr(self.sink, "log_config", None)
        while self._configs:
            config = self._configs.popleft()
            if update is None:
                continue
            try:
                update(config)
            except Exception as exc:  # noqa: BLE001 - config trouble never stops the metrics
                LOG.warning("%s did not take the config update %s: %s", self.name, sorted(config), exc)

    @property
    def acked_points(self) -> int:
        return self._ack.points

    def pending_points(self) -> int:
        with self._cond:
            return max(0, self._journal_end.points - self._ack.points)

    def wait_acked(self, points: int, deadline: float) -> bool:
        """Wait until the first ``points`` journal points are acknowledged; False on timeout or
        when the sink is failing (a failing sink is not waited for: its points are spooled)."""
        with self._cond:
            while self._ack.points < points:
                if self.state in ("failing", "rejected", "closed") and self.opened.is_set():
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.25))
            return True

    def stop(self, status: str, deadline: float) -> None:
        with self._cond:
            self._stopping = True
            self._status = status
            self._deadline = deadline
            self._cond.notify_all()

    def join(self, timeout: float | None) -> None:
        self._thread.join(timeout)

    # ---- lane thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        locked = self.run_dir.lock_sink(self.name)
        if not locked:
            self.error = f"another process is writing {self.name} for run {self.run.run_id}"
            with self._cond:
                self.state = "failing"
                self._cond.notify_all()
            self.opened.set()
            return
        try:
            if not self._open():
                return
            self._pump()
            if self._caught_up() and self.state == "ok":
                try:
                    self.sink.close(self._status or "FINISHED")
                    self.closed_cleanly = True
                    self.run_dir.update_meta(sinks={self.name: {"closed": True, "status": self._status}})
                except Exception as exc:  # noqa: BLE001 - reported, never raised into training
                    self._fail(exc)
        finally:
            with self._cond:
                self.state = "closed" if self.closed_cleanly else self.state
                self._cond.notify_all()
            if locked:
                self.run_dir.unlock_sink(self.name)

    def _open(self) -> bool:
        backoff = self.backoff_initial_s
        while True:
            try:
                state = self.sink.open(self.run, self._resume_state)
                self.run_dir.update_meta(sinks={self.name: {**state, "closed": False}})
                with self._cond:
                    self.state = "ok"
                    self._cond.notify_all()
                self.opened.set()
                if self._warned:
                    LOG.warning("%s is reachable again: %s", self.name, self.sink.location)
                return True
            except Exception as exc:  # noqa: BLE001
                self._fail(exc)
                self.opened.set()
                if self.state == "rejected" or not self._sleep(backoff):
                    return False
                backoff = min(backoff * 2, self.backoff_max_s)

    def _caught_up(self) -> bool:
        with self._cond:
            return self._ack.points >= self._journal_end.points

    def _pump(self) -> None:
        backoff = self.backoff_initial_s
        while True:
            with self._cond:
                while True:
                    if self._from_journal and self._ack.offset >= self._journal_end.offset:
                        self._from_journal = False  # caught up from disk: back to memory batches
                    while self._queue and self._queue[0].first + len(self._queue[0].points) <= self._ack.points:
                        self._buffered -= len(self._queue.popleft().points)
                    if self._queue or self._from_journal:
                        break
                    if self._configs:
                        break
                    if self._stopping:
                        return
                    self._cond.wait()
                if self._stopping and time.monotonic() >= self._deadline:
                    return
                if not self._queue and not self._from_journal:
                    batch = None
                else:
                    batch = self._next_batch_locked()
            if batch is None:
                self._apply_configs()
                continue
            if not batch.points:  # nothing readable past the acknowledged offset: stop reading
                with self._cond:
                    self._from_journal = False
                    if self._stopping:
                        return
                continue
            try:
                self._apply_configs()
                self.sink.write(batch.points)
                self._acknowledge(batch, len(batch.points))
            except Exception as exc:  # noqa: BLE001
                if isinstance(exc, PartialWrite) and exc.written:
                    self._acknowledge(batch, exc.written)
                self._fail(exc)
                with self._cond:
                    self._from_journal = True
                    self._queue.clear()
                    self._buffered = 0
                if self.state == "rejected" or not self._sleep(backoff):
                    return
                backoff = min(backoff * 2, self.backoff_max_s)
                continue
            if self.state == "failing":
                LOG.warning("%s recovered; %d points behind, catching up from the spool", self.name,
                            self.pending_points())
                with self._cond:
                    self.state = "ok"
                    self.error = None
                    self._cond.notify_all()
            backoff = self.backoff_initial_s

    def _next_batch_locked(self) -> Batch:
        if self._from_journal:
            points: list[Point] = []
            ends: list[int] = []
            for point, end in self.run_dir.read_points(self._ack.offset, self._journal_end.offset):
                points.append(point)
                ends.append(end)
                if len(points) >= self.max_batch_points:
                    break
            return Batch(points, self._ack.points, ends)
        return self._queue[0].tail(self._ack.points)

    def _acknowledge(self, batch: Batch, written: int) -> None:
        if written <= 0:
            return
        ack = Ack(batch.first + written, batch.ends[written - 1])
        self.run_dir.write_ack(self.name, ack)
        with self._cond:
            self._ack = ack
            self._cond.notify_all()

    def _fail(self, exc: BaseException) -> None:
        self.failures += 1
        self.error = str(exc)
        rejected = isinstance(exc, SinkRejected) or (
            isinstance(exc, PartialWrite) and isinstance(exc.cause, SinkRejected)
        )
        with self._cond:
            self.state = "rejected" if rejected else "failing"
            self._cond.notify_all()
        where = self.run_dir.points_path
        if rejected:
            LOG.warning(
                "%s refused the data: %s. Training continues; its points stay in %s; fix the cause "
                "and run `cliptrack replay %s`", self.name, exc, where, self.run_dir.root,
            )
        elif not self._warned:
            LOG.warning(
                "%s is failing: %s. Training continues; points are kept in %s and retried with backoff",
                self.name, exc if isinstance(exc, SinkError) else f"{type(exc).__name__}: {exc}", where,
            )
        else:
            LOG.debug("%s still failing: %s", self.name, exc)
        self._warned = True

    def _sleep(self, seconds: float) -> bool:
        """Back off; returns False when the lane must give up (stopping and past its deadline)."""
        with self._cond:
            end = time.monotonic() + seconds
            if self._stopping:
                end = min(end, self._deadline)
            while True:
                now = time.monotonic()
                if self._stopping and now >= self._deadline:
                    return False
                if now >= end:
                    return True
                self._cond.wait(end - now)


class BackgroundWriter:
    """Moves points from the training thread to points.jsonl and on to the sink lanes."""

    def __init__(
        self,
        journal: JsonlSink,
        lanes: Sequence[SinkLane],
        *,
        flush_interval_s: float,
        max_batch_points: int,
    ) -> None:
        if flush_interval_s <= 0:
            raise ValueError(f"flush_interval_s must be > 0 seconds, got {flush_interval_s!r}")
        if max_batch_points < 1:
            raise ValueError(f"max_batch_points must be >= 1, got {max_batch_points!r}")
        self.journal = journal
        self.lanes = list(lanes)
        self.flush_interval_s = flush_interval_s
        self.max_batch_points = max_batch_points
        self._inbox: deque[Point | _Marker] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self.points_journaled = 0
        self.values_journaled = 0
        self.journal_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="cliptrack-writer", daemon=True)

    def start(self) -> None:
        for lane in self.lanes:
            lane.start()
        self._thread.start()

    def submit(self, point: Point) -> None:
        """Enqueue ``point`` (training thread): O(1), no lock, no I/O."""
        inbox = self._inbox
        inbox.append(point)
        if len(inbox) >= self.max_batch_points:
            self._wake.set()

    def flush(self, timeout_s: float | None) -> bool:
        """Make every point submitted so far durable in points.jsonl, then wait (up to
        ``timeout_s`` seconds in all) for healthy sinks to acknowledge them. True if all did."""
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else float("inf"))
        marker = _Marker()
        self._inbox.append(marker)
        self._wake.set()
        while not marker.done.wait(0.25):
            if not self._thread.is_alive() or time.monotonic() > deadline:
                return False
        if not marker.durable:  # the local disk refused the points: they are held in memory, retried
            return False
        return all(lane.wait_acked(marker.journal_points, deadline) for lane in self.lanes)

    def stop(self, timeout_s: float | None = None) -> None:
        """Drain the inbox into points.jsonl and stop the writer thread."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            self._drain()
            if self._stopping:
                self._drain()
                return

    def _drain(self) -> None:
        batches: list[Batch] = []
        markers: list[_Marker] = []
        inbox = self._inbox
        healthy = True
        while inbox:
            points: list[Point] = []
            while inbox and len(points) < self.max_batch_points:
                item = inbox.popleft()
                if isinstance(item, _Marker):
                    markers.append(item)
                    item.journal_points = self.points_journaled + len(points)
                    if points:
                        break
                    continue
                points.append(item)
            if not points:
                continue
            try:
                ends = self.journal.append(points)
            except Exception as exc:  # noqa: BLE001 - disk trouble: keep the points, retry next tick
                inbox.extendleft(reversed(points))
                if self.journal_error is None:
                    LOG.warning("cannot write %s: %s; points are held in memory and retried",
                                self.journal.location, exc)
                self.journal_error = str(exc)
                healthy = False
                break
            batches.append(Batch(points, self.points_journaled, ends))
            self.points_journaled += len(points)
            self.values_journaled += sum(len(p.metrics) for p in points)
        if batches:
            try:
                self.journal.flush()
            except Exception as exc:  # noqa: BLE001
                healthy = False
                if self.journal_error is None:
                    LOG.warning("cannot flush %s: %s", self.journal.location, exc)
                self.journal_error = str(exc)
            for batch in batches:
                for lane in self.lanes:
                    lane.offer(batch)
        if healthy and batches:
            self.journal_error = None
        for marker in markers:
            marker.durable = healthy
            marker.done.set()
