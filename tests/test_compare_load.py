"""Loading the same runs from MLflow, W&B offline files and the JSONL spool gives the same frame.

The runs are written with the real MLflow client (sqlite store), real wandb in offline mode and
plain JSONL files, in the layouts the tracker's sinks use. Only the W&B *cloud* API is replaced, in
``test_wandb_online_loader``, by an object serving the same rows (no network here).
"""

from __future__ import annotations

import json
import warnings

import pandas as pd
import pytest
from cliptrack.backends import load_runs
from cliptrack.backends.load import RunNotFoundError
from cliptrack.backends.wandb import reader as wandb_reader
from cliptrack.backends.wandb._compat import records as wandb_records
from cliptrack.core import keys
from cliptrack.store.records import RunInfo
from cliptrack.store.spool import RunDir

from tests._compare_fixtures import megatron_vs_miles, write_jsonl, write_mlflow, write_wandb_offline


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("stores")
    megatron, miles = megatron_vs_miles(
        miles_clip_p=0.14, n_miles=45, miles_missing=(4, 9), miles_name="<script>alert(1)</script>"
    )
    uri = f"sqlite:///{root / 'mlflow.db'}"
    ids = {}
    for run in (megatron, miles):
        write_jsonl(root / "spool", run)
        ids[run.run_id] = write_mlflow(uri, run)
        write_wandb_offline(root / "wb", run)
    return {"root": root, "uri": uri, "runs": (megatron, miles), "mlflow_ids": ids}


def _normalised(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=["run_id"]).sort_values(["run", "step", "metric"]).reset_index(drop=True)


def test_same_frame_from_all_three_stores(stores):
    megatron, miles = stores["runs"]
    refs = [megatron.run_id, miles.run_id]
    from_jsonl = load_runs(refs, jsonl_dir=stores["root"] / "spool")
    from_wandb = load_runs(refs, wandb_dir=stores["root"] / "wb")
    from_mlflow = load_runs([megatron.run_name, miles.run_name], tracking_uri=stores["uri"])
    expected_rows = sum(len(p.metrics) for run in (megatron, miles) for p in run.points)
    assert len(from_jsonl.frame) == expected_rows
    pd.testing.assert_frame_equal(
        _normalised(from_jsonl.frame), _normalised(from_wandb.frame), check_exact=True
    )
    pd.testing.assert_frame_equal(
        _normalised(from_jsonl.frame), _normalised(from_mlflow.frame), check_exact=True
    )
    assert [i.run.backend_label for i in from_mlflow.runs] == ["megatron", "miles"]
    assert [i.source for i in (from_jsonl.runs[0], from_wandb.runs[0], from_mlflow.runs[0])] == [
        "jsonl",
        "wandb",
        "mlflow",
    ]
    assert from_wandb.runs[1].run.config["seed"] == 2 and from_mlflow.runs[1].run.config["seed"] == "2"
    # one run record (cliptrack.store.records.RunInfo) whatever the store; the spool's is its run.json
    assert all(type(i.run) is RunInfo for rs in (from_jsonl, from_wandb, from_mlflow) for i in rs.runs)
    assert from_jsonl.runs[0].run == RunDir(stores["root"] / "spool", megatron.run_id).read_run()
    assert [i.run.run_name for i in from_wandb.runs] == [megatron.run_name, miles.run_name]
    assert from_mlflow.runs[0].run.status == "FINISHED" and from_mlflow.runs[0].run.started > 0


def test_frame_columns_and_values(stores):
    megatron, _ = stores["runs"]
    rs = load_runs([megatron.run_id], jsonl_dir=stores["root"] / "spool")
    f = rs.frame
    assert list(f.columns) == [
        "run",
        "run_id",
        "backend",
        "step",
        "tokens_seen",
        "wall_time",
        "elapsed_s",
        "metric",
        "value",
    ]
    step5 = f[(f.step == 5) & (f.metric == keys.CLIPPED_TOKENS)].iloc[0]
    assert step5.value == megatron.points[5].metrics[keys.CLIPPED_TOKENS]
    assert step5.tokens_seen == sum(p.metrics[keys.LOSS_TOKENS] for p in megatron.points[:6])
    assert step5.wall_time == megatron.points[5].wall_time
    assert step5.elapsed_s == pytest.approx(megatron.points[5].wall_time - megatron.points[0].wall_time)


