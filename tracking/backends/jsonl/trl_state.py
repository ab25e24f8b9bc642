"""Runs logged by TRL's own trainer state, read beside a spool's runs (``--jsonl DIR``).

TRL's trainers are transformers' ``Trainer``: every ``log()`` call appends its metrics, with
``epoch`` and ``step`` (the optimizer step, ``global_step``), to ``state.log_history``, and the state
is written as ``trainer_state.json`` (``TrainerState.save_to_json``: the dataclass as JSON) into each
checkpoint folder ``checkpoint-<step>/`` and, with ``trainer.save_state()``, into ``output_dir``.

An output directory is ``DIR`` itself or a folder directly below it holding ``trainer_state.json``
or a ``checkpoint-<step>/trainer_state.json``; it is one run, read from the state with the highest
``global_step`` of its own and its last checkpoint's (its own on a tie). The run is named after the
output directory, its stack is ``trl``, it is FINISHED when its log holds ``train()``'s closing entry
(``train_runtime``), RUNNING otherwise. Entries of one step (a training log, an evaluation, the
closing entry) make one point; a value TRL logged as ``null`` (a metric with no valid value in the
window) is left out. Its wall time, in seconds from the first step, adds TRL's ``step_time`` (the
window's mean seconds per optimizer step) for each optimizer step since the previous entry; 0 where
TRL logged none. The points go through the same key translation as other trackers'
(:mod:`cliptrack.store.aliases`): cliptrack's exact sums (logged by ``cliptrack.adapters.trl``)
are ours, TRL's ``clip_ratio/region_mean`` is kept beside them, or read as an approximate
``clip_fraction:mean`` without them (docs/FRAMEWORKS.md). TRL's ``reward`` (the window's mean
reward of its generation batches) is read as ``reward:mean`` where the entry has none, as
``cliptrack.adapters.trl`` logs it to a tracker; TRL's own key stays beside it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from cliptrack.core import keys
from cliptrack.store.aliases import as_logged, canonical_points
from cliptrack.store.frame import LoadedRun
from cliptrack.store.records import Point, RunInfo

__all__ = ["BACKEND", "STATE_FILE", "find_states", "read_state"]

BACKEND = "trl"
"""The stack label of a run read from TRL's trainer state."""
STATE_FILE = "trainer_state.json"
"""transformers' ``TRAINER_STATE_NAME``."""
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
"""transformers' ``PREFIX_CHECKPOINT_DIR``-``<global_step>``."""
_REWARD = "reward"
"""TRL's mean reward of the logging window's generation batches (read as ``reward:mean``)."""
_CLOSING = "train_runtime"
"""A key of the entry ``train()`` logs when it completes."""


def _checkpoint_step(path: Path) -> int | None:
    match = _CHECKPOINT.match(path.name)
    return int(match.group(1)) if match is not None and path.is_dir() else None


def _candidates(output_dir: Path) -> list[Path]:
    """The output directory's own state file and its last checkpoint's, those that exist."""
    found = [output_dir / STATE_FILE] if (output_dir / STATE_FILE).is_file() else []
    checkpoints = [(s, p) for p in output_dir.iterdir() if (s := _checkpoint_step(p)) is not None]
    for _, checkpoint in sorted(checkpoints, reverse=True):
        if (checkpoint / STATE_FILE).is_file():
            found.append(checkpoint / STATE_FILE)
            break
    return found


def _load(path: Path) -> dict[str, Any]:
    """A trainer_state.json as its mapping; ValueError naming the file when it is not one."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: not a readable trainer_state.json ({error})") from None
    if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
        raise ValueError(f"{path}: not a trainer_state.json of transformers' Trainer (no log_history list)")
    return state


def _global_step(path: Path) -> int:
    step = _load(path).get("global_step", 0)
    return int(step) if isinstance(step, int | float) and not isinstance(step, bool) else 0


def _state_of(output_dir: Path) -> Path | None:
    """The state file an output directory's run is read from (see the module docstring)."""
    candidates = _candidates(output_dir)
    if len(candidates) < 2:
        return candidates[0] if candidates else None
    own, checkpoint = candidates
    return checkpoint if _global_step(checkpoint) > _global_step(own) else own


def find_states(directory: Path) -> list[Path]:
    """The state file of each TRL output directory: ``directory`` itself or a folder directly below
    it (a checkpoint folder belongs to its output directory), sorted."""
    folders = [directory] + sorted(
        p for p in directory.iterdir() if p.is_dir() and _checkpoint_step(p) is None
    )
    return [state for folder in folders if (state := _state_of(folder)) is not None]


def _output_dir(path: Path) -> Path:
    """The output directory of a state file (the folder above a checkpoint's)."""
    return path.parent.parent if _checkpoint_step(path.parent) is not None else path.parent


def _entry_metrics(entry: Any, path: Path, number: int) -> tuple[int, dict[str, float]]:
    """One log_history entry: its step and its numeric values (``null`` and text left out)."""
    if not isinstance(entry, dict) or not isinstance(entry.get("step"), int):
        raise ValueError(f"{path}: log_history[{number}] is not a log entry with an integer step")
    values = {
        str(k): float(v)
        for k, v in entry.items()
        if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)
    }
    return entry["step"], values


def _steps(path: Path, history: list[Any]) -> list[tuple[int, dict[str, float]]]:
    """The entries merged by step, in step order."""
    merged: dict[int, dict[str, float]] = {}
    for number, entry in enumerate(history):
        step, values = _entry_metrics(entry, path, number)
        merged.setdefault(step, {}).update(values)
    for values in merged.values():
        if _REWARD in values and keys.REWARD not in values:
            values[keys.REWARD] = values[_REWARD]
    return sorted(merged.items())


def _points(steps: list[tuple[int, dict[str, float]]]) -> list[Point]:
    clock, previous, points = 0.0, None, []
    for step, metrics in steps:
        seconds = metrics.get("step_time")
        if previous is not None and seconds is not None and math.isfinite(seconds):
            clock += seconds * (step - previous)
        previous = step
        points.append(Point(step, clock, metrics))
    return points


def _run_id(name: str) -> str:
    text = re.sub(r"[^A-Za-z0-9_-]", "-", name)
    return text[-128:] or "trl-run"


def read_state(path: Path) -> tuple[LoadedRun, list[Point]]:
    """One output directory's run from its state file ``path`` (as :func:`find_states` gives it):
    the loaded run and its points (our keys, TRL's own beside them)."""
    history = _load(path)["log_history"]
    steps = _steps(path, history)
    output_dir = _output_dir(path)
    name = output_dir.resolve().name
    info = RunInfo(
        run_id=_run_id(name),
        run_name=name,
        backend_label=BACKEND,
        config={},
        started=path.stat().st_mtime,
        experiment=output_dir.resolve().parent.name,
        status="FINISHED" if any(_CLOSING in values for _, values in steps) else "RUNNING",
    )
    read = canonical_points(_points(steps))
    return as_logged(LoadedRun(info, source="jsonl", location=str(path)), read), read.points
