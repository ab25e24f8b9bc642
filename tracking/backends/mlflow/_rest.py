"""Reading MLflow metric histories from a tracking server over HTTP, bounded for a busy server.

``MlflowClient.get_metric_history`` asks for a whole history in one request and turns every value
into a protobuf message and then a ``Metric`` object; on a loaded server that one request outlasts
a short timeout, and the client's own parsing costs as much again. Here:

- each (run, metric) history is one request to the server's bulk endpoint
  (``GET /ajax-api/2.0/mlflow/metrics/get-history-bulk``, what ``mlflow ui`` draws its charts from:
  plain JSON, the cheapest answer a server gives), read with ``json.loads`` straight into columns;
- a history of ``PAGE_ROWS`` values or more (the endpoint's cap) is read instead in pages of
  ``PAGE_ROWS`` through the public REST API (``GET /api/2.0/mlflow/metrics/get-history`` with
  ``max_results`` and ``page_token``), and so is every history when the server has no bulk
  endpoint (HTTP 404);
- ``WORKERS`` requests are in flight at once (a server's worker processes answer them in
  parallel);
- every request runs under ``_compat_mlflow.bounded_requests(reads=True)``: it connects within
  ``READ_CONNECT_TIMEOUT_S``, waits ``read_timeout_s()`` for its reply, and is retried twice with
  backoff on a refused connection, a timeout or a 429/5xx answer. A server that cannot be reached
  fails in seconds; a slow one is waited for.

Values are decoded as ``get_metric_history`` gives them (NaN and the clamped infinities as MLflow
stores them) and in its order (timestamp, step, value), so this path, the SQL bulk read
(``_compat_mlflow_store``) and the public client give the same frame.

This touches MLflow beyond its public client (``mlflow.utils.rest_utils.http_request``, the host
credentials of ``mlflow.tracking._tracking_service.utils._get_store``, and the UI's bulk endpoint):
``http_columns`` returns None where those are not there, and the caller reads through
``MlflowClient`` instead.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from cliptrack.backends.mlflow import _compat as compat
from cliptrack.backends.preflight import StoreError
from cliptrack.core.secrets import redact
from cliptrack.store.frame import Columns

HTTP_SCHEMES = ("http://", "https://")
PAGE_ROWS = 25_000
"""Values per request: the cap of the server's bulk endpoint (``MAX_HISTORY_RESULTS``), and the page
size of a paged read."""
WORKERS = 4
"""Requests in flight at once (``mlflow server`` starts 4 worker processes by default)."""
BULK_ENDPOINT = "/ajax-api/2.0/mlflow/metrics/get-history-bulk"
HISTORY_ENDPOINT = "/api/2.0/mlflow/metrics/get-history"

DRIFT = (ImportError, AttributeError, TypeError)
"""What a changed MLflow raises here: a function moved or renamed, a changed signature."""


class _NoBulkEndpoint(Exception):
    """The server answered 404 to the bulk endpoint (an older server, or a proxy in front of it)."""


def http_columns(tracking_uri: str, histories: dict[str, list[str]]) -> dict[str, Columns] | None:
    """Every value of the metrics ``histories`` names (run id -> metric keys) as ``Columns`` per run
    id, or None when ``tracking_uri`` is not an HTTP server or MLflow's REST helpers are not there.

    StoreError (one line, naming the server, run and metric, credentials hidden) when a history
    cannot be read within the bounds.
    """
    if not tracking_uri.startswith(HTTP_SCHEMES):
        return None
    reader = _Reader.open(tracking_uri)
    if reader is None:
        return None
    tasks = [(run_id, key) for run_id, keys in histories.items() for key in sorted(keys)]
    with ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="cliptrack-read") as pool:
        parts = list(pool.map(lambda task: reader.history(*task), tasks))
    out: dict[str, list[_Part]] = {run_id: [] for run_id in histories}
    for (run_id, _), part in zip(tasks, parts, strict=True):
        out[run_id].append(part)
    return {run_id: _columns(run_parts) for run_id, run_parts in out.items()}


def history_length(tracking_uri: str, run_id: str, key: str) -> int | None:
    """How many values ``key`` has in run ``run_id`` on an HTTP server (None: not an HTTP server or
    no REST helpers; then the caller counts through ``MlflowClient``)."""
    if not tracking_uri.startswith(HTTP_SCHEMES):
        return None
    reader = _Reader.open(tracking_uri)
    return None if reader is None else len(reader.history(run_id, key).step)


class _Part:
    """One (run, metric) history as parallel lists: steps, timestamps (ms), values."""

    __slots__ = ("key", "step", "timestamp", "value")

    def __init__(self, key: str, rows: list[dict[str, Any]]) -> None:
        self.key = key
        self.step = [int(row.get("step", 0)) for row in rows]
        self.timestamp = [int(row.get("timestamp", 0)) for row in rows]
        self.value = [float(row.get("value", 0.0)) for row in rows]  # "NaN", "Infinity" strings too

    def extend(self, other: _Part) -> None:
        self.step += other.step
        self.timestamp += other.timestamp
        self.value += other.value


def _columns(parts: list[_Part]) -> Columns:
    """The parts of one run as ``Columns`` (metric by metric, each in the server's order)."""
    return Columns(
        np.asarray([s for p in parts for s in p.step], dtype=np.int64),
        np.asarray([t for p in parts for t in p.timestamp], dtype=np.float64) / 1000.0,
        np.asarray([p.key for p in parts for _ in p.step], dtype=object),
        np.asarray([v for p in parts for v in p.value], dtype=np.float64),
    )


class _Reader:
    """Bounded GET requests to one server, with the credentials MLflow's client would send."""

    def __init__(self, tracking_uri: str, creds: Any, request: Any, verify: Any) -> None:
        self.tracking_uri = tracking_uri
        self._creds = creds
        self._request = request
        self._verify = verify
        self._bulk = True

    @classmethod
    def open(cls, tracking_uri: str) -> _Reader | None:
        try:
            from mlflow.tracking._tracking_service.utils import _get_store
            from mlflow.utils.rest_utils import http_request, verify_rest_response

            creds = _get_store(tracking_uri).get_host_creds()
        except DRIFT:
            return None
        return cls(tracking_uri, creds, http_request, verify_rest_response)

    def history(self, run_id: str, key: str) -> _Part:
        """Every value of ``key`` in run ``run_id``: one bulk request, or pages (see the module)."""
        if self._bulk:
            try:
                answer = self._get(BULK_ENDPOINT, run_id, key, {"max_results": PAGE_ROWS})
                part = _Part(key, answer.get("metrics", []))
            except _NoBulkEndpoint:
                self._bulk = False
            else:
                if len(part.step) < PAGE_ROWS:
                    return part
        return self._paged(run_id, key)

    def _paged(self, run_id: str, key: str) -> _Part:
        part = _Part(key, [])
        token: str | None = None
        while True:
            params: dict[str, Any] = {"max_results": PAGE_ROWS}
            if token:
                params["page_token"] = token
            answer = self._get(HISTORY_ENDPOINT, run_id, key, params)
            part.extend(_Part(key, answer.get("metrics", [])))
            token = answer.get("next_page_token") or None
            if token is None:
                return part

    def _get(self, endpoint: str, run_id: str, key: str, params: dict[str, Any]) -> dict[str, Any]:
        """One GET under the reader's bounds, its JSON answer as a dict; StoreError when it fails."""
        from mlflow.exceptions import MlflowException

        try:
            with compat.bounded_requests(reads=True):
                response = self._request(
                    self._creds, endpoint, "GET", params={"run_id": run_id, "metric_key": key, **params}
                )
            if endpoint == BULK_ENDPOINT and response.status_code == 404:
                raise _NoBulkEndpoint
            answer = json.loads(self._verify(response, endpoint).text)
        except (MlflowException, ValueError) as exc:  # ValueError: a reply that is not JSON
            raise StoreError(
                f"MLflow server {redact(self.tracking_uri)} did not give the history of "
                f"{key!r} in run {run_id} ({compat.message(exc)}); waited up to "
                f"{compat.read_timeout_s():g} s for each reply (MLFLOW_HTTP_REQUEST_TIMEOUT sets it)"
            ) from None
        if not isinstance(answer, dict):
            raise StoreError(
                f"MLflow server {redact(self.tracking_uri)} answered {endpoint} for {key!r} "
                f"in run {run_id} with JSON that is not an object"
            )
        return answer
