"""The background writer: the training thread only enqueues; threads here do all the I/O.

Path of a point::

    Tracker.log (training thread) -- bounded inbox --> writer thread
        every ``flush_interval_s`` (or as soon as ``max_batch_points`` are waiting): each batch of
        at most ``max_batch_points`` is appended to points.jsonl atomically and fsynced, then
        offered to each sink lane
    SinkLane (one thread per remote sink) -- batches in order --> sink.write
        on success: the journal offset it reached is the sink's acknowledgement (acked-<sink>.json)
        on failure: one warning, retry with exponential backoff; the unacknowledged points are the
        tail of points.jsonl, read back from disk once the sink answers again

Bounds:

- *Crash window*: a batch is durable as soon as it is written, and the writer takes at most
  ``max_batch_points`` at a time, so the inbox is the only thing a crash can lose.
- *Backpressure*: ``log`` waits (and warns once) only while the writer is behind by more than the
  bound: more than ``max_queued_points`` points queued, or the oldest queued point older than
  ``flush_interval_s + LAG_GRACE_S``. Each wait lasts until the writer has written a batch. So
  under any load a crash loses at most about ``flush_interval_s + LAG_GRACE_S`` plus one batch's
  write, and the inbox's memory is bounded. While the local disk refuses writes (full, read-only)
  ``log`` does not wait: points are held in memory and written once the disk takes them again.
- *Lanes*: each holds at most ``max_buffered_points`` points in memory; one that falls further
  behind (slow or dead backend) drops its in-memory copies, which are already on disk, and reads
  the tail of points.jsonl instead: nothing is discarded.
"""

from __future__ import annotations

import enum
import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tracking import journal
from tracking.records import FINISHED, Point, RawPoint, RunInfo, printable
from tracking.sinks.base import PartialWrite, Sink, SinkError, SinkRejected
from tracking.spool import Ack, Journal, RunDir

LOG = logging.getLogger("cliptrack")

LAG_GRACE_S = 0.25
"""Seconds beyond ``flush_interval_s`` the oldest queued point may wait before ``log`` waits."""


class LaneState(str, enum.Enum):
    """Where a sink lane stands (a str enum: compares equal to its value, "ok" etc.)."""

    OPENING = "opening"
    OK = "ok"
    FAILING = "failing"
    REJECTED = "rejected"
    CLOSED = "closed"

    def __str__(self) -> str:
        return self.value


class WriterClosed(RuntimeError):
    """``submit`` after the writer stopped accepting points."""


