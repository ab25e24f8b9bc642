"""A sink lane: one thread feeding one sink, as a small state machine.

States (``LaneState``): OPENING -> OK <-> FAILING; REJECTED (the backend refused the run itself:
retrying cannot help); CLOSED (caught up and the sink's run ended). The lane takes batches from
the writer (``offer``) into a queue bounded in points and in bytes; a lane that falls further
behind (slow or dead backend) drops its in-memory copies, which are in the journal (on disk, or
held in memory by the writer while the disk refuses them), and reads them back from there.
Batches go out in order through ``cliptrack.log._pipeline.delivery`` (refused keys left out for this sink only);
each success advances the acknowledgement (``cliptrack.log._pipeline.acks``). Params and tags go first, after
every (re)open and config update, until the sink has taken or refused each (``cliptrack.store.params``).
"""

from __future__ import annotations

import enum
import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from cliptrack.backends.base import Alert, Sink, SinkError
from cliptrack.core.text import printable
from cliptrack.core.worst import Worst
from cliptrack.log._pipeline.acks import AckBook
from cliptrack.log._pipeline.delivery import Backlog, Batch, Refusals, Sender, rejected
from cliptrack.store.params import ParamBook
from cliptrack.store.params import summary as params_summary
from cliptrack.store.records import FINISHED, Point, RunInfo
from cliptrack.store.spool import Ack, RunDir

LOG = logging.getLogger("cliptrack")

MAX_BUFFERED_BYTES = 32 * 2**20
"""Default bytes of encoded points one lane holds in memory before reading back from the journal."""

_PARAMS = Batch(b"", 0, 0, 0)
"""What ``_next_batch`` returns when only params and tags are left to send."""

ReadLines = Callable[[int, int, int], bytes]
"""``read(offset, end, limit)``: at most ``limit`` whole journal lines between byte ``offset`` and ``end``."""


class LaneState(str, enum.Enum):
    """Where a sink lane stands (a str enum: compares equal to its value, "ok" etc.)."""

    OPENING = "opening"
    OK = "ok"
    FAILING = "failing"
    REJECTED = "rejected"
    CLOSED = "closed"

    def __str__(self) -> str:
        return self.value


