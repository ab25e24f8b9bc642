"""The test session's one demo run (the ``demo_run`` fixture of ``tests/conftest.py``), without torch."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO_STEPS = 6
"""Training steps per run of the test session's demo (too few for a verdict: "insufficient data")."""


@dataclass(frozen=True)
class DemoRun:
    """The test session's one ``cliptrack demo --steps DEMO_STEPS --wandb``, run as a newcomer runs it
    (working directory ``home``, output in the default ``home/cliptrack-demo``, stdout and stderr
    pipes rather than a terminal, W&B offline). Tests only read what it wrote."""

    home: Path
    out: Path
    proc: subprocess.CompletedProcess


def run_demo(home: Path) -> DemoRun:
    """Run the demo in ``home`` (at most 10 minutes); AssertionError with its output's tail when it fails."""
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "cliptrack.cli.main", "demo", "--steps", str(DEMO_STEPS), "--wandb"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=home,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return DemoRun(home, home / "cliptrack-demo", proc)
