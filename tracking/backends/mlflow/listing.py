"""MLflow runs as ``cliptrack runs`` lists them (``RunEntry``): both ids, name, backend, status,
start time, steps, experiment."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cliptrack.backends.catalog import RunEntry, RunNotFoundError
from cliptrack.backends.mlflow import creation
from cliptrack.backends.mlflow._compat import bounded_requests, installed_version, schema_revision
from cliptrack.backends.mlflow._rest import history_length
from cliptrack.backends.preflight import StoreError, resolve_tracking_uri
from cliptrack.core import frameworks, keys


def check_schema(revision: str | None, uri: str, origin: str, tables: list[str]) -> None:
    """StoreError unless a SQL store's schema ``revision`` is the one the installed MLflow reads:
    MLflow's client would migrate a store at any other one when it opens it (upgrade a store an older
    MLflow wrote, half-migrate one missing a table), and reading writes nothing
    (``preflight.SchemaCheck``). A store being created now, or one an interrupted migration left
    behind (``tables`` holding alembic's leftovers, or no recorded revision), is named so, the
    latter with its repair (``creation``)."""
    expected = schema_revision()
    if revision == expected:
        return
    database = creation.database_file(uri)
    if database is not None and creation.in_progress(database):
        raise StoreError(
            f"{uri}{origin} is being created by another process right now (it holds "
            f"{database.name}{creation.LOCK_SUFFIX}): try again once it is done"
        )
    stuck = creation.mid_migration(tables, revision)
    if stuck is not None:
        raise StoreError(
            f"{uri}{origin} was left mid-migration ({stuck}; MLflow {installed_version()} reads revision "
            f"{expected}): it was left untouched (reading neither writes nor migrates a store); "
            f"{creation.repair(uri, database, tables)}"
        )
    raise StoreError(
        f"{uri}{origin} is an MLflow store of another schema (revision {revision}; MLflow "
        f"{installed_version()} reads {expected}): it was left untouched (reading neither writes nor "
        f"migrates a store); read it with the MLflow version that wrote it, or back it up and run "
        f"mlflow db upgrade {uri}"
    )


def read_uri(tracking_uri: str | None) -> str:
    """The tracking URI to read (``preflight.resolve_tracking_uri``), a SQL store's schema revision
    checked too (``check_schema``)."""
    return resolve_tracking_uri(tracking_uri, check_schema)


def mlflow_entry(client: Any, run: Any, count_key: str) -> RunEntry:
    """An MLflow run (``mlflow.entities.Run``) as listed; steps are the points of ``count_key`` (of a
    framework's own metric for a run that framework logged itself, which then names its backend when
    the run has none: ``cliptrack.core.frameworks.detect``)."""
    tags = run.data.tags
    framework = frameworks.detect(run.data.metrics)
    if framework is not None and count_key not in run.data.metrics:  # a framework's own run: its own metric
        count_key = next(m.name for m in frameworks.of(framework.name) if m.name in run.data.metrics)
    steps: int | None = 0
    if count_key in run.data.metrics:  # a server's history in bounded pages, else through the client
        steps = history_length(str(client.tracking_uri), run.info.run_id, count_key)
        if steps is None:
            steps = len(client.get_metric_history(run.info.run_id, count_key))
    return RunEntry(
        cliptrack_id=tags.get(keys.TAG_RUN_ID, run.info.run_id),
        store_id=run.info.run_id,
        name=run.info.run_name or "",
        backend=tags.get(keys.TAG_BACKEND) or (framework.name if framework is not None else ""),
        status=run.info.status,
        started=(run.info.start_time or 0) / 1000.0,
        steps=steps,
        experiment=run.info.experiment_id,
    )


def mlflow_entries(
    tracking_uri: str | None, experiment: str | None = None, include_comparisons: bool = False
) -> list[RunEntry]:
    """Every run of the MLflow store (of ``experiment`` when named), as ``RunEntry``, comparison
    runs only with ``include_comparisons``; requests to a server are a reader's, as ``compare``'s
    (``_compat_mlflow.bounded_requests(reads=True)``)."""
    with bounded_requests(reads=True):
        return _mlflow_entries(tracking_uri, experiment, include_comparisons)


def _mlflow_entries(
    tracking_uri: str | None, experiment: str | None, include_comparisons: bool
) -> list[RunEntry]:
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=read_uri(tracking_uri))
    experiments = list(client.search_experiments(view_type=ViewType.ACTIVE_ONLY))
    if experiment is not None:
        experiments = [e for e in experiments if experiment in (e.name, e.experiment_id)]
        if not experiments:
            raise RunNotFoundError(
                f"no experiment named or with id {experiment!r} in MLflow store {client.tracking_uri}"
            )
    names = {e.experiment_id: e.name for e in experiments}
    runs = client.search_runs(list(names), max_results=50000) if names else []
    entries = []
    for run in runs:
        if not include_comparisons and run.data.tags.get(keys.TAG_RUN_KIND) == keys.RUN_KIND_COMPARISON:
            continue
        entry = mlflow_entry(client, run, keys.LOSS_TOKENS)
        entries.append(replace(entry, experiment=names[run.info.experiment_id]))
    return entries


def list_runs(
    *, include_comparisons: bool = False, tracking_uri: str | None = None, experiment: str | None = None
) -> list[RunEntry]:
    """The registry's listing: ``mlflow_entries`` of the store ``tracking_uri`` names."""
    return mlflow_entries(tracking_uri, experiment, include_comparisons)
