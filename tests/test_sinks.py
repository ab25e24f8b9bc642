"""Sink selection by name/URI, the JSONL layout and spool readers, MLflow key rules."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from cliptrack.backends import Sink, is_jsonl, jsonl_root, make_sink
from cliptrack.backends.mlflow.sink import MlflowSink, flatten_config, resolve_tracking_uri
from cliptrack.backends.wandb.sink import WandbSink, resolve_mode
from cliptrack.core import keys
from cliptrack.store.records import Point, RunInfo
from cliptrack.store.spool import Ack, Journal, RunDir, pending, run_dirs, spool_runs


@pytest.mark.parametrize(
    ("spec", "kind", "where"),
    [
        ("mlflow", MlflowSink, "sqlite:///"),
        ("sqlite:///x.db", MlflowSink, "sqlite:///"),
        ("http://127.0.0.1:5000", MlflowSink, "http://127.0.0.1:5000"),
        ("https://mlflow.example.org", MlflowSink, "https://mlflow.example.org"),
        ("postgresql://u@h/db", MlflowSink, "postgresql://u@h/db"),
        ("wandb", WandbSink, "project 'cliptrack'"),
        ("wandb:rl-clips", WandbSink, "project 'rl-clips'"),
        ("wandb:team/rl-clips", WandbSink, "project 'rl-clips'"),
    ],
)
def test_backends_are_selected_by_name_or_uri(spec, kind, where, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    sink = make_sink(spec)
    assert isinstance(sink, kind) and isinstance(sink, Sink)
    assert where in sink.location


def test_wandb_entity_and_mode(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", "/nonexistent")
    monkeypatch.setenv("HOME", "/nonexistent")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert resolve_mode(None) == "offline"  # no credentials anywhere
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert resolve_mode(None) == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_mode(None) == "disabled" and resolve_mode("offline") == "offline"
    assert make_sink("wandb:team/p").entity == "team"


@pytest.mark.parametrize("spec", ["neptune", "s3://bucket/x", "", 42])
def test_unknown_backends_are_refused_with_the_choices(spec):
    with pytest.raises(ValueError, match="unknown tracking backend|neither a name"):
        make_sink(spec)


def test_jsonl_specs_name_a_directory():
    assert is_jsonl("jsonl") and jsonl_root("jsonl") is None
    assert jsonl_root("jsonl:/tmp/runs") == "/tmp/runs" and jsonl_root("jsonl:///tmp/runs") == "/tmp/runs"
    assert jsonl_root("file:///tmp/runs") == "/tmp/runs"
    assert not is_jsonl("mlflow") and not is_jsonl("sqlite:///x.db")


def test_default_mlflow_store_is_sqlite_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert resolve_tracking_uri(None) == f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5001")
    assert resolve_tracking_uri(None) == "http://127.0.0.1:5001"
    assert resolve_tracking_uri("sqlite:///rel/m.db") == f"sqlite:///{tmp_path / 'rel' / 'm.db'}"
    assert resolve_tracking_uri("sqlite:////abs/m.db") == "sqlite:////abs/m.db"


@pytest.mark.parametrize("key", ["loss:sum", "clip_fraction:mean", "kl/policy:mean", "a b-c.d:max"])
def test_mlflow_accepts_tinker_keys(key):
    MlflowSink("sqlite:///unused.db").check_key(key)


@pytest.mark.parametrize("key", ["loss@rank0:sum", "../x:sum", "a//b:sum", "/x:sum", "x" * 251])
def test_mlflow_refuses_keys_by_name(key):
    with pytest.raises(ValueError, match="MLflow refuses metric key") as info:
        MlflowSink("sqlite:///unused.db").check_key(key)
    assert repr(key) in str(info.value)


def test_config_is_flattened_for_mlflow_params():
    config = {"a": 1, "b": {"c": {"d": [1, 2]}, "e": None}, "f": {}}
    assert dict(flatten_config(config)) == {"a": "1", "b.c.d": "[1, 2]", "b.e": "None", "f": "{}"}


def test_jsonl_run_directory_is_self_describing_and_readable_past_a_torn_line(tmp_path):
    run = RunInfo("abc123", "name", "megatron", {"k": {"v": 1}}, started=1700000000.5)
    reader = RunDir(tmp_path, "abc123")
    reader.update_meta(**run.to_meta())
    journal = Journal(reader, fsync=False)
    journal.open()
    points = [Point(3, 1700000001.25, {"a:mean": 0.5}), Point(1, 1700000002.0, {"a:mean": float("inf")})]
    data = journal.append(points)
    ends = [end for _, end in reader.read_points()]
    run_dir = tmp_path / "abc123"
    assert data == (run_dir / keys.POINTS_FILE).read_bytes() and journal.offset == len(data) == ends[-1]
    assert ends[-1] == (run_dir / keys.POINTS_FILE).stat().st_size
    with open(run_dir / keys.POINTS_FILE, "ab") as fh:  # a crash in the middle of a line
        fh.write(b'{"step": 9, "wall_ti')
    journal.close()
    reader.update_meta(status="FINISHED")
    meta = json.loads((run_dir / keys.RUN_META_FILE).read_text())
    assert {k: meta[k] for k in ("run_id", "run_name", "backend", "config", "started", "status")} == {
        "run_id": "abc123",
        "run_name": "name",
        "backend": "megatron",
        "config": {"k": {"v": 1}},
        "started": 1700000000.5,
        "status": "FINISHED",
    }
    assert RunInfo.from_meta(meta, "abc123") == RunInfo(
        "abc123", "name", "megatron", {"k": {"v": 1}}, started=1700000000.5, status="FINISHED"
    )
    lines = (run_dir / keys.POINTS_FILE).read_text().splitlines()
    assert json.loads(lines[0]) == {"step": 3, "wall_time": 1700000001.25, "metrics": {"a:mean": 0.5}}
    assert "Infinity" in lines[1]
    assert [(p, end) for p, end in reader.read_points()] == list(zip(points, ends, strict=True))
    assert [p for p, _ in reader.read_points(ends[0])] == points[1:]
    assert pending(reader, "mlflow") == (2, os.path.getsize(run_dir / keys.POINTS_FILE))
    reader.write_ack("mlflow", Ack(1, ends[0]))
    assert reader.read_ack("mlflow") == Ack(1, ends[0]) and pending(reader, "mlflow")[0] == 1
    assert reader.journal_end() == Ack(2, ends[-1])  # the torn tail is not part of the journal
    assert [r.run_id for r in run_dirs(tmp_path)] == ["abc123"] == [r.run_id for r in run_dirs(run_dir)]


def test_whole_run_reader_warns_on_a_torn_last_line_and_names_a_bad_middle_line(tmp_path):
    run = RunDir(tmp_path, "r1")
    run.path.mkdir()
    good = [Point(0, 10.0, {"a:mean": 1.5}), Point(1, 11.0, {"a:mean": 2.5})]
    run.points_path.write_bytes(
        b"".join(json.dumps(p.to_json()).encode() + b"\n" for p in good) + b'{"step": 2, "wall_ti'
    )
    assert [p for p, _ in run.read_points()] == good  # the incremental reader stops silently
    with pytest.warns(UserWarning, match=r"points.jsonl:3: incomplete last line skipped"):
        assert run.load_points() == good
    run.points_path.write_bytes(b'{"step": 0}\n' + json.dumps(good[1].to_json()).encode() + b"\n")
    with pytest.raises(ValueError, match=r"points.jsonl:1: not a cliptrack point"):
        run.load_points()
    run.points_path.write_bytes(
        b'{"step": 0, "wall_ti{"step": 1, "wall_time": 11.0, "metrics": {}}\n'
        + json.dumps(good[1].to_json()).encode()
        + b"\n"
    )
    with pytest.warns(UserWarning, match=r"points.jsonl:1: damaged line skipped"):
        assert run.load_points() == [good[1]]  # a glued line is reported, the rest is read
    assert RunDir(tmp_path, "absent").load_points() == []


def test_spool_runs_are_listed_by_name_and_run_dirs_oldest_first(tmp_path):
    for run_id, started in (("b", 1.0), ("a", 2.0), ("c", 0.5)):
        RunDir(tmp_path, run_id).update_meta(run_id=run_id, started=started)
    (tmp_path / "not-a-run").mkdir()
    assert [r.run_id for r in spool_runs(tmp_path)] == ["a", "b", "c"]
    assert [r.run_id for r in run_dirs(tmp_path)] == ["c", "b", "a"]
    assert spool_runs(tmp_path / "nowhere") == []


def test_a_live_run_lock_excludes_a_second_writer(tmp_path):
    first, second = RunDir(tmp_path, "r"), RunDir(tmp_path, "r")
    assert first.lock_sink("mlflow")
    assert not second.lock_sink("mlflow")  # flock is per open file: a second opener is refused
    first.unlock_sink("mlflow")
    assert second.lock_sink("mlflow")
    second.unlock_sink("mlflow")


def test_the_wandb_directory_is_resolved_once_and_replay_uses_the_recorded_one(tmp_path, monkeypatch):
    """A run that relied on WANDB_DIR must be replayed into that directory, not ./wandb of wherever
    replay runs."""
    from cliptrack.backends import sink_from_state

    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    monkeypatch.chdir(tmp_path)
    state = WandbSink().settings()
    assert state["dir"] == str(tmp_path / "wandb-home")
    monkeypatch.delenv("WANDB_DIR")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert sink_from_state("wandb", state).dir == str(tmp_path / "wandb-home")
    assert WandbSink().dir == str(elsewhere)  # no WANDB_DIR: the working directory, made absolute


def test_the_sink_registry_names_every_sink_and_refuses_unknown_ones():
    from cliptrack.backends import sink_class, sink_from_state, sink_names

    assert {name: sink_class(name).name for name in sink_names()} == {
        "mlflow": "mlflow",
        "wandb": "wandb",
        "csv": "csv",
    }
    assert sink_from_state(
        "mlflow", {"tracking_uri": "sqlite:////x/m.db", "experiment": "e"}
    ).location.startswith("mlflow sqlite:////x/m.db experiment 'e'")
    with pytest.raises(
        ValueError, match=r"unknown sink 'neptune': registered sinks are \['csv', 'mlflow', 'wandb'\]"
    ):
        sink_class("neptune")
    with pytest.raises(ValueError, match="neither a name, a URI nor a Sink"):
        make_sink(object())


def test_config_mlflow_refuses_is_refused_by_name_not_dropped_silently():
    """Params MLflow refuses by its rules are refused one by one (never sent, never sinking the
    others), each with a short reason; tags are sent."""
    from cliptrack.backends.mlflow.sink import _entries

    entries, refused = _entries(
        {
            "param:ok": "1",
            "param:bad@name": "2",
            "param:nested.long": "x" * 7000,
            "param:nul": "a\x00b",
            "tag:t": "v",
        }
    )
    assert sorted(entries) == ["param:ok", "tag:t"]
    assert sorted(refused) == ["param:bad@name", "param:nested.long", "param:nul"]
    assert refused["param:nested.long"] == "value of 7000 characters, over MLflow's limit of 6000"
    assert "NUL" in refused["param:nul"]


def test_the_sink_seams_accept_the_installed_versions_and_refuse_others_by_name(monkeypatch):
    """The sink seams follow the adapters' seam convention: MINIMUM, SUPPORTED_BELOW, USES,
    installed_version(), check_supported()."""
    from importlib import metadata

    from cliptrack.backends.mlflow import _compat as _compat_mlflow
    from cliptrack.backends.wandb import _compat as _compat_wandb
    from cliptrack.core.versions import UnsupportedVersionError, parse_version

    for seam, package in ((_compat_mlflow, "mlflow"), (_compat_wandb, "wandb")):
        assert seam.installed_version() == metadata.version(package)
        assert seam.MINIMUM <= parse_version(seam.installed_version()) < seam.SUPPORTED_BELOW
        seam.check_supported()
    monkeypatch.setattr(_compat_mlflow, "installed_version", lambda: "4.0.0")
    with pytest.raises(
        UnsupportedVersionError,
        match=r"mlflow 4\.0\.0 is not supported .*mlflow>=3\.0,<4\.0.*_validate_metric_name",
    ):
        _compat_mlflow.check_supported()
    monkeypatch.setattr(_compat_wandb, "installed_version", lambda: "0.18.7")
    with pytest.raises(
        UnsupportedVersionError,
        match=r"wandb 0\.18\.7 is not supported .*wandb>=0\.19,<1\.0.*\.wandb transaction log",
    ):
        _compat_wandb.check_supported()


@pytest.mark.parametrize("relative", [False, True])
def test_an_experiment_the_mlflow_sink_creates_on_sqlite_keeps_artifacts_beside_the_database(
    tmp_path, monkeypatch, relative
):
    """MLflow's default artifact location for a sqlite store is ``./mlruns`` of the working
    directory; an experiment the sink creates puts them in ``mlartifacts/`` beside the database."""
    from mlflow.tracking import MlflowClient

    store, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    store.mkdir()
    elsewhere.mkdir()
    uri = "sqlite:///store/m.db" if relative else f"sqlite:///{store / 'm.db'}"
    monkeypatch.chdir(tmp_path)  # a relative URI is relative to the working directory at open
    sink = MlflowSink(uri, experiment="beside")
    state = sink.open(RunInfo("run-1", "beside", "megatron"))
    sink.close("FINISHED")
    monkeypatch.chdir(elsewhere)  # where the artifacts are logged from must not matter
    client = MlflowClient(tracking_uri=f"sqlite:///{store / 'm.db'}")
    assert client.get_experiment_by_name("beside").artifact_location == (store / "mlartifacts").as_uri()
    note = tmp_path / "note.txt"
    note.write_text("kept beside the store")
    client.log_artifact(state["mlflow_run_id"], str(note))
    assert [p.read_text() for p in (store / "mlartifacts").rglob("note.txt")] == ["kept beside the store"]
    assert not (elsewhere / "mlruns").exists() and not (tmp_path / "mlruns").exists()


def test_only_a_local_sqlite_store_gets_an_artifact_directory_beside_it():
    from cliptrack.backends.mlflow._compat import artifacts_beside

    assert artifacts_beside("sqlite:////data/runs/m.db?timeout=20", "mlartifacts") == Path(
        "/data/runs/mlartifacts"
    )
    for uri in ("http://127.0.0.1:5000", "postgresql://u@h/db", "file:///data/mlruns", "databricks"):
        assert artifacts_beside(uri, "mlartifacts") is None, uri


def test_wandb_items_have_one_decoder_nested_keys_joined_with_a_dot():
    """History rows and config updates are decoded by the seam alone (the sink's read-back, the
    comparison's loader, the tests): a nested key reads ``a.b``, W&B's own flat spelling."""
    from cliptrack.backends.wandb import _compat as _compat_wandb
    from cliptrack.backends.wandb import reader as load
    from wandb.proto import wandb_internal_pb2

    record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
    flat = record.history.item.add()
    flat.key, flat.value_json = "trainer/step", "3"
    nested = record.history.item.add()
    nested.nested_key.extend(["optim", "lr:mean"])
    nested.value_json = "NaN"
    row = _compat_wandb.items(record.history.item)
    assert list(row) == ["trainer/step", "optim.lr:mean"] and row["trainer/step"] == 3
    assert math.isnan(row["optim.lr:mean"])
    assert load.compat_wandb.items is _compat_wandb.items and not hasattr(load, "_item_key")
