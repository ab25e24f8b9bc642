"""The HTML dashboard: self-contained, escaped, and rendered by headless Chromium without errors."""

from __future__ import annotations

import html
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests._compare_fixtures import megatron_vs_miles
from tracking.compare import LoadedRun, RunSet, compare
from tracking.compare.dashboard import render_dashboard, write_dashboard
from tracking.compare.panels import PANELS
from tracking.records import RunInfo

CHROMIUM = "/usr/bin/chromium"
EVIL = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    megatron, miles = megatron_vs_miles(miles_clip_p=0.15, miles_name=EVIL, miles_missing=(3,))
    miles.config["note"] = "</script><img src=x onerror=alert(2)>"
    rs = RunSet.from_points(
        [
            (LoadedRun(RunInfo(r.run_id, r.run_name, r.backend, r.config), "test"), r.points)
            for r in (megatron, miles)
        ]
    )
    result = compare(rs)
    path = write_dashboard(tmp_path_factory.mktemp("dash") / "dashboard.html", rs, result)
    return path, result


def test_self_contained_and_escaped(dashboard):
    path, result = dashboard
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"""<script[^>]+src=|<link[^>]+href=["']?https?:""", text)
    # plotly.js is inline: the only raw <script> tags are ours (plotly, JSON data, boot script)
    assert text.count("<script") == 3
    assert EVIL not in text and "<img src=x" not in text
    assert html.escape(EVIL) in text
    assert "\\u0026lt;script\\u0026gt;alert(1)" in text  # trace names inside the figure JSON
    assert f'class="summary {result.on_policy_verdict}"' in text
    assert all(f'data-panel="{panel.id}"' in text for panel in PANELS)  # the one panel list


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    base = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=15000",
    ]
    return subprocess.run(
        base + args, capture_output=True, text=True, timeout=120, env={**os.environ, "TZ": "UTC"}
    )


def _console(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


needs_chromium = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed")


@needs_chromium
@pytest.mark.slow
def test_console_capture_sees_errors(tmp_path):
    """Control: the console capture below does report a page's errors."""
    page = tmp_path / "bad.html"
    page.write_text("<html><body><script>undefinedFunction();</script></body></html>")
    proc = _chromium(["--dump-dom", page.as_uri()], tmp_path / "profile")
    assert any("undefinedFunction is not defined" in line for line in _console(proc.stderr))


@needs_chromium
@pytest.mark.slow
def test_renders_in_headless_chromium(dashboard, tmp_path):
    path, result = dashboard
    dom = _chromium(["--dump-dom", path.as_uri()], tmp_path / "profile")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert _console(dom.stderr) == [], _console(dom.stderr)
    out = dom.stdout
    assert f'data-rendered="{len(PANELS)}"' in out  # every panel drawn by plotly
    assert out.count("js-plotly-plot") >= len(PANELS)
    assert "megatron-run" in out and html.escape(EVIL) in out
    assert EVIL not in out  # shown as text, never as an element
    assert '<img src="x"' not in out and "<img src=x" not in out
    legend = re.findall(r'class="legendtext"[^>]*>([^<]*)<', out)
    assert any("megatron-run" in t for t in legend) and any("&lt;script&gt;alert(1)" in t for t in legend)

    shot = tmp_path / "dashboard.png"
    proc = _chromium(
        ["--window-size=1400,1800", f"--screenshot={shot}", path.as_uri()], tmp_path / "profile2"
    )
    assert _console(proc.stderr) == []
    assert shot.exists() and shot.stat().st_size > 50_000
    print(f"\ndashboard screenshot: {shot}")


def test_render_is_deterministic(dashboard):
    path, result = dashboard
    megatron, miles = megatron_vs_miles(miles_clip_p=0.15, miles_name=EVIL, miles_missing=(3,))
    miles.config["note"] = "</script><img src=x onerror=alert(2)>"
    rs = RunSet.from_points(
        [
            (LoadedRun(RunInfo(r.run_id, r.run_name, r.backend, r.config), "test"), r.points)
            for r in (megatron, miles)
        ]
    )
    assert render_dashboard(rs, compare(rs)) == path.read_text(encoding="utf-8")


def test_insufficient_data_is_shown(tmp_path):
    from tests._compare_fixtures import synthetic_run

    a = synthetic_run("a", "a", "megatron", seed=1, n_steps=30)
    b = synthetic_run("b", "b", "miles", seed=2, n_steps=30, clip_p=0.3)
    a.points[10].metrics["reward:mean"] = float("nan")
    rs = RunSet.from_points(
        [(LoadedRun(RunInfo(r.run_id, r.run_name, r.backend), "test"), r.points) for r in (a, b)]
    )
    result = compare(rs)
    assert result.on_policy_verdict == "insufficient data"
    text = render_dashboard(rs, result)
    assert 'class="summary insufficient-data"' in text
    assert '<td class="verdict insufficient-data">insufficient data</td>' in text
    assert "only 30 paired units (minimum 100)" in text
    assert "Warning: a: reward:mean is NaN or infinite at 1 of 30 steps (first at step 10)" in text
