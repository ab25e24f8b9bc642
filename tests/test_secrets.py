"""No secret leaves cliptrack: credentials in store addresses and the environment are redacted in
everything it prints or writes, while the real values are still used to connect.

Unit tests of ``cliptrack.core.secrets`` (hypothesis: a URI's password never survives, a URI without a
secret is unchanged; restoring the real URI at resume), then one end-to-end test: a password (in
the tracking URI's user info), a token (in its query string) and a W&B key (``WANDB_API_KEY``) are
planted; two runs are logged to a real ``mlflow server`` (behind a loopback gateway that demands
the token and the password, so delivery proves the real values were used) and to W&B offline, one
of them while the gateway refuses writes (the errors echo the full URL); then ``cliptrack replay``
(the real URI from the environment), ``runs``, ``compare`` (table, ``--json``, ``--html``,
``--markdown``), ``panels mlflow`` and ``panels wandb`` run, and every line they print and every file
they (and the tracker) wrote is searched for the three secrets, as are the params and tags on the
server and the comparison run's artifacts.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import math
import os
import sqlite3
import subprocess
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cliptrack.core import keys, secrets
from cliptrack.core.secrets import MASK, redact, redact_value
from hypothesis import given
from hypothesis import strategies as st

from tests._tools import needs_mlflow_command

REPO = Path(__file__).resolve().parents[1]

PASSWORD = "Pw-s3cr3t-98712"
TOKEN = "Tk-9f8e7d6c5b4a"
WANDB_KEY = "c1a55ec7" * 5
"""Planted secrets: a URI password, a query-string token, a W&B API key (40 hex characters)."""
SECRETS = (PASSWORD, TOKEN, WANDB_KEY)
STEPS = 40


# ---- cliptrack.core.secrets ---------------------------------------------------------------------------

_WORD = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~", min_size=1, max_size=12
)
_PASSWORD = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~!$&'()*+,;=%:",
    min_size=1,
    max_size=24,
).filter(lambda p: p.strip("*") != "")
_SCHEME = st.sampled_from(["http", "https", "postgresql", "postgresql+psycopg2", "mysql+pymysql", "mssql"])
_HOST = st.from_regex(r"[a-z][a-z0-9\-]{0,10}(\.[a-z]{2,5}){0,2}", fullmatch=True)


@given(_SCHEME, _WORD, _PASSWORD, _HOST, st.integers(1, 65535), _WORD)
def test_a_uri_password_never_survives(scheme, user, password, host, port, db):
    uri = f"{scheme}://{user}:{password}@{host}:{port}/{db}"
    out = redact(uri)
    assert out == f"{scheme}://{user}:{MASK}@{host}:{port}/{db}"
    assert redact(f"could not open the MLflow run at {uri}: refused") == (
        f"could not open the MLflow run at {out}: refused"
    )


@given(_SCHEME, _WORD, _HOST, st.integers(1, 65535), _WORD, _WORD)
def test_a_uri_without_a_secret_is_unchanged(scheme, user, host, port, db, value):
    for uri in (
        f"{scheme}://{host}:{port}/{db}",
        f"{scheme}://{user}@{host}/{db}",
        f"{scheme}://{host}/{db}?experiment={value}&step={port}",
        f"sqlite:////data/{db}/mlflow.db",
    ):
        assert redact(uri) == uri


_TOKEN = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~%+/=", min_size=1, max_size=40
)
"""A token as URLs carry them (unreserved characters, percent escapes, base64's ``+/=``)."""


@given(_TOKEN, _HOST)
def test_query_tokens_are_hidden_and_the_rest_of_the_query_kept(token, host):
    uri = f"https://{host}/api?experiment=7&token={token}&access_token={token}&api_key={token}"
    assert redact(uri) == f"https://{host}/api?experiment=7&token={MASK}&access_token={MASK}&api_key={MASK}"


def test_other_credential_shapes_are_hidden(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", WANDB_KEY)
    assert redact("host=db.internal user=ml password=hunter2-x dbname=m") == (
        f"host=db.internal user=ml password={MASK} dbname=m"
    )
    assert redact("Authorization: Bearer abcdefghijkl.mnop") == f"Authorization: Bearer {MASK}"
    assert redact(f"wandb login failed for key {WANDB_KEY}") == f"wandb login failed for key {MASK}"
    # ordinary prose around the words is left alone
    for text in ("Basic settings apply", "Token counts per datum", "the reward model's keyboard=3"):
        assert redact(text) == text
    assert redact_value({"uri": f"http://u:{PASSWORD}@h", "n": 3, "l": [f"?token={TOKEN}"]}) == {
        "uri": f"http://u:{MASK}@h",
        "n": 3,
        "l": [f"?token={MASK}"],
    }


def test_the_mlflow_ui_share_key_is_no_secret_and_look_alikes_still_are():
    """The MLflow UI address the demo prints names its chart view with ``viewStateShareKey``."""
    ui = "http://127.0.0.1:5000/#/experiments/1/runs?workflowType=machine_learning&viewStateShareKey=cliptrack-charts"
    assert redact(ui) == ui
    assert redact(f"http://h/?shareKey={TOKEN}&key={TOKEN}&myviewStateShareKey={TOKEN}") == (
        f"http://h/?shareKey={MASK}&key={MASK}&myviewStateShareKey={MASK}"
    )


def test_redaction_is_idempotent():
    uri = f"postgresql+psycopg2://ml:{PASSWORD}@db:5432/mlflow?sslmode=require&password={TOKEN}"
    once = redact(uri)
    assert PASSWORD not in once and TOKEN not in once
    assert redact(once) == once


def test_the_real_uri_is_restored_from_a_candidate_that_matches_the_stored_one():
    real = f"http://ml:{PASSWORD}@127.0.0.1:5000?token={TOKEN}"
    stored = redact(real)
    assert secrets.restore(stored, [None, "http://other:5000", real]) == real
    assert secrets.restore(stored, [stored, "http://ml:wrong@127.0.0.2:5000"]) is None  # no candidate
    assert secrets.restore("sqlite:////data/mlflow.db", []) == "sqlite:////data/mlflow.db"  # nothing hidden


def test_quoted_passwords_and_a_dict_held_authorization_header_are_hidden():
    """libpq's quoted ``password='...'`` (spaces and escaped quotes inside), a dict's repr and JSON
    of a password or an ``Authorization`` header: each value hidden up to its closing quote, the
    rest of the text kept; redacting twice changes nothing."""
    basic = base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    cases = {
        f"host=db password='{PASSWORD}' dbname=m": f"host=db password='{MASK}' dbname=m",
        f"host=db password = 'my {PASSWORD}\\'s' port=5": f"host=db password = '{MASK}' port=5",
        f'password="{PASSWORD}"': f'password="{MASK}"',
        f"{{'user': 'ml', 'password': '{PASSWORD}'}}": f"{{'user': 'ml', 'password': '{MASK}'}}",
        f'{{"password": "{PASSWORD}", "n": 3}}': f'{{"password": "{MASK}", "n": 3}}',
        f"{{'Authorization': 'Basic {basic}', 'Accept': 'json'}}": (
            f"{{'Authorization': 'Basic {MASK}', 'Accept': 'json'}}"
        ),
        f'{{"authorization": "Bearer {TOKEN}"}}': f'{{"authorization": "Bearer {MASK}"}}',
        f"{{'Proxy-Authorization': '{TOKEN}'}}": f"{{'Proxy-Authorization': '{MASK}'}}",
    }
    for text, expected in cases.items():
        assert redact(text) == expected, text
        assert redact(expected) == expected


@given(
    _WORD, st.text(alphabet=st.characters(codec="ascii", exclude_categories=("Cc",)), min_size=1, max_size=24)
)
def test_a_password_or_a_header_in_a_dict_s_repr_never_survives(user, password):
    """Python's own ``repr`` of a dict (whichever quotes it picks, with its backslash escapes) is
    the plain reference: redacted, it is the same repr with the password's value (in its quotes)
    and the header's credentials masked."""
    held = {"user": user, "password": password}
    shown = repr(password)  # in the quotes repr picks for it
    head, _, tail = repr(held).rpartition(shown)
    assert redact(repr(held)) == f"{head}{shown[0]}{MASK}{shown[0]}{tail}"
    header = {"Authorization": "Basic " + base64.b64encode(f"user-{user}:{password}".encode()).decode()}
    assert redact(repr(header)) == repr({"Authorization": f"Basic {MASK}"})
    libpq = password.replace("\\", "\\\\").replace("'", "\\'")  # libpq's quoted form escapes these
    assert redact(f"host=db password='{libpq}' port=5") == f"host=db password='{MASK}' port=5"


def test_redacted_text_in_a_sentence_is_redacted_again_unchanged():
    """A masked query value or password followed by punctuation (a URI in parentheses, before a
    colon) is left as it is by a second pass: the sentence keeps its ``):``."""
    once = redact(f"http://u:{PASSWORD}@h:1?token={TOKEN}")
    assert once == f"http://u:{MASK}@h:1?token={MASK}"
    sentence = f"watch kl_k3:mean: reference run r (tracking_uri={once}): no run; password={MASK}, retry"
    assert redact(sentence) == sentence


def test_an_error_leaving_a_library_entry_point_holds_no_secret_nor_do_its_causes():
    """``redacted_errors`` redacts the exception it lets out, and its cause and context (a
    traceback prints them), keeping the type and the object; cliptrack's own errors are redacted
    when made."""
    from cliptrack.backends.catalog import RunNotFoundError
    from cliptrack.backends.preflight import StoreError

    uri = f"http://user:{PASSWORD}@h:1?token={TOKEN}"

    class ClientError(Exception):
        def __init__(self, message: str) -> None:
            super().__init__(message)
            self.message = message

    def fail() -> None:
        try:
            raise ConnectionError(f"API request to {uri} failed")
        except ConnectionError as exc:
            raise ClientError(f"could not reach {uri}") from exc

    with pytest.raises(ClientError) as caught, secrets.redacted_errors():
        fail()
    text = "".join(traceback.format_exception(caught.value))
    assert not _leaks(text) and caught.value.message == f"could not reach {redact(uri)}"
    assert f"API request to {redact(uri)} failed" in text  # the cause: redacted, not dropped
    for error in (StoreError, RunNotFoundError):
        assert str(error(f"no run in MLflow store {uri}")) == f"no run in MLflow store {redact(uri)}"


def test_errors_of_load_runs_and_of_a_watch_reference_hold_no_secret(tmp_path, monkeypatch):
    """A store that does not answer, given with a password and a token: ``load_runs`` raises
    ``StoreError``, a ``Tracker`` whose watch names a run there ``ValueError``; neither message
    nor traceback holds them."""
    from cliptrack import load_runs
    from cliptrack.backends.preflight import StoreError
    from cliptrack.log.tracker import Tracker
    from cliptrack.log.watch import Watch

    from tests._harness import free_port

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"http://user:{PASSWORD}@127.0.0.1:{free_port()}?token={TOKEN}"
    with pytest.raises(StoreError) as store_error:
        load_runs(["r"], tracking_uri=uri)
    with pytest.raises(ValueError) as watch_error:
        Tracker(
            "w",
            sinks=["jsonl"],
            spool_dir=tmp_path / "spool",
            handle_signals=False,
            watch=Watch("kl_k3:mean", reference=f"{uri}#r"),
        )
    with pytest.raises(ValueError) as parse_error:
        Tracker("w", sinks=["jsonl"], spool_dir=tmp_path, watch=f"kl_k3:mean,reference={uri}#r,window=x")
    for caught in (store_error, watch_error, parse_error):
        text = "".join(traceback.format_exception(caught.value))
        assert not _leaks(text), text
        assert f"user:{MASK}@127.0.0.1" in str(caught.value)


def test_a_watch_keeps_its_reference_s_credentials_out_of_its_source_and_alerts():
    """``Watch.source`` and the alerts ``describe`` makes (their text, title and reference, which
    the stderr line, ``watch.jsonl`` and every sink take) name the reference's store redacted."""
    from cliptrack.compare.stats.watch import Breach
    from cliptrack.log.watch import RunRef, Watch, describe, describe_not_finite

    for reference in (
        f"http://user:{PASSWORD}@h:5000?token={TOKEN}#run-1",
        RunRef("run-1", (("tracking_uri", f"postgresql://ml:{PASSWORD}@db/m?sslmode=x&password={TOKEN}"),)),
    ):
        watch = Watch("kl_k3:mean", reference=reference)
        assert not _leaks(watch.source) and MASK in watch.source and "run-1" in watch.source
        alerts = [
            describe(watch, Breach(3, 7, 0.5, 0.1, 9.0, "up"), "abc"),
            describe_not_finite(watch, 8, math.nan, "up", "abc"),
        ]
        for alert in alerts:
            assert not _leaks(json.dumps(dataclasses.asdict(alert))), alert
            assert watch.source in alert.text and alert.reference == watch.source


def test_the_demo_prints_no_secret_of_its_store(tmp_path):
    from cliptrack.cli.demo import next_steps, where_everything_is

    uri = f"postgresql://ml:{PASSWORD}@db/mlflow?token={TOKEN}"
    groups = {"megatron": ["r1", "r2"], "miles": ["r3", "r4"]}
    text = next_steps(tmp_path, uri, "1", groups, groups) + where_everything_is(
        tmp_path, uri, groups, wandb=True
    )
    assert PASSWORD not in text and TOKEN not in text
    assert f"ml:{MASK}@db/mlflow" in text


# ---- end to end ---------------------------------------------------------------------------------


class Gateway:
    """A loopback HTTP gateway in front of an ``mlflow server`` that, like an authenticating proxy,
    serves only requests carrying ``?token=TOKEN`` and basic auth ``user:PASSWORD``, strips the
    token and forwards the rest. MLflow's client appends the request path to the tracking URI
    (``http://user:PW@host:port?token=T`` + ``/api/2.0/...``); the gateway reads it back from the
    query. ``refuse_metrics`` answers 503 to every batch of metrics (an outage the tracker reports)."""

    def __init__(self, upstream_port: int, port: int) -> None:
        self.upstream_port, self.port = upstream_port, port
        self.refuse_metrics = False
        self.served = 0
        self.rejected: list[str] = []
        gateway = self
        expected = "Basic " + base64.b64encode(f"user:{PASSWORD}".encode()).decode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                prefix = f"/?token={TOKEN}"
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if not self.path.startswith(prefix) or self.headers.get("Authorization") != expected:
                    gateway.rejected.append(self.path)
                    self._answer(401, b'{"error_code": "UNAUTHENTICATED", "message": "no credentials"}')
                    return
                path = self.path[len(prefix) :] or "/"
                if "?" not in path and "&" in path:  # requests appended the query with '&'
                    path = path.replace("&", "?", 1)
                if gateway.refuse_metrics and path.endswith("runs/log-batch") and b'"metrics"' in body:
                    self._answer(503, b"unavailable")
                    return
                upstream = http.client.HTTPConnection("127.0.0.1", gateway.upstream_port, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")}
                upstream.request(self.command, path, body=body or None, headers=headers)
                response = upstream.getresponse()
                data = response.read()
                upstream.close()
                gateway.served += 1
                self._answer(response.status, data, response.getheader("Content-Type") or "application/json")

            def _answer(self, status: int, data: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Gateway:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


_LOG_RUN = """
import sys
import mlflow  # imported before the watch's reference is read (a loaded machine takes seconds)
from cliptrack import Limits
from cliptrack.core import keys
from cliptrack.log.tracker import Tracker
from cliptrack.log.watch import Watch
import os
uri = os.environ["CLIPTRACK_TEST_URI"]
spool, wandb_dir, name, clipped, steps, reference = sys.argv[1:7]
watch = None if reference == "-" else Watch(keys.REWARD, f"{uri}#{reference}", window=20, scale="value")
with Tracker(name, sinks=[uri, "wandb"], backend_label=name, spool_dir=spool,
             sink_options={"wandb": {"dir": wandb_dir}}, watch=watch,
             experiment="secrets", config={"store": uri, "lr": 0.1}, limits=Limits(flush_interval_s=0.05),
             close_timeout_s=8, handle_signals=False) as t:
    for step in range(int(steps)):
        n = 100 + step % 7
        c = (step * int(clipped)) % 13
        jump = 50.0 if watch is not None and step >= 30 else 0.0
        t.log(step, {keys.LOSS_TOKENS: n, keys.CLIPPED_TOKENS: c, keys.CLIP_FRACTION: c / n,
                     keys.REWARD: (step % 5) / 4 + jump})
print(t.run_id)
"""
"""One training run (a subprocess: its stderr is what a user sees) logged to MLflow and W&B; the URI
comes from the environment, as a job's would (W&B records a program's command line). Given a
reference run (its id on the same server, named by the same URI), it watches its reward against
it, and its reward jumps at step 30: an alert."""


def _probe_output(shift: float) -> dict[str, Any]:
    """A ``ForwardBackwardOutput`` as JSON with 12 datums of 8 tokens (the probe's input)."""
    datums = [
        {
            "logprobs": {
                "data": [-0.5 - 0.01 * (i + t) + shift for t in range(8)],
                "dtype": "float32",
                "shape": [8],
            },
            "loss_tokens": {"data": [8], "dtype": "int64", "shape": [1]},
        }
        for i in range(12)
    ]
    return {"loss_fn_output_type": "ArrayRecord", "metrics": {}, "loss_fn_outputs": datums}


def _library_errors(real: str, reference: str, spool: Path) -> dict[str, str]:
    """The text (message and traceback) of each error a library caller gets naming the store by
    ``real``: a run or an experiment it does not hold, a watch whose reference run is missing, a
    watch's string form that is malformed."""
    from cliptrack import load_runs
    from cliptrack.log.tracker import Tracker
    from cliptrack.log.watch import Watch

    calls = {
        "load_runs (no such run)": lambda: load_runs(["no-such-run"], tracking_uri=real),
        "load_runs (no such experiment)": lambda: load_runs(
            [reference], tracking_uri=real, experiment="none"
        ),
        "Tracker(watch=) (no such run)": lambda: Tracker(
            "w",
            sinks=["jsonl"],
            spool_dir=spool,
            handle_signals=False,
            watch=Watch(keys.REWARD, f"{real}#no-such-run"),
        ),
        "Tracker(watch=) (malformed)": lambda: Tracker(
            "w",
            sinks=["jsonl"],
            spool_dir=spool,
            handle_signals=False,
            watch=f"{keys.REWARD},reference={real}#{reference},window=many",
        ),
    }
    out = {}
    for name, call in calls.items():
        with pytest.raises((LookupError, ValueError)) as caught:
            call()
        out[f"exception: {name}"] = "".join(traceback.format_exception(caught.value))
    return out


def _cli(*args: str, env: dict[str, str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "cliptrack.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )
    if check:
        assert proc.returncode == 0, f"cliptrack {' '.join(args)}: {proc.stdout}\n{proc.stderr}"
    return proc


def _leaks(text: str) -> list[str]:
    """The lines of ``text`` that hold a planted secret (the first three, cut to 300 characters)."""
    return [line[:300] for line in text.splitlines() if any(s in line for s in SECRETS)][:3]


@pytest.mark.slow
@needs_mlflow_command
def test_no_secret_in_any_output_or_file_while_the_runs_are_delivered(tmp_path):
    from mlflow import MlflowClient

    from tests._harness import free_port
    from tests.test_tracker_mlflow_server import MlflowServer

    server = MlflowServer(tmp_path / "server.db", free_port(), tmp_path / "server.log")
    server.start()
    work = tmp_path / "work"
    work.mkdir()
    spool, wandb_dir = work / "spool", work / "wandb-runs"
    outputs: dict[str, str] = {}  # what each command printed, by name

    try:
        with Gateway(server.port, free_port()) as gateway:
            real = f"http://user:{PASSWORD}@127.0.0.1:{gateway.port}?token={TOKEN}"
            env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "WANDB_"))}
            env.update(
                WANDB_API_KEY=WANDB_KEY,
                WANDB_MODE="offline",
                WANDB_SILENT="true",
                WANDB_BASE_URL=f"http://user:{PASSWORD}@127.0.0.1:9?token={TOKEN}",  # W&B's settings
                PYTHONPATH=str(REPO),
            )
            run_ids: list[str] = []
            for name, clipped in (("alpha", "1"), ("beta", "2"), ("gamma", "3")):
                gateway.refuse_metrics = name == "beta"  # beta's points wait in the spool, with errors
                reference = run_ids[0] if name == "gamma" else "-"  # gamma watches its reward against alpha's
                proc = subprocess.run(
                    [
                        sys.executable,
                        "-c",
                        _LOG_RUN,
                        str(spool),
                        str(wandb_dir),
                        name,
                        clipped,
                        str(STEPS),
                        reference,
                    ],
                    capture_output=True,
                    text=True,
                    env={**env, "CLIPTRACK_TEST_URI": real},
                    cwd=work,
                    timeout=300,
                )
                assert proc.returncode == 0, proc.stdout + proc.stderr
                outputs[f"tracker {name}"] = proc.stdout + proc.stderr
                run_ids.append(proc.stdout.split()[-1])
            gateway.refuse_metrics = False
            assert "pending" in outputs["tracker beta"]  # the outage was reported (redacted)
            watcher = run_ids.pop()  # gamma: only the watch's
            assert f"cliptrack watch: run {watcher}: {keys.REWARD} = " in outputs["tracker gamma"]  # alerted
            assert (spool / watcher / "watch.jsonl").is_file()
            outputs.update(_library_errors(real, run_ids[0], work / "spool-errors"))

            # replay: run.json holds no password, so without the real URI it says where to give it
            refused = _cli("replay", str(spool), env=env, cwd=work, check=False)
            outputs["replay without the URI"] = refused.stdout + refused.stderr
            assert refused.returncode == 1
            assert "MLFLOW_TRACKING_URI" in refused.stdout and "--tracking-uri" in refused.stdout
            replayed = _cli("replay", str(spool), env={**env, "MLFLOW_TRACKING_URI": real}, cwd=work)
            outputs["replay"] = replayed.stdout + replayed.stderr
            assert f"run {run_ids[1]} mlflow: replayed" in replayed.stdout

            store = ("--tracking-uri", real)
            outputs["runs"] = _cli("runs", *store, env=env, cwd=work).stdout
            outputs["runs --json"] = _cli("runs", *store, "--json", env=env, cwd=work).stdout
            compared = _cli(
                "compare",
                *run_ids,
                *store,
                "--json",
                str(work / "c.json"),
                "--html",
                str(work / "c.html"),
                "--markdown",
                str(work / "c.md"),
                env=env,
                cwd=work,
            )
            outputs["compare"] = compared.stdout + compared.stderr
            json_out = _cli("compare", *run_ids, *store, "--json", "-", env=env, cwd=work)
            outputs["compare --json -"] = json_out.stdout + json_out.stderr
            on_spool = _cli(
                "compare", *run_ids, "--jsonl", str(spool), "--html", str(work / "s.html"), env=env, cwd=work
            )
            outputs["compare --jsonl"] = on_spool.stdout + on_spool.stderr
            panels = _cli(
                "panels",
                "mlflow",
                *run_ids,
                *store,
                "--artifact-dir",
                str(work / "artifacts"),
                env=env,
                cwd=work,
            )
            outputs["panels mlflow"] = panels.stdout + panels.stderr
            comparison_id = panels.stdout.split("comparison run:")[-1].split()[0]
            wb = _cli(
                "panels",
                "wandb",
                "--entity",
                "team",
                "--project",
                "secrets",
                "--runs",
                *run_ids,
                "--summary-from",
                str(wandb_dir),
                "--offline",
                "--out",
                str(work / "wandb-panels.json"),
                env=env,
                cwd=work,
            )
            outputs["panels wandb"] = wb.stdout + wb.stderr
            watched = _cli(
                "watch",
                str(spool / watcher),
                "--watch",
                f"{keys.REWARD},reference={real}#{run_ids[0]},window=20,scale=value",
                "--once",
                env=env,
                cwd=work,
                check=False,
            )
            outputs["watch"] = watched.stdout + watched.stderr
            # the alert names its band's source, or the reference's error its store: redacted either way
            assert f"user:{MASK}@127.0.0.1" in outputs["watch"], outputs["watch"]
            for name, shift in (("a", 0.0), ("b", 0.25)):
                (work / f"probe-{name}.json").write_text(json.dumps(_probe_output(shift)))
            probe_files = (str(work / "probe-a.json"), str(work / "probe-b.json"))
            for args in (("--labels", f"{real},b"), ("--labels", f"{real},b", "--json")):
                probed = _cli("probe", *probe_files, *args, env=env, cwd=work, check=False)
                assert probed.returncode == 1, probed.stdout + probed.stderr  # different
                outputs[f"probe {' '.join(args[2:])}"] = probed.stdout + probed.stderr
            missing = _cli(
                "probe", probe_files[0], f"{work}/missing?token={TOKEN}.json", env=env, cwd=work, check=False
            )
            assert missing.returncode == 2 and "missing?token=" in missing.stderr
            outputs["probe (a missing file)"] = missing.stdout + missing.stderr
            assert not gateway.rejected, gateway.rejected[:3]  # every request carried the real credentials

        # the runs were delivered: every point of both runs is on the server
        client = MlflowClient(server.uri)
        experiment = client.get_experiment_by_name("secrets")
        runs = {r.data.tags["cliptrack.run_id"]: r for r in client.search_runs([experiment.experiment_id])}
        for run_id in run_ids:
            history = client.get_metric_history(runs[run_id].info.run_id, "clip_fraction:mean")
            assert len(history) == STEPS
        stored = [
            str(r.data.params) + str(r.data.tags) for r in client.search_runs([experiment.experiment_id])
        ]
        comparison = client.get_run(comparison_id)
        stored.append(str(comparison.data.params) + str(comparison.data.tags))
        watch_tags = [
            t for r in runs.values() for k, t in r.data.tags.items() if k.startswith("cliptrack.watch.")
        ]
        assert watch_tags and all(f"user:{MASK}@127.0.0.1" in t for t in watch_tags), watch_tags
        downloaded = Path(client.download_artifacts(comparison_id, "", str(tmp_path / "downloaded")))
    finally:
        server.kill()
    with sqlite3.connect(tmp_path / "server.db") as db:  # every row of every table the server keeps
        tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        stored += [f"{table}: {row}" for table in tables for row in db.execute(f"SELECT * FROM {table}")]

    leaks = {name: _leaks(text) for name, text in outputs.items() if _leaks(text)}
    leaks.update({f"server params, tags, rows {i}": _leaks(t) for i, t in enumerate(stored) if _leaks(t)})
    files = [p for root in (work, downloaded) for p in root.rglob("*") if p.is_file()]
    assert any(p.name == "run.json" for p in files) and any(p.name == "dashboard.html" for p in files)
    assert any(p.suffix == ".wandb" for p in files) and any(p.name == "watch.jsonl" for p in files)
    for path in files:
        found = _leaks(path.read_bytes().decode("utf-8", "replace"))
        if found:
            leaks[str(path.relative_to(tmp_path))] = found
    assert not leaks, json.dumps(leaks, indent=1)
    assert f"user:{MASK}@127.0.0.1" in outputs["tracker alpha"]  # redacted, not dropped


def test_a_resumed_run_and_replay_reach_the_store_with_the_uri_run_json_does_not_hold(tmp_path, monkeypatch):
    """run.json records ``?token=***``; a resumed tracker given the real URI, and replay given it in
    ``MLFLOW_TRACKING_URI``, reach the store; replay without it fails saying where to give it."""
    from cliptrack.core import keys
    from cliptrack.log.replay import replay_run
    from cliptrack.log.tracker import Tracker
    from cliptrack.store.spool import Ack, RunDir
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    real = f"sqlite:///{tmp_path / 'mlflow.db'}?token={TOKEN}"  # SQLAlchemy's sqlite ignores the query
    spool = tmp_path / "spool"

    def log(steps: range, run_id: str | None = None) -> Tracker:
        with Tracker(
            "resumed", sinks=[real], spool_dir=spool, run_id=run_id, handle_signals=False
        ) as tracker:
            for step in steps:
                tracker.log(step, {keys.REWARD: step / 10})
        return tracker

    first = log(range(0, 5))
    meta = (spool / first.run_id / keys.RUN_META_FILE).read_text()
    assert TOKEN not in meta and f"?token={MASK}" in meta
    log(range(5, 10), run_id=first.run_id)  # resumed: the real URI is this tracker's own
    assert TOKEN not in (spool / first.run_id / keys.RUN_META_FILE).read_text()

    # replay needs the store again: MLflow's acknowledgement set back to the first 5 points
    run_dir = RunDir(spool, first.run_id)
    fifth = [offset for _, offset in run_dir.read_points()][4]
    run_dir.write_ack("mlflow", Ack(5, fifth))
    [failed] = replay_run(run_dir, sinks={"mlflow"})
    assert failed.outcome == "failed" and "MLFLOW_TRACKING_URI" in (failed.error or "")
    assert TOKEN not in (failed.error or "") and f"token={MASK}" in (failed.error or "")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", real)
    [done] = replay_run(run_dir, sinks={"mlflow"})
    assert done.outcome == "replayed" and done.pushed == 5, done.line()

    client = MlflowClient(real)
    [run] = client.search_runs([client.get_experiment_by_name("cliptrack").experiment_id])
    assert len(client.get_metric_history(run.info.run_id, keys.REWARD)) == 10


def test_a_watch_and_its_reference_show_no_password_in_their_repr():
    from cliptrack.log.watch import RunRef, Watch

    text = "http://alice:S3cretPW@mlflow.example:5000#RUN7"
    for obj in (
        Watch("kl_k3:mean", reference=text),
        RunRef.parse(text),
        Watch("kl_k3:mean", RunRef.parse(text)),
    ):
        shown = repr(obj)
        assert "S3cretPW" not in shown and "RUN7" in shown and "alice" in shown, shown