def test_runs_resolved_by_id_and_name_with_clear_errors(stores):
    megatron, miles = stores["runs"]
    mlflow_id = stores["mlflow_ids"][miles.run_id]
    rs = load_runs([mlflow_id, "megatron-run"], tracking_uri=stores["uri"])
    assert rs.labels == ["<script>alert(1)</script>", "megatron-run"]
    rs = load_runs([], tracking_uri=stores["uri"], experiment="cliptrack-tests")
    assert sorted(rs.labels) == sorted([megatron.run_name, miles.run_name])
    with pytest.raises(RunNotFoundError, match="no run with id, name or cliptrack run id 'ghost'"):
        load_runs(["ghost"], tracking_uri=stores["uri"])
    with pytest.raises(RunNotFoundError, match="runs there: megatron0001"):
        load_runs(["ghost"], jsonl_dir=stores["root"] / "spool")
    with pytest.raises(RunNotFoundError, match="no run with id or name 'ghost'"):
        load_runs(["ghost"], wandb_dir=stores["root"] / "wb")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_runs(["x"], jsonl_dir=stores["root"] / "nowhere")
    with pytest.raises(ValueError, match="name one store"):
        load_runs(["x"], jsonl_dir="a", wandb_dir="b")


def test_ambiguous_name_takes_the_latest_finished_run_and_lists_the_others(tmp_path):
    from cliptrack.backends.catalog import RunChoiceWarning
    from mlflow.tracking import MlflowClient

    megatron, _ = megatron_vs_miles()
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    first, second, crashed = (write_mlflow(uri, megatron) for _ in range(3))
    MlflowClient(tracking_uri=uri).set_terminated(crashed, status="FAILED")  # the latest run crashed
    with pytest.warns(RunChoiceWarning, match="matches 3 runs") as caught:
        runset = load_runs(["megatron-run"], tracking_uri=uri)
    assert [info.run.run_id for info in runset.runs] == [second]
    message = str(caught[0].message)
    assert first in message and crashed in message and "FAILED" in message and "200 steps" in message
    MlflowClient(tracking_uri=uri).set_terminated(first, status="FAILED")
    MlflowClient(tracking_uri=uri).set_terminated(second, status="KILLED")
    with pytest.raises(RunNotFoundError, match="none FINISHED") as info:
        load_runs(["megatron-run"], tracking_uri=uri)
    assert first in str(info.value) and second in str(info.value)


def test_jsonl_torn_lines_are_skipped_with_a_warning_and_a_foreign_line_is_named(tmp_path):
    megatron, _ = megatron_vs_miles()
    run_dir = write_jsonl(tmp_path, megatron)
    points = run_dir / keys.POINTS_FILE
    with open(points, "a", encoding="utf-8") as fh:
        fh.write('{"step": 200, "wall_ti')  # crash mid-write
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rs = load_runs([], jsonl_dir=tmp_path)
    assert rs.frame.step.max() == 199 and any("incomplete last line" in str(w.message) for w in caught)
    lines = points.read_text().splitlines()
    lines[3] = "not json"
    points.write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match=r"points.jsonl:4: damaged line skipped"):  # torn by a full disk
        rs = load_runs([], jsonl_dir=tmp_path)
    assert sorted(rs.frame.step.unique()) == [s for s in range(200) if s != 3]  # the rest of the run is read
    lines[3] = '{"step": 3}'
    points.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"points.jsonl:4: not a cliptrack point"):
        load_runs([], jsonl_dir=tmp_path)


def test_wandb_transaction_log_damage_is_reported(stores, tmp_path):
    source = next((stores["root"] / "wb").rglob("run-megatron0001.wandb"))
    data = bytearray(source.read_bytes())
    assert (
        sum(1 for r in wandb_records(source, strict=True) if r.WhichOneof("record_type") == "history") == 200
    )
    damaged = tmp_path / "run-x.wandb"
    data[200] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum mismatch"):
        list(wandb_records(damaged, strict=True))
    truncated = tmp_path / "t" / "run-y.wandb"
    truncated.parent.mkdir()
    truncated.write_bytes(source.read_bytes()[:-40])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rs = load_runs([], wandb_dir=truncated.parent)
    assert 195 <= rs.frame.step.nunique() <= 200


