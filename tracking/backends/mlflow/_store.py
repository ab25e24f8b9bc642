"""Reading MLflow metric histories in bulk from a SQL tracking store (sqlite, PostgreSQL, MySQL).

``MlflowClient.get_metric_history`` returns one ``Metric`` object per value, one request per
metric key: at 100,000 steps x 5 keys that is a million ORM objects. Here one SELECT over
MLflow's own ``SqlMetric`` model (through MLflow's own ``SqlAlchemyStore`` and its engine) reads
every value of the wanted runs as columns. The values are decoded as MLflow does
(``is_nan`` -> NaN; infinities are stored clamped to the largest float) and ordered as
``get_metric_history`` orders them (timestamp, step, value), so both paths give the same frame.

This touches MLflow's store classes, which are not a stable public API: ``bulk_columns`` returns
None for any store it cannot read this way (non-SQL URIs, or an MLflow whose store changed), and
the caller falls back to ``get_metric_history``.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from cliptrack.store.frame import Columns

SQL_SCHEMES = ("sqlite:", "postgresql", "mysql", "mssql")
CHUNK_ROWS = 100_000
"""Rows fetched from the cursor at a time."""


DRIFT = (ImportError, AttributeError, TypeError, KeyError)
"""What a changed MLflow store raises here: a model or class moved or renamed, a changed signature."""


def bulk_columns(tracking_uri: str, run_ids: list[str]) -> dict[str, Columns] | None:
    """Every metric value of ``run_ids`` as ``Columns`` per run id, or None when not a readable SQL store."""
    if not tracking_uri.startswith(SQL_SCHEMES) or not run_ids:
        return None
    import pandas as pd

    names = ["run_uuid", "key", "value", "is_nan", "timestamp", "step"]
    try:
        chunks = _read_chunks(tracking_uri, run_ids, names)
    except _StoreUnreadable as exc:  # drift in MLflow's store: read through the public client instead
        warnings.warn(
            f"MLflow bulk metric read unavailable ({exc}); reading histories one metric at a time",
            stacklevel=2,
        )
        return None
    rows = pd.concat(chunks, ignore_index=True) if chunks else pd.DataFrame(columns=names)
    stored = rows["value"].to_numpy(dtype=np.float64)
    run_codes, _ = pd.factorize(rows["run_uuid"])
    key_codes, _ = pd.factorize(rows["key"])
    # get_metric_history's order within a key: timestamp, step, stored value (a NaN is stored as 0)
    order = np.lexsort((stored, rows["step"].to_numpy(), rows["timestamp"].to_numpy(), key_codes, run_codes))
    rows = rows.iloc[order]
    rows = rows.assign(value=np.where(rows["is_nan"].to_numpy(dtype=bool), np.nan, stored[order]))
    out = {}
    for run_id, part in rows.groupby("run_uuid", sort=False):
        out[str(run_id)] = Columns(
            part["step"].to_numpy(dtype=np.int64),
            part["timestamp"].to_numpy(dtype=np.float64) / 1000.0,
            part["key"].to_numpy(dtype=object),
            part["value"].to_numpy(dtype=np.float64),
        )
    for run_id in run_ids:
        out.setdefault(run_id, Columns(np.empty(0, np.int64), np.empty(0), np.empty(0, object), np.empty(0)))
    return out


class _StoreUnreadable(Exception):
    """MLflow's SQL store could not be read through its models (the cause is chained)."""


def _read_chunks(tracking_uri: str, run_ids: list[str], names: list[str]) -> list[Any]:
    """The metric rows of ``run_ids`` as DataFrame chunks of ``CHUNK_ROWS``, read with one SELECT
    over MLflow's ``SqlMetric`` model on the DB-API cursor of MLflow's own engine (no per-row ORM
    or type processing). _StoreUnreadable when MLflow's store classes, or its schema, changed."""
    import pandas as pd

    try:
        import sqlalchemy as sa
        from mlflow.exceptions import MlflowException
        from mlflow.store.tracking.dbmodels.models import SqlMetric
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    except ImportError as exc:
        raise _StoreUnreadable(f"{type(exc).__name__}: {exc}") from exc
    try:
        store: Any = SqlAlchemyStore(tracking_uri, None)
        stmt: Any = sa.select(
            SqlMetric.run_uuid,
            SqlMetric.key,
            SqlMetric.value,
            SqlMetric.is_nan,
            SqlMetric.timestamp,
            SqlMetric.step,
        ).where(SqlMetric.run_uuid.in_(run_ids))
        sql = str(stmt.compile(dialect=store.engine.dialect, compile_kwargs={"literal_binds": True}))
        driver_error = store.engine.dialect.dbapi.Error  # the DB-API driver's own base error
        raw = store.engine.raw_connection()
    except (*DRIFT, MlflowException, sa.exc.SQLAlchemyError) as exc:
        raise _StoreUnreadable(f"{type(exc).__name__}: {exc}") from exc
    chunks = []
    try:
        cursor = raw.cursor()
        cursor.execute(sql)
        while records := cursor.fetchmany(CHUNK_ROWS):  # a chunk of tuples at a time bounds memory
            chunks.append(pd.DataFrame.from_records(records, columns=names))
    except (*DRIFT, driver_error) as exc:  # e.g. a column renamed by a schema migration
        raise _StoreUnreadable(f"{type(exc).__name__}: {exc}") from exc
    finally:
        raw.close()
    return chunks
