"""A full local disk: remote sinks keep receiving every point from memory (bounded in bytes), the
journal catches up when space returns, and what reached neither is counted at close.

Real components: a real 2 MiB tmpfs for the spool (mounted when the test runs as root), a real
sqlite MLflow store beside it (on the healthy disk), a closed port for a dead MLflow server.
Each test counts points in the journal and in the sink.
"""

from __future__ import annotations

import json
import logging
import time

import pytest
from cliptrack import Limits
from cliptrack.core import keys
from cliptrack.log.tracker import Tracker
from mlflow import MlflowClient

from tests._disk import fill
from tests._harness import closed_port
from tests._journal import journal_steps, run_summary
from tests.test_tracker_faults import tmpfs  # noqa: F401 - tmpfs is a fixture


def _metrics(step: int) -> dict[str, float]:
    return {keys.LOSS_SUM: step * 0.5, keys.REWARD: step / 7, "x/y:max": float(step % 13)}


def _wait_until(condition, what: str, timeout_s: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _mlflow_steps(db: str, experiment: str, key: str = keys.LOSS_SUM) -> list[int]:
    client = MlflowClient(db)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return sorted(m.step for m in client.get_metric_history(run.info.run_id, key))


@pytest.mark.slow
def test_mlflow_gets_every_point_while_the_spool_disk_is_full_and_the_journal_catches_up(tmpfs, caplog):  # noqa: F811
    caplog.set_level(logging.INFO, logger="cliptrack")
    db = f"sqlite:///{tmpfs.parent / 'mlflow.db'}"
    tracker = Tracker(
        "full-disk",
        sinks=[db],
        spool_dir=tmpfs / "spool",
        experiment="full-disk",
        limits=Limits(flush_interval_s=0.05, max_batch_points=500),
        handle_signals=False,
    )
    lane = tracker._lanes[0]
    run_dir = tmpfs / "spool" / tracker.run_id
    for step in range(2000):
        tracker.log(step, _metrics(step))
    assert tracker.flush(timeout_s=60) is True
    filler = fill(tmpfs)
    try:
        for step in range(2000, 8000):
            tracker.log(step, _metrics(step))
        assert tracker.flush(timeout_s=5) is False  # not durable: the disk refuses it
        _wait_until(lambda: lane.acked_points >= 8000, f"mlflow has {lane.acked_points} of 8000")
        assert journal_steps(run_dir) == list(range(2000))  # the disk holds only what it took
        assert _mlflow_steps(db, "full-disk") == list(range(8000))  # every point, from memory
        saved = json.loads((run_dir / "acked-mlflow.json").read_text())
        assert saved["offset"] <= (run_dir / keys.POINTS_FILE).stat().st_size  # never past the journal
        assert tracker._writer.held.points == 6000
    finally:
        filler.unlink()
    for step in range(8000, 10_000):
        tracker.log(step, _metrics(step))
    assert tracker.flush(timeout_s=60) is True  # the journal caught up, then took the rest
    tracker.close()
    assert journal_steps(run_dir) == list(range(10_000))
    assert _mlflow_steps(db, "full-disk") == list(range(10_000))  # each once
    assert json.loads((run_dir / "acked-mlflow.json").read_text())["points"] == 10_000
    summary = run_summary(caplog, tracker.run_id)
    assert "mlflow: all written" in summary and "NOT in the journal" not in summary, summary
    assert len([r for r in caplog.records if "cannot write" in r.getMessage()]) == 1


@pytest.mark.slow
def test_a_disk_full_until_close_is_reported_with_what_reached_no_backend(tmpfs, caplog):  # noqa: F811
    """The disk stays full to the end: a healthy MLflow still holds every point and the summary
    says how many points are not in the journal (none lost); with the server dead too, every such
    point is counted as written nowhere, never "all written"."""
    caplog.set_level(logging.INFO, logger="cliptrack")
    db = f"sqlite:///{tmpfs.parent / 'mlflow.db'}"
    dead = f"http://127.0.0.1:{closed_port()}"
    for uri, experiment in ((db, "stays-full"), (dead, "stays-full-dead")):
        filler = None
        tracker = Tracker(
            experiment,
            sinks=[uri],
            spool_dir=tmpfs / "spool",
            experiment=experiment,
            limits=Limits(flush_interval_s=0.05, max_batch_points=500),
            open_timeout_s=0 if uri == dead else 5,
            handle_signals=False,
        )
        try:
            for step in range(1000):
                tracker.log(step, _metrics(step))
            assert tracker.flush(timeout_s=60) is (uri == db)
            filler = fill(tmpfs)
            for step in range(1000, 4000):
                tracker.log(step, _metrics(step))
            tracker.close(timeout_s=30 if uri == db else 1)
        finally:
            if filler is not None:
                filler.unlink()
        summary = run_summary(caplog, tracker.run_id)
        assert journal_steps(tmpfs / "spool" / tracker.run_id) == list(range(1000))
        assert "3000 points NOT in the journal" in summary, summary
        if uri == db:
            assert "0 of them written nowhere" in summary and "mlflow: all written" in summary, summary
            assert _mlflow_steps(db, experiment) == list(range(4000))
        else:
            assert "3000 of them written nowhere (lost)" in summary, summary
            assert "all written" not in summary and "mlflow: 4000 points pending" in summary, summary


def test_memory_stays_within_the_byte_bounds_with_200_metrics_per_point(tmpfs):  # noqa: F811
    """Full disk and a dead server, 200 metrics per point: the held tail, the lane's buffer and the
    inbox stay within their bounds (bytes, values) whatever the number of points; what passes the
    held bound is counted as written nowhere."""
    dead = f"http://127.0.0.1:{closed_port()}"
    held_bound, lane_bound, values_bound = 400_000, 200_000, 40_000
    tracker = Tracker(
        sinks=[dead],
        spool_dir=tmpfs / "spool",
        limits=Limits(
            flush_interval_s=0.02,
            max_batch_points=50,
            max_queued_values=values_bound,
            max_buffered_bytes=lane_bound,
            max_held_bytes=held_bound,
        ),
        open_timeout_s=0,
        handle_signals=False,
    )
    writer, lane = tracker._writer, tracker._lanes[0]
    filler = fill(tmpfs)
    peaks = {"held": 0, "lane": 0, "queued": 0}
    try:
        for step in range(3000):
            tracker.log(step, {f"m{i}:mean": step + i / 1000 for i in range(200)})
            peaks["held"] = max(peaks["held"], writer.held.bytes)
            peaks["lane"] = max(peaks["lane"], lane.buffered_bytes)
            peaks["queued"] = max(peaks["queued"], writer._queued_values)
        tracker.close(timeout_s=1)
    finally:
        filler.unlink()
    assert 0 < peaks["held"] <= held_bound, peaks
    assert peaks["lane"] <= lane_bound, peaks
    assert peaks["queued"] <= values_bound + 200, peaks  # the bound, plus the point that reaches it
    assert writer.not_journaled > 0  # past the held bound
    on_disk = len(journal_steps(tmpfs / "spool" / tracker.run_id))
    assert on_disk + writer.held.points + writer.not_journaled == 3000  # every point accounted for
    assert writer.lost_points() == writer.held.points + writer.not_journaled  # the server took none


def test_the_default_bounds_add_up_to_the_documented_memory_bound():
    from cliptrack.log._pipeline import writer
    from cliptrack.log.limits import Limits

    limits = Limits()
    total = writer.memory_bound(
        limits.max_queued_points,
        limits.max_queued_values,
        1,
        limits.max_buffered_bytes,
        limits.max_held_bytes,
    )
    assert total <= writer.MEMORY_BOUND_BYTES == 256 * 2**20
    with pytest.raises(ValueError, match="max_held_bytes must be >= 0 bytes, got -1"):
        Limits(max_held_bytes=-1)
    with pytest.raises(ValueError, match="max_queued_values must be a number, got '1'"):
        Limits(max_queued_values="1")  # type: ignore[arg-type]
