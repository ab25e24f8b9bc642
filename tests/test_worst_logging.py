"""A step's worst sequences after the step: ``Tracker.log_worst`` writes them to the run's
``worst.jsonl``, a W&B table and an MLflow artifact, each read back equal to the records; bad
input is named and loses nothing; other ranks log nothing; a sink that fails takes them later.

Real stores throughout: MLflow on a sqlite file, W&B offline (its table files and ``.wandb`` log).
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from cliptrack import Tracker
from cliptrack.backends.base import Sink
from cliptrack.backends.load import load_runs, load_worst
from cliptrack.core.worst import SequenceGauge, Worst, worst_of
from cliptrack.log.tracker import NullTracker
from cliptrack.store import worst as worst_store
from cliptrack.store.records import Point, RunInfo


def _sequences(seed: int, n: int = 40) -> list[SequenceGauge]:
    rng = random.Random(seed)
    out = []
    for datum in rng.sample(range(1000), n):
        tokens = rng.randint(0, 30)
        l_sum = rng.uniform(-2, 2) * tokens
        abs_sum = abs(l_sum) + rng.random() * tokens
        out.append(
            SequenceGauge(
                datum=datum,
                tokens=tokens,
                log_ratio=l_sum,
                abs_log_ratio=abs_sum,
                kl_k3=rng.random() * tokens * 0.1,
                max_abs_log_ratio=min(rng.random() * 3, abs_sum),
                worst_token=rng.randrange(max(tokens, 1)),
            )
        )
    return out


def _worst(step: int, k: int = 4) -> Worst:
    return Worst(step, k, worst_of(_sequences(step), k))


def _lines(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / worst_store.WORST_FILE).read_text().splitlines()]


def test_log_worst_writes_each_step_to_the_run_directory(tmp_path) -> None:
    tables = [_worst(step) for step in range(5)] + [_worst(2, k=3)]  # step 2 logged again
    with Tracker("w", sinks=["jsonl"], spool_dir=tmp_path) as t:
        for worst in tables:
            t.log(worst.step, {"loss:sum": 1.0})
            t.log_worst(worst.step, worst)
    lines = _lines(t.run_dir.path)
    assert [line["records"] for line in lines] == [w.records() for w in tables]
    assert [(line["step"], line["k"]) for line in lines] == [(w.step, w.k) for w in tables]
    assert all(len(w.records()) == 3 * w.k for w in tables)  # the test's tables are full

    runset = load_runs([t.run_id], jsonl_dir=tmp_path)
    expected = [tables[0], tables[1], tables[5], tables[3], tables[4]]  # one per step, the last logged
    assert load_worst(runset) == {runset.labels[0]: expected}


def test_bad_input_is_named_and_loses_nothing(tmp_path) -> None:
    with Tracker("w", sinks=["jsonl"], spool_dir=tmp_path) as t:
        t.log_worst(0, _worst(0))
        with pytest.raises(TypeError, match="step 1: log_worst takes a cliptrack.core.worst.Worst, got dict"):
            t.log_worst(1, {"datum": 3})
        with pytest.raises(TypeError, match="got list"):
            t.log_worst(1, _worst(1).records())
        with pytest.raises(ValueError, match="step 1: the Worst given is of step 0"):
            t.log_worst(1, _worst(0))
        with pytest.raises(ValueError, match="step must be a non-negative int, got str '1'"):
            t.log_worst("1", _worst(1))
        with pytest.raises(ValueError, match="step must be >= 0"):
            t.log_worst(-1, _worst(1))
        too_many = Worst(1, 2, worst_of(_sequences(1), 4))
        with pytest.raises(ValueError, match="step 1: 4 sequences by abs_log_ratio, more than k=2"):
            t.log_worst(1, too_many)
        ranked = _worst(1).by["kl_k3"]
        for listed, message in (
            (ranked[::-1], r"step 1: the worst sequences by kl_k3, rank 2 \(datum \d+\) ranks above rank 1"),
            ((ranked[0], ranked[0]), "rank 2 .* the datum is listed twice"),
            ((SequenceGauge(5, 0, 0.0, 0.0, 0.0, 0.0, -1),), "rank 1 \\(datum 5\\) has no eligible token"),
        ):
            with pytest.raises(ValueError, match=message):
                t.log_worst(1, Worst(1, 4, {"kl_k3": listed}))
        t.log_worst(1, _worst(1))
    assert [line["step"] for line in _lines(t.run_dir.path)] == [0, 1]
    with pytest.raises(ValueError, match="is closed"):
        t.log_worst(2, _worst(2))


def test_numpy_values_are_logged_as_plain_numbers(tmp_path) -> None:
    import numpy as np

    s = _worst(0).by["kl_k3"][0]
    odd = SequenceGauge(
        np.int64(s.datum),
        np.int32(s.tokens),
        np.float32(s.log_ratio),
        np.float64(s.abs_log_ratio),
        s.kl_k3,
        s.max_abs_log_ratio,
        np.int64(s.worst_token),
    )
    with Tracker("w", sinks=["jsonl"], spool_dir=tmp_path) as t:
        t.log_worst(0, Worst(0, 1, {"kl_k3": (odd,)}))
    (line,) = _lines(t.run_dir.path)
    (record,) = line["records"]
    assert record["datum"] == s.datum and record["log_ratio"] == float(np.float32(s.log_ratio))


def test_other_ranks_log_no_worst_sequences(tmp_path) -> None:
    t = Tracker("w", sinks=["jsonl"], spool_dir=tmp_path, rank=1)
    assert isinstance(t, NullTracker)
    assert t.log_worst(0, _worst(0)) is None
    assert t.log_worst(0, "anything") is None  # a no-op: nothing is checked on other ranks
    with pytest.raises(TypeError):
        t.log_worst(0)  # the signature is Tracker's
    t.close()
    assert not any(tmp_path.iterdir())


class FlakySink(Sink):
    """A real in-process sink whose ``log_worst`` fails ``failures`` times, then keeps each table."""

    name = "flaky"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.tables: list[Worst] = []
        self.tried = threading.Event()

    @property
    def location(self) -> str:
        return "flaky"

    def open(self, run: RunInfo, state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {}

    def write(self, points: Sequence[Point]) -> None:
        pass

    def close(self, status: str) -> None:
        pass

    def log_worst(self, worst: Worst) -> None:
        self.tried.set()
        if self.failures > 0:
            self.failures -= 1
            raise OSError("the store is away")
        self.tables.append(worst)


def test_a_sink_that_fails_gets_every_table_later_in_order(tmp_path, caplog) -> None:
    sink = FlakySink(failures=2)
    tables = [_worst(step) for step in range(6)]
    with Tracker("w", sinks=[sink], spool_dir=tmp_path) as t:
        t.log_worst(0, tables[0])
        assert sink.tried.wait(10)
        for worst in tables[1:]:
            t.log_worst(worst.step, worst)
    assert sink.tables == tables
    assert "flaky did not take the worst sequences of step 0" in caplog.text
    assert [line["step"] for line in _lines(t.run_dir.path)] == list(range(6))


def test_a_sink_without_tables_skips_them_quietly(tmp_path, caplog) -> None:
    class Plain(FlakySink):
        log_worst = Sink.log_worst

    with Tracker("w", sinks=[Plain(0)], spool_dir=tmp_path) as t:
        t.log(0, {"loss:sum": 1.0})
        t.log_worst(0, _worst(0))
    assert "worst" not in caplog.text and "all written" in t.summary()


def test_a_disk_that_refuses_the_file_keeps_the_tables_for_the_sinks(tmp_path, caplog) -> None:
    sink = FlakySink(failures=0)
    with Tracker("w", sinks=[sink], spool_dir=tmp_path) as t:
        (t.run_dir.path / worst_store.WORST_FILE).mkdir()  # appending to it fails: IsADirectoryError
        t.log_worst(0, _worst(0))
        t.log_worst(1, _worst(1))
    assert sink.tables == [_worst(0), _worst(1)]
    assert "cannot write the worst sequences" in caplog.text
    assert "2 worst-sequence tables NOT in worst.jsonl" in t.summary()


def test_a_torn_last_line_is_skipped_and_the_next_starts_a_line(tmp_path, caplog) -> None:
    with Tracker("w", sinks=["jsonl"], spool_dir=tmp_path) as t:
        t.log_worst(0, _worst(0))
    path = t.run_dir.path / worst_store.WORST_FILE
    path.write_bytes(path.read_bytes() + b'{"step":1,"k":4,"rec')  # a crash mid-line
    with Tracker("w", sinks=["jsonl"], spool_dir=tmp_path, run_id=t.run_id) as again:
        again.log_worst(2, _worst(2))
    assert worst_store.read_worst_file(path) == [_worst(0), _worst(2)]
    assert "line 2 is not a worst-sequences table" in caplog.text


@pytest.mark.slow  # MLflow and W&B runs
def test_mlflow_and_wandb_hold_the_tables_and_read_back_equal(tmp_path, monkeypatch) -> None:
    """MLflow: one artifact per step in the table layout; W&B offline: a table file per history
    row; each store's reader gives back the ``Worst`` of every step, and the W&B table rows leave
    the run's metrics and steps as they are."""
    from cliptrack.backends.mlflow.sink import MlflowSink
    from cliptrack.backends.wandb.sink import WandbSink
    from mlflow import MlflowClient

    from tests._tracking_wandb_log import history

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sinks = [MlflowSink(tracking_uri=uri), WandbSink(project="worst", mode="offline", dir=str(tmp_path))]
    tables = [_worst(step, k=3) for step in range(4)] + [_worst(12, k=2)]
    with Tracker("w", sinks=sinks, spool_dir=tmp_path / "spool") as t:
        for worst in tables:
            t.log(worst.step, {"loss:sum": float(worst.step)})
            t.log_worst(worst.step, worst)
    assert "worst-sequence" not in t.summary()

    client = MlflowClient(uri)
    run_id = sinks[0].mlflow_run_id
    listed = [f.path for f in client.list_artifacts(run_id, worst_store.ARTIFACT_DIR)]
    assert listed == [worst_store.artifact_path(w.step) for w in tables]
    assert listed[-1] == "worst_sequences/step_000012.json"
    local = Path(client.download_artifacts(run_id, worst_store.ARTIFACT_DIR, str(tmp_path / "dl")))
    for worst in tables:
        stored = json.loads((local / Path(worst_store.artifact_path(worst.step)).name).read_text())
        assert stored["columns"] == list(worst_store.TABLE_COLUMNS)
        assert [dict(zip(stored["columns"], row, strict=True)) for row in stored["data"]] == [
            {**r, "k": worst.k} for r in worst.records()
        ]

    (wandb_file,) = tmp_path.glob(f"wandb/offline-run-*-{t.run_id}/run-{t.run_id}.wandb")
    rows = [r for r in history(wandb_file) if worst_store.WANDB_KEY + "._type" in r]
    assert [r["trainer/step"] for r in rows] == [w.step for w in tables]
    for row, worst in zip(rows, tables, strict=True):
        table = json.loads((wandb_file.parent / "files" / row[worst_store.WANDB_KEY + ".path"]).read_text())
        assert table["columns"] == list(worst_store.TABLE_COLUMNS)
        assert table["data"] == worst_store.table_rows(worst)

    from_mlflow = load_runs([run_id], tracking_uri=uri)
    assert list(load_worst(from_mlflow).values()) == [tables]
    from_wandb = load_runs([t.run_id], wandb_dir=tmp_path)
    assert list(load_worst(from_wandb).values()) == [tables]
    frame = from_wandb.frame
    assert sorted(set(frame["metric"])) == ["loss:sum"]
    assert sorted(set(frame["step"])) == [w.step for w in tables]
