"""Runs read back from an MLflow tracking store (sqlite, SQL servers, an HTTP server) for the
comparison; MLflow keeps wall time in milliseconds, so a run's ``wall_time`` is rounded to 1 ms.

Reading never writes: the store is checked first (``preflight``).
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cliptrack.backends.catalog import RunNotFoundError, choose_by_name, short_list
from cliptrack.backends.mlflow._compat import bounded_requests
from cliptrack.backends.mlflow._rest import http_columns
from cliptrack.backends.mlflow._store import bulk_columns
from cliptrack.backends.mlflow.listing import mlflow_entry, read_uri
from cliptrack.backends.preflight import StoreError
from cliptrack.core import keys
from cliptrack.core.worst import Worst
from cliptrack.store import worst as worst_store
from cliptrack.store.aliases import as_logged, canonical_points, needs_aliases
from cliptrack.store.frame import Columns, LoadedRun, Point, RunSet
from cliptrack.store.records import RunInfo

__all__ = ["mlflow_run_info", "read", "read_worst"]


def _mlflow_quote(value: str) -> str:
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise ValueError(f"run name {value!r} contains both quote characters; pass its run id instead")


def _load_mlflow(refs: Sequence[str], tracking_uri: str | None, experiment: str | None) -> RunSet:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=read_uri(tracking_uri))
    where = f"MLflow store {client.tracking_uri}"
    experiment_ids = _mlflow_experiment_ids(client, experiment, where)
    if refs:
        runs = [_mlflow_find(client, ref, experiment_ids, where) for ref in refs]
    elif experiment is None:
        raise ValueError("MLflow: name runs (ids or names) or an experiment to load from")
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
        read = canonical_points(raw)  # another tracker's spellings: renamed point by point
        items.append((as_logged(info, read), read.points))
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
    present = client.search_runs(experiment_ids, max_results=20, order_by=["attributes.start_time DESC"])
    if not present:
        raise StoreError(f"{where} holds no runs: is it the store the training logged to?")
    training = [r for r in present if r.data.tags.get(keys.TAG_RUN_KIND) != keys.RUN_KIND_COMPARISON]
    names = [r.info.run_name or r.data.tags.get(keys.TAG_RUN_ID, r.info.run_id) for r in training]
    raise RunNotFoundError(
        f"no run with id, name or cliptrack run id {ref!r} in {where}\n"
        f"training runs there, latest first: {short_list(names)}\n"
        f"cliptrack runs --tracking-uri {absolute_uri(client.tracking_uri)} lists them all"
    )


def absolute_uri(uri: str) -> str:
    """A relative ``sqlite:///`` URI made absolute, so that a printed command works from any folder."""
    prefix = "sqlite:///"
    path = uri[len(prefix) :]
    if uri.startswith(prefix) and not path.startswith("/"):
        return f"{prefix}{Path(path).resolve()}"
    return uri


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


def read_worst(run: LoadedRun) -> list[Worst]:
    """An MLflow run's worst-sequence tables (its ``worst_sequences/step_*.json`` artifacts), by
    step; ``[]`` when it logged none (its run tag ``worst_store.TAG`` unset: the artifacts are then
    not listed). The directory is downloaded once, to a temporary directory."""
    from mlflow.tracking import MlflowClient

    with bounded_requests(reads=True):
        client = MlflowClient(tracking_uri=run.location or None)
        if client.get_run(run.run.run_id).data.tags.get(worst_store.TAG) != "1":
            return []  # no table reached the run: no artifact request (see worst_store.TAG)
        listed = client.list_artifacts(run.run.run_id, worst_store.ARTIFACT_DIR)
        if not any(worst_store.artifact_step(f.path) is not None for f in listed):
            return []
        with tempfile.TemporaryDirectory() as tmp:
            local = client.download_artifacts(run.run.run_id, worst_store.ARTIFACT_DIR, tmp)
            tables = []
            for f in listed:
                step = worst_store.artifact_step(f.path)
                if step is None:
                    continue
                name = f.path.rsplit("/", 1)[-1]
                with open(f"{local}/{name}", encoding="utf-8") as fh:
                    table = json.load(fh)
                tables.append(worst_store.from_rows(table["columns"], table["data"], step))
    return worst_store.latest_per_step(tables)


def read(
    refs: Sequence[str] = (), *, tracking_uri: str | None = None, experiment: str | None = None
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