def test_wandb_online_loader(stores):
    """The W&B cloud API is replaced by a stand-in serving the rows the offline run recorded."""
    megatron, _ = stores["runs"]
    rows = []
    for p in megatron.points:
        rows.append(
            {
                "_step": len(rows),
                "_timestamp": 1.0,
                keys.WANDB_STEP_METRIC: p.step,
                keys.WANDB_WALL_TIME: p.wall_time,
                **p.metrics,
            }
        )

    class FakeRun:
        id, name, group = megatron.run_id, megatron.run_name, "megatron"
        config = {keys.TAG_BACKEND: "megatron", "_wandb": {}, **megatron.config}

        def scan_history(self):
            return iter(json.loads(json.dumps(rows)))

    class FakeApi:
        def run(self, path):
            assert path == f"ent/proj/{megatron.run_id}"
            return FakeRun()

    online = load_runs([f"ent/proj/{megatron.run_id}"], wandb_api=FakeApi())
    offline = load_runs([megatron.run_id], jsonl_dir=stores["root"] / "spool")
    pd.testing.assert_frame_equal(_normalised(online.frame), _normalised(offline.frame), check_exact=True)
    assert "_wandb" not in online.runs[0].run.config
    with pytest.raises(ValueError, match="entity/project/run_id"):  # the W&B reader itself
        wandb_reader.read(["just-an-id"], wandb_api=FakeApi())


@pytest.mark.slow
def test_runs_logged_by_the_tracker_load_the_same_from_every_store(tmp_path):
    """End to end: Tracker -> MLflow (sqlite), W&B (offline) and JSONL sinks -> the same frame."""
    from cliptrack.compare import compare

    from tests._compare_fixtures import log_with_tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    megatron, miles = megatron_vs_miles(miles_clip_p=0.16, miles_missing=(2,))
    ids = [
        log_with_tracker(r, tracking_uri=uri, spool_dir=tmp_path / "spool", wandb_dir=tmp_path / "wb")
        for r in (megatron, miles)
    ]
    frames = {
        "jsonl": load_runs(ids, jsonl_dir=tmp_path / "spool"),
        "wandb": load_runs(ids, wandb_dir=tmp_path / "wb"),
        "mlflow": load_runs(ids, tracking_uri=uri),  # by the cliptrack run id tag
    }
    assert (
        load_runs([megatron.run_name], tracking_uri=uri).runs[0].run.run_id
        == frames["mlflow"].runs[0].run.run_id
    )
    base = _normalised(frames["jsonl"].frame)
    assert len(base) == sum(len(p.metrics) for r in (megatron, miles) for p in r.points)
    for source in ("wandb", "mlflow"):
        other = _normalised(frames[source].frame)
        exact = ["run", "backend", "step", "tokens_seen", "metric", "value"]
        pd.testing.assert_frame_equal(base[exact], other[exact], check_exact=True)
        # MLflow keeps wall time in whole milliseconds
        pd.testing.assert_frame_equal(
            base[["wall_time", "elapsed_s"]],
            other[["wall_time", "elapsed_s"]],
            check_exact=False,
            atol=2e-3,
            rtol=0,
        )
    assert [i.run.backend_label for i in frames["mlflow"].runs] == ["megatron", "miles"]
    result = compare(frames["mlflow"])
    assert result.difference("clip_fraction").verdict == "different"
    assert result.difference("clip_fraction").estimate.n_units == 199


