"""Runs read back from W&B for the comparison: offline run files on disk (``.wandb`` transaction
logs, read by the W&B seam) or the public API (``entity/project/run_id``).

A run file also gives the run's start time (its run record, unix seconds) and its status (its exit
record: exit code 0 ``FINISHED``, 143 ``KILLED``, any other ``FAILED``; none yet ``RUNNING`` — still
running, or killed before W&B could write one, as MLflow shows such a run), so ``cliptrack runs``
lists W&B runs as it lists MLflow's and a name matching several runs takes the latest FINISHED one.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from cliptrack.backends.catalog import RunEntry, choose_runs
from cliptrack.backends.wandb import _compat as compat_wandb
from cliptrack.core import keys
from cliptrack.core.worst import Worst
from cliptrack.store import worst as worst_store
from cliptrack.store.aliases import as_logged, canonical_points, foreign_step
from cliptrack.store.frame import LoadedRun, Point, RunSet
from cliptrack.store.records import EXIT_CODES, FAILED, RUNNING, RunInfo

__all__ = [
    "read",
    "read_worst",
    "wandb_run_files",
    "wandb_run_info",
]

_SKIP_WANDB_KEYS = frozenset({keys.WANDB_STEP_METRIC, keys.WANDB_WALL_TIME})


def _numeric(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


STATUS_OF_EXIT_CODE = {code: status for status, code in EXIT_CODES.items()}
"""A W&B exit code -> the run status it records (``FAILED`` for any code not listed)."""


def run_status(exit_code: int | None) -> str:
    """The status of a W&B run whose file ends with ``exit_code`` (None: no exit record yet)."""
    if exit_code is None:
        return RUNNING
    return STATUS_OF_EXIT_CODE.get(exit_code, FAILED)


def _wandb_offline_run(path: Path, location: str) -> tuple[LoadedRun, list[Point]]:
    """One ``.wandb`` file (read by the W&B seam's one reader; a damaged record is an error) as a
    run, with its start time (unix seconds) and status (``run_status``)."""
    run_id, name, group, started = "", "", "", 0.0
    exit_code: int | None = None
    config: dict[str, Any] = {}
    points: list[Point] = []
    for record in compat_wandb.records(path, strict=True):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id, name, group = record.run.run_id, record.run.display_name, record.run.run_group
            started = started or _seconds(record.run.start_time)
            config.update(compat_wandb.items(record.run.config.update))
        elif kind == "config":
            config.update(compat_wandb.items(record.config.update))
        elif kind == "exit":
            exit_code = int(record.exit.exit_code)
        elif kind == "history":
            row = compat_wandb.items(record.history.item)
            point = _history_point(row)
            if point is not None:
                points.append(point)
    backend = config.get(keys.TAG_BACKEND) or group
    read = canonical_points(points)
    run = wandb_run_info(
        run_id or path.stem.removeprefix("run-"),
        name,
        backend,
        config,
        started=started or _first_wall_time(read.points) or _directory_time(path),
        status=run_status(exit_code),
    )
    return as_logged(LoadedRun(run, source="wandb", location=location), read), read.points


def _seconds(timestamp: Any) -> float:
    """A protobuf ``Timestamp`` as unix seconds (0.0 when unset)."""
    return float(timestamp.seconds) + float(timestamp.nanos) / 1e9


def _first_wall_time(points: Sequence[Point]) -> float:
    """The earliest finite wall time of ``points`` (unix seconds; 0.0 when none: unknown)."""
    times = [p.wall_time for p in points if p.wall_time == p.wall_time]
    return min(times, default=0.0)


def wandb_run_info(
    run_id: str,
    name: str,
    backend: object,
    config: dict[str, Any],
    *,
    started: float = 0.0,
    status: str = RUNNING,
) -> RunInfo:
    """The ``cliptrack.store.records.RunInfo`` of a W&B run: its id, display name, the ``cliptrack.backend``
    config key (else the run group) as ``backend_label``, its config without W&B's own keys, its
    start (unix seconds, 0.0: unknown) and status."""
    return RunInfo(
        run_id=run_id,
        run_name=name or "",
        backend_label=str(backend) if backend else None,
        config={k: v for k, v in config.items() if not str(k).startswith("_")},
        started=started,
        status=status,
    )


def _history_point(row: dict[str, Any]) -> Point | None:
    """A W&B history row as a Point, at ``trainer/step`` (cliptrack) or another tracker's step
    column (``keys.FOREIGN_STEP_COLUMNS``); rows with neither are skipped."""
    step = _numeric(row.get(keys.WANDB_STEP_METRIC))
    if step is None:
        step = foreign_step(row)
    if step is None:
        return None
    wall = _numeric(row.get(keys.WANDB_WALL_TIME))
    if wall is None:
        wall = _numeric(row.get("_timestamp"))
    media = _media(row)
    metrics = {}
    for key, value in row.items():
        if key.startswith("_") or key in _SKIP_WANDB_KEYS or key in keys.FOREIGN_STEP_COLUMNS:
            continue
        if key.partition(compat_wandb.NESTED_KEY_SEPARATOR)[0] in media:
            continue  # a table's or an image's own fields (size, nrows, ...), no metric
        number = _numeric(value)
        if number is not None:
            metrics[key] = number
    if media and not metrics:
        return None  # a row of media only (a worst-sequences table): no point of the run
    return Point(int(step), wall if wall is not None else float("nan"), metrics)


def _media(row: dict[str, Any]) -> set[str]:
    """The keys of a history row holding W&B media (a table, an image: ``<key>._type`` is set)."""
    suffix = compat_wandb.NESTED_KEY_SEPARATOR + "_type"
    return {k[: -len(suffix)] for k, v in row.items() if k.endswith(suffix) and isinstance(v, str)}


def wandb_run_files(directory: str | Path) -> list[Path]:
    """Every ``run-*.wandb`` transaction log under ``directory`` (a run dir, ``wandb/`` or its parent)."""
    root = Path(directory)
    if not root.exists():
        raise FileNotFoundError(f"W&B directory {str(root)!r} does not exist")
    if root.is_file():
        return [root]
    return sorted(p for p in root.rglob("run-*.wandb") if p.is_file() and "latest-run" not in p.parts)


_RUN_DIR_TIME = re.compile(r"(?:offline-)?run-(\d{8}_\d{6})-")


def _started(path: Path) -> str:
    """The ``YYYYMMDD_HHMMSS`` start stamp of a W&B run directory's name ("" when absent)."""
    found = _RUN_DIR_TIME.match(path.parent.name)
    return found.group(1) if found else ""


def _directory_time(path: Path) -> float:
    """The start stamp of a W&B run directory's name as unix seconds (W&B names it in local time;
    0.0 when absent): the start of a run killed before its first record reached the file."""
    stamp = _started(path)
    return time.mktime(time.strptime(stamp, "%Y%m%d_%H%M%S")) if stamp else 0.0


def _merge_segments(segments: list[tuple[LoadedRun, list[Point]]]) -> list[tuple[LoadedRun, list[Point]]]:
    """One entry per W&B run id: a run resumed later (``cliptrack replay``, ``resume=``) leaves one
    run directory per process; their points are concatenated in the order the segments started."""
    merged: dict[str, tuple[LoadedRun, list[Point]]] = {}
    for info, points in segments:
        run_id = info.run.run_id
        if run_id not in merged:
            merged[run_id] = (info, list(points))
            continue
        first, kept = merged[run_id]
        run = replace(
            first.run,
            run_name=first.run.run_name or info.run.run_name,
            backend_label=first.run.backend_label or info.run.backend_label,
            config={**first.run.config, **info.run.config},
            started=first.run.started or info.run.started,
            status=info.run.status,  # the latest segment's
        )
        merged[run_id] = (LoadedRun(run, first.source, first.location), kept + list(points))
    return list(merged.values())


def _load_offline(refs: Sequence[str], directory: str | Path) -> RunSet:
    """Load runs from W&B run directories on disk (offline runs, or online runs' local copies).

    ``refs`` are W&B run ids or display names; empty loads every run found under ``directory``.
    A run resumed by another process (e.g. ``cliptrack replay``) spans several run directories;
    they are read as one run.
    """
    files = sorted(wandb_run_files(directory), key=lambda p: (_started(p), str(p)))
    runs = _merge_segments([_wandb_offline_run(path, str(path.parent)) for path in files])
    chosen = choose_runs(
        refs,
        [(run, run[0].run.run_id, run[0].run.run_name) for run in runs],
        f"W&B dir {directory}",
        entry=lambda run: wandb_entry(*run),
    )
    return RunSet.from_points(chosen)


def wandb_entry(info: LoadedRun, points: Sequence[Point]) -> RunEntry:
    """A W&B run as ``cliptrack runs`` lists it: its id (cliptrack's and W&B's are one), name,
    backend, status, start (unix seconds) and steps (distinct steps logged)."""
    run = info.run
    steps = len({p.step for p in points})
    return RunEntry(
        cliptrack_id=run.run_id,
        store_id=run.run_id,
        name=run.run_name,
        backend=run.backend_label or "",
        status=run.status,
        started=run.started,
        steps=steps,
    )


def _load_online(paths: Sequence[str], api: Any = None) -> RunSet:
    """Load runs through the W&B public API; ``paths`` are ``entity/project/run_id``.

    ``api`` defaults to ``wandb.Api()`` (needs an API key and network).
    """
    if api is None:
        import wandb

        api = wandb.Api()
    items = []
    for path in paths:
        if path.count("/") != 2:
            raise ValueError(f"W&B run path {path!r} must be 'entity/project/run_id'")
        run = api.run(path)
        config = dict(run.config)
        read = canonical_points(
            [p for p in (_history_point(dict(row)) for row in run.scan_history()) if p is not None]
        )
        backend = config.get(keys.TAG_BACKEND) or getattr(run, "group", "") or ""
        info = wandb_run_info(run.id, run.name, backend, config)
        items.append((as_logged(LoadedRun(info, source="wandb", location=path), read), read.points))
    return RunSet.from_points(items)


def read_worst(run: LoadedRun) -> list[Worst]:
    """A W&B run's worst-sequence tables read from its run files on disk (every segment of a resumed
    run): each history row's ``worst_sequences`` table file, by step; ``[]`` when it logged none, and
    for a run read through the public API (not read from there)."""
    location = Path(run.location)
    if not location.is_dir():
        return []
    files = compat_wandb.run_files(location.parent.parent, run.run.run_id) or wandb_run_files(location)
    tables = []
    key = worst_store.WANDB_KEY + compat_wandb.NESTED_KEY_SEPARATOR
    for path in files:
        for row in compat_wandb.history_rows(path, strict=True):
            if row.get(key + "_type") != "table-file":
                continue
            table = json.loads((path.parent / "files" / str(row[key + "path"])).read_text(encoding="utf-8"))
            step = _numeric(row.get(keys.WANDB_STEP_METRIC))
            tables.append(
                worst_store.from_rows(table["columns"], table["data"], None if step is None else int(step))
            )
    return worst_store.latest_per_step(tables)


def read(refs: Sequence[str], *, wandb_dir: str | Path | None = None, wandb_api: Any = None) -> RunSet:
    """The registry's reader: the run files under ``wandb_dir``, else the public API (``wandb_api``,
    default ``wandb.Api()``) for refs ``entity/project/run_id``."""
    if wandb_dir is not None:
        return _load_offline(refs, wandb_dir)
    return _load_online(refs, api=wandb_api)
