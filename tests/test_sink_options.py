"""Vendor options travel as ``Tracker(sink_options={<sink>: {...}})`` (or in a ready sink); the
removed keyword arguments (``tracking_uri=``, ``wandb_project=``, ...) are refused by name. Replay's
re-target flags come from each backend's options (``--csv-dir`` for the CSV backend)."""

from __future__ import annotations

import pytest
from cliptrack.backends import load_runs
from cliptrack.cli.main import main
from cliptrack.log.tracker import Tracker
from mlflow import MlflowClient


def test_sink_options_reach_the_sink(tmp_path):
    uri = f"sqlite:///{tmp_path / 'new.db'}"
    with Tracker(
        "new-form",
        sinks=["mlflow"],
        sink_options={"mlflow": {"tracking_uri": uri, "experiment": "own"}},
        experiment="run-level",
        spool_dir=tmp_path / "spool",
        handle_signals=False,
    ) as tracker:
        tracker.log(0, {"reward:mean": 1.0})
    (sink,) = tracker.sinks
    assert (sink.tracking_uri, sink.experiment) == (uri, "own")  # the sink's own option wins
    assert tracker.run.experiment == "run-level"
    assert MlflowClient(uri).get_experiment_by_name("own") is not None


@pytest.mark.parametrize(
    "removed",
    [
        {"tracking_uri": "sqlite:///x.db"},
        {"wandb_project": "p"},
        {"wandb_mode": "offline"},
        {"wandb_dir": "w"},
        {"backends": ["jsonl"]},
        {"flush_interval_s": 0.5},
        {"max_held_bytes": 1},
    ],
)
def test_the_removed_keywords_are_refused_by_name(tmp_path, removed):
    (name,) = removed
    with pytest.raises(TypeError, match=name):
        Tracker("removed", spool_dir=tmp_path, handle_signals=False, **removed)
    assert not (tmp_path / "removed").exists() and not list(tmp_path.iterdir())  # no run left behind


def test_bad_sink_options_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"sink_options names 'wandbb', which is no registered sink"):
        Tracker(sinks=["jsonl"], spool_dir=tmp_path, sink_options={"wandbb": {"project": "p"}})
    with pytest.raises(ValueError, match=r"sink_options\['csv'\]='x' must be a mapping"):
        Tracker(sinks=["jsonl"], spool_dir=tmp_path, sink_options={"csv": "x"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"limits=\{'flush_interval_s': 0.5\} must be a cliptrack.Limits"):
        Tracker(sinks=["jsonl"], spool_dir=tmp_path, limits={"flush_interval_s": 0.5})  # type: ignore[arg-type]


def test_replay_re_targets_a_csv_sink_with_the_flag_its_backend_declares(tmp_path, capsys):
    first, second = tmp_path / "first", tmp_path / "second"
    with Tracker("moved", sinks=[f"csv:{first}"], spool_dir=tmp_path / "spool", handle_signals=False) as t:
        for step in range(40):
            t.log(step, {"loss_tokens:sum": 100 + step, "clipped_tokens:sum": step})
    assert main(["replay", str(tmp_path / "spool"), "--csv-dir", str(second)]) == 0
    assert "40 points pushed" in capsys.readouterr().out
    for directory in (first, second):
        frame = load_runs([t.run_id], csv_dir=directory).frame
        clipped = frame[frame["metric"] == "clipped_tokens:sum"]
        assert sorted(clipped["step"]) == list(range(40)) and clipped["value"].sum() == sum(range(40))
