"""Two and four gloo processes on loopback: exactly one run, written by global rank 0."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cliptrack.core import keys
from mlflow import MlflowClient

from tests._harness import free_port

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def db_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    uri = f"sqlite:///{tmp_path_factory.mktemp('dist') / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()  # schema created once, not by each test's rank 0
    return uri


@pytest.mark.parametrize("world", [2, 4])
def test_one_run_per_job_whatever_the_number_of_ranks(tmp_path, db_uri, world):
    spool, port = tmp_path / "spool", free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests._tracking_worker",
                "dist",
                str(spool),
                db_uri,
                str(rank),
                str(world),
                str(port),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    outputs = [p.communicate(timeout=240) for p in procs]
    for rank, (proc, (_, err)) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0, f"rank {rank}: {err[-3000:]}"
    lines = sorted(out.strip().splitlines()[-1] for out, _ in outputs)
    assert lines[0].startswith("rank 0 active=True run_id=")
    assert lines[1:] == [f"rank {r} active=False run_id=None" for r in range(1, world)]
    run_id = lines[0].rsplit("=", 1)[1]

    assert [p.name for p in spool.iterdir()] == [run_id]
    meta = json.loads((spool / run_id / keys.RUN_META_FILE).read_text())
    assert meta["config"] == {"world_size": world} and meta["status"] == "FINISHED"
    client = MlflowClient(db_uri)
    runs = client.search_runs(
        [client.get_experiment_by_name("cliptrack").experiment_id],
        filter_string=f"params.world_size = '{world}'",
    )
    assert len(runs) == 1 and runs[0].data.tags[keys.TAG_RUN_ID] == run_id
    history = client.get_metric_history(runs[0].info.run_id, keys.LOSS_SUM)
    assert sorted((m.step, m.value) for m in history) == [(s, float(s)) for s in range(5)]  # rank 0's values
