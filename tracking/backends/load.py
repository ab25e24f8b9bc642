"""Load runs into a ``RunSet`` from MLflow, W&B (online API or offline run files) or the JSONL spool.

Every loader turns what it reads into ``Point``s and hands them to ``RunSet.from_points``, so the same
run loaded from any store gives the same frame (MLflow keeps wall time in milliseconds, so its
``wall_time`` is rounded to 1 ms).

Runs are named by id (cliptrack's or the store's) or by run name. A name that matches several runs
picks the latest FINISHED one and says so (``catalog.choose_by_name``; W&B files, which keep no
status, make it an error listing their ids); a reference that matches nothing is an error that lists
what is there. Reading never writes: the MLflow store is checked first (``preflight``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from cliptrack.backends.catalog import RunNotFoundError, choose_by_name, mlflow_entry, spool_entry
from cliptrack.backends.mlflow._compat import bounded_requests
from cliptrack.backends.mlflow._rest import http_columns
from cliptrack.backends.mlflow._store import bulk_columns
from cliptrack.backends.preflight import StoreError, resolve_tracking_uri
from cliptrack.backends.wandb import _compat as compat_wandb
from cliptrack.compare.aliases import canonical_points, foreign_step, needs_aliases
from cliptrack.compare.frame import Columns, LoadedRun, MetricCodes, Point, RunSet
from cliptrack.core import keys
from cliptrack.store import journal
from cliptrack.store.records import RunInfo
from cliptrack.store.spool import RunDir, spool_runs

__all__ = [
    "RunNotFoundError",
    "load_jsonl",
    "load_mlflow",
    "load_runs",
    "load_wandb_offline",
    "load_wandb_online",
]

_SKIP_WANDB_KEYS = frozenset({keys.WANDB_STEP_METRIC, keys.WANDB_WALL_TIME})


# ---------------------------------------------------------------------------------------- JSONL


def _jsonl_runs(directory: Path) -> list[RunDir]:
    """The run directories of the spool ``directory``, by name (the first is the comparison's reference)."""
    if not directory.is_dir():
        raise FileNotFoundError(f"JSONL run directory {str(directory)!r} does not exist")
    return spool_runs(directory)


def load_jsonl(refs: Sequence[str], directory: str | Path) -> RunSet:
    """Load runs from a JSONL spool directory (``<dir>/<run_id>/run.json`` + ``points.jsonl``).

    ``refs`` are run ids or run names; an empty ``refs`` loads every run in the directory. Points are
    read by ``journal.load_columns``: a damaged line (torn, not JSON, over the reader's limits) is
    skipped with a warning naming the file and line; a line that is not a point raises ValueError
    naming it. A run id claimed by two directories is refused (``spool.DuplicateRunId``).
    """
    root = Path(directory)
    found = []
    for run_dir in _jsonl_runs(root):
        info = LoadedRun(run_dir.read_run(), source="jsonl", location=str(root))  # the run.json mapping
        found.append((info, run_dir))
    by_id = {info.run.run_id: run_dir for info, run_dir in found}
    chosen = _choose(
        refs,
        [(info, info.run.run_id, info.run.run_name) for info, _ in found],
        f"JSONL dir {root}",
        entry=lambda info: spool_entry(by_id[info.run.run_id]),
    )
    return RunSet.from_points((info, _spool_columns(by_id[info.run.run_id])) for info in chosen)


def _spool_columns(run_dir: RunDir) -> Columns:
    """A run's points.jsonl as ``Columns``, streamed by ``journal.load_columns`` into compact
    arrays (no point objects): a bad line is skipped with a warning naming the file and line, a
    line that is not a point or holds a non-numeric value raises ValueError naming it, a FIFO or a
    device is refused (``SpecialFileError``)."""
    cols = journal.load_columns(run_dir.points_path)
    return Columns(
        np.frombuffer(cols.step, dtype=np.int64),
        np.frombuffer(cols.wall_time, dtype=np.float64),
        MetricCodes(np.frombuffer(cols.code, dtype=np.int32), np.asarray(cols.names, dtype=object)),
        np.frombuffer(cols.value, dtype=np.float64),
    )


def _choose(
    refs: Sequence[str], candidates: list[tuple[Any, str, str]], where: str, entry: Any = None
) -> list[Any]:
    """Pick candidates (item, id, name) by id first, then by name, in the order of ``refs``. Several
    runs of one name: the latest FINISHED (``entry`` lists an item), or an error without ``entry``."""
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
        if len(by_name) > 1 and entry is not None:
            chosen.append(choose_by_name(ref, [item for item, _ in by_name], entry, where))
            continue
        if len(by_name) > 1:
            ids = ", ".join(run_id for _, run_id in by_name)
            raise RunNotFoundError(
                f"run name {ref!r} matches {len(by_name)} runs in {where} ({ids}): pass a run id"
            )
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

    Histories are read in bulk from SQL stores (``_compat_mlflow_store``), in bounded pages from a
    server (``_compat_mlflow_rest``), one metric at a time through
    ``MlflowClient.get_metric_history`` otherwise; all give the same frame.

    ``refs`` are MLflow run ids, run names, or cliptrack run ids (tag ``cliptrack.run_id``). With
    ``experiment`` (a name or id) and no refs, every training run of that experiment is loaded
    (comparison runs, tagged ``cliptrack.kind=comparison``, are left out); with both, names are
    looked up inside that experiment only. Requests to a server are a reader's
    (``_compat_mlflow.bounded_requests(reads=True)``): a server that cannot be reached (or dies
    mid-read) fails within seconds, a busy one is waited for; histories are read by
    ``_compat_mlflow_rest`` (bulk endpoint or pages, several requests at once).
    """
    with bounded_requests(reads=True):
        return _load_mlflow(refs, tracking_uri, experiment)


def _load_mlflow(refs: Sequence[str], tracking_uri: str | None, experiment: str | None) -> RunSet:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=resolve_tracking_uri(tracking_uri))
    where = f"MLflow store {client.tracking_uri}"
    experiment_ids = _mlflow_experiment_ids(client, experiment, where)
    if refs:
        runs = [_mlflow_find(client, ref, experiment_ids, where) for ref in refs]
    elif experiment is None:
        raise ValueError("load_mlflow: name runs (ids or names) or an experiment to load from")
    else:
        runs = _mlflow_training_runs(client, experiment_ids, f"experiment {experiment!r} in {where}")
    bulk = bulk_columns(str(client.tracking_uri), [run.info.run_id for run in runs])
    if bulk is None:  # a server: bounded, paged, concurrent requests (_compat_mlflow_rest)
        bulk = http_columns(
            str(client.tracking_uri), {run.info.run_id: list(run.data.metrics) for run in runs}
        )
    items: list[tuple[LoadedRun, list[Point] | Columns]] = []
    for run in runs:
        info = LoadedRun(mlflow_run_info(run), source="mlflow", location=str(client.tracking_uri))
        columns = None if bulk is None else bulk[run.info.run_id]
        if columns is not None and not needs_aliases(columns):
            items.append((info, columns))
            continue
        raw = _points_of(columns) if columns is not None else _metric_histories(client, run)
        points, approximate = canonical_points(raw)  # another tracker's spellings: renamed point by point
        items.append((replace(info, approximate=approximate), points))
    return RunSet.from_points(items)


def mlflow_run_info(run: Any) -> RunInfo:
    """The ``cliptrack.store.records.RunInfo`` of an MLflow run (``mlflow.entities.Run``): its MLflow id
    and name, the ``cliptrack.backend`` tag, params as config, start/end in unix seconds (MLflow
    stores milliseconds) and status."""
    end = run.info.end_time
    return RunInfo(
        run_id=run.info.run_id,
        run_name=run.info.run_name or "",
        backend_label=run.data.tags.get(keys.TAG_BACKEND),
        config=dict(run.data.params),
        started=(run.info.start_time or 0) / 1000.0,
        status=run.info.status,
        ended=None if end is None else end / 1000.0,
    )


def _mlflow_experiment_ids(client: Any, experiment: str | None, where: str) -> list[str]:
    """The id of ``experiment`` (a name or an id), or of every experiment when it is None."""
    from mlflow.entities import ViewType
    from mlflow.exceptions import MlflowException

    if experiment is None:
        return [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        try:
            exp = client.get_experiment(experiment)
        except MlflowException:
            exp = None
    if exp is None:
        raise RunNotFoundError(f"no experiment named or with id {experiment!r} in {where}")
    return [exp.experiment_id]


def _mlflow_training_runs(client: Any, experiment_ids: list[str], where: str) -> list[Any]:
    """Every run of the experiments but comparison runs (tag ``cliptrack.kind=comparison``)."""
    runs = [
        found
        for found in client.search_runs(experiment_ids, max_results=50000)
        if found.data.tags.get(keys.TAG_RUN_KIND) != keys.RUN_KIND_COMPARISON
    ]
    if not runs:
        raise RunNotFoundError(f"{where} has no training runs")
    return runs


def _mlflow_find(client: Any, ref: str, experiment_ids: list[str], where: str) -> Any:
    """The run ``ref`` names: an MLflow run id, else a run name, else a cliptrack run id (the first
    kind that matches decides; several runs of one name is an error listing their ids)."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(ref)
        if run.info.experiment_id in experiment_ids:
            return run
    except MlflowException:
        pass
    lookups = (
        (f"attributes.run_name = {_mlflow_quote(ref)}", f"run name {ref!r}", ": pass a run id"),
        (f"tags.`{keys.TAG_RUN_ID}` = {_mlflow_quote(ref)}", f"cliptrack run id {ref!r}", ""),
    )
    for filter_string, what, hint in lookups:
        matches = client.search_runs(experiment_ids, filter_string=filter_string, max_results=100)
        if len(matches) > 1 and hint:  # a run name: the latest finished run, the others listed
            return choose_by_name(ref, matches, lambda r: mlflow_entry(client, r, keys.LOSS_TOKENS), where)
        if len(matches) > 1:
            ids = ", ".join(m.info.run_id for m in matches)
            raise RunNotFoundError(f"{what} matches {len(matches)} runs in {where} ({ids}){hint}")
        if matches:
            return matches[0]
    present = client.search_runs(experiment_ids, max_results=10, order_by=["attributes.start_time DESC"])
    if not present:
        raise StoreError(f"{where} holds no runs: is it the store the training logged to?")
    listing = ", ".join(
        f"{r.info.run_name} ({r.data.tags.get(keys.TAG_RUN_ID, r.info.run_id)})" for r in present
    )
    raise RunNotFoundError(
        f"no run with id, name or cliptrack run id {ref!r} in {where}; latest runs there: {listing} "
        f"(cliptrack runs --tracking-uri {client.tracking_uri} lists them all)"
    )


def _metric_histories(client: Any, run: Any) -> list[Point]:
    """A run's points read one metric at a time (stores without a bulk read); a step's wall time
    is the latest of its entries (MLflow timestamps are milliseconds)."""
    by_step: dict[int, dict[str, float]] = {}
    wall: dict[int, float] = {}
    for key in sorted(run.data.metrics):
        for m in client.get_metric_history(run.info.run_id, key):
            by_step.setdefault(int(m.step), {})[m.key] = float(m.value)
            wall[int(m.step)] = max(wall.get(int(m.step), -math.inf), m.timestamp / 1000.0)
    return [Point(step, wall[step], metrics) for step, metrics in sorted(by_step.items())]


def _points_of(columns: Columns) -> list[Point]:
    """Bulk-read columns as one Point per step (a step's wall time is the latest of its entries)."""
    by_step: dict[int, dict[str, float]] = {}
    wall: dict[int, float] = {}
    for step, when, name, value in zip(
        columns.step.tolist(),
        columns.wall_time.tolist(),
        columns.metric_keys().tolist(),
        columns.value.tolist(),
        strict=True,
    ):
        by_step.setdefault(int(step), {})[str(name)] = float(value)
        wall[int(step)] = max(wall.get(int(step), -math.inf), float(when))
    return [Point(step, wall[step], metrics) for step, metrics in sorted(by_step.items())]


# ------------------------------------------------------------------------------ W&B offline files


def _numeric(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _wandb_offline_run(path: Path, location: str) -> tuple[LoadedRun, list[Point]]:
    """One ``.wandb`` file (read by the W&B seam's one reader; a damaged record is an error) as a run."""
    run_id, name, group = "", "", ""
    config: dict[str, Any] = {}
    points: list[Point] = []
    for record in compat_wandb.records(path, strict=True):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id, name, group = record.run.run_id, record.run.display_name, record.run.run_group
            config.update(compat_wandb.items(record.run.config.update))
        elif kind == "config":
            config.update(compat_wandb.items(record.config.update))
        elif kind == "history":
            row = compat_wandb.items(record.history.item)
            point = _history_point(row)
            if point is not None:
                points.append(point)
    backend = config.get(keys.TAG_BACKEND) or group
    points, approximate = canonical_points(points)
    run = wandb_run_info(run_id or path.stem.removeprefix("run-"), name, backend, config)
    return LoadedRun(run, source="wandb", location=location, approximate=approximate), points


def wandb_run_info(run_id: str, name: str, backend: object, config: dict[str, Any]) -> RunInfo:
    """The ``cliptrack.store.records.RunInfo`` of a W&B run: its id, display name, the ``cliptrack.backend``
    config key (else the run group) as ``backend_label``, and its config without W&B's own keys."""
    return RunInfo(
        run_id=run_id,
        run_name=name or "",
        backend_label=str(backend) if backend else None,
        config={k: v for k, v in config.items() if not str(k).startswith("_")},
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
        )
        merged[run_id] = (LoadedRun(run, first.source, first.location), kept + list(points))
    return list(merged.values())


def load_wandb_offline(refs: Sequence[str], directory: str | Path) -> RunSet:
    """Load runs from W&B run directories on disk (offline runs, or online runs' local copies).

    ``refs`` are W&B run ids or display names; empty loads every run found under ``directory``.
    A run resumed by another process (e.g. ``cliptrack replay``) spans several run directories;
    they are read as one run.
    """
    files = sorted(wandb_run_files(directory), key=lambda p: (_started(p), str(p)))
    runs = _merge_segments([_wandb_offline_run(path, str(path.parent)) for path in files])
    chosen = _choose(
        refs, [(run, run[0].run.run_id, run[0].run.run_name) for run in runs], f"W&B dir {directory}"
    )
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
        config = dict(run.config)
        points, approximate = canonical_points(
            [p for p in (_history_point(dict(row)) for row in run.scan_history()) if p is not None]
        )
        backend = config.get(keys.TAG_BACKEND) or getattr(run, "group", "") or ""
        info = wandb_run_info(run.id, run.name, backend, config)
        items.append((LoadedRun(info, source="wandb", location=path, approximate=approximate), points))
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
    named = [
        n
        for n, v in (("jsonl_dir", jsonl_dir), ("wandb_dir", wandb_dir), ("tracking_uri", tracking_uri))
        if v is not None
    ]
    if len(named) > 1:
        raise ValueError(f"load_runs: name one store, got {', '.join(named)}")
    if jsonl_dir is not None:
        return load_jsonl(refs, jsonl_dir)
    if wandb_dir is not None:
        return load_wandb_offline(refs, wandb_dir)
    if refs and tracking_uri is None and experiment is None and all(r.count("/") == 2 for r in refs):
        return load_wandb_online(refs, api=wandb_api)
    return load_mlflow(refs, tracking_uri=tracking_uri, experiment=experiment)
