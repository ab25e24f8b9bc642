"""A real ``mlflow server`` on loopback (sqlite backend), killed and restarted under a run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from cliptrack import Limits
from cliptrack.core import keys
from cliptrack.log.tracker import Tracker
from mlflow import MlflowClient

from tests._harness import free_port

REPO = Path(__file__).resolve().parents[1]
STEPS = 10_000

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("mlflow") is None, reason="the mlflow command is not installed"),
]


class MlflowServer:
    """``mlflow server --backend-store-uri sqlite:///DB --host 127.0.0.1 --port PORT`` in its own
    process group, so that a kill takes the uvicorn worker down with it. ``db`` is the sqlite file,
    or any backend store URI as a string (``postgresql+psycopg2://…``)."""

    def __init__(self, db: Path | str, port: int, log: Path) -> None:
        self.db, self.port, self.log = db, port, log
        self.store = f"sqlite:///{db}" if isinstance(db, Path) else db
        self.proc: subprocess.Popen | None = None
        self.uri = f"http://127.0.0.1:{port}"

    def start(self, timeout_s: float = 60.0) -> None:
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    "mlflow",
                    "server",
                    "--backend-store-uri",
                    self.store,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--workers",
                    "1",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}"
                )
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"mlflow server not healthy after {timeout_s} s: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None


def _values(step: int) -> dict[str, float]:
    return {
        keys.LOSS_SUM: step * 0.5,
        keys.REWARD: (step % 97) / 96,
        "throughput/tokens:mean": float(step % 5),
    }


def test_server_killed_mid_run_then_replay_leaves_every_point_exactly_once(tmp_path, monkeypatch):
    server = MlflowServer(tmp_path / "server.db", free_port(), tmp_path / "server.log")
    server.start()
    spool = tmp_path / "spool"
    try:
        tracker = Tracker(
            "server-run",
            sinks=(server.uri,),
            backend_label="miles",
            spool_dir=spool,
            experiment="server-test",
            limits=Limits(flush_interval_s=0.1),
            close_timeout_s=2,
            handle_signals=False,
        )
        lane = tracker._lanes[0]
        for step in range(STEPS):
            tracker.log(step, _values(step))
            if step == 3000:  # killed mid-run, with batches in flight
                server.kill()
            elif step == 6000:  # back while training runs: the sink recovers from the spool by itself
                server.start()
                deadline = time.monotonic() + 90
                while lane.pending_points() or lane.state != "ok":
                    assert time.monotonic() < deadline, f"no recovery: {lane.state} {lane.error}"
                    time.sleep(0.1)
            elif step == 8000:  # killed again; this time the run ends before it is back
                server.kill()
        tracker.close()
        assert tracker.pending()["mlflow"] > 0  # the tail waits on disk
        meta = json.loads((spool / tracker.run_id / keys.RUN_META_FILE).read_text())
        assert meta["sinks"]["mlflow"]["closed"] is False

        server.start()
        replay = subprocess.run(
            [sys.executable, "-m", "cliptrack.cli.main", "replay", str(spool)],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=180,
        )
        assert replay.returncode == 0, replay.stdout + replay.stderr
        assert f"run {tracker.run_id} mlflow: replayed" in replay.stdout

        client = MlflowClient(server.uri)
        experiment = client.get_experiment_by_name("server-test")
        runs = client.search_runs([experiment.experiment_id])
        assert len(runs) == 1
        run = runs[0]
        assert run.info.status == "FINISHED" and run.data.tags[keys.TAG_BACKEND] == "miles"
        for key in _values(0):
            history = client.get_metric_history(run.info.run_id, key)
            steps = sorted(m.step for m in history)
            assert steps == list(range(STEPS)), (key, len(steps), len(set(steps)))  # each point once
            assert all(m.value == _values(m.step)[key] for m in history)
    finally:
        server.kill()
