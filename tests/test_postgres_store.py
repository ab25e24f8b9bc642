"""PostgreSQL as MLflow's store, with the drivers the ``mlflow`` extra installs: an ``mlflow server``
on PostgreSQL under concurrent runs while the server is killed and PostgreSQL crash-restarted
(every point exactly once in PostgreSQL's own ``metrics`` table), and the tracker, ``cliptrack
runs`` and ``cliptrack compare`` on a ``postgresql://`` URI directly.

PostgreSQL is Debian's package, started by the tests (``tests/_postgres.py``); they are skipped,
with the reason, where it is not installed or cannot run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import _postgres
from tests._harness import free_port
from tests.test_tracker_mlflow_server import MlflowServer
from tracking import keys

REPO = Path(__file__).resolve().parents[1]
PASSWORD = "pg-Pa55word-4e1d"
"""The cluster's password: it is in every URI the tests hand out, and must never be printed."""

RUNS, STEPS, METRICS = 4, 2000, 5
"""The load test: concurrent tracker processes, steps each, metrics per step."""

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("mlflow") is None, reason="the mlflow command is not installed"),
    pytest.mark.skipif(_postgres.unavailable() is not None, reason=str(_postgres.unavailable())),
]


@pytest.fixture(scope="module")
def postgres():
    try:
        with _postgres.running(free_port(), PASSWORD) as server:
            yield server
    except _postgres.PostgresError as exc:  # pragma: no cover - a host where the package cannot start
        pytest.skip(f"PostgreSQL cannot run here: {str(exc)[:500]}")


def _rows(uri: str, experiment: str) -> dict[str, dict[tuple[str, int], list[float]]]:
    """PostgreSQL's ``metrics`` rows of ``experiment``'s runs: cliptrack run id -> (key, step) ->
    the values stored, read with SQL (not through MLflow)."""
    import sqlalchemy as sa

    engine = sa.create_engine(uri)
    query = sa.text(
        "SELECT t.value, m.key, m.step, m.value FROM metrics m "
        "JOIN runs r ON r.run_uuid = m.run_uuid "
        "JOIN experiments e ON e.experiment_id = r.experiment_id "
        "JOIN tags t ON t.run_uuid = m.run_uuid AND t.key = :tag "
        "WHERE e.name = :experiment"
    )
    out: dict[str, dict[tuple[str, int], list[float]]] = {}
    try:
        with engine.connect() as connection:
            for run_id, key, step, value in connection.execute(
                query, {"tag": keys.TAG_RUN_ID, "experiment": experiment}
            ):
                out.setdefault(run_id, {}).setdefault((key, int(step)), []).append(float(value))
    finally:
        engine.dispose()
    return out


def _wait_all(
    gates: Path, phase: str, children: list[subprocess.Popen], logs: list[Path], timeout_s: float = 300
):
    deadline = time.monotonic() + timeout_s
    while not all((gates / f"{phase}-pg-load-{i}").exists() for i in range(RUNS)):
        for child, log in zip(children, logs, strict=True):
            assert child.poll() is None, f"tracker exited with {child.returncode}: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, (
            f"the runs did not reach the end of phase {phase} in {timeout_s} s"
        )
        time.sleep(0.05)


