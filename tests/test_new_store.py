"""A new MLflow store survives concurrent writers, and a store left mid-migration is named with its repair.

- eight trackers (processes) starting together on a sqlite store that does not exist yet, beside
  four CPU-bound processes (on two cores: a loaded machine, where MLflow's migrations, run by every
  process at once, interleaved and left the store mid-migration with no row), twice in a row: every
  point is delivered exactly once, the store is at MLflow's head revision with no leftover table,
  and MLflow and ``cliptrack runs`` read it;
- a store left mid-migration (alembic's ``_alembic_tmp_<table>`` left behind, an older revision) is
  refused by ``cliptrack runs`` naming what was left and the repair command, and that command, run
  as printed, repairs it (``mlflow db upgrade`` alone fails while the leftover table is there); the
  tracker's error names the same repair.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from cliptrack.backends.mlflow._compat import schema_revision
from cliptrack.core import keys
from mlflow import MlflowClient

REPO = Path(__file__).resolve().parents[1]
WRITERS = 8
BURNERS = 4
POINTS = 400
"""Steps each writer logs (two keys each)."""
ALTERS_METRICS = "181f10493468"
"""MLflow's migration "allow nulls for metric values", which rebuilds ``metrics`` through a copy on
sqlite: the one the eight-writer race was caught inside (``updating '90e64c465722' to
'181f10493468'``, ``_alembic_tmp_metrics`` left behind)."""


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RANK", None)
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _eight_writers_on_a_new_store(root: Path) -> list[str]:
    """Eight ``newstore`` workers started at once on ``root/mlflow.db`` beside ``BURNERS`` busy
    loops; their summaries."""
    uri = f"sqlite:///{root / 'mlflow.db'}"
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(BURNERS)]
    try:
        writers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests._tracking_worker",
                    "newstore",
                    str(root / "spool"),
                    uri,
                    str(POINTS),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=REPO,
                env=_env(),
            )
            for _ in range(WRITERS)
        ]
        outputs = [writer.communicate(timeout=900) for writer in writers]
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    for writer, (_, err) in zip(writers, outputs, strict=True):
        assert writer.returncode == 0, err[-3000:]
    return [out for out, _ in outputs]


@pytest.mark.slow  # 2 x 8 trackers beside 4 busy loops
@pytest.mark.timeout(1800)  # 8-10 min at a load of 15-17 on two cores (the suite's default is 600 s)
def test_eight_trackers_starting_together_on_a_new_store_deliver_every_point_once_twice(tmp_path):
    for attempt in ("first", "second"):
        root = tmp_path / attempt
        summaries = _eight_writers_on_a_new_store(root)
        assert all("mlflow: all written" in summary for summary in summaries), summaries
        database = root / "mlflow.db"
        connection = sqlite3.connect(database)
        try:
            tables = {
                name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            (revision,) = connection.execute("SELECT version_num FROM alembic_version").fetchone()
            rows = Counter((run, key) for run, key in connection.execute("SELECT run_uuid, key FROM metrics"))
        finally:
            connection.close()
        assert revision == schema_revision() and not [t for t in tables if t.startswith("_alembic_tmp_")]
        runs = {run for run, _ in rows}
        assert len(runs) == WRITERS
        assert rows == Counter({(run, key): POINTS for run in runs for key in (keys.LOSS_SUM, keys.REWARD)})
        assert not list(root.glob("mlflow.db.creating-*"))  # no temporary store left behind
        client = MlflowClient(f"sqlite:///{database}")
        experiment = client.get_experiment_by_name("cliptrack").experiment_id
        assert {r.info.run_id for r in client.search_runs([experiment])} == runs
        listed = subprocess.run(
            [
                sys.executable,
                "-m",
                "cliptrack.cli.main",
                "runs",
                "--tracking-uri",
                f"sqlite:///{database}",
                "--json",
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=_env(),
            timeout=300,
        )
        assert listed.returncode == 0, listed.stderr
        assert {entry["store_id"] for entry in json.loads(listed.stdout)} == runs


def _stuck_store(path: Path) -> str:
    """A store as the eight-writer race left it: MLflow's tables migrated up to the revision before
    ``ALTERS_METRICS`` and interrupted inside it (alembic's batch-mode copy ``_alembic_tmp_metrics``
    left behind); the revision it stopped at."""
    from alembic import command
    from alembic.script import ScriptDirectory
    from mlflow.store.db import utils
    from mlflow.store.tracking.dbmodels.initial_models import Base

    config = utils._get_alembic_config(f"sqlite:///{path}")
    stopped = ScriptDirectory.from_config(config).get_revision(ALTERS_METRICS).down_revision
    engine = utils.create_sqlalchemy_engine_with_retry(f"sqlite:///{path}")
    try:
        Base.metadata.create_all(engine)
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, str(stopped))
    finally:
        engine.dispose()
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE _alembic_tmp_metrics AS SELECT * FROM metrics")
    connection.commit()
    connection.close()
    return str(stopped)


@pytest.mark.slow  # mlflow db upgrade in a subprocess
def test_a_store_left_mid_migration_is_named_with_a_repair_that_works(tmp_path):
    path = tmp_path / "mlflow.db"
    stopped = _stuck_store(path)
    uri = f"sqlite:///{path}"
    runs = [sys.executable, "-m", "cliptrack.cli.main", "runs", "--tracking-uri", uri]
    refused = subprocess.run(runs, capture_output=True, text=True, cwd=REPO, env=_env(), timeout=300)
    assert refused.returncode == 2
    line = refused.stderr.strip()
    assert f"{uri} was left mid-migration (the leftover tables _alembic_tmp_metrics" in line, line
    assert f"at revision {stopped}; MLflow" in line and f"reads revision {schema_revision()})" in line, line
    assert "another schema" not in line
    repair = line.split("then run: ", 1)[1]
    assert repair.endswith(f"&& mlflow db upgrade {uri}"), repair

    alone = subprocess.run(
        ["mlflow", "db", "upgrade", uri],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
        cwd=tmp_path,
    )
    assert "table _alembic_tmp_metrics already exists" in alone.stderr  # why the leftover goes first
    fixed = subprocess.run(
        repair, shell=True, capture_output=True, text=True, env=_env(), timeout=600, cwd=tmp_path
    )
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    listed = subprocess.run(
        [*runs, "--json"], capture_output=True, text=True, cwd=REPO, env=_env(), timeout=300
    )
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr


def test_the_tracker_names_the_repair_of_a_store_left_mid_migration(tmp_path):
    from cliptrack.backends.base import SinkError
    from cliptrack.backends.mlflow.sink import MlflowSink
    from cliptrack.store.records import RunInfo

    path = tmp_path / "mlflow.db"
    stopped = _stuck_store(path)
    sink = MlflowSink(f"sqlite:///{path}")
    with pytest.raises(SinkError) as raised:
        sink.open(RunInfo("r1", "r1", None, started=1.0))
    message = str(raised.value)
    assert re.search(
        rf"the store was left mid-migration \(the leftover tables _alembic_tmp_metrics .*{stopped}", message
    )
    assert message.endswith(f"&& mlflow db upgrade sqlite:///{path}"), message


def test_a_store_being_created_is_said_to_be_not_refused_as_stuck(tmp_path, capsys):
    from cliptrack.backends.mlflow import creation
    from cliptrack.cli.main import main

    path = tmp_path / "mlflow.db"
    _stuck_store(path)  # as a creator sees it midway
    uri = f"sqlite:///{path}"
    with creation.creating(uri):  # another creator holds the lock
        assert main(["runs", "--tracking-uri", uri]) == 2
    line = capsys.readouterr().err
    assert f"{uri} is being created by another process right now (it holds mlflow.db.cliptrack-lock)" in line
    assert main(["runs", "--tracking-uri", uri]) == 2  # the lock let go: what it left is named
    assert "was left mid-migration" in capsys.readouterr().err