@pytest.mark.slow
def test_wandb_run_resumed_in_a_second_process_loads_as_one_run(tmp_path, monkeypatch):
    """``cliptrack replay`` resumes a W&B run by id: the run then spans two offline run directories,
    and every point of both must be loaded, as one run, by id and without refs."""
    import time

    from cliptrack.backends.base import Point as SinkPoint
    from cliptrack.backends.base import RunInfo as SinkRun
    from cliptrack.backends.wandb.sink import WandbSink

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    run = SinkRun("0123456789abcdef0123456789abcdef", "resumed", "miles", {"lr": 0.5}, started=1.7e9)
    first = WandbSink(dir=tmp_path)
    state = first.open(run)
    first.write([SinkPoint(s, 1.7e9 + s, {keys.REWARD: s / 10}) for s in range(3)])
    first.close("FAILED")
    time.sleep(1.1)  # W&B names run directories by the second they started
    second = WandbSink(dir=tmp_path)
    second.open(run, state)  # what replay does: resume the same run id
    second.write([SinkPoint(s, 1.7e9 + s, {keys.REWARD: s / 10}) for s in range(3, 6)])
    second.close("FINISHED")
    assert len(list(tmp_path.rglob("run-*.wandb"))) == 2
    # finish() of a run resumed in the same process can return before W&B's service has written its
    # rows (seen under load): wait until the second file holds them, then check everything
    deadline = time.monotonic() + 60
    while len(load_runs([], wandb_dir=tmp_path).frame.query("metric == @keys.REWARD")) < 6:
        assert time.monotonic() < deadline, "W&B never wrote the resumed run's rows"
        time.sleep(0.2)

    for refs in ([run.run_id], ["resumed"], []):
        rs = load_runs(refs, wandb_dir=tmp_path)
        assert rs.labels == ["resumed"], refs
        rows = rs.frame[rs.frame.metric == keys.REWARD].sort_values("step")
        assert rows.step.tolist() == list(range(6)) and rows.value.tolist() == [s / 10 for s in range(6)]
        assert rows.wall_time.tolist() == [1.7e9 + s for s in range(6)]
        assert rs.runs[0].run.backend_label == "miles" and rs.runs[0].run.config["lr"] == 0.5


def test_mlflow_bulk_read_gives_the_same_frame_as_metric_history(tmp_path, monkeypatch):
    """NaN, infinity and a value logged twice at one step read the same through the bulk SQL read
    and through ``get_metric_history`` (forced by switching the bulk read off)."""
    from cliptrack.backends.mlflow import reader as load_module
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    megatron, _ = megatron_vs_miles(n_megatron=30)
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    run_id = write_mlflow(uri, megatron)
    client = MlflowClient(tracking_uri=uri)
    ms = int(megatron.points[5].wall_time * 1000)
    client.log_batch(
        run_id,
        metrics=[
            Metric(keys.REWARD, float("nan"), ms + 10**7, 5),
            Metric(keys.THROUGHPUT, float("inf"), ms + 10**7, 6),
            Metric(keys.REWARD, 7.0, ms + 10**7, 7),
        ],
    )  # logged again, later
    bulk = load_runs([run_id], tracking_uri=uri)
    monkeypatch.setattr(load_module, "bulk_columns", lambda uri, ids: None)
    one_by_one = load_runs([run_id], tracking_uri=uri)
    pd.testing.assert_frame_equal(_normalised(bulk.frame), _normalised(one_by_one.frame), check_exact=True)
    f = bulk.frame.set_index(["step", "metric"])["value"]
    assert f[7, keys.REWARD] == 7.0 and f[6, keys.THROUGHPUT] > 1e307
    assert f[5, keys.REWARD] != f[5, keys.REWARD]  # NaN stays NaN


def test_mlflow_bulk_read_falls_back_when_the_store_schema_changed(tmp_path):
    """A store whose metrics table no longer has the columns the bulk read selects (a schema MLflow
    changed) is reported in a warning and read one metric at a time, not raised."""
    import sqlite3

    from cliptrack.backends.mlflow._store import bulk_columns

    megatron, _ = megatron_vs_miles(n_megatron=12)
    db = tmp_path / "m.db"
    uri = f"sqlite:///{db}"
    run_id = write_mlflow(uri, megatron)
    assert bulk_columns(uri, [run_id]) is not None
    with sqlite3.connect(db) as conn:
        conn.execute("ALTER TABLE metrics RENAME COLUMN is_nan TO is_nan_renamed")
    with pytest.warns(UserWarning, match="MLflow bulk metric read unavailable .*OperationalError"):
        assert bulk_columns(uri, [run_id]) is None
