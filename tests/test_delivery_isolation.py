"""A point a backend refuses for a reason its ``check_key`` did not predict is isolated: the batch
is sent again point by point, the refused point reported (run, step, keys, why) and skipped for
that sink only; a backend that refuses every point refuses the run (nothing skipped, nothing
acknowledged). A real in-process sink; points counted in the journal and in the sink."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from cliptrack import Limits
from cliptrack.backends import Sink, SinkError, SinkRejected
from cliptrack.log.tracker import Tracker
from cliptrack.store.records import Point, RunInfo

from tests._journal import journal_steps, run_summary


class PickySink(Sink):
    """Refuses, whole, any batch holding a point with a negative value (or every batch)."""

    name = "picky"

    def __init__(self, refuse_all: bool = False) -> None:
        self.points: list[Point] = []
        self.refuse_all = refuse_all

    @property
    def location(self) -> str:
        return "picky"

    def open(self, run: RunInfo, state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {}

    def write(self, points: Sequence[Point]) -> None:
        if self.refuse_all or any(v < 0 for p in points for v in p.metrics.values()):
            raise SinkRejected("INVALID_PARAMETER_VALUE: negative values are not taken here")
        self.points.extend(points)

    def close(self, status: str) -> None:
        pass


def test_a_refused_point_is_skipped_and_every_other_point_delivered(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="cliptrack")
    sink = PickySink()
    poisoned = {17, 250, 251, 999}
    with Tracker(
        sinks=[sink], spool_dir=tmp_path, limits=Limits(max_batch_points=100), handle_signals=False
    ) as tracker:
        for step in range(1000):
            tracker.log(step, {"a:mean": -1.0 if step in poisoned else float(step)})
    assert journal_steps(tmp_path / tracker.run_id) == list(range(1000))  # the journal keeps all
    assert [p.step for p in sink.points] == [s for s in range(1000) if s not in poisoned]
    reports = [r.getMessage() for r in caplog.records if "refuses the point" in r.getMessage()]
    assert len(reports) == len(poisoned) and all(tracker.run_id in m for m in reports)
    assert sorted(int(m.split("at step ")[1].split(" ")[0]) for m in reports) == sorted(poisoned)
    assert "picky: all written" in run_summary(caplog, tracker.run_id)
    assert "4 points refused whole" in run_summary(caplog, tracker.run_id)


def test_a_sink_that_refuses_every_point_refuses_the_run_and_skips_nothing(tmp_path, caplog):
    sink = PickySink(refuse_all=True)
    tracker = Tracker(sinks=[sink], spool_dir=tmp_path, close_timeout_s=2, handle_signals=False)
    for step in range(300):
        tracker.log(step, {"a:mean": float(step)})
    tracker.close()
    lane = tracker._lanes[0]
    assert lane.state == "rejected" and lane.acked_points == 0 and lane.refusals.points_skipped == 0
    assert tracker.pending() == {"picky": 300} and not sink.points
    assert journal_steps(tmp_path / tracker.run_id) == list(range(300))


class StuckSink(PickySink):
    """Its ``open`` waits until released, then fails: a request still in flight when the run closes."""

    name = "stuck"

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def open(self, run: RunInfo, state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        self.release.wait(60)
        raise SinkError("connection reset")


@pytest.mark.slow
def test_a_lane_that_fails_after_its_run_closed_warns_no_more(tmp_path, caplog):
    """The closing summary already said what is pending; a request that fails after it must not
    announce retries that will never come (nor land in whatever is logging by then)."""
    caplog.set_level(logging.INFO, logger="cliptrack")
    sink = StuckSink()
    tracker = Tracker(sinks=[sink], spool_dir=tmp_path, handle_signals=False)
    for step in range(10):
        tracker.log(step, {"a:mean": float(step)})
    tracker.close(timeout_s=0.2)
    summary = run_summary(caplog, tracker.run_id)
    assert "stuck: 10 points pending" in summary, summary
    sink.release.set()
    tracker._lanes[0].join(30)
    assert not tracker._lanes[0]._thread.is_alive()
    late = [  # other tests' HTTP clients (urllib3) may still be retrying in their threads
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("cliptrack")
    ]
    assert not late, late
    assert journal_steps(tmp_path / tracker.run_id) == list(range(10))
