"""Vendor options travel as ``Tracker(sink_options={<sink>: {...}})``; the older keyword arguments
keep working for one release with a DeprecationWarning naming the new form. Replay's re-target
flags come from each backend's options (``--csv-dir`` for the CSV backend)."""

from __future__ import annotations

import warnings

import pytest
from cliptrack.backends import load_runs
from cliptrack.cli.main import main
from cliptrack.log.tracker import Tracker
from mlflow import MlflowClient


def test_sink_options_reach_the_sink_and_the_old_keyword_warns_naming_them(tmp_path):
    uri = f"sqlite:///{tmp_path / 'new.db'}"
    with Tracker(
        "new-form",
        backends=["mlflow"],
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

    old = f"sqlite:///{tmp_path / 'old.db'}"
    with pytest.warns(DeprecationWarning, match=r"tracking_uri=.*sink_options=\{'mlflow': \{'tracking_uri'"):
        tracker = Tracker("old-form", backends=["mlflow"], tracking_uri=old, spool_dir=tmp_path / "spool")
    tracker.close()
    assert tracker.sinks[0].tracking_uri == old


def test_wandb_keywords_warn_and_become_the_wandb_sinks_options(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracker = Tracker(
            backends=["jsonl"],
            spool_dir=tmp_path,
            wandb_project="p",
            wandb_mode="offline",
            handle_signals=False,
        )
    tracker.close()
    messages = sorted(str(w.message) for w in caught if w.category is DeprecationWarning)
    assert [m.split("=")[0] for m in messages] == ["Tracker(wandb_mode", "Tracker(wandb_project"]
    assert "sink_options={'wandb': {'project': ...}}" in messages[1]
    assert all(
        w.filename == __file__ for w in caught if w.category is DeprecationWarning
    )  # the caller's line


def test_bad_sink_options_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"sink_options names 'wandbb', which is no registered sink"):
        Tracker(backends=["jsonl"], spool_dir=tmp_path, sink_options={"wandbb": {"project": "p"}})
    with pytest.raises(ValueError, match=r"sink_options\['csv'\]='x' must be a mapping"):
        Tracker(backends=["jsonl"], spool_dir=tmp_path, sink_options={"csv": "x"})  # type: ignore[dict-item]
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="give mlflow 'tracking_uri' once"):
        Tracker(
            backends=["jsonl"],
            spool_dir=tmp_path,
            sink_options={"mlflow": {"tracking_uri": "sqlite:///a.db"}},
            tracking_uri="sqlite:///b.db",
        )


def test_replay_re_targets_a_csv_sink_with_the_flag_its_backend_declares(tmp_path, capsys):
    first, second = tmp_path / "first", tmp_path / "second"
    with Tracker("moved", backends=[f"csv:{first}"], spool_dir=tmp_path / "spool", handle_signals=False) as t:
        for step in range(40):
            t.log(step, {"loss_tokens:sum": 100 + step, "clipped_tokens:sum": step})
    assert main(["replay", str(tmp_path / "spool"), "--csv-dir", str(second)]) == 0
    assert "40 points pushed" in capsys.readouterr().out
    for directory in (first, second):
        frame = load_runs([t.run_id], csv_dir=directory).frame
        clipped = frame[frame["metric"] == "clipped_tokens:sum"]
        assert sorted(clipped["step"]) == list(range(40)) and clipped["value"].sum() == sum(range(40))