class SinkLane:
    """Feeds one sink from its own thread; acknowledges progress (journal offsets) in the run directory.

    ``read_lines`` reads the journal back (default: the file; the tracker passes the writer's
    ``HeldTail``, which also serves batches the disk refused); ``durable`` answers the journal's
    on-disk end, past which acknowledgements are not saved.
    """

    def __init__(
        self,
        sink: Sink,
        run_dir: RunDir,
        run: RunInfo,
        *,
        max_buffered_points: int,
        max_batch_points: int,
        max_buffered_bytes: int = MAX_BUFFERED_BYTES,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 30.0,
        state: dict[str, Any] | None = None,
        journal_end: Ack | None = None,
        freeze_gc: bool = False,
        lock_wait_s: float = 0.0,
        read_lines: ReadLines | None = None,
        durable: Callable[[], int] | None = None,
    ) -> None:
        self.sink = sink
        self.name: str = sink.name
        self.run_dir = run_dir
        self.run = replace(run, config=dict(run.config))
        """The run, with this lane's own copy of its config (updated on the lane thread)."""
        self.freeze_gc = freeze_gc
        self.lock_wait_s = lock_wait_s
        self.max_buffered_points = max_buffered_points
        self.max_buffered_bytes = max_buffered_bytes
        self.max_batch_points = max_batch_points
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._read_lines = read_lines or run_dir.read_lines
        self._resume_state = state
        self.state = LaneState.OPENING
        self.error: str | None = None
        self.failures = 0
        self.sent_points = 0
        """Points this lane has handed to its sink successfully."""
        self.sent_in_memory_only = 0
        """Points in no journal (past the writer's held bound) this lane sent."""
        self.opened = threading.Event()
        self.closed_cleanly = False
        self.refusals = Refusals(self.name, run.run_id, sink.check_key)
        self.sender = Sender(sink, self.refusals)
        self._cond = threading.Condition()
        self._queue = Backlog(max_buffered_points, max_buffered_bytes)
        self.acks = AckBook(self.name, run_dir, durable)
        self.params = ParamBook(self.name, run_dir)
        self._params_due = True
        """Params or tags may be pending: sent before the next batch (and before the sink is closed)."""
        self.params_left: int | None = None
        """Params and tags the sink has not taken at the last try (None: not tried yet)."""
        self.params_refused: dict[str, str] = {}
        """Params and tags the sink refused (name -> why), with the run's current values."""
        self.resumed_from = self.acks.current
        """Where this lane started in the journal (after reading back what the backend holds)."""
        self._journal_end = journal_end or self.acks.current
        self._from_journal = self._journal_end.offset > self.acks.current.offset  # resuming: tail on disk
        self._stopping = False
        self._deadline = float("inf")
        self._status: str | None = None
        self._warned = False
        self._configs: deque[dict[str, Any]] = deque()
        self._alerts: deque[Alert] = deque()
        self._worst_warned = False
        self.alerts_sent = 0
        """Alerts (a live watch's breaches) this lane's sink has taken."""
        self._worst: deque[Worst] = deque()
        self._worst_failed: list[Worst] = []
        """Tables the sink failed to take: tried again with the lane's next work and before close."""
        self.worst_sent = 0
        """Tables of worst sequences this lane's sink has taken."""
        if state is None:  # so that replay can reach a sink that never opened
            run_dir.update_meta(sinks={self.name: {**sink.settings(), "closed": False}})
        self._thread = threading.Thread(target=self._run, name=f"cliptrack-{self.name}", daemon=True)

    # ---- writer-thread side --------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def offer(self, batch: Batch) -> None:
        """Hand a batch (in the journal, or held for it, or in memory only) to this lane; never
        blocks on the sink."""
        with self._cond:
            if batch.journaled:
                self._journal_end = Ack(batch.first + batch.lines, batch.end)
            if self._from_journal:
                if not batch.journaled:
                    self._queue.lost += batch.lines  # behind, and the batch is nowhere to read back
            elif not self._queue.fits(batch):
                self._drop_queue_locked()
                LOG.info(
                    "%s is more than %d points or %d MB behind; it will read them back from %s",
                    self.name,
                    self.max_buffered_points,
                    self.max_buffered_bytes // 2**20,
                    printable(self.run_dir.points_path),
                )
                if not batch.journaled:
                    self._queue.lost += batch.lines
            else:
                self._queue.push(batch)
            self._cond.notify()

    def _drop_queue_locked(self) -> None:
        """Read back from the journal from now on; batches in no journal are lost to this lane."""
        self._from_journal = True
        self._queue.clear()

    def journal_advanced(self) -> None:
        """The journal's on-disk end moved (the disk took held batches): save the acknowledgement."""
        with self._cond:
            self.acks.journal_advanced()

    def offer_config(self, config: dict[str, Any]) -> None:
        """Queue a config update; applied on the lane thread before the next batch."""
        with self._cond:
            self._configs.append(config)
            self._cond.notify()

    def offer_alert(self, alert: Alert) -> None:
        """Queue a live watch's alert; raised on the lane thread before the next batch."""
        with self._cond:
            self._alerts.append(alert)
            self._cond.notify()

    def _apply_alerts(self) -> None:
        while self._alerts:
            alert = self._alerts.popleft()
            try:
                self.sink.alert(alert)
                self.alerts_sent += 1
            except Exception as exc:  # noqa: BLE001 - an alert never stops the metrics
                LOG.warning(
                    "%s did not take the alert %r: %s", self.name, printable(alert.title), printable(exc)
                )

    def offer_worst(self, worst: Worst) -> None:
        """Queue a step's worst sequences; logged on the lane thread before the next batch."""
        with self._cond:
            self._worst.append(worst)
            self._cond.notify()

    @property
    def worst_pending(self) -> int:
        """Tables of worst sequences offered that the sink has not taken (yet)."""
        with self._cond:
            return len(self._worst) + len(self._worst_failed)

    def _apply_worst(self) -> None:
        """Log the tables that failed before, then the queued ones, in order; at the first failure
        the rest wait for the lane's next work (one warning per run of failures)."""
        with self._cond:
            todo = self._worst_failed + list(self._worst)
            self._worst_failed = []
            self._worst.clear()
        for index, worst in enumerate(todo):
            try:
                self.sink.log_worst(worst)
            except Exception as exc:  # noqa: BLE001 - a table never stops the metrics
                with self._cond:
                    self._worst_failed = todo[index:] + self._worst_failed
                if not self._worst_warned:
                    self._worst_warned = True
                    LOG.warning(
                        "%s did not take the worst sequences of step %d: %s (kept in %s; tried again)",
                        self.name,
                        worst.step,
                        printable(exc),
                        printable(self.run_dir.path),
                    )
                return
            self.worst_sent += 1
            self._worst_warned = False

    def _apply_configs(self) -> None:
        self._apply_alerts()
        if self._worst or self._worst_failed:
            self._apply_worst()
        while self._configs:
            config = self._configs.popleft()
            self.run.config.update(config)
            self._params_due = True
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
        return self.acks.current

    @property
    def acked_points(self) -> int:
        return self.acks.current.points

    @property
    def buffered_points(self) -> int:
        """Points this lane holds in memory now."""
        return self._queue.points

    @property
    def buffered_bytes(self) -> int:
        """Bytes of encoded points this lane holds in memory now."""
        return self._queue.bytes

    @property
    def lost_points(self) -> int:
        """Points in no journal (past the writer's held bound) this lane dropped before sending."""
        return self._queue.lost

    def pending_points(self) -> int:
        with self._cond:
            return max(0, self._journal_end.points - self.acks.current.points)

    def wait_acked(self, offset: int, deadline: float) -> bool:
        """Wait until the journal up to byte ``offset`` is acknowledged; False on timeout or when
        the sink is failing (a failing sink is not waited for: its points are spooled)."""
        with self._cond:
            while self.acks.current.offset < offset:
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

    def _lock(self) -> bool:
        locked = self.run_dir.lock_sink(self.name)
        give_up = time.monotonic() + self.lock_wait_s
        while not locked and time.monotonic() < give_up:  # a closed tracker's request still in flight
            time.sleep(0.2)
            locked = self.run_dir.lock_sink(self.name)
        return locked

    def _run(self) -> None:
        if not self._lock():
            self.error = f"another process is writing {self.name} for run {self.run.run_id}"
            self._set_state(LaneState.FAILING)
            self.opened.set()
            return
        try:
            if not self._open():
                return
            self._pump()
            if self._caught_up() and self.state is LaneState.OK:
                self._close_sink()
        finally:
            self._set_state(LaneState.CLOSED if self.closed_cleanly else self.state)
            self.run_dir.unlock_sink(self.name)

    def _close_sink(self) -> None:
        if self._worst or self._worst_failed:  # the last tables (and those that failed) before the run ends
            self._apply_worst()
        try:
            self.sink.close(self._status or FINISHED)
            self.closed_cleanly = True
        except Exception as exc:  # noqa: BLE001 - reported, never raised into training
            self._fail(exc)
        else:
            self._save_meta(sinks={self.name: {"closed": True, "status": self._status}})

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
        can tell (W&B reads its transaction log back; a run created anew holds nothing), else from
        the recorded acknowledgement."""
        with self._cond:
            end = self._journal_end.offset
        offset = self.sink.delivered(self.run, self.run_dir.read_points(0, end))
        if offset == 0 and (self.params.taken or self.params.refused):
            self.params.reset()  # the backend holds nothing of the run: its params and tags neither
        if offset is None or offset == self.acks.current.offset:
            return
        ack = Ack(self.run_dir.count_points(0, offset), offset)
        LOG.info(
            "%s holds the journal up to byte %d (acknowledged: %d); going on from there",
            self.name,
            offset,
            self.acks.current.offset,
        )
        with self._cond:
            self.acks.reset(ack)
            self.resumed_from = ack
            self._drop_queue_locked()
            self._from_journal = ack.offset < self._journal_end.offset
            self._cond.notify_all()

    def _save_meta(self, **fields: Any) -> None:
        try:
            self.run_dir.update_meta(**fields)
        except OSError as exc:
            with self._cond:
                self.acks.disk_warning(f"cannot update {self.run_dir.meta_path}: {exc}")

    def _caught_up(self) -> bool:
        with self._cond:
            return (
                self.acks.current.offset >= self._journal_end.offset
                and not self._queue.memory_only()
                and not self._params_due
            )

    @property
    def params_due(self) -> bool:
        """True while params or tags may still be pending for this sink."""
        return self._params_due

    def params_summary(self) -> str:
        """``""`` when every param and tag is in the sink; else what is pending and each refusal
        (``cliptrack.store.params.summary``)."""
        with self._cond:
            left, refused, due = self.params_left, dict(self.params_refused), self._params_due
        text = params_summary(self.name, left or 0, refused)
        if due and not left:  # not tried yet, or a config update waits
            text = ", ".join(part for part in ("params and tags not all sent yet", text) if part)
        return text

    def _pump(self) -> None:
        """Write batches to the sink until stopped: each acknowledged once written; a failed write
        is retried from the journal after a backoff that doubles up to ``backoff_max_s`` seconds."""
        backoff = self.backoff_initial_s
        while (batch := self._next_batch()) is not None:
            if batch is _PARAMS:
                written = self._deliver_params()
            else:
                points, ends = batch.decode(self.run_dir.report_damaged)
                if not points:  # nothing readable past the acknowledged offset
                    if self._step_over_unreadable(batch, ends):
                        continue
                    return
                written = self._write(batch, ends, points)
            if written:
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
            if self._params_due:
                return _PARAMS

    def _wait_for_work_locked(self) -> bool:
        """Wait (holding ``_cond``) for points or configs to send, dropping acknowledged batches;
        False when the lane is stopping with nothing left, or past its stop deadline."""
        while True:
            if self._from_journal and self.acks.current.offset >= self._journal_end.offset:
                self._from_journal = False  # caught up from the journal: back to memory batches
            self._queue.drop_acknowledged(self.acks.current.offset)
            if (
                self._queue
                or self._from_journal
                or self._configs
                or self._alerts
                or self._worst
                or self._params_due
            ):
                break
            if self._stopping:
                return False
            self._cond.wait()
        return not (self._stopping and time.monotonic() >= self._deadline)

    def _step_over_unreadable(self, batch: Batch, ends: list[int]) -> bool:
        """A batch with no readable point: acknowledge its damaged lines, or, when nothing lies past
        the acknowledged offset, go back to memory batches. False when the lane is stopping then."""
        if batch.journaled and batch.end > self.acks.current.offset:  # only damaged lines: step over
            self._acknowledge(batch, ends, 0)
            return True
        with self._cond:
            if not batch.journaled:
                self._queue.pop(batch)
                return True
            self._from_journal = False
            return not self._stopping

    def _write(self, batch: Batch, ends: list[int], points: list[Point]) -> bool:
        """Send pending configs, then ``points`` (``cliptrack.log._pipeline.delivery.Sender``: refused keys left
        out, refused points isolated), and acknowledge what the sink took; on failure record it and
        resend the rest from the journal. True if the whole batch is done."""
        self._apply_configs()
        if self._params_due and not self._deliver_params():
            return False
        outcome = self.sender.send(points)
        if self.refusals.new:
            self.refusals.new = False
            self._save_meta(sinks={self.name: {"refused": self.refusals.record()}})
        if outcome.taken:
            self._acknowledge(batch, ends, outcome.taken)
        if outcome.error is None:
            return True
        self._fail(outcome.error)
        with self._cond:
            self._drop_queue_locked()
        return False

    def _deliver_params(self) -> bool:
        """Send the params and tags the sink has not taken (``cliptrack.store.params``); True when none is
        left pending (taken, or refused and reported), False after a failure (recorded)."""
        wanted = self.sink.attributes(self.run)
        pending = self.params.pending(wanted)
        error: BaseException | None = None
        if pending:
            try:
                refused = self.sink.send_attributes(pending)
            except Exception as exc:  # noqa: BLE001 - retried like a failed batch
                error = exc
            else:
                self.params.record(pending, refused, self.run.run_id)
        left = len(self.params.pending(wanted))
        with self._cond:
            self.params_left = left
            self.params_refused = self.params.refusals(wanted)
            self._params_due = error is not None or bool(self._configs)
            self._cond.notify_all()
        if error is not None:
            self._fail(error)
            return False
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
            start = self.acks.current.offset
            data = self._read_lines(start, self._journal_end.offset, self.max_batch_points)
            return Batch(data, start, self.acks.current.points, data.count(b"\n"))
        return self._queue.first().tail(self.acks.current.offset)

    def _acknowledge(self, batch: Batch, ends: Sequence[int], written: int) -> None:
        """Record that the first ``written`` of the batch's readable points reached the sink (all
        of them: the whole batch, damaged lines included). The in-memory acknowledgement always
        advances, so a batch is never sent twice by this process; saving it to disk is retried with
        the next batch when it fails. A batch in no journal is dropped from the queue instead."""
        self.sent_points += written
        with self._cond:
            if not batch.journaled:
                self.sent_in_memory_only += written
                if written >= len(ends):
                    self._queue.pop(batch)
                self._cond.notify_all()
                return
            if written >= len(ends):
                ack = Ack(batch.first + batch.lines, batch.end)
            else:
                ack = Ack(batch.first + written, ends[written - 1])
            self.acks.advance(ack)
            self._cond.notify_all()

    def _fail(self, exc: BaseException) -> None:
        self.failures += 1
        self.error = printable(exc)
        refused = rejected(exc)
        self._set_state(LaneState.REJECTED if refused else LaneState.FAILING)
        where = printable(self.run_dir.points_path)
        if refused:
            LOG.warning(
                "%s refused the data: %s. Training continues; its points stay in %s; fix the cause "
                "and run `cliptrack replay %s`",
                self.name,
                self.error,
                where,
                printable(self.run_dir.root),
            )
        elif self._stopping and time.monotonic() >= self._deadline:
            # the tracker closed and summarized this lane already: no retry follows, no warning
            LOG.debug("%s failed after its run closed: %s", self.name, self.error)
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
