"""``compare`` and ``runs`` over HTTP against a real ``mlflow server`` that is busy but healthy.

The store: two runs of 20,000 steps x 7 metrics (280,000 values) in sqlite. The runs and their first
steps are logged with MLflow's client; the remaining metric rows are inserted into MLflow's own
``metrics``/``latest_metrics`` tables in one transaction (logging 280,000 values through
``log_batch`` takes minutes). The server then reads them as it reads any run.

"Busy" is made deterministic by a proxy in front of the server that holds every reply
``DELAY_S`` seconds (beyond the 5 s per attempt reads used to wait): no dependence on how idle the
machine is. A server that cannot be reached still fails within ``BOUND_S``.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cliptrack.cli.main import main

from tests._compare_fixtures import synthetic_run, write_mlflow
from tests._mlflow_ui import free_port, mlflow_server
from tests._tools import needs_mlflow_command

pytestmark = [
    pytest.mark.slow,
    needs_mlflow_command,
]

STEPS = 20_000
DELAY_S = 6.0
"""Seconds the proxy holds every reply (the old per-attempt read timeout was 5 s)."""
BOUND_S = 10.0
"""A server that cannot be reached fails within this (the issue's bound)."""
LOGGED = 10
"""Steps of each run logged through MLflow's client; the rest are inserted into its tables."""


def _store(db: Path) -> list[str]:
    """Two 20,000-step runs in the sqlite store ``db``; their MLflow run ids."""
    uri = f"sqlite:///{db}"
    runs = [
        synthetic_run("megatron0001", "megatron-run", "megatron", seed=1, n_steps=STEPS),
        synthetic_run("miles0000002", "miles-run", "miles", seed=2, n_steps=STEPS),
    ]
    ids = []
    for run in runs:
        head = type(run)(run.run_id, run.run_name, run.backend, run.points[:LOGGED], run.config)
        run_id = write_mlflow(uri, head)
        ids.append(run_id)
        rows = [
            (key, value, int(round(p.wall_time * 1000)), run_id, p.step, 0)
            for p in run.points[LOGGED:]
            for key, value in p.metrics.items()
        ]
        last = run.points[-1]
        with sqlite3.connect(db) as con:
            con.executemany(
                "INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            con.executemany(
                "UPDATE latest_metrics SET value = ?, timestamp = ?, step = ? WHERE key = ? AND run_uuid = ?",
                [
                    (value, int(round(last.wall_time * 1000)), last.step, key, run_id)
                    for key, value in last.metrics.items()
                ],
            )
    return ids


class DelayingProxy:
    """A TCP proxy on 127.0.0.1 that forwards requests at once and holds each reply ``delay_s``
    seconds after the request that asked for it (``delay_s=None``: closes every connection at
    once, a server that went away behind its port)."""

    def __init__(self, upstream_port: int, delay_s: float | None) -> None:
        self.upstream = ("127.0.0.1", upstream_port)
        self.delay_s = delay_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.uri = f"http://127.0.0.1:{self.port}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.delay_s is None:
                client.close()
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        asked: list[float] = []  # when the request awaiting its reply was forwarded
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return

        def requests() -> None:
            try:
                while data := client.recv(65536):
                    asked.append(time.monotonic())
                    server.sendall(data)
            except OSError:
                pass
            finally:
                server.close()

        threading.Thread(target=requests, daemon=True).start()
        try:
            while data := server.recv(65536):
                if asked:  # the first bytes of a reply: held until delay_s after its request
                    time.sleep(max(0.0, asked[-1] + float(self.delay_s or 0) - time.monotonic()))
                    asked.clear()
                client.sendall(data)
        except OSError:
            pass
        finally:
            client.close()

    def close(self) -> None:
        self._closed = True
        self.listener.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[Path, list[str], int]]:
    """The store, its run ids and the port of a real ``mlflow server`` over it."""
    root = tmp_path_factory.mktemp("busy")
    db = root / "mlflow.db"
    ids = _store(db)
    with mlflow_server(f"sqlite:///{db}", root / "server.log") as port:
        yield db, ids, port


def _compare_json(argv: list[str], out: Path, capsys) -> dict:
    capsys.readouterr()
    code = main(["compare", *argv, "--json", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(out.read_text())


def test_compare_through_a_server_that_holds_every_reply_beyond_the_old_timeout(
    served, tmp_path, capsys, monkeypatch
):
    """Every reply 6 s late (the old reads gave up after 5 s per attempt: exit 2): compare reads
    both 20,000-step runs and gives what it gives reading the database directly."""
    db, ids, port = served
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    direct = _compare_json([*ids, "--tracking-uri", f"sqlite:///{db}"], tmp_path / "direct.json", capsys)
    proxy = DelayingProxy(port, DELAY_S)
    try:
        started = time.monotonic()
        slow = _compare_json([*ids, "--tracking-uri", proxy.uri], tmp_path / "slow.json", capsys)
        elapsed = time.monotonic() - started
    finally:
        proxy.close()
    assert elapsed >= DELAY_S  # the replies were held
    for result in (direct, slow):  # where each was read from differs; the comparison does not
        result.pop("sources", None)
    assert json.dumps(slow, sort_keys=True) == json.dumps(direct, sort_keys=True)


def test_runs_lists_both_runs_through_the_delaying_proxy(served, capsys, monkeypatch):
    _, ids, port = served
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    proxy = DelayingProxy(port, DELAY_S)
    try:
        capsys.readouterr()
        code = main(["runs", "--tracking-uri", proxy.uri, "--json"])
        captured = capsys.readouterr()
    finally:
        proxy.close()
    assert code == 0, captured.err
    listed = {entry["store_id"]: entry["steps"] for entry in json.loads(captured.out)}
    assert listed == {ids[0]: STEPS, ids[1]: STEPS}


@pytest.mark.parametrize("command", ["compare", "runs"])
@pytest.mark.parametrize("server", ["closed port", "closes every connection"])
def test_a_server_that_cannot_be_reached_fails_within_the_bound(command, server, capsys, monkeypatch):
    """No server behind the port, or one that accepts the probe's connection and then drops every
    request: exit 2, one line naming the server, within 10 s (the read timeout is not waited)."""
    import cliptrack.backends.load
    import cliptrack.cli.runs  # noqa: F401
    import mlflow.tracking  # noqa: F401 - imported before the clock starts

    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    proxy = DelayingProxy(free_port(), None) if server == "closes every connection" else None
    uri = proxy.uri if proxy else f"http://127.0.0.1:{free_port()}"
    argv = ["compare", "a", "b"] if command == "compare" else ["runs"]
    try:
        capsys.readouterr()
        started = time.perf_counter()
        code = main([*argv, "--tracking-uri", uri])
        elapsed = time.perf_counter() - started
        captured = capsys.readouterr()
    finally:
        if proxy:
            proxy.close()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured
    assert len(lines) == 1 and "127.0.0.1" in lines[0], captured.err
    assert elapsed < BOUND_S, elapsed
