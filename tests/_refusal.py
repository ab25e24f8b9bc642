"""A read that is refused: ``cliptrack ARGV`` run in process, checked to leave its store untouched."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

import pytest
from cliptrack.cli.main import main


def refused(
    argv: list[str],
    cwd: Path,
    state: Callable[[], object],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> str:
    """Run ``cliptrack ARGV`` in ``cwd`` (no ``MLFLOW_TRACKING_URI``): exit 2, one line on stderr
    without a traceback, nothing on stdout, and ``state()`` (a snapshot of the store) the same
    before and after; return the stderr line."""
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    importlib.import_module("mlflow.tracking")  # MLflow's own import-time files are not the read's
    before = state()
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert captured.out == ""
    assert state() == before, "reading changed the store"
    return lines[0]
