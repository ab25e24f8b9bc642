"""A real ``mlflow server`` on 127.0.0.1 and a headless Chromium that renders its UI, for the UI tests."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from html import unescape
from pathlib import Path

from tests._tools import CHROMIUM


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(proc: subprocess.Popen, port: int, log_path: Path, timeout_s: float) -> None:
    """Wait until the MLflow server ``proc`` answers ``/health`` on ``port``; AssertionError with
    the tail of its log when it dies or is not healthy within ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, log_path.read_text()[-2000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            assert time.monotonic() < deadline, (
                f"mlflow server not healthy after {timeout_s:g} s: {log_path.read_text()[-2000:]}"
            )
            time.sleep(0.3)


@contextlib.contextmanager
def mlflow_server(uri: str, log_path: Path, timeout_s: float = 120, command: str = "server") -> Iterator[int]:
    """``mlflow server`` (or ``command="ui"``: ``mlflow ui``, what the demo prints) on ``uri`` (one
    worker, 127.0.0.1, a free port), healthy; yields the port and kills the server's process group
    after. Its output goes to ``log_path``."""
    port = free_port()
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", command, "--backend-store-uri", uri, "--host", "127.0.0.1"]
        + ["--port", str(port), "--workers", "1"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    try:
        wait_healthy(proc, port, log_path, timeout_s)
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        log.close()


WINDOW = "--window-size=1600,1000"
"""A laptop's screen: the chart view draws only the charts in view (Chromium's default 800x600 shows
none below the shared view's banner)."""


def page_dom(url: str, profile: Path, budget_ms: int = 30000) -> str:
    """The DOM of ``url`` after ``budget_ms`` of virtual time in a fresh headless Chromium profile
    (a ``WINDOW``-sized window)."""
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync", WINDOW]
        + ["--disable-background-networking", "--disable-component-update", f"--user-data-dir={profile}"]
        + [f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=180,
    )
    return proc.stdout


def dom_text(dom: str) -> str:
    """The rendered text of a dumped DOM (scripts and styles dropped, whitespace collapsed)."""
    dom = re.sub(r"<script.*?</script>|<style.*?</style>", " ", dom, flags=re.S)
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", dom)))


def page_text(url: str, profile: Path) -> str:
    """The rendered text of ``url`` in a fresh headless Chromium profile."""
    return dom_text(page_dom(url, profile))


def settled_text(url: str, profile: Path, settled, attempts: int = 6) -> str:
    """The page text once ``settled(text)`` holds (a busy machine can leave the first dump half
    rendered: the budget is virtual time, the server's answers take real time — the section's count
    can be drawn before its charts), at most ``attempts``."""
    text = ""
    for attempt in range(attempts):
        text = page_text(url, profile / str(attempt))
        if settled(text):
            break
    return text
