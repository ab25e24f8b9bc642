"""Runs logged by verl's own loggers, read beside a spool's runs (``--jsonl DIR``).

- verl's file logger (``trainer.logger=['file']``) writes ``<VERL_FILE_LOGGER_ROOT>/<project>/<experiment>.jsonl``
  (or ``VERL_FILE_LOGGER_PATH``), one ``{"step": n, "data": {key: value}}`` per line;
- its console logger prints ``step:<n> - <key>:<value> - ...`` per step: its output saved to a
  ``.log`` or ``.txt`` file reads the same.

Either is found directly in ``DIR`` or one folder below (verl's project folder). A run is named after
its file (``<project>/<experiment>``), its stack is ``verl``, and its recipe is the one the
cliptrack verl losses logged beside their sums (:func:`cliptrack.core.verl_keys.logged_recipe`),
recorded in its config under ``loss_recipe.<field>``; the points go through the same key translation
as other trackers' (:mod:`cliptrack.store.aliases`): the losses' exact sums become ours, verl's own
``actor/pg_clipfrac`` is kept beside them.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from cliptrack.core import verl_keys
from cliptrack.core.recipe import CONFIG_KEY
from cliptrack.store.aliases import as_logged, canonical_points
from cliptrack.store.frame import LoadedRun
from cliptrack.store.records import Point, RunInfo

__all__ = ["BACKEND", "find_logs", "read_log"]

BACKEND = "verl"
"""The stack label of a run read from verl's own log."""
_CONSOLE = re.compile(r"^step:(\d+)\s+-\s+")
_NUMBER = re.compile(r"^(?:np\.float\d*\(|np\.int\d*\()?\s*([-+0-9.eEinfa]+)\s*\)?$")
_SUFFIXES = (".jsonl", ".log", ".txt")
_CONSOLE_HEAD = 50
"""Lines of a saved console output searched for verl's first ``step:`` line (others print first)."""


def _kind(path: Path) -> str | None:
    """``"file"`` (verl's file logger: its first line), ``"console"`` (its console output: a ``step:``
    line among the first :data:`_CONSOLE_HEAD`) or None."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            head = [f.readline(1 << 20) for _ in range(_CONSOLE_HEAD)]
    except OSError:
        return None
    first = head[0]
    if path.suffix == ".jsonl":
        try:
            line = json.loads(first)
        except ValueError:
            return None
        return "file" if isinstance(line, dict) and set(line) == {"step", "data"} else None
    return "console" if any(_CONSOLE.match(line) for line in head) else None


def find_logs(directory: Path) -> list[Path]:
    """verl log files directly in ``directory`` or in a folder directly below it, sorted."""
    candidates = [p for p in directory.iterdir() if p.is_file()]
    candidates += [q for p in directory.iterdir() if p.is_dir() for q in p.iterdir() if q.is_file()]
    return sorted(p for p in candidates if p.suffix in _SUFFIXES and _kind(p) is not None)


def _number(text: str) -> float | None:
    match = _NUMBER.match(text.strip())
    if match is None:
        return None
    try:
        return float(match.group(1))
    except ValueError:
        return None


def _console_line(line: str) -> tuple[int, dict[str, float]] | None:
    match = _CONSOLE.match(line)
    if match is None:
        return None
    metrics = {}
    for part in line[match.end() :].rstrip("\n").split(" - "):
        key, sep, value = part.rpartition(":")
        number = _number(value) if sep else None
        if number is not None:
            metrics[key] = number
    return int(match.group(1)), metrics


def _file_line(line: str, path: Path, number: int) -> tuple[int, dict[str, float]] | None:
    if not line.strip():
        return None
    try:
        obj = json.loads(line)
        data = obj["data"]
        step = int(obj["step"])
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path}:{number}: not a line of verl's file logger ({error})") from None
    out = {}
    for key, value in data.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[str(key)] = float(value)
    return step, out


def _steps(path: Path) -> list[tuple[int, dict[str, float]]]:
    kind = _kind(path)
    out = []
    with path.open(encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            read = _console_line(line) if kind == "console" else _file_line(line, path, number)
            if read is not None:
                out.append(read)
    return out


def _run_id(path: Path) -> str:
    text = re.sub(r"[^A-Za-z0-9_-]", "-", f"{path.parent.name}-{path.stem}")
    return text[-128:] or "verl-run"


def _recipe(steps: list[tuple[int, dict[str, float]]]) -> dict[str, Any]:
    """The recipe fields the cliptrack verl losses logged (the first step that has them)."""
    for _, metrics in steps:
        found = verl_keys.logged_recipe(metrics)
        if found:
            return {f"{CONFIG_KEY}.{name}": value for name, value in found.items()}
    return {}


def read_log(path: Path) -> tuple[LoadedRun, list[Point]]:
    """One verl log file as a loaded run and its points (our keys, verl's own beside them)."""
    steps = _steps(path)
    clock = 0.0
    points = []
    for step, metrics in steps:
        seconds = metrics.get("timing_s/step")
        clock += seconds if seconds is not None and math.isfinite(seconds) else 0.0
        points.append(Point(step, clock, metrics))
    info = RunInfo(
        run_id=_run_id(path),
        run_name=f"{path.parent.name}/{path.stem}",
        backend_label=BACKEND,
        config=_recipe(steps),
        started=path.stat().st_mtime,
        experiment=path.parent.name,
        status="FINISHED",
    )
    read = canonical_points(points)
    return as_logged(LoadedRun(info, source="jsonl", location=str(path)), read), read.points
