"""Params and tags are delivered or reported: sent on every (re)open until acknowledged, through a
flaky proxy in front of a real ``mlflow server``, across a resumed process and ``cliptrack replay``;
a value MLflow refuses is named in the summary while the others arrive; names MLflow's PostgreSQL
store cannot hold are made storable, and no error line echoes SQL."""

from __future__ import annotations

import http.client
import json
import logging
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cliptrack import Limits
from cliptrack.core import keys
from cliptrack.log.tracker import Tracker

from tests import _postgres
from tests._harness import free_port
from tests._tools import needs_mlflow_command, needs_postgres

REPO = Path(__file__).resolve().parents[1]
CONFIG = {"lr": 3e-4, "optimizer": {"name": "adam", "beta1": 0.9}, "seed": 7}
PARAMS = {"lr": "0.0003", "optimizer.name": "adam", "optimizer.beta1": "0.9", "seed": "7"}


class FlakyProxy:
    """A reverse proxy on 127.0.0.1 in front of the server at ``upstream`` (a port): it answers 503
    to the next ``times`` requests whose path contains ``path`` (``fail``), and forwards every other
    request. ``refused`` counts the 503s per rule; ``params_sent`` counts, per param key, the
    log-batch requests that carried it to the server."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.rules: dict[str, int] = {}
        self.refused: Counter[str] = Counter()
        self.params_sent: Counter[str] = Counter()
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if proxy._refuse(self.path):
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if "runs/log-batch" in self.path and body:
                    with proxy.lock:
                        proxy.params_sent.update(p["key"] for p in json.loads(body).get("params", []))
                connection = http.client.HTTPConnection("127.0.0.1", proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                connection.request(self.command, self.path, body=body or None, headers=headers)
                response = connection.getresponse()
                data = response.read()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                connection.close()

            do_GET = do_POST = do_PATCH = do_DELETE = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def fail(self, path: str, times: int) -> None:
        with self.lock:
            self.rules[path] = times

    def heal(self) -> None:
        with self.lock:
            self.rules.clear()

    def _refuse(self, path: str) -> bool:
        with self.lock:
            for rule, left in self.rules.items():
                if rule in path and left > 0:
                    self.rules[rule] = left - 1
                    self.refused[rule] += 1
                    return True
        return False

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server(tmp_path):
    from tests.test_tracker_mlflow_server import MlflowServer

    mlflow_server = MlflowServer(tmp_path / "server.db", free_port(), tmp_path / "server.log")
    mlflow_server.start(timeout_s=240)  # a busy machine starts it slowly
    try:
        yield mlflow_server
    finally:
        mlflow_server.kill()


def _mlflow_run(uri: str, spool: Path, run_id: str):  # type: ignore[no-untyped-def]
    from mlflow import MlflowClient

    meta = json.loads((spool / run_id / keys.RUN_META_FILE).read_text())
    return MlflowClient(uri).get_run(meta["sinks"]["mlflow"]["mlflow_run_id"])


def _summary(caplog: pytest.LogCaptureFixture, run_id: str) -> str:
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"run {run_id} FINISHED")]
    assert lines, "no summary line"
    return lines[-1]


@pytest.mark.slow
@needs_mlflow_command
def test_params_and_tags_arrive_through_503s_a_resumed_process_and_replay(tmp_path, server, caplog):
    caplog.set_level(logging.INFO, logger="cliptrack")
    proxy = FlakyProxy(server.port)
    spool = tmp_path / "spool"
    try:
        # 1. the first three log-batch requests (the params) get a 503: the retry must still send them
        proxy.fail("runs/log-batch", 3)
        tracker = Tracker(
            "flaky-params",
            sinks=(proxy.uri,),
            backend_label="megatron",
            config=CONFIG,
            spool_dir=spool,
            experiment="flaky-params",
            limits=Limits(flush_interval_s=0.1),
            close_timeout_s=60,
            handle_signals=False,
        )
        for step in range(200):
            tracker.log(step, {"loss:sum": step * 0.5})
        tracker.close()
        summary = _summary(caplog, tracker.run_id)
        run = _mlflow_run(server.uri, spool, tracker.run_id)
        assert proxy.refused["runs/log-batch"] == 3
        assert run.data.params == PARAMS, (run.data.params, summary)
        assert (
            run.data.tags[keys.TAG_BACKEND] == "megatron" and run.data.tags[keys.TAG_RUN_ID] == tracker.run_id
        )
        assert "mlflow: all written" in summary, summary

        # 2. a resumed process adds config while every log-batch is refused: pending, and said so
        proxy.fail("runs/log-batch", 10**9)
        resumed = Tracker(
            sinks=(proxy.uri,),
            config={"extra": 1},
            spool_dir=spool,
            run_id=tracker.run_id,
            limits=Limits(flush_interval_s=0.1),
            close_timeout_s=3,
            handle_signals=False,
        )
        resumed.log_config({"late": {"x": 2}})
        resumed.log(200, {"loss:sum": 100.0})
        resumed.close()
        summary = _summary(caplog, tracker.run_id)
        assert "all written" not in summary and "cliptrack replay" in summary, summary
        assert "extra" not in _mlflow_run(server.uri, spool, tracker.run_id).data.params

        # 3. replay, once the proxy forwards again, sends what was not acknowledged, nothing twice
        proxy.heal()
        done = subprocess.run(
            [sys.executable, "-m", "cliptrack.cli.main", "replay", str(spool)],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"run {tracker.run_id} mlflow: replayed" in done.stdout, done.stdout
        run = _mlflow_run(server.uri, spool, tracker.run_id)
        assert run.data.params == {**PARAMS, "extra": "1", "late.x": "2"}
        assert run.info.status == "FINISHED"
        # every param reached the server in exactly one request: acknowledged ones are not re-sent
        assert dict(proxy.params_sent) == dict.fromkeys(run.data.params, 1), proxy.params_sent
        record = json.loads((spool / tracker.run_id / "params-mlflow.json").read_text())
        assert sorted(record["taken"]) == sorted(
            [f"param:{k}" for k in run.data.params]
            + [f"tag:{k}" for k in (keys.TAG_RUN_KIND, keys.TAG_RUN_ID, keys.TAG_BACKEND)]
        )
    finally:
        proxy.close()


@pytest.mark.slow
@needs_mlflow_command
def test_params_mlflow_refuses_are_named_and_the_others_arrive(tmp_path, server, caplog):
    caplog.set_level(logging.INFO, logger="cliptrack")
    spool = tmp_path / "spool"
    config = {"ok": 1, "big": "x" * 7000, "nul": "a\x00b", "bad key!": 2, "nested": {"lr": 0.1}}
    with Tracker(
        "refusals",
        sinks=(server.uri,),
        config=config,
        spool_dir=spool,
        experiment="refused-params",
        limits=Limits(flush_interval_s=0.1),
        handle_signals=False,
    ) as tracker:
        tracker.log(0, {"loss:sum": 1.0})
        tracker.flush()
        tracker.log_config({"ok": 2, "late": "yes"})  # MLflow never changes a param: 'ok' is refused
        tracker.log(1, {"loss:sum": 2.0})
    summary = _summary(caplog, tracker.run_id)
    run = _mlflow_run(server.uri, spool, tracker.run_id)
    assert run.data.params == {"ok": "1", "nested.lr": "0.1", "late": "yes"}
    assert "all written" not in summary and "mlflow: every point written" in summary, summary
    assert "param 'big' refused by mlflow: value of 7000 characters, over MLflow's limit of 6000" in summary
    assert "param 'nul' refused by mlflow: a NUL character" in summary
    assert "param 'bad key!' refused by mlflow: Invalid value" in summary
    assert "param 'ok' refused by mlflow: already logged with another value ('1')" in summary
    assert len(summary) < 2000, summary


def test_error_lines_are_short_and_echo_no_sql():
    """A SQL store's error as the MLflow server returns it (SQLAlchemy's text, with the statement
    and its parameters) is cut to its reason; a metric key of 1 MB is not repeated whole."""
    from cliptrack.backends.mlflow import _compat as compat
    from cliptrack.backends.mlflow.sink import MlflowSink
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import DataError

    statement = "INSERT INTO runs (run_uuid, name) VALUES (%(run_uuid)s, %(name)s)"
    error = DataError(statement, {"run_uuid": "a" * 32, "name": "n" * 2**20}, Exception("value too long"))
    text = compat.message(MlflowException(str(error), error_code="BAD_REQUEST"))
    assert "value too long" in text and "INSERT" not in text and "[SQL" not in text, text
    assert len(text) <= compat.MESSAGE_CHARS
    with pytest.raises(ValueError, match="MLflow refuses metric key") as info:
        MlflowSink("sqlite:///unused.db").check_key("m" * 2**20 + ":mean")
    assert len(str(info.value)) < 300


@pytest.mark.slow
@needs_mlflow_command
@needs_postgres
def test_names_and_values_postgres_refuses_are_made_storable_or_named(tmp_path, caplog):
    """On PostgreSQL a run name over 250 characters is a BAD_REQUEST echoing the SQL, and a NUL in
    a name, label or param an HTTP 500 (retried until close): names are made storable, the NUL
    param is named, the other params arrive, no line echoes SQL."""
    from tests.test_tracker_mlflow_server import MlflowServer

    caplog.set_level(logging.INFO, logger="cliptrack")
    try:
        cluster = _postgres.running(free_port(), "pg-params-4e1d")
        postgres = cluster.__enter__()
    except _postgres.PostgresError as exc:  # pragma: no cover - a host where the package cannot start
        pytest.skip(f"PostgreSQL cannot run here: {str(exc)[:500]}")
    server = None
    try:
        postgres.createdb("mlflow_params")
        server = MlflowServer(postgres.uri("mlflow_params"), free_port(), tmp_path / "server.log")
        server.start(timeout_s=240)
        spool = tmp_path / "spool"
        name = "n\x00" + "n" * 2**20
        with Tracker(
            name,
            sinks=(server.uri,),
            backend_label="lab\x00el",
            config={"ok": 1, "nul": "a\x00b"},
            spool_dir=spool,
            experiment="pg-params",
            limits=Limits(flush_interval_s=0.1),
            close_timeout_s=30,
            handle_signals=False,
        ) as tracker:
            tracker.log(0, {"loss:sum": 1.0})
        summary = _summary(caplog, tracker.run_id)
        run = _mlflow_run(server.uri, spool, tracker.run_id)
        assert run.info.run_name.startswith("n\\x00nnn") and len(run.info.run_name) <= 250
        assert run.data.tags[keys.TAG_BACKEND] == "lab\\x00el"
        assert run.data.params == {"ok": "1"}
        assert "param 'nul' refused by mlflow: a NUL character" in summary, summary
        assert "all written" not in summary and "mlflow: every point written" in summary, summary
        lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] + [summary]
        bad = [line[:3000] for line in lines if len(line) > 2000 or "INSERT INTO" in line or "[SQL" in line]
        assert not bad, bad
    finally:
        if server is not None:
            server.kill()
        cluster.__exit__(None, None, None)
