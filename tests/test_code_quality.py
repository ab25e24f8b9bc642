"""The lint and type step of the test command: ruff (rules and format) over the tree, mypy over the public
modules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_finds_nothing():
    pytest.importorskip("ruff")
    proc = _run("ruff", "check", "tracking", "adapters", "tests", "benchmarks")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_tree_is_formatted():
    pytest.importorskip("ruff")
    proc = _run("ruff", "format", "--check", "tracking", "adapters", "tests", "benchmarks")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_finds_nothing_in_the_public_modules():
    pytest.importorskip("mypy")
    proc = _run("mypy", "tracking", "adapters")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_tracking_imports_without_torch():
    code = (
        "import sys, importlib.abc\n"
        "class NoTorch(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "import tracking, tracking.tracker, tracking.compare, tracking.cli\n"
        "from tracking import Tracker\n"
        "assert 'torch' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
