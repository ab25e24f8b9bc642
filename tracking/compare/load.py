"""Load runs into a ``RunSet`` from MLflow, W&B (online API or offline run files) or the JSONL spool.

Every loader turns what it reads into ``Point``s and hands them to ``RunSet.from_points``, so the same
run loaded from any store gives the same frame (MLflow keeps wall time in milliseconds, so its
``wall_time`` is rounded to 1 ms).

Runs are named by id or by run name. A name that matches several runs is an error that lists their
ids; a reference that matches nothing is an error that lists what is there.
"""

from __future__ import annotations

import json
import math
import re
import struct
import warnings
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from tracking import keys
from tracking.compare._compat_mlflow_store import bulk_columns
from tracking.compare.aliases import canonical_points, foreign_step, needs_aliases
from tracking.compare.frame import Columns, Point, RunInfo, RunSet
from tracking.spool import RunDir, spool_runs

_SKIP_WANDB_KEYS = frozenset({keys.WANDB_STEP_METRIC, keys.WANDB_WALL_TIME})


class RunNotFoundError(LookupError):
    """A run reference matched no run (or several) in the named store."""


# ---------------------------------------------------------------------------------------- JSONL


def _jsonl_runs(directory: Path) -> list[RunDir]:
    """The run directories of the spool ``directory``, by name (the first is the comparison's reference)."""
    if not directory.is_dir():
        raise FileNotFoundError(f"JSONL run directory {str(directory)!r} does not exist")
    return spool_runs(directory)


def load_jsonl(refs: Sequence[str], directory: str | Path) -> RunSet:
    """Load runs from a JSONL spool directory (``<dir>/<run_id>/run.json`` + ``points.jsonl``).

    ``refs`` are run ids or run names; an empty ``refs`` loads every run in the directory. Points are
    read by ``RunDir.load_points``: a torn last line is skipped with a warning, any other bad line
    raises ValueError naming the file and line.
    """
    root = Path(directory)
    found = []
    for run_dir in _jsonl_runs(root):
        run = run_dir.read_run()  # the run.json mapping of tracking.records
        info = RunInfo(run_id=run.run_id, run_name=run.run_name, backend=run.backend_label or "", source="jsonl",
                       location=str(root), config=run.config)
        found.append((info, run_dir))
    chosen = _choose(refs, [(info, info.run_id, info.run_name) for info, _ in found], f"JSONL dir {root}")
    by_id = {info.run_id: run_dir for info, run_dir in found}
    return RunSet.from_points((info, _spool_columns(by_id[info.run_id])) for info in chosen)


def _spool_columns(run_dir: RunDir) -> Columns | list[Point]:
    """A run's points.jsonl parsed in one ``json.loads`` of all its lines, as ``Columns``.

    A file that does not parse as well-formed points that way (a torn last line, a bad line) is
    read by ``RunDir.load_points`` instead, which skips a torn last line with a warning and names
    any other bad line.
    """
    try:
        text = run_dir.points_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        records = json.loads("[" + ",".join(lines) + "]")
        if len(records) != len(lines):
            raise ValueError("a line holds more than one value")
        steps: list[int] = []
        walls: list[float] = []
        names: list[str] = []
        values: list[Any] = []
        for record in records:
            metrics = record["metrics"]
            if not isinstance(metrics, dict) or isinstance(record["step"], bool):
                raise ValueError("not a point")
            count = len(metrics)
            steps.extend([int(record["step"])] * count)
            walls.extend([float(record["wall_time"])] * count)
            names.extend(metrics)
            values.extend(metrics.values())
        kinds = set(map(type, values))
        if not kinds <= {int, float}:
            raise ValueError("a non-numeric value")
        return Columns(np.asarray(steps, dtype=np.int64), np.asarray(walls, dtype=np.float64),
                       np.asarray(names, dtype=object), np.asarray(values, dtype=np.float64))
    except (ValueError, KeyError, TypeError, AttributeError):
        return run_dir.load_points()


