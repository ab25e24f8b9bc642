"""One refused key never blocks a sink, and replay re-targets a run to a new or emptied store.

Rows: a journal line with a key MLflow refuses (logged while only W&B was on, then resumed with
MLflow): MLflow gets every valid point, live and through replay; ``cliptrack replay
--tracking-uri`` (and ``--wandb-dir``) delivers a run to a new store, recording the mapping; a
real ``mlflow server`` restarted on an empty store gets every point from replay. Each test counts
points in the journal and in the sink (sqlite MLflow stores, a real server, W&B offline).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from cliptrack import Limits
from cliptrack.core import keys
from cliptrack.log.tracker import Tracker
from mlflow import MlflowClient

from tests._harness import free_port
from tests._journal import journal_steps, run_summary
from tests._tools import needs_mlflow_command
from tests._tracking_wandb_log import history
from tests.test_tracker_mlflow_server import MlflowServer

REPO = Path(__file__).resolve().parents[1]
BAD = "bad!key:mean"
"""A key W&B takes and MLflow refuses (``!`` is outside MLflow's metric name characters)."""
POINTS = 400

pytestmark = pytest.mark.slow


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_SERVICE", raising=False)
    return tmp_path


def _metrics(step: int) -> dict[str, float]:
    metrics = {keys.LOSS_SUM: step * 0.5}
    if step % 4 == 0:
        metrics[BAD] = float(step)
    return metrics


def _wandb_only_run(root: Path) -> str:
    with Tracker(
        "refused",
        sinks=["wandb"],
        spool_dir=root / "spool",
        sink_options={"wandb": {"dir": root}},
        handle_signals=False,
    ) as t:
        for step in range(POINTS):
            t.log(step, _metrics(step))
    return t.run_id


def _mlflow_steps(uri: str, experiment: str = "cliptrack", key: str = keys.LOSS_SUM) -> list[int]:
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return sorted(m.step for m in client.get_metric_history(run.info.run_id, key))


def _replay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cliptrack.cli.main", "replay", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=240,
    )


def test_a_key_mlflow_refuses_is_skipped_for_mlflow_only_when_a_wandb_run_resumes_with_mlflow(
    offline, caplog
):
    caplog.set_level(logging.INFO, logger="cliptrack")
    run_id = _wandb_only_run(offline)
    db = f"sqlite:///{offline / 'mlflow.db'}"
    with Tracker(run_id=run_id, sinks=[db], spool_dir=offline / "spool", handle_signals=False) as tracker:
        for step in range(POINTS, POINTS + 100):
            tracker.log(step, {keys.LOSS_SUM: step * 0.5})
    assert journal_steps(offline / "spool" / run_id) == list(range(POINTS + 100))
    assert _mlflow_steps(db) == list(range(POINTS + 100))  # every valid point, old and new
    refusals = [r for r in caplog.records if "refuses the key" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in refusals]  # once: run, first step, key, why
    message = refusals[0].getMessage()
    assert run_id in message and "step 0" in message and BAD in message
    summary = run_summary(caplog, run_id)
    assert "mlflow: all written" in summary and f"{POINTS // 4} values refused (1 key: '{BAD}')" in summary
    meta = json.loads((offline / "spool" / run_id / keys.RUN_META_FILE).read_text())
    assert BAD in meta["sinks"]["mlflow"]["refused"] and meta["sinks"]["mlflow"]["refused"][BAD]["step"] == 0
    (wandb_file,) = offline.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")
    assert sum(1 for row in history(wandb_file) if BAD in row) == POINTS // 4  # W&B keeps them


def test_replay_completes_past_a_refused_key_and_re_targets_mlflow_and_wandb(offline):
    """The resumed run's MLflow server is dead; replay re-targets MLflow to a new sqlite store and
    W&B to a new directory: each gets every point it can take, and run.json records the mapping."""
    run_id = _wandb_only_run(offline)
    dead = f"http://127.0.0.1:{free_port()}"
    tracker = Tracker(
        run_id=run_id, sinks=[dead, "wandb"], spool_dir=offline / "spool", sink_options={"wandb": {"dir": offline}},
        open_timeout_s=0, close_timeout_s=1, handle_signals=False,
    )  # fmt: skip
    tracker.close()
    assert tracker.pending()["mlflow"] == POINTS
    new_store = f"sqlite:///{offline / 'new.db'}"
    new_dir = offline / "elsewhere"
    replay = _replay(str(offline / "spool"), "--tracking-uri", new_store, "--wandb-dir", str(new_dir))
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert f"run {run_id} mlflow: replayed, {POINTS} points pushed" in replay.stdout, replay.stdout
    assert f"{POINTS // 4} values refused" in replay.stdout
    assert _mlflow_steps(new_store) == list(range(POINTS))
    (wandb_file,) = new_dir.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")
    assert sorted(row[keys.WANDB_STEP_METRIC] for row in history(wandb_file)) == list(range(POINTS))
    mlflow_state = json.loads((offline / "spool" / run_id / keys.RUN_META_FILE).read_text())["sinks"][
        "mlflow"
    ]
    assert mlflow_state["tracking_uri"] == new_store and mlflow_state["closed"] is True
    assert mlflow_state["previous"][0]["tracking_uri"] == dead  # the mapping: where it was pinned before
    again = _replay(str(offline / "spool"))
    assert again.returncode == 0 and f"run {run_id} mlflow: up to date" in again.stdout, again.stdout


@needs_mlflow_command
def test_replay_delivers_every_point_to_a_server_restarted_on_an_empty_store(tmp_path):
    server = MlflowServer(tmp_path / "server.db", free_port(), tmp_path / "server.log")
    server.start()
    spool = tmp_path / "spool"
    try:
        tracker = Tracker(
            "emptied", sinks=[server.uri], spool_dir=spool, experiment="emptied", limits=Limits(flush_interval_s=0.1),
            close_timeout_s=1, handle_signals=False,
        )  # fmt: skip
        for step in range(1000):
            tracker.log(step, {keys.LOSS_SUM: step * 0.5})
        assert tracker.flush(timeout_s=60) is True
        pinned = json.loads((spool / tracker.run_id / keys.RUN_META_FILE).read_text())["sinks"]["mlflow"]
        server.kill()
        for step in range(1000, 2000):
            tracker.log(step, {keys.LOSS_SUM: step * 0.5})
        tracker.close()
        assert tracker.pending()["mlflow"] == 1000
        (tmp_path / "server.db").unlink()  # the store is gone: restarted empty
        server.start(timeout_s=300)  # a new store creates its tables first (slow on a loaded machine)
        replay = _replay(str(spool))
        assert replay.returncode == 0, replay.stdout + replay.stderr
        assert f"run {tracker.run_id} mlflow: replayed, 2000 points pushed" in replay.stdout, replay.stdout
        assert journal_steps(spool / tracker.run_id) == list(range(2000))
        assert _mlflow_steps(server.uri, "emptied") == list(range(2000))  # all, once
        state = json.loads((spool / tracker.run_id / keys.RUN_META_FILE).read_text())["sinks"]["mlflow"]
        assert state["mlflow_run_id"] != pinned["mlflow_run_id"] and state["closed"] is True
    finally:
        server.kill()
