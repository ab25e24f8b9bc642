"""Wall-time stamps that keep every point of a run a distinct row in every backend.

MLflow's SQL store identifies a metric row by (run, key, value, step, timestamp in milliseconds):
two points logged at one step with equal values in the same millisecond (per-micro-batch
logging) collapse into one row. ``StepClock.stamp`` gives each point its wall time (unix seconds)
such that no two points of one run share a step *and* a millisecond: a repeat of the step within
the millisecond of an earlier point at that step is moved to the next free millisecond (the
stamp is then the middle of that millisecond, so ``int(wall_time * 1000)`` names it exactly).

Points at different steps keep the clock's own time, so ordinary logging never runs ahead of the
clock; a burst of ``n`` points at one step runs at most ``n`` milliseconds ahead. The stamp is
written to the journal, so a re-sent or replayed point has the same timestamp (and a re-sent row
is merged by the store, never stored twice).
"""

from __future__ import annotations

import time
from collections.abc import Callable


def millisecond(wall_time: float) -> int:
    """The millisecond (unix ms) a sink stores for a point stamped ``wall_time`` (unix seconds)."""
    return int(wall_time * 1000)


class StepClock:
    """Stamps the points of one run (one instance per tracker; training thread only)."""

    __slots__ = ("_ms", "_now", "_steps")

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self._now = now
        """The clock: unix seconds."""
        self._ms = -1
        """The latest millisecond a stamp was placed in."""
        self._steps: set[int] = set()
        """Steps already stamped in millisecond ``_ms``."""

    def stamp(self, step: int) -> float:
        """The wall time (unix seconds) of a point at ``step`` logged now."""
        now = self._now()
        ms = int(now * 1000)
        if ms > self._ms:
            self._ms = ms
            self._steps = {step}
            return now
        if step not in self._steps:  # same millisecond (or the clock stepped back): still distinct
            self._steps.add(step)
            return now if ms == self._ms else (self._ms + 0.5) / 1000
        self._ms += 1  # this step already has a point in this millisecond: the next one
        self._steps = {step}
        return (self._ms + 0.5) / 1000