def _choose(refs: Sequence[str], candidates: list[tuple[Any, str, str]], where: str) -> list[Any]:
    """Pick candidates (item, id, name) by id first, then by unique name, in the order of ``refs``."""
    if not refs:
        if not candidates:
            raise RunNotFoundError(f"no runs in {where}")
        return [item for item, _, _ in candidates]
    chosen = []
    for ref in refs:
        by_id = [item for item, run_id, _ in candidates if run_id == ref]
        if by_id:
            chosen.append(by_id[0])
            continue
        by_name = [(item, run_id) for item, run_id, name in candidates if name == ref]
        if len(by_name) > 1:
            ids = ", ".join(run_id for _, run_id in by_name)
            raise RunNotFoundError(f"run name {ref!r} matches {len(by_name)} runs in {where} ({ids}): pass a run id")
        if not by_name:
            known = ", ".join(f"{run_id} ({name})" for _, run_id, name in candidates[:20]) or "none"
            raise RunNotFoundError(f"no run with id or name {ref!r} in {where}; runs there: {known}")
        chosen.append(by_name[0][0])
    return chosen


# --------------------------------------------------------------------------------------- MLflow


def _mlflow_quote(value: str) -> str:
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise ValueError(f"run name {value!r} contains both quote characters; pass its run id instead")


def load_mlflow(
    refs: Sequence[str] = (), tracking_uri: str | None = None, experiment: str | None = None
) -> RunSet:
    """Load runs from an MLflow tracking store (any URI: sqlite, file, http server).

    Histories are read in bulk from SQL stores (``_compat_mlflow_store``), one metric at a time
    through ``MlflowClient.get_metric_history`` otherwise; both give the same frame.

    ``refs`` are MLflow run ids, run names, or cliptrack run ids (tag ``cliptrack.run_id``). With ``experiment`` (a name or id) and no refs, every
    training run of that experiment is loaded (comparison runs, tagged ``cliptrack.kind=comparison``,
    are left out); with both, names are looked up inside that experiment only.
    """
    from mlflow.entities import ViewType
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    where = f"MLflow store {client.tracking_uri}"
    if experiment is not None:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            try:
                exp = client.get_experiment(experiment)
            except MlflowException:
                exp = None
        if exp is None:
            raise RunNotFoundError(f"no experiment named or with id {experiment!r} in {where}")
        experiment_ids = [exp.experiment_id]
    else:
        experiment_ids = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]

    runs: list[Any] = []
    if not refs:
        if experiment is None:
            raise ValueError("load_mlflow: name runs (ids or names) or an experiment to load from")
        for found in client.search_runs(experiment_ids, max_results=50000):
            if found.data.tags.get(keys.TAG_RUN_KIND) != keys.RUN_KIND_COMPARISON:
                runs.append(found)
        if not runs:
            raise RunNotFoundError(f"experiment {experiment!r} in {where} has no training runs")
    for ref in refs:
        run: Any = None
        try:
            run = client.get_run(ref)
            if run.info.experiment_id not in experiment_ids:
                run = None
        except MlflowException:
            run = None
        lookups = (  # by run name, then by cliptrack run id; the first that matches decides
            (f"attributes.run_name = {_mlflow_quote(ref)}", f"run name {ref!r}", ": pass a run id"),
            (f"tags.`{keys.TAG_RUN_ID}` = {_mlflow_quote(ref)}", f"cliptrack run id {ref!r}", ""),
        )
        for filter_string, what, hint in lookups if run is None else ():
            matches = client.search_runs(experiment_ids, filter_string=filter_string, max_results=100)
            if len(matches) > 1:
                ids = ", ".join(m.info.run_id for m in matches)
                raise RunNotFoundError(f"{what} matches {len(matches)} runs in {where} ({ids}){hint}")
            if matches:
                run = matches[0]
                break
        if run is None:
            raise RunNotFoundError(f"no run with id, name or cliptrack run id {ref!r} in {where}")
        runs.append(run)

    bulk = bulk_columns(str(client.tracking_uri), [run.info.run_id for run in runs])
    items: list[tuple[RunInfo, list[Point] | Columns]] = []
    for run in runs:
        info = RunInfo(
            run_id=run.info.run_id,
            run_name=run.info.run_name or "",
            backend=run.data.tags.get(keys.TAG_BACKEND, ""),
            source="mlflow",
            location=str(client.tracking_uri),
            config=dict(run.data.params),
        )
        if bulk is not None and not needs_aliases(bulk[run.info.run_id]):
            items.append((info, bulk[run.info.run_id]))
            continue
        if bulk is not None:  # another tracker's spellings: renamed point by point
            points, approximate = canonical_points(_points_of(bulk[run.info.run_id]))
        else:
            by_step: dict[int, dict[str, float]] = {}
            wall: dict[int, float] = {}
            for key in sorted(run.data.metrics):
                for m in client.get_metric_history(run.info.run_id, key):
                    by_step.setdefault(int(m.step), {})[m.key] = float(m.value)
                    wall[int(m.step)] = max(wall.get(int(m.step), -math.inf), m.timestamp / 1000.0)
            points, approximate = canonical_points(
                [Point(step, wall[step], metrics) for step, metrics in sorted(by_step.items())])
        items.append((replace(info, approximate=approximate), points))
    return RunSet.from_points(items)


