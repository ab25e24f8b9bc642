"""How fast the spool disk takes the writer's batches: the crash window in seconds, on any disk.

The writer times each batch it appends to the journal (encoding, ``pwrite`` and ``fsync``);
``DiskPace`` keeps the last ``WRITES`` of them. From them come

- ``per_value``: seconds per metric value over those writes (a throttled disk makes a small write
  after a large one wait for the large one's bytes: the sum over several writes is its real pace);
- ``floor_s``: the quickest of those writes (what one write costs at least: an fsync);
- the seconds one write of the queued points will take (``write_s``: ``floor_s`` plus
  ``per_value`` per value; values past ``proven``, twice the largest recent batch, count at least
  ``FIRST_PER_VALUE_S`` each: a pace is trusted only for writes about the size it was measured
  on). ``log`` waits while the queued points would reach the disk later than the lag bound allows
  (``cliptrack.log._pipeline.writer``), so that on a slow disk the crash window stays in seconds, not points;
- the size of one batch (``batch_values``): at most about ``batch_s`` of writing (the writer gives
  half its lag bound: a point waits for the write in progress, then for its own), so that a slow
  disk gets a smaller fsync unit (a fast one still takes ``max_batch_points`` at a time),
  and at most ``proven`` values: a disk (or a throttle) that takes its first writes quickly and
  then slows down is found out before one batch outlasts the window.

Before the first batch is timed the estimate assumes a slow disk (``FIRST_PER_VALUE_S``), so the
first batch is small.
"""

from __future__ import annotations

from collections import deque

FIRST_PER_VALUE_S = 1e-3
"""Seconds per metric value assumed before the first batch is timed (a 10-metric point is about
300 bytes: a disk of about 30 KB/s)."""
WRITES = 8
"""Writes the estimate spans."""


class DiskPace:
    """The writer's estimate of its disk (writer thread writes it, the training thread reads it)."""

    __slots__ = ("batch_s", "floor_s", "per_value", "proven", "slowest_s", "_writes")

    def __init__(self, batch_s: float) -> None:
        self.batch_s = batch_s
        """Seconds of writing one batch is cut to."""
        self.per_value = FIRST_PER_VALUE_S
        """Seconds one metric value takes to be written (the estimate)."""
        self.floor_s = 0.0
        """Seconds the quickest recent write took: what one write costs at least."""
        self.proven = 0
        """Twice the metric values of the largest recent batch: how far ``per_value`` is trusted."""
        self.slowest_s = 0.0
        """The longest one batch took (seconds)."""
        self._writes: deque[tuple[float, int]] = deque(maxlen=WRITES)

    def timed(self, seconds: float, values: int) -> None:
        """One batch of ``values`` metric values took ``seconds`` to append and fsync."""
        writes = self._writes
        writes.append((seconds, max(1, values)))
        self.per_value = sum(s for s, _ in writes) / sum(v for _, v in writes)
        self.floor_s = min(s for s, _ in writes)
        self.proven = 2 * max(v for _, v in writes)
        self.slowest_s = max(self.slowest_s, seconds)

    def write_s(self, values: int) -> float:
        """Seconds one write of ``values`` metric values will take."""
        seconds = self.floor_s + values * self.per_value
        if values > self.proven and self.per_value < FIRST_PER_VALUE_S:
            seconds += (values - self.proven) * (FIRST_PER_VALUE_S - self.per_value)
        return seconds

    def batch_values(self) -> int:
        """The most metric values one batch should hold (at least one point is always taken)."""
        most = int(self.batch_s / self.per_value)
        return max(1, min(most, self.proven) if self.proven else most)