@dataclass(frozen=True)
class Batch:
    """Journal bytes ``data`` (whole lines) from byte ``start`` of points.jsonl, whose first line is
    line number ``first``; ``lines`` counts them.

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

    def tail(self, offset: int) -> Batch:
        """The part of this batch past journal byte ``offset`` (a line boundary)."""
        if offset <= self.start:
            return self
        cut = offset - self.start
        return Batch(
            self.data[cut:],
            offset,
            self.first + self.data.count(b"\n", 0, cut),
            self.lines - self.data.count(b"\n", 0, cut),
        )

    def decode(self, run_dir: RunDir) -> tuple[list[Point], list[int]]:
        """The batch's points and the journal offset just past each; damaged lines are reported
        (``run_dir.report_damaged``) and skipped."""
        return journal.decode(self.data, self.start, run_dir.report_damaged)


@dataclass
class _Marker:
    """Set by the writer once the first ``target`` submitted points are in points.jsonl."""

    target: int
    done: threading.Event = field(default_factory=threading.Event)
    offset: int = 0
    durable: bool = False


class SinkLane:
    """Feeds one sink from its own thread; acknowledges progress (journal offsets) in the run directory."""

    def __init__(
        self,
        sink: Sink,
        run_dir: RunDir,
        run: RunInfo,
        *,
        max_buffered_points: int,
        max_batch_points: int,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        state: dict[str, Any] | None = None,
        journal_end: Ack | None = None,
        freeze_gc: bool = False,
        lock_wait_s: float = 0.0,
    ) -> None:
        self.sink = sink
        self.freeze_gc = freeze_gc
        self.lock_wait_s = lock_wait_s
        self.name: str = sink.name
        self.run_dir = run_dir
        self.run = run
        self.max_buffered_points = max_buffered_points
        self.max_batch_points = max_batch_points
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._resume_state = state
        self.state = LaneState.OPENING
        self.error: str | None = None
        self.failures = 0
        self.sent_points = 0
        """Points this lane has handed to its sink successfully."""
        self.opened = threading.Event()
        self.closed_cleanly = False
        self._cond = threading.Condition()
        self._queue: deque[Batch] = deque()
        self._buffered = 0
        self._ack = run_dir.read_ack(self.name)
        self.resumed_from = self._ack
        """Where this lane started in the journal (after reading back what the backend holds)."""
        self._journal_end = journal_end or self._ack
        self._from_journal = self._journal_end.offset > self._ack.offset  # resuming: the tail is on disk
        self._stopping = False
        self._deadline = float("inf")
        self._status: str | None = None
        self._warned = False
        self._ack_error: str | None = None
        self._configs: deque[dict[str, Any]] = deque()
        if state is None:  # so that replay can reach a sink that never opened
            run_dir.update_meta(sinks={self.name: {**sink.settings(), "closed": False}})
        self._thread = threading.Thread(target=self._run, name=f"cliptrack-{self.name}", daemon=True)

    # ---- writer-thread side --------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def offer(self, batch: Batch) -> None:
        """Hand a batch already durable in points.jsonl to this lane (never blocks on the sink)."""
        with self._cond:
            self._journal_end = Ack(batch.first + batch.lines, batch.end)
            if not self._from_journal:
                if self._buffered + batch.lines > self.max_buffered_points:
                    self._from_journal = True
                    self._queue.clear()
                    self._buffered = 0
                    LOG.info(
                        "%s is more than %d points behind; it will read them back from %s",
                        self.name,
                        self.max_buffered_points,
                        printable(self.run_dir.points_path),
                    )
                else:
                    self._queue.append(batch)
                    self._buffered += batch.lines
            self._cond.notify()

    def offer_config(self, config: dict[str, Any]) -> None:
        """Queue a config update; applied on the lane thread before the next batch."""
        with self._cond:
            self._configs.append(config)
            self._cond.notify()

    def _apply_configs(self) -> None:
        while self._configs:
            config = self._configs.popleft()
            try:
                self.sink.log_config(config)
            except Exception as exc:  # noqa: BLE001 - config trouble never stops the metrics
                LOG.warning(
                    "%s did not take the config update %s: %s",
                    self.name,
                    printable(sorted(config)),
                    printable(exc),
                )

    @property
    def acked(self) -> Ack:
        return self._ack

    @property
    def acked_points(self) -> int:
        return self._ack.points

    @property
    def buffered_points(self) -> int:
        """Points this lane holds in memory now."""
        return self._buffered

    def pending_points(self) -> int:
        with self._cond:
            return max(0, self._journal_end.points - self._ack.points)

    def wait_acked(self, offset: int, deadline: float) -> bool:
        """Wait until the journal up to byte ``offset`` is acknowledged; False on timeout or when
        the sink is failing (a failing sink is not waited for: its points are spooled)."""
        with self._cond:
            while self._ack.offset < offset:
                if (
                    self.state in (LaneState.FAILING, LaneState.REJECTED, LaneState.CLOSED)
                    and self.opened.is_set()
                ):
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
    def _set_state(self, state: LaneState) -> None:
        with self._cond:
            self.state = state
            self._cond.notify_all()

    def _run(self) -> None:
        locked = self.run_dir.lock_sink(self.name)
        give_up = time.monotonic() + self.lock_wait_s
        while not locked and time.monotonic() < give_up:  # a closed tracker's request still in flight
            time.sleep(0.2)
            locked = self.run_dir.lock_sink(self.name)
        if not locked:
            self.error = f"another process is writing {self.name} for run {self.run.run_id}"
            self._set_state(LaneState.FAILING)
            self.opened.set()
            return
        try:
            if not self._open():
                return
            self._pump()
            if self._caught_up() and self.state is LaneState.OK:
                try:
                    self.sink.close(self._status or FINISHED)
                    self.closed_cleanly = True
                except Exception as exc:  # noqa: BLE001 - reported, never raised into training
                    self._fail(exc)
                else:
                    self._save_meta(sinks={self.name: {"closed": True, "status": self._status}})
        finally:
            if self.closed_cleanly:
                self._set_state(LaneState.CLOSED)
            else:
                self._set_state(self.state)
            self.run_dir.unlock_sink(self.name)

    def _open(self) -> bool:
        backoff = self.backoff_initial_s
        first = True
        while True:
            try:
                try:
                    state = self.sink.open(self.run, self._resume_state)
                finally:
                    if first and self.freeze_gc:  # the client's modules and session, imported by now
                        gc.freeze()
                    first = False
                if self._resume_state is not None:
                    self._reconcile()
                self._save_meta(sinks={self.name: {**state, "closed": False}})
                self._set_state(LaneState.OK)
                self.opened.set()
                if self._warned:
                    LOG.warning("%s is reachable again: %s", self.name, printable(self.sink.location))
                return True
            except Exception as exc:  # noqa: BLE001 - a backend that cannot open is retried, never raised into training
                self._fail(exc)
                self.opened.set()
                if self.state is LaneState.REJECTED or not self._sleep(backoff):
                    return False
                backoff = min(backoff * 2, self.backoff_max_s)

    def _reconcile(self) -> None:
        """Resuming (a new process or replay): start from what the backend really holds when it
        can tell (W&B reads its transaction log back), else from the recorded acknowledgement."""
        with self._cond:
            end = self._journal_end.offset
        offset = self.sink.delivered(self.run, self.run_dir.read_points(0, end))
        if offset is None or offset == self._ack.offset:
            return
        ack = Ack(self.run_dir.count_points(0, offset), offset)
        LOG.info(
            "%s holds the journal up to byte %d (acknowledged: %d); going on from there",
            self.name,
            offset,
            self._ack.offset,
        )
        self._persist_ack(ack)
        with self._cond:
            self._ack = self.resumed_from = ack
            self._queue.clear()
            self._buffered = 0
            self._from_journal = ack.offset < self._journal_end.offset
            self._cond.notify_all()

    def _save_meta(self, **fields: Any) -> None:
        try:
            self.run_dir.update_meta(**fields)
        except OSError as exc:
            self._disk_warning(f"cannot update {self.run_dir.meta_path}: {exc}")

    def _disk_warning(self, text: str) -> None:
        if self._ack_error is None:
            LOG.warning(
                "%s: %s; progress is kept in memory and saved again later", self.name, printable(text)
            )
        self._ack_error = text

    def _caught_up(self) -> bool:
        with self._cond:
            return self._ack.offset >= self._journal_end.offset

    def _pump(self) -> None:
        """Write batches to the sink until stopped: each acknowledged once written; a failed write
        is retried from the journal after a backoff that doubles up to ``backoff_max_s`` seconds."""
        backoff = self.backoff_initial_s
        while (batch := self._next_batch()) is not None:
            points, ends = batch.decode(self.run_dir)
            if not points:  # nothing readable past the acknowledged offset
                if self._step_over_unreadable(batch, ends):
                    continue
                return
            if self._write(batch, ends, points):
                self._note_recovery()
                backoff = self.backoff_initial_s
            elif self.state is LaneState.REJECTED or not self._sleep(backoff):
                return
            else:
                backoff = min(backoff * 2, self.backoff_max_s)

    def _next_batch(self) -> Batch | None:
        """The next batch to write, applying queued config updates meanwhile; ``None``: stop."""
        while True:
            with self._cond:
                if not self._wait_for_work_locked():
                    return None
                batch = self._next_batch_locked() if (self._queue or self._from_journal) else None
            if batch is not None:
                return batch
            self._apply_configs()

    def _wait_for_work_locked(self) -> bool:
        """Wait (holding ``_cond``) for points or configs to send, dropping acknowledged batches;
        False when the lane is stopping with nothing left, or past its stop deadline."""
        while True:
            if self._from_journal and self._ack.offset >= self._journal_end.offset:
                self._from_journal = False  # caught up from disk: back to memory batches
            while self._queue and self._queue[0].end <= self._ack.offset:
                self._buffered -= self._queue.popleft().lines
            if self._queue or self._from_journal or self._configs:
                break
            if self._stopping:
                return False
            self._cond.wait()
        return not (self._stopping and time.monotonic() >= self._deadline)

    def _step_over_unreadable(self, batch: Batch, ends: list[int]) -> bool:
        """A batch with no readable point: acknowledge its damaged lines, or, when nothing lies past
        the acknowledged offset, go back to memory batches. False when the lane is stopping then."""
        if batch.end > self._ack.offset:  # only damaged lines: step over them
            self._acknowledge(batch, ends, 0)
            return True
        with self._cond:
            self._from_journal = False
            return not self._stopping

    def _write(self, batch: Batch, ends: list[int], points: list[Point]) -> bool:
        """Send pending configs and ``points`` to the sink and acknowledge them; on failure record
        it, acknowledge what a partial write took, and resend the rest from the journal. True if
        written."""
        try:
            self._apply_configs()
            self.sink.write(points)
        except Exception as exc:  # noqa: BLE001 - a sink's failure is recorded and retried, never raised into training
            if isinstance(exc, PartialWrite) and exc.written:
                self._acknowledge(batch, ends, exc.written)
            self._fail(exc)
            with self._cond:
                self._from_journal = True
                self._queue.clear()
                self._buffered = 0
            return False
        self._acknowledge(batch, ends, len(points))
        return True

    def _note_recovery(self) -> None:
        """After a successful write: a failing lane is OK again (and says so)."""
        if self.state is not LaneState.FAILING:
            return
        LOG.warning(
            "%s recovered; %d points behind, catching up from the spool",
            self.name,
            self.pending_points(),
        )
        with self._cond:
            self.state = LaneState.OK
            self.error = None
            self._cond.notify_all()

    def _next_batch_locked(self) -> Batch:
        if self._from_journal:
            start = self._ack.offset
            data = self.run_dir.read_lines(start, self._journal_end.offset, self.max_batch_points)
            return Batch(data, start, self._ack.points, data.count(b"\n"))
        return self._queue[0].tail(self._ack.offset)

    def _acknowledge(self, batch: Batch, ends: Sequence[int], written: int) -> None:
        """Record that the first ``written`` of the batch's readable points reached the sink (all
        of them: the whole batch, damaged lines included). The in-memory acknowledgement always
        advances, so a batch is never sent twice by this process; saving it to disk is retried with
        the next batch when it fails."""
        self.sent_points += written
        if written >= len(ends):
            ack = Ack(batch.first + batch.lines, batch.end)
        else:
            ack = Ack(batch.first + written, ends[written - 1])
        with self._cond:
            self._ack = ack
            self._cond.notify_all()
        self._persist_ack(ack)

    def _persist_ack(self, ack: Ack) -> None:
        try:
            self.run_dir.write_ack(self.name, ack)
        except OSError as exc:
            self._disk_warning(f"cannot save its progress to {self.run_dir.ack_path(self.name)}: {exc}")
        else:
            self._ack_error = None

    def _fail(self, exc: BaseException) -> None:
        self.failures += 1
        self.error = printable(exc)
        rejected = isinstance(exc, SinkRejected) or (
            isinstance(exc, PartialWrite) and isinstance(exc.cause, SinkRejected)
        )
        self._set_state(LaneState.REJECTED if rejected else LaneState.FAILING)
        where = printable(self.run_dir.points_path)
        if rejected:
            LOG.warning(
                "%s refused the data: %s. Training continues; its points stay in %s; fix the cause "
                "and run `cliptrack replay %s`",
                self.name,
                self.error,
                where,
                printable(self.run_dir.root),
            )
        elif not self._warned:
            LOG.warning(
                "%s is failing: %s. Training continues; points are kept in %s and retried with backoff",
                self.name,
                self.error if isinstance(exc, SinkError) else f"{type(exc).__name__}: {self.error}",
                where,
            )
        else:
            LOG.debug("%s still failing: %s", self.name, self.error)
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
        journal: Journal,
        lanes: Sequence[SinkLane],
        *,
        flush_interval_s: float,
        max_batch_points: int,
        max_queued_points: int,
    ) -> None:
        if flush_interval_s <= 0:
            raise ValueError(f"flush_interval_s must be > 0 seconds, got {flush_interval_s!r}")
        if max_batch_points < 1:
            raise ValueError(f"max_batch_points must be >= 1, got {max_batch_points!r}")
        if max_queued_points < max_batch_points:
            raise ValueError(
                f"max_queued_points={max_queued_points} must be >= max_batch_points={max_batch_points}"
            )
        self.journal = journal
        self.lanes = list(lanes)
        self.flush_interval_s = flush_interval_s
        self.max_batch_points = max_batch_points
        self.max_queued_points = max_queued_points
        self._max_lag_s = flush_interval_s + LAG_GRACE_S
        self._inbox: deque[RawPoint] = deque()
        self._lock = threading.RLock()  # orders submit against stop (reentrant: a signal handler may close)
        self._progress = threading.Condition()
        self._markers: list[_Marker] = []
        self._wake = threading.Event()
        self._accepting = True
        self._stopping = False
        self.submitted = 0
        self.points_journaled = 0
        self.values_journaled = 0
        self.waits = 0
        self.journal_error: str | None = None
        self.unwritten = 0
        self._thread = threading.Thread(target=self._run, name="cliptrack-writer", daemon=True)

    def start(self) -> None:
        for lane in self.lanes:
            lane.start()
        self._thread.start()

    def submit(self, point: RawPoint) -> None:
        """Enqueue ``point`` (training thread): O(1), no I/O; waits only while the writer is behind
        by more than the bound (see the module docstring). Raises WriterClosed after ``stop``."""
        inbox = self._inbox
        if inbox and (len(inbox) >= self.max_queued_points or point[1] - inbox[0][1] > self._max_lag_s):
            self._wait_for_writer(point[1])
        with self._lock:
            if not self._accepting:
                raise WriterClosed("the writer is stopped")
            inbox.append(point)
            self.submitted += 1
        if len(inbox) >= self.max_batch_points:
            self._wake.set()

    def _behind(self, now: float) -> bool:
        inbox = self._inbox
        if not inbox or self.journal_error is not None or not self._thread.is_alive():
            return False
        try:
            oldest = inbox[0][1]
        except IndexError:
            return False
        return len(inbox) >= self.max_queued_points or now - oldest > self._max_lag_s

    def _wait_for_writer(self, now: float) -> None:
        if not self._behind(now):
            return
        if self.waits == 0:
            LOG.warning(
                "log() is faster than points can be written to %s: it waits while more than %d points "
                "or %.2f s of points are queued (backpressure keeps the crash window bounded)",
                printable(self.journal.location),
                self.max_queued_points,
                self._max_lag_s,
            )
        self.waits += 1
        while True:  # until the writer is within the bound again (each batch it writes wakes us)
            self._wake.set()
            with self._progress:
                self._progress.wait(0.05)
            if not self._behind(time.time()):
                return

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
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            self._write_pass(final=False)
            if self._stopping:
                self._write_pass(final=True)
                self.unwritten = len(self._inbox)
                return

    def _write_pass(self, *, final: bool) -> None:
        """Write what is queued now, one atomic batch at a time (points queued meanwhile wait for
        the next pass, so that one pass never outlasts the load)."""
        inbox = self._inbox
        budget = len(inbox)
        failed = False
        while inbox and (final or budget > 0):
            points: list[RawPoint] = []
            while inbox and len(points) < self.max_batch_points:
                points.append(inbox.popleft())
            budget -= len(points)
            start, first = self.journal.offset, self.journal.points
            try:
                data = self.journal.append(points)
            except Exception as exc:  # noqa: BLE001 - disk trouble: keep the points, retry next tick
                inbox.extendleft(reversed(points))
                if self.journal_error is None:
                    LOG.warning(
                        "cannot write %s: %s; points are held in memory and retried",
                        printable(self.journal.location),
                        printable(exc),
                    )
                self.journal_error = str(exc)
                failed = True
                break
            if self.journal_error is not None:
                LOG.warning("%s is writable again", printable(self.journal.location))
                self.journal_error = None
            self.points_journaled += len(points)
            self.values_journaled += sum(len(p[2]) for p in points)
            batch = Batch(data, start, first, len(points))
            for lane in self.lanes:
                lane.offer(batch)
            self._resolve_markers(failed=False)
            with self._progress:
                self._progress.notify_all()
        self._resolve_markers(failed=failed)
        with self._progress:
            self._progress.notify_all()

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
