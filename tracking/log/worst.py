"""A step's worst sequences, logged without blocking: ``Tracker.log_worst`` checks the table on the
training thread (``cliptrack.store.worst.checked``) and hands it here; this module's thread appends
it to the run directory's ``worst.jsonl`` (written and fsynced in batches, every table in logging
order) and then offers it to each remote sink's lane (``SinkLane.offer_worst``: a W&B table, an
MLflow artifact, on the sink's own thread).

Nothing logged is lost while the process lives: a table the disk refuses is kept in memory and
written with the next batch and at close (a warning says so once; the sinks still get it), a table
a sink refuses is retried by its lane. The queue holds at most ``MAX_QUEUED`` tables; past it
``log_worst`` waits for the thread (backpressure, as ``log`` does, warned once), which at a few
microseconds per table never happens in practice.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable

from cliptrack.core.text import printable
from cliptrack.core.worst import Worst
from cliptrack.store import worst as stored
from cliptrack.store.spool import RunDir

LOG = logging.getLogger("cliptrack")

MAX_QUEUED = 10_000
"""Tables queued for the thread before ``log_worst`` waits (a few MB at ``k`` = 8)."""


class WorstLog:
    """The run's worst-sequence tables on their own thread (see the module docstring);
    ``deliver(worst)`` hands a table written (or held) to the sinks' lanes."""

    def __init__(self, run_dir: RunDir, deliver: Callable[[Worst], None]) -> None:
        self.path = run_dir.path / stored.WORST_FILE
        self._deliver = deliver
        self._queue: deque[tuple[Worst, bytes]] = deque()
        self._cond = threading.Condition()
        self._unwritten: list[bytes] = []
        """Lines the disk refused, written before the next ones."""
        self._offered = 0
        self._done = 0
        self._stopping = False
        self._warned_full = False
        self._warned_disk = False
        self.logged = 0
        """Tables handed to ``offer``."""
        self._thread = threading.Thread(target=self._run, name="cliptrack-worst", daemon=True)
        self._thread.start()

    # ---- training thread -------------------------------------------------------------------------
    def offer(self, worst: Worst) -> None:
        """Queue a checked table (``cliptrack.store.worst.checked``); waits only while ``MAX_QUEUED``
        tables are queued."""
        line = stored.encode(worst)
        with self._cond:
            while len(self._queue) >= MAX_QUEUED and self._thread.is_alive():
                if not self._warned_full:
                    self._warned_full = True
                    LOG.warning("%d worst-sequence tables wait for the disk; log_worst waits", MAX_QUEUED)
                self._cond.wait(0.1)
            self._queue.append((worst, line))
            self._offered += 1
            self.logged += 1
            self._cond.notify_all()

    # ---- any thread ------------------------------------------------------------------------------
    @property
    def unwritten(self) -> int:
        """Tables the disk has refused so far and not taken since (held in memory)."""
        with self._cond:
            return len(self._unwritten)

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queued table is written (or held) and offered to the lanes; False on timeout."""
        with self._cond:
            target = self._offered
            return self._cond.wait_for(lambda: self._done >= target, max(0.0, timeout_s))

    def stop(self, timeout_s: float) -> None:
        """Write and hand on what is queued (up to ``timeout_s`` seconds), then end the thread."""
        self.drain(timeout_s)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(max(0.0, timeout_s))
        if not self._thread.is_alive() and self.unwritten:
            self._write([])  # the disk's last chance: what it refused before

    # ---- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queue) or self._stopping)
                batch = list(self._queue)
                self._queue.clear()
                self._cond.notify_all()  # room again for a waiting log_worst
                if not batch and self._stopping:
                    return
            self._write([line for _, line in batch])
            for worst, _ in batch:
                try:
                    self._deliver(worst)
                except Exception as exc:  # noqa: BLE001 - reported, never raised into training
                    LOG.warning("the worst sequences could not be handed to the sinks: %s", printable(exc))
            with self._cond:
                self._done += len(batch)
                self._cond.notify_all()

    def _after_torn_tail(self, size: int) -> bytes:
        """A newline when the file ends in a line torn by a crash (a resumed run), so that the
        next line starts a line of its own; else nothing."""
        if size == 0:
            return b""
        with open(self.path, "rb") as fh:
            fh.seek(size - 1)
            return b"" if fh.read(1) == b"\n" else b"\n"

    def _write(self, lines: list[bytes]) -> None:
        """Append the held lines and ``lines`` to ``worst.jsonl``, fsynced; held again on failure."""
        pending = self._unwritten + lines
        try:
            with open(self.path, "ab") as fh:
                start = fh.seek(0, os.SEEK_END)
                try:
                    fh.write(self._after_torn_tail(start) + b"".join(pending))
                    fh.flush()
                    os.fsync(fh.fileno())
                except OSError:
                    os.ftruncate(fh.fileno(), start)  # no partial line left for the next to follow
                    raise
        except OSError as exc:
            with self._cond:
                self._unwritten = pending
            if not self._warned_disk:
                self._warned_disk = True
                LOG.warning(
                    "cannot write the worst sequences to %s: %s; they are held in memory and the sinks "
                    "still get them",
                    printable(self.path),
                    printable(exc),
                )
            return
        with self._cond:
            self._unwritten = []
        if self._warned_disk:
            self._warned_disk = False
            LOG.warning("%s takes the worst sequences again", printable(self.path))
