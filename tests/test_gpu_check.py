"""benchmarks/gpu_check.py, the one prepared check for a CUDA device, run as its CPU dry run: the
same code at a small shape, so that it cannot rot between the times a device is lent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )


@pytest.mark.slow  # compiles the fused losses and the anchors for two dtypes
def test_the_dry_run_checks_every_loss_dtype_and_path_and_prints_one_json_line():
    proc = _run("--dry-run", "--repeats", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    [line] = proc.stdout.strip().splitlines()
    report = json.loads(line)
    rows = {(r["loss"], r["dtype"], r["path"]) for r in report["rows"]}
    assert rows == {
        (loss, dtype, path)
        for loss in ("ppo", "cispo")
        for dtype in ("float32", "bfloat16")
        for path in ("eager", "fused")
    }
    assert report["exact"] is True, report
    assert all(r["counts_exact"] and 0 <= r["loss_error"] <= r["loss_bound"] for r in report["rows"])
    assert all(r["ratio_to_anchor"] > 0 for r in report["rows"])
    assert report["sync_free"] == "not checked on the CPU"


def test_without_a_device_it_asks_for_the_dry_run():
    proc = _run()
    assert proc.returncode == 2 and "no CUDA device: run with --dry-run on the CPU" in proc.stderr