def test_mlflow_server_on_postgres_killed_and_postgres_restarted_keeps_every_point_exactly_once(
    postgres, tmp_path
):
    postgres.createdb("mlflow_server")
    store = postgres.uri(
        "mlflow_server"
    )  # postgresql+psycopg2://cliptrack:PASSWORD@127.0.0.1:PORT/mlflow_server
    server = MlflowServer(store, free_port(), tmp_path / "server.log")
    spool, gates = tmp_path / "spool", tmp_path / "gates"
    gates.mkdir()
    children: list[subprocess.Popen] = []
    logs = [tmp_path / f"tracker-{i}.log" for i in range(RUNS)]
    started = time.monotonic()
    try:
        server.start(timeout_s=240)  # the first start creates MLflow's schema in PostgreSQL
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for i, log in enumerate(logs):
            with open(log, "wb") as out:
                args = [str(spool), server.uri, f"pg-load-{i}", str(STEPS), str(METRICS), str(gates)]
                children.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "tests._postgres",
                            "load",
                            *args,
                            str(tmp_path / f"result-{i}.json"),
                        ],
                        cwd=REPO,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=env,
                    )
                )
        _wait_all(gates, "a", children, logs)
        server.kill()  # the MLflow server dies with batches in flight
        _wait_all(gates, "b", children, logs)
        server.start(timeout_s=240)  # back on the same port, while the runs log on
        (gates / "server-back").touch()
        _wait_all(gates, "c", children, logs)
        postgres.restart("immediate")  # PostgreSQL crash-restarts under the MLflow server
        (gates / "pg-back").touch()
        for child, log in zip(children, logs, strict=True):
            assert child.wait(timeout=300) == 0, log.read_text()[-3000:]
        results = [json.loads((tmp_path / f"result-{i}.json").read_text()) for i in range(RUNS)]
        replay = subprocess.run(  # what a close left pending (if anything) is delivered by replay
            [sys.executable, "-m", "tracking.cli", "replay", str(spool)],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
        )
        assert replay.returncode == 0, replay.stdout + replay.stderr
        elapsed = time.monotonic() - started

        rows = _rows(store, "postgres-load")
        assert sorted(rows) == [f"pg-load-{i}" for i in range(RUNS)]
        for result in results:
            index = int(result["run_id"].rsplit("-", 1)[1])
            stored = rows[result["run_id"]]
            expected = {
                (f"m{m}:mean", step): [_postgres.metric_value(index, step, m)]
                for step in range(STEPS)
                for m in range(METRICS)
            }
            lost = expected.keys() - stored.keys()
            duplicated = {point: values for point, values in stored.items() if len(values) > 1}
            assert not lost, f"{result['run_id']}: {len(lost)} points lost, e.g. {sorted(lost)[:5]}"
            assert not duplicated, (
                f"{result['run_id']}: {len(duplicated)} duplicated, e.g. {list(duplicated.items())[:5]}"
            )
            assert stored == expected, result["run_id"]  # nothing else, every value exact
        printed = "".join(log.read_text() for log in logs) + replay.stdout + replay.stderr
        assert PASSWORD not in printed
        print(
            f"\n{RUNS} runs x {STEPS} steps x {METRICS} metrics = {RUNS * STEPS * METRICS} rows in PostgreSQL, "
            f"0 lost, 0 duplicated; pending at close {[r['pending'] for r in results]}; {elapsed:.1f} s"
        )
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(10)
        server.kill()


def _cli(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tracking.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout_s,
    )


def _log_run(uri: str, spool: Path, name: str, clipped: int) -> subprocess.CompletedProcess[str]:
    """One run of 150 steps logged straight to ``uri`` (MLflow's SQLAlchemy store), in its own process."""
    code = f"""
from tracking import keys
from tracking.tracker import Tracker
with Tracker({name!r}, backends=({uri!r},), spool_dir={str(spool)!r}, experiment="postgres-direct",
             backend_label={name!r}, handle_signals=False) as tracker:
    for step in range(150):
        tracker.log(step, {{keys.LOSS_TOKENS: 1000.0, keys.CLIPPED_TOKENS: float({clipped} + step % 7),
                            keys.CLIP_FRACTION: ({clipped} + step % 7) / 1000, keys.REWARD: 0.5 + (step % 5) / 100}})
"""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=240)


def test_tracker_runs_and_compare_read_and_write_postgres_directly(postgres, tmp_path):
    postgres.createdb("direct")
    plain, explicit = postgres.uri("direct", driver=None), postgres.uri("direct")
    first = _log_run(
        plain, tmp_path / "spool", "pg-megatron", clipped=100
    )  # postgresql://: SQLAlchemy's default driver
    assert first.returncode == 0, first.stderr
    second = _log_run(explicit, tmp_path / "spool", "pg-miles", clipped=300)  # postgresql+psycopg2://
    assert second.returncode == 0, second.stderr
    assert "mlflow: all written" in first.stderr and "mlflow: all written" in second.stderr

    listed = _cli("runs", "--tracking-uri", explicit, "--json")
    assert listed.returncode == 0, listed.stderr
    names = sorted(run["name"] for run in json.loads(listed.stdout))
    assert names == ["pg-megatron", "pg-miles"]

    compared = _cli("compare", "pg-megatron", "pg-miles", "--tracking-uri", explicit, "--json")
    assert compared.returncode == 0, compared.stderr
    result = json.loads(compared.stdout)
    clip = next(d for d in result["differences"] if d["metric"] == "clip_fraction")
    assert clip["difference"]["units"] == 150 and clip["verdict"] == "different"  # 10 % against 30 %

    printed = "".join(p.stdout + p.stderr for p in (first, second, listed, compared))
    assert PASSWORD not in printed