def _points_of(columns: Columns) -> list[Point]:
    """Bulk-read columns as one Point per step (a step's wall time is the latest of its entries)."""
    by_step: dict[int, dict[str, float]] = {}
    wall: dict[int, float] = {}
    for step, when, name, value in zip(columns.step.tolist(), columns.wall_time.tolist(),
                                       columns.metric.tolist(), columns.value.tolist(), strict=True):
        by_step.setdefault(int(step), {})[str(name)] = float(value)
        wall[int(step)] = max(wall.get(int(step), -math.inf), float(when))
    return [Point(step, wall[step], metrics) for step, metrics in sorted(by_step.items())]


# ------------------------------------------------------------------------------ W&B offline files

_LOG_BLOCK = 32768
_LOG_HEADER = struct.Struct("<IHB")  # crc32, length, record type (leveldb log framing)
_FILE_HEADER = struct.Struct("<4sHB")  # ":W&B", magic 0xBEE1, version
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def read_wandb_records(path: str | Path) -> Iterator[Any]:
    """Yield the ``wandb_internal_pb2.Record`` protobufs of a run's ``.wandb`` transaction log.

    The file is leveldb-log framed (32 KiB blocks of crc32/length/type chunks) after a 7-byte
    ``:W&B`` header; each record is parsed with wandb's own protobuf class. A record cut short at
    the end of the file (a run killed mid-write) is skipped; a checksum mismatch before the end raises
    ValueError naming the file and byte offset.
    """
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if len(data) < _FILE_HEADER.size:
        raise ValueError(f"{path}: too short to be a W&B transaction log")
    ident, _magic, _version = _FILE_HEADER.unpack_from(data, 0)
    if ident != b":W&B":
        raise ValueError(f"{path}: not a W&B transaction log (header {data[:7]!r})")
    pos = _FILE_HEADER.size
    pending = b""
    while pos + _LOG_HEADER.size <= len(data):
        room = _LOG_BLOCK - pos % _LOG_BLOCK
        if room < _LOG_HEADER.size:
            pos += room
            continue
        crc, length, kind = _LOG_HEADER.unpack_from(data, pos)
        if kind == 0 and length == 0:
            pos += _LOG_HEADER.size
            continue
        payload = data[pos + _LOG_HEADER.size: pos + _LOG_HEADER.size + length]
        if len(payload) < length:
            warnings.warn(f"{path}: record cut short at byte {pos} skipped", stacklevel=2)
            return
        if zlib.crc32(payload, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            raise ValueError(f"{path}: checksum mismatch in record at byte {pos}; the file is damaged")
        pos += _LOG_HEADER.size + length
        if kind == _FULL:
            chunk = payload
        elif kind == _FIRST:
            pending = payload
            continue
        elif kind == _MIDDLE:
            pending += payload
            continue
        elif kind == _LAST:
            chunk, pending = pending + payload, b""
        else:
            raise ValueError(f"{path}: unknown record type {kind} at byte {pos}")
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        record.ParseFromString(chunk)
        yield record


def _item_key(item: Any) -> str:
    return item.key if item.key else ".".join(item.nested_key)


def _numeric(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _wandb_offline_run(path: Path, location: str) -> tuple[RunInfo, list[Point]]:
    run_id, name, group = "", "", ""
    config: dict[str, Any] = {}
    points: list[Point] = []
    for record in read_wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id, name, group = record.run.run_id, record.run.display_name, record.run.run_group
            for item in record.run.config.update:
                config[_item_key(item)] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                config[_item_key(item)] = json.loads(item.value_json)
        elif kind == "history":
            row = {_item_key(item): json.loads(item.value_json) for item in record.history.item}
            point = _history_point(row)
            if point is not None:
                points.append(point)
    config.pop("_wandb", None)
    backend = config.get(keys.TAG_BACKEND) or group
    points, approximate = canonical_points(points)
    info = RunInfo(run_id=run_id or path.stem.removeprefix("run-"), run_name=name, backend=str(backend or ""),
                   source="wandb", location=location, config=config, approximate=approximate)
    return info, points


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
    metrics = {}
    for key, value in row.items():
        if key.startswith("_") or key in _SKIP_WANDB_KEYS or key in keys.FOREIGN_STEP_COLUMNS:
            continue
        number = _numeric(value)
        if number is not None:
            metrics[key] = number
    return Point(int(step), wall if wall is not None else float("nan"), metrics)


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


def _merge_segments(segments: list[tuple[RunInfo, list[Point]]]) -> list[tuple[RunInfo, list[Point]]]:
    """One entry per W&B run id: a run resumed later (``cliptrack replay``, ``resume=``) leaves one
    run directory per process; their points are concatenated in the order the segments started."""
    merged: dict[str, tuple[RunInfo, list[Point]]] = {}
    for info, points in segments:
        if info.run_id not in merged:
            merged[info.run_id] = (info, list(points))
            continue
        first, kept = merged[info.run_id]
        config = {**first.config, **info.config}
        merged[info.run_id] = (RunInfo(first.run_id, first.run_name or info.run_name, first.backend or info.backend,
                                       first.source, first.location, config), kept + list(points))
    return list(merged.values())


def load_wandb_offline(refs: Sequence[str], directory: str | Path) -> RunSet:
    """Load runs from W&B run directories on disk (offline runs, or online runs' local copies).

    ``refs`` are W&B run ids or display names; empty loads every run found under ``directory``.
    A run resumed by another process (e.g. ``cliptrack replay``) spans several run directories;
    they are read as one run.
    """
    files = sorted(wandb_run_files(directory), key=lambda p: (_started(p), str(p)))
    runs = _merge_segments([_wandb_offline_run(path, str(path.parent)) for path in files])
    chosen = _choose(refs, [(run, run[0].run_id, run[0].run_name) for run in runs], f"W&B dir {directory}")
    return RunSet.from_points(chosen)


# ----------------------------------------------------------------------------------- W&B online


def load_wandb_online(paths: Sequence[str], api: Any = None) -> RunSet:
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
        config = {k: v for k, v in dict(run.config).items() if not k.startswith("_")}
        points, approximate = canonical_points(
            [p for p in (_history_point(dict(row)) for row in run.scan_history()) if p is not None])
        backend = config.get(keys.TAG_BACKEND) or getattr(run, "group", "") or ""
        info = RunInfo(run_id=run.id, run_name=run.name or "", backend=str(backend), source="wandb",
                       location=path, config=config, approximate=approximate)
        items.append((info, points))
    return RunSet.from_points(items)


# ------------------------------------------------------------------------------------- dispatch


def load_runs(
    refs: Iterable[str] = (),
    *,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    jsonl_dir: str | Path | None = None,
    wandb_dir: str | Path | None = None,
    wandb_api: Any = None,
) -> RunSet:
    """Load runs from exactly one store.

    ``jsonl_dir``: the JSONL spool; ``wandb_dir``: W&B run files on disk; refs of the form
    ``entity/project/run_id`` (with no other store named): the W&B public API; otherwise MLflow at
    ``tracking_uri`` (default: MLflow's own default, ``MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``).
    """
    refs = list(refs)
    named = [n for n, v in (("jsonl_dir", jsonl_dir), ("wandb_dir", wandb_dir), ("tracking_uri", tracking_uri))
             if v is not None]
    if len(named) > 1:
        raise ValueError(f"load_runs: name one store, got {', '.join(named)}")
    if jsonl_dir is not None:
        return load_jsonl(refs, jsonl_dir)
    if wandb_dir is not None:
        return load_wandb_offline(refs, wandb_dir)
    if refs and tracking_uri is None and experiment is None and all(r.count("/") == 2 for r in refs):
        return load_wandb_online(refs, api=wandb_api)
    return load_mlflow(refs, tracking_uri=tracking_uri, experiment=experiment)
