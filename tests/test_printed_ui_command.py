"""The ``mlflow ui`` command the demo prints comes up as printed: one worker (``--workers 1``;
MLflow's default of 4 uvicorn workers never came up on two loaded cores), healthy on the store the
demo names, serving the runs. Only the port is swapped for a free one."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from cliptrack.cli.demo import mlflow_ui_url, next_steps
from cliptrack.core.secrets import redacted_output

from tests._compare_fixtures import megatron_vs_miles, write_mlflow
from tests._mlflow_ui import free_port, wait_healthy

HEALTHY_WITHIN_S = 180.0
"""Seconds the printed command may take to answer ``/health`` (MLflow's start on two busy cores)."""


def _printed_ui_command(tmp_path: Path) -> tuple[list[str], str]:
    """The ``mlflow ui`` line of the demo's next steps for a real store of one run, as argv; the
    store's URI."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    write_mlflow(uri, megatron_vs_miles()[0])
    text = next_steps(tmp_path, uri, "1", {"megatron": ["a", "b"], "miles": ["c", "d"]}, {})
    [line] = [line.strip()[2:] for line in text.splitlines() if line.strip().startswith("$ mlflow ui")]
    return shlex.split(line), uri


def test_the_printed_command_names_one_worker(tmp_path):
    argv, uri = _printed_ui_command(tmp_path)
    assert argv[:4] == ["mlflow", "ui", "--backend-store-uri", uri]
    assert argv[argv.index("--workers") + 1] == "1"


def test_the_printed_address_is_whole(tmp_path, capsys):
    """The address names MLflow's view of the four charts (``viewStateShareKey``, not a secret:
    the demo's output passes through ``redact``), on stdout as the demo prints it."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    write_mlflow(uri, megatron_vs_miles()[0])
    with redacted_output():
        print(next_steps(tmp_path, uri, "1", {"megatron": ["a", "b"], "miles": ["c", "d"]}, {}))
    out = capsys.readouterr().out
    assert f"    {mlflow_ui_url('1')}\n" in out and "viewStateShareKey=cliptrack-charts" in out, out


@pytest.mark.slow  # starts `mlflow ui` as printed
def test_the_printed_command_comes_up_and_serves_the_runs(tmp_path):
    argv, _ = _printed_ui_command(tmp_path)
    port = free_port()
    argv[argv.index("--port") + 1] = str(port)
    log = tmp_path / "ui.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", *argv],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=tmp_path,
            env={**os.environ},
        )
    try:
        wait_healthy(proc, port, log, HEALTHY_WITHIN_S)
        query = json.dumps({"experiment_ids": ["1"]}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/2.0/mlflow/runs/search",
            data=query,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            runs = json.loads(reply.read())["runs"]
        assert [run["info"]["run_name"] for run in runs] == ["megatron-run"]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
