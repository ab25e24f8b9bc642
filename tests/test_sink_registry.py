"""Adding a sink is one class and one registry entry (docs/ARCHITECTURE.md, "How to add a sink").

``CsvSink`` below is such a class, written as a newcomer would: it is registered by name, reached
by ``"csv:<path>"`` from ``Tracker(sinks=...)``, handed over ready through
``Tracker(sinks=[...])`` beside a real MLflow sink, and rebuilt by replay from run.json. Every
point is counted in the journal and in the CSV file.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cliptrack.backends import BACKENDS, Backend, Sink, SinkError, make_sink, register_backend
from cliptrack.backends.mlflow.sink import MlflowSink
from cliptrack.log.replay import replay_run
from cliptrack.log.tracker import Tracker
from cliptrack.store.records import Point, RunInfo
from cliptrack.store.spool import RunDir
from mlflow import MlflowClient

from tests._journal import journal_steps


class CsvSink(Sink):
    """One row per metric value: step, wall time (unix s), key, value; a last row with the status."""

    name = "csv"
    down = False
    """Set by a test: every write fails (a backend that is down for the whole run)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = Path(path or "points.csv").resolve()

    @classmethod
    def from_state(cls, state: Mapping[str, Any], **overrides: Any) -> CsvSink:
        return cls(overrides.get("path") or state["path"])

    @property
    def location(self) -> str:
        return f"csv {self.path}"

    def settings(self) -> dict[str, Any]:
        return {"path": str(self.path)}

    def open(self, run: RunInfo, state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()
        return self.settings()

    def write(self, points: Sequence[Point]) -> None:
        if self.down:
            raise SinkError("the CSV disk is away")
        with open(self.path, "a", newline="") as fh:
            out = csv.writer(fh)
            for point in points:
                for key, value in point.metrics.items():
                    out.writerow([point.step, point.wall_time, key, repr(value)])

    def close(self, status: str) -> None:
        with open(self.path, "a", newline="") as fh:
            csv.writer(fh).writerow(["status", status])


def _rows(path: Path) -> list[list[str]]:
    with open(path, newline="") as fh:
        return list(csv.reader(fh))


def _metrics(step: int) -> dict[str, float]:
    return {"loss:sum": step * 0.5, "reward:mean": step / 3, "kl:mean": 1e-3 * step}


@pytest.fixture
def csv_registered(monkeypatch):
    monkeypatch.setitem(BACKENDS, "csv", replace(BACKENDS["csv"], sink="tests.test_sink_registry:CsvSink"))
    return CsvSink


def test_a_registered_sink_is_reached_by_name_and_receives_every_point(tmp_path, csv_registered):
    target = tmp_path / "out" / "points.csv"
    with Tracker("csv-run", sinks=[f"csv:{target}", "jsonl"], spool_dir=tmp_path / "spool") as tracker:
        for step in range(500):
            tracker.log(step, _metrics(step))
    assert journal_steps(tmp_path / "spool" / tracker.run_id) == list(range(500))
    rows = _rows(target)
    assert rows[-1] == ["status", "FINISHED"]
    assert sorted((int(r[0]), r[2]) for r in rows[:-1]) == sorted(
        (s, k) for s in range(500) for k in _metrics(s)
    )
    assert all(float(r[3]) == _metrics(int(r[0]))[r[2]] for r in rows[:-1])


def test_ready_sink_objects_with_vendor_options_beside_mlflow(tmp_path, csv_registered):
    db = f"sqlite:///{tmp_path / 'mlflow.db'}"
    target = tmp_path / "objects.csv"
    sinks = [CsvSink(str(target)), MlflowSink(tracking_uri=db, experiment="objects")]
    with Tracker("objects", sinks=sinks, spool_dir=tmp_path / "spool", handle_signals=False) as tracker:
        for step in range(300):
            tracker.log(step, _metrics(step))
    assert len(_rows(target)) == 300 * 3 + 1
    client = MlflowClient(db)
    (run,) = client.search_runs([client.get_experiment_by_name("objects").experiment_id])
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "kl:mean")) == list(range(300))
    assert tracker.run.run_name == "objects"


def test_replay_rebuilds_a_registered_sink_by_name_and_delivers_what_it_missed(
    tmp_path, csv_registered, monkeypatch
):
    target = tmp_path / "late.csv"
    monkeypatch.setattr(CsvSink, "down", True)
    tracker = Tracker(
        sinks=[f"csv:{target}"], spool_dir=tmp_path / "spool", close_timeout_s=0.5, handle_signals=False
    )
    for step in range(200):
        tracker.log(step, _metrics(step))
    tracker.close()
    assert tracker.pending() == {"csv": 200} and not _rows(target)
    monkeypatch.setattr(CsvSink, "down", False)
    (result,) = replay_run(RunDir(tmp_path / "spool", tracker.run_id), timeout_s=60)
    assert (result.outcome, result.pushed) == ("replayed", 200), result.line()
    rows = _rows(target)
    assert rows[-1] == ["status", "FINISHED"] and len(rows) == 200 * 3 + 1


def test_register_backend_checks_the_sink_it_is_given(monkeypatch):
    monkeypatch.setitem(BACKENDS, "placeholder", Backend("placeholder"))  # restored afterwards
    register_backend("placeholder", sink=CsvSink)
    assert BACKENDS["placeholder"].sink == "tests.test_sink_registry:CsvSink"
    assert isinstance(make_sink("placeholder:/tmp/p.csv"), CsvSink)
    with pytest.raises(ValueError, match="without ':'"):
        register_backend("a:b", sink=CsvSink)
    with pytest.raises(ValueError, match="does not derive from cliptrack.backends.Sink"):
        register_backend("placeholder", sink=dict)
    with pytest.raises(ValueError, match="is not 'module:attribute'"):
        register_backend("placeholder", sink="no_class_here")
