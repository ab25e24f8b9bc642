"""PostgreSQL as MLflow's store, with the drivers the ``mlflow`` extra installs: an ``mlflow server``
on PostgreSQL under concurrent runs while the server is killed and PostgreSQL crash-restarted
(every point exactly once in PostgreSQL's own ``metrics`` table), and the tracker, ``cliptrack
runs`` and ``cliptrack compare`` on a ``postgresql://`` URI directly.

PostgreSQL is Debian's package, started by the tests (``tests/_postgres.py``); they are skipped,
with the reason, where it is not installed or cannot run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cliptrack.core import keys

from tests import _postgres
from tests._harness import free_port
from tests._tools import needs_mlflow_command, needs_postgres
from tests.test_tracker_mlflow_server import MlflowServer

REPO = Path(__file__).resolve().parents[1]
PASSWORD = "pg-Pa55word-4e1d"
"""The cluster's password: it is in every URI the tests hand out, and must never be printed."""

RUNS, METRICS = 4, 5
"""The load test: concurrent tracker processes, metrics per step."""

pytestmark = [
    pytest.mark.slow,
    needs_mlflow_command,
    needs_postgres,
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


def _counts(uri: str, experiment: str) -> dict[str, int]:
    """How many ``metrics`` rows each of ``experiment``'s runs has in PostgreSQL (by cliptrack id)."""
    import sqlalchemy as sa

    engine = sa.create_engine(uri)
    query = sa.text(
        "SELECT t.value, count(*) FROM metrics m "
        "JOIN runs r ON r.run_uuid = m.run_uuid "
        "JOIN experiments e ON e.experiment_id = r.experiment_id "
        "JOIN tags t ON t.run_uuid = m.run_uuid AND t.key = :tag "
        "WHERE e.name = :experiment GROUP BY t.value"
    )
    try:
        with engine.connect() as connection:
            found = connection.execute(query, {"tag": keys.TAG_RUN_ID, "experiment": experiment})
            return {run_id: int(count) for run_id, count in found}
    finally:
        engine.dispose()


class Load:
    """The load test's tracker processes, and waiting on what PostgreSQL holds of their runs."""

    def __init__(self, tmp_path: Path, store: str) -> None:
        self.tmp_path, self.store = tmp_path, store
        self.run_ids = [f"pg-load-{i}" for i in range(RUNS)]
        self.logs = [tmp_path / f"tracker-{i}.log" for i in range(RUNS)]
        self.stop = tmp_path / "stop"
        self.children: list[subprocess.Popen] = []

    def start(self, server_uri: str) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for run_id, log in zip(self.run_ids, self.logs, strict=True):
            args = [str(self.tmp_path / "spool"), server_uri, run_id, str(METRICS), str(self.stop)]
            with open(log, "wb") as out:
                self.children.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "tests._postgres", "load", *args, str(self._result(run_id))],
                        cwd=REPO,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=env,
                    )
                )

    def _result(self, run_id: str) -> Path:
        return self.tmp_path / f"result-{run_id}.json"

    def wait_rows(self, more_than: dict[str, int], what: str, timeout_s: float = 300) -> dict[str, int]:
        """Wait until every run holds more rows in PostgreSQL than ``more_than`` says (0 if absent):
        delivery is flowing. Returns the counts then."""
        deadline = time.monotonic() + timeout_s
        while True:
            for child, log in zip(self.children, self.logs, strict=True):
                assert child.poll() is None, (
                    f"tracker exited with {child.returncode}: {log.read_text()[-3000:]}"
                )
            counts = _counts(self.store, "postgres-load")
            if all(counts.get(r, 0) > more_than.get(r, 0) for r in self.run_ids):
                return counts
            assert time.monotonic() < deadline, f"no rows {what} after {timeout_s} s: {counts}"
            time.sleep(0.5)

    def finish(self) -> list[dict]:
        """Tell the runs to stop, wait for them to close; what each logged and left pending."""
        self.stop.touch()
        for child, log in zip(self.children, self.logs, strict=True):
            assert child.wait(timeout=300) == 0, log.read_text()[-3000:]
        return [json.loads(self._result(r).read_text()) for r in self.run_ids]

    def kill(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()
                child.wait(10)


def test_mlflow_server_on_postgres_killed_and_postgres_restarted_keeps_every_point_exactly_once(
    postgres, tmp_path
):
    """Four runs log on (a point of 5 values every 20 ms each) while the MLflow server is killed
    with requests in flight and started again, then while PostgreSQL crash-restarts under the
    server's connections; each fault is injected once every run's rows are seen arriving."""
    postgres.createdb("mlflow_server")
    store = postgres.uri("mlflow_server")  # postgresql+psycopg2://cliptrack:PASSWORD@127.0.0.1:…
    server = MlflowServer(store, free_port(), tmp_path / "server.log")
    load = Load(tmp_path, store)
    started = time.monotonic()
    try:
        server.start(timeout_s=240)  # the first start creates MLflow's schema in PostgreSQL
        load.start(server.uri)
        flowing = load.wait_rows({}, "at all")
        server.kill()  # the MLflow server dies while every run is delivering
        server.start(timeout_s=240)  # back on the same port; the runs logged on meanwhile
        resumed = load.wait_rows(_counts(store, "postgres-load"), "after the server's restart")
        postgres.restart("immediate")  # PostgreSQL crash-restarts under the MLflow server
        recovered = load.wait_rows(_counts(store, "postgres-load"), "after PostgreSQL's restart")
        results = load.finish()
        replay = subprocess.run(  # what a close left pending (if anything) is delivered by replay
            [sys.executable, "-m", "cliptrack.cli.main", "replay", str(tmp_path / "spool")],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
        )
        assert replay.returncode == 0, replay.stdout + replay.stderr
        elapsed = time.monotonic() - started

        rows = _rows(store, "postgres-load")
        assert sorted(rows) == load.run_ids
        for result in results:
            index = int(result["run_id"].rsplit("-", 1)[1])
            stored = rows[result["run_id"]]
            expected = {
                (f"m{m}:mean", step): [_postgres.metric_value(index, step, m)]
                for step in range(result["logged"])
                for m in range(METRICS)
            }
            lost = expected.keys() - stored.keys()
            duplicated = {point: values for point, values in stored.items() if len(values) > 1}
            assert not lost, f"{result['run_id']}: {len(lost)} points lost, e.g. {sorted(lost)[:5]}"
            assert not duplicated, (
                f"{result['run_id']}: {len(duplicated)} duplicated: {list(duplicated.items())[:5]}"
            )
            assert stored == expected, result["run_id"]  # nothing else, every value exact
        printed = "".join(log.read_text() for log in load.logs) + replay.stdout + replay.stderr
        assert PASSWORD not in printed
        total = sum(r["logged"] for r in results) * METRICS
        refused = server.log.read_text().count('" 500')  # requests PostgreSQL's restart cut (retried)
        print(
            f"\n{RUNS} runs, {[r['logged'] for r in results]} steps x {METRICS} metrics = {total} rows in "
            f"PostgreSQL, 0 lost, 0 duplicated; rows when the server was killed {sum(flowing.values())}, "
            f"when PostgreSQL was restarted {sum(resumed.values())}, after {sum(recovered.values())} "
            f"({refused} HTTP 500 from the server); "
            f"pending at close {[r['pending']['mlflow'] for r in results]}; {elapsed:.1f} s"
        )
    finally:
        load.kill()
        server.kill()


def _cli(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cliptrack.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout_s,
    )


def _log_run(uri: str, spool: Path, name: str, clipped: int) -> subprocess.CompletedProcess[str]:
    """One run of 150 steps logged straight to ``uri`` (MLflow's SQLAlchemy store), in its own process."""
    code = f"""
from cliptrack.core import keys
from cliptrack.log.tracker import Tracker
with Tracker({name!r}, sinks=({uri!r},), spool_dir={str(spool)!r}, experiment="postgres-direct",
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
