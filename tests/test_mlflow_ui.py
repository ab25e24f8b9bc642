"""The MLflow UI opens the demo's training experiment on its runs and charts, in a real browser.

MLflow 3.17's UI chooses between its GenAI view (an "Overview" of traces) and its model-training
view from its ``workflowType`` setting — the URL parameter, else the browser's saved choice,
GenAI by default — not from the experiment's ``mlflow.experimentKind`` tag. The address the demo
prints (``tracking.demo.mlflow_ui_url``) names the model-training view and the charts; a fresh
headless Chromium (no saved choice) must land there, against a real ``mlflow server``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from html import unescape
from pathlib import Path

import pytest

from tests._compare_fixtures import megatron_vs_miles, write_mlflow
from tracking.demo import EXPERIMENT, _training_experiment, mlflow_ui_url

CHROMIUM = "/usr/bin/chromium"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed"),
    pytest.mark.skipif(shutil.which("mlflow") is None, reason="the mlflow command is not installed"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """A demo-like store (the demo's training experiment, two runs) behind a real ``mlflow server``."""
    out = tmp_path_factory.mktemp("ui")
    uri = f"sqlite:///{out / 'mlflow.db'}"
    experiment_id = _training_experiment(uri, out)
    for run in megatron_vs_miles(n_megatron=30, n_miles=30):
        write_mlflow(uri, run, experiment=EXPERIMENT)
    port = _free_port()
    log = open(out / "server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", "127.0.0.1"]
        + ["--port", str(port), "--workers", "1"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (out / "server.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, "mlflow server not healthy after 120 s"
                time.sleep(0.3)
        yield port, experiment_id, out
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        log.close()


def _page_text(url: str, profile: Path) -> str:
    """The rendered text of ``url`` in a fresh headless Chromium profile (scripts and styles dropped)."""
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"]
        + ["--disable-background-networking", "--disable-component-update", f"--user-data-dir={profile}"]
        + ["--virtual-time-budget=30000", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=180,
    )
    dom = re.sub(r"<script.*?</script>|<style.*?</style>", " ", proc.stdout, flags=re.S)
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", dom)))


def _settled_text(url: str, profile: Path, settled, attempts: int = 6) -> str:
    """The page text once ``settled(text)`` holds (a busy machine can leave the first dump half
    rendered: the budget is virtual time, the server's answers take real time — the section's count
    can be drawn before its charts), at most ``attempts``."""
    text = ""
    for attempt in range(attempts):
        text = _page_text(url, profile / str(attempt))
        if settled(text):
            break
    return text


def _is_genai_overview(text: str) -> bool:
    return "Overview - Experiment" in text and "Detect Issues" in text and "Traces" in text


def test_the_printed_address_opens_the_runs_and_their_charts(ui, tmp_path):
    port, experiment_id, _ = ui
    text = _settled_text(
        mlflow_ui_url(experiment_id, port),
        tmp_path,
        lambda t: "Model metrics (" in t and "clip_fraction:mean" in t,
    )
    assert not _is_genai_overview(text), text[:600]
    assert f"Runs - Experiment {experiment_id}" in text, text[:600]
    assert "megatron-run" in text and "miles-run" in text
    assert re.search(r"Model metrics \(\d+\)", text) and "clip_fraction:mean" in text, text[:1500]


def test_a_fresh_browser_without_the_parameter_lands_on_the_genai_overview(ui, tmp_path):
    """Why the demo prints the full address: MLflow 3.17's default view ignores the experiment-kind tag."""
    port, experiment_id, _ = ui
    url = f"http://127.0.0.1:{port}/#/experiments/{experiment_id}"
    text = _settled_text(url, tmp_path, lambda t: _is_genai_overview(t) or "Model metrics (" in t)
    assert _is_genai_overview(text), text[:600]
