"""Everything cliptrack takes from MLflow beyond its public client, in one place.

- key and param rules: MLflow's private ``mlflow.utils.validation`` (``_validate_metric_name``,
  ``_validate_param_name``, ``MAX_ENTITY_KEY_LENGTH``, ``MAX_PARAM_VAL_LENGTH``);
- bounded HTTP requests for cliptrack's own threads: MLflow's REST client reads
  ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` / ``_TIMEOUT`` / ``_BACKOFF_FACTOR`` / ``_BACKOFF_JITTER``
  through ``mlflow.environment_variables`` objects on every request (``rest_utils.http_request``).
  ``bounded_requests()`` makes those objects answer cliptrack's bounds on the calling thread only:
  the application's own MLflow calls, on its threads, keep MLflow's settings untouched. Writes
  (the tracker) wait ``REQUEST_TIMEOUT_S`` per attempt; reads (``compare``, ``runs``:
  ``bounded_requests(reads=True)``) connect within ``READ_CONNECT_TIMEOUT_S`` but wait
  ``read_timeout_s()`` for a reply, so a busy server's large answer arrives while a server that is
  not there still fails in seconds (MLflow's timeout object answers a (connect, read) pair there).
  On those threads ``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT`` answers true as well: MLflow's
  ``set_terminated`` would print "View run ... at: <tracking URI>" on the application's stdout,
  the URI with its password (``cliptrack.core.secrets``: cliptrack shows it redacted, in its summary);
  and ``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR`` false: a reader downloading a run's worst-sequence
  tables would draw a "Downloading artifacts" bar on stderr for each run;
- the schema revision MLflow's SQL store expects (``schema_revision``: MLflow's private
  ``mlflow.store.db.utils._get_latest_schema_revision``, the head of its alembic migrations): a
  store at another revision would be migrated by MLflow's store constructor, so readers refuse it
  first (``cliptrack.backends.preflight``); and the step that builds that schema in an empty database
  (``initialize_schema``: MLflow's private ``mlflow.store.db.utils._initialize_tables``), which
  ``cliptrack.backends.mlflow.creation`` runs on a file of its own before a new store is put in place;
- the MLflow UI's shared view (``shared_view_state``, ``SHARED_VIEW_TAG_PREFIX``, ``SHARED_VIEW_PARAM``): the experiment page
  reads a view state (its chart search, its run list shown or hidden) from the experiment tag
  ``mlflow.sharedViewState.<key>`` when its address carries ``viewStateShareKey=<key>`` — what its
  own "Share" button writes. No other setting a client can write orders or filters the charts
  (their layout otherwise lives in the browser's local storage); a view may also group the runs
  by a param (``grouped_view_state``: the UI's ``groupBy``, one row per value with its runs under
  it, and the charts drawing each group's mean with its range);
- the experiment kind tag ``mlflow.experimentKind`` that ``mlflow ui`` 3.x reads to open an
  experiment as a training one (``custom_model_development``) rather than a GenAI one;
- where a local ``sqlite:///<path>`` store keeps its database file (``artifacts_beside``): MLflow
  gives an experiment created without an artifact location ``./mlruns`` of the *working
  directory*, so experiments cliptrack creates there get a directory beside the database instead.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from cliptrack.core.secrets import redact
from cliptrack.core.versions import check_version

MINIMUM = (3, 0)
"""Oldest MLflow release the seam was verified on (verified: 3.17.2)."""
SUPPORTED_BELOW = (4, 0)
"""First MLflow release not verified (exclusive bound); others are refused by ``check_supported``."""
USES = (
    "mlflow.utils.validation (_validate_metric_name, _validate_param_name, MAX_ENTITY_KEY_LENGTH, "
    "MAX_PARAM_VAL_LENGTH), the HTTP settings, MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT and MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR of "
    "mlflow.environment_variables read per request, mlflow.store.db.utils._get_latest_schema_revision and "
    "_initialize_tables, the "
    "experiment tags mlflow.experimentKind, mlflow.note.content and mlflow.sharedViewState.<key> (the UI's "
    "viewStateShareKey, its groupBy)"
)

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_EXPERIMENT_KIND = "custom_model_development"
"""What ``mlflow ui`` shows as a classic ML training experiment (``genai_development`` is the other)."""

SHARED_VIEW_TAG_PREFIX = "mlflow.sharedViewState."
"""Experiment tags holding a view of the MLflow UI's experiment page (JSON), by share key."""
SHARED_VIEW_PARAM = "viewStateShareKey"
"""The UI address's parameter naming the share key of the view to open."""

SQLITE_PREFIX = "sqlite:///"
"""A local sqlite store's URI: ``sqlite:///relative.db`` or ``sqlite:////absolute.db``."""


def shared_view_state(charts_search: str, run_list_hidden: bool) -> str:
    """A view of the UI's experiment page as its "Share" button stores it (JSON, the value of a
    ``SHARED_VIEW_TAG_PREFIX`` tag): the charts' search box set to ``charts_search`` (a regular
    expression the UI matches against each chart's metric key, ignoring case), empty charts hidden,
    the run list folded or not."""
    state = {"chartsSearchFilter": charts_search, "hideEmptyCharts": True, "runListHidden": run_list_hidden}
    return json.dumps(state)


def grouped_view_state(view: str, param: str) -> str:
    """The view ``view`` (a ``shared_view_state`` JSON) with the runs grouped by the value of their
    param ``param`` (the UI's ``groupBy``: ``{"aggregateFunction": "average", "groupByKeys":
    [{"mode": "param", "groupByData": param}]}``, as its "Group by" menu stores it), the charts
    drawing each group's average over its runs and their range."""
    state = json.loads(view)
    state["groupBy"] = {
        "aggregateFunction": "average",
        "groupByKeys": [{"mode": "param", "groupByData": param}],
    }
    state["useGroupedValuesInCharts"] = True
    return json.dumps(state)


EXPERIMENT_DESCRIPTION_TAG = "mlflow.note.content"
"""The experiment tag the MLflow UI shows, as markdown, at the top of the experiment page."""


def artifacts_beside(tracking_uri: str, name: str) -> Path | None:
    """The absolute directory ``name`` beside a local sqlite store's database file (the store's
    query string, if any, left out); None for any other store (a server keeps its own default)."""
    if not tracking_uri.startswith(SQLITE_PREFIX):
        return None
    database = tracking_uri.removeprefix(SQLITE_PREFIX).split("?", 1)[0]
    return Path(database).expanduser().resolve().parent / name


REQUEST_MAX_RETRIES = 2
"""HTTP retries per MLflow request from cliptrack's threads (MLflow's default: 7, ~4 min when down)."""
REQUEST_TIMEOUT_S = 5
"""Seconds per HTTP attempt (MLflow's default: 120)."""
REQUEST_BACKOFF_FACTOR = 1
"""Backoff factor (seconds) between retries: 1 s, 2 s (MLflow's default: 2)."""
REQUEST_BACKOFF_JITTER = 0.5
REQUEST_WORST_CASE_S = (REQUEST_MAX_RETRIES + 1) * REQUEST_TIMEOUT_S + 3 * REQUEST_BACKOFF_FACTOR + 2
"""Upper bound (seconds) of one request from cliptrack's threads against an unresponsive server."""

READ_CONNECT_TIMEOUT_S = 2.0
"""Seconds a read (``compare``, ``runs``) may take to connect to a server: one that is not there
(refused, or no answer to the connection) fails within ``READ_UNREACHABLE_WORST_CASE_S``."""
READ_TIMEOUT_S = 60.0
"""Seconds a read waits for a server's reply once connected (MLflow's own default: 120): a busy
server answering a page of history (``_compat_mlflow_rest.PAGE_ROWS`` values) takes seconds to tens
of seconds. ``MLFLOW_HTTP_REQUEST_TIMEOUT``, when set, replaces it (see ``read_timeout_s``)."""
READ_UNREACHABLE_WORST_CASE_S = (
    (REQUEST_MAX_RETRIES + 1) * READ_CONNECT_TIMEOUT_S
    + 2 * REQUEST_BACKOFF_FACTOR
    + REQUEST_MAX_RETRIES * REQUEST_BACKOFF_JITTER
)
"""Upper bound (seconds) of one read request against a server that cannot be reached: three
connection attempts and urllib3's backoff between them (none, then 2 x the factor, plus jitter)."""

_BOUNDS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": REQUEST_MAX_RETRIES,
    "MLFLOW_HTTP_REQUEST_TIMEOUT": REQUEST_TIMEOUT_S,
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": REQUEST_BACKOFF_FACTOR,
    "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": REQUEST_BACKOFF_JITTER,
}
_TIMEOUT_VAR = "MLFLOW_HTTP_REQUEST_TIMEOUT"
_SWITCHES = {"MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": True, "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": False}
"""MLflow's switches that answer these values on cliptrack's threads (inside ``bounded_requests``):
no "View run ... at: <URI>" line on stdout, no "Downloading artifacts" progress bar on stderr (the
reader fetches each run's worst-sequence tables: a bar per run in the middle of ``compare``'s and the
demo's output)."""


def read_timeout_s() -> float:
    """Seconds a read waits for a reply: ``MLFLOW_HTTP_REQUEST_TIMEOUT`` when the user set it to a
    positive number (either way: it is their explicit choice), else ``READ_TIMEOUT_S``."""
    import os

    raw = os.environ.get(_TIMEOUT_VAR)
    try:
        value = float(raw) if raw is not None else 0.0
    except ValueError:
        value = 0.0
    return value if value > 0 else READ_TIMEOUT_S


def read_timeout() -> tuple[float, float]:
    """The (connect, read) timeout pair, in seconds, of one read request (requests' ``timeout=``)."""
    return (READ_CONNECT_TIMEOUT_S, read_timeout_s())


_local = threading.local()
_installed = False
_install_lock = threading.Lock()


def _install() -> None:
    """Give MLflow's four HTTP setting objects a thread-aware ``get_raw``, its timeout object a
    thread-aware ``get`` that answers ``read_timeout()`` inside ``bounded_requests(reads=True)``,
    and its URL-printing and progress-bar switches (``_SWITCHES``) ones that answer cliptrack's values
    inside ``bounded_requests`` (once per process)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        from mlflow import environment_variables as env

        timeout = getattr(env, _TIMEOUT_VAR)
        original_get = timeout.get

        def get(original_get: Any = original_get) -> Any:
            if getattr(_local, "reads", False):
                return read_timeout()
            return original_get()

        timeout.get = get
        for name, bound in _BOUNDS.items():
            var = getattr(env, name)
            original = var.get_raw

            def get_raw(original: Any = original, name: str = name, bound: float = bound) -> Any:
                if getattr(_local, "bounded", False):
                    raw = original()
                    try:  # the user's own, stricter setting wins
                        if raw is not None and float(raw) < bound:
                            return raw
                    except ValueError:
                        pass
                    return str(bound)
                return original()

            var.get_raw = get_raw
        _install_switches(env)
        _installed = True


def _install_switches(env: Any) -> None:
    """Give each of MLflow's ``_SWITCHES`` a ``get`` that answers cliptrack's value inside
    ``bounded_requests`` and the user's setting elsewhere."""
    for name, inside in _SWITCHES.items():
        switch: Any = getattr(env, name)
        original_switch = switch.get

        def switch_get(original_switch: Any = original_switch, inside: bool = inside) -> Any:
            return inside if getattr(_local, "bounded", False) else original_switch()

        switch.get = switch_get


@contextlib.contextmanager
def bounded_requests(reads: bool = False) -> Iterator[None]:
    """MLflow requests made on this thread inside the block use cliptrack's bounds (see above):
    the tracker's (``REQUEST_TIMEOUT_S`` per attempt), or with ``reads`` a reader's (connect within
    ``READ_CONNECT_TIMEOUT_S``, a reply within ``read_timeout_s()``); both retry twice."""
    _install()
    previous = (getattr(_local, "bounded", False), getattr(_local, "reads", False))
    _local.bounded, _local.reads = True, reads
    try:
        yield
    finally:
        _local.bounded, _local.reads = previous


def installed_version() -> str:
    """The installed MLflow's version string."""
    return metadata.version("mlflow")


def schema_revision() -> str:
    """The alembic revision of the SQL store schema the installed MLflow reads and writes (a store
    at any other revision would be migrated, or refused, by MLflow's ``SqlAlchemyStore``)."""
    from mlflow.store.db.utils import _get_latest_schema_revision

    return str(_get_latest_schema_revision())


def initialize_schema(database_uri: str) -> None:
    """MLflow's tables at its head schema revision in the empty database ``database_uri``: what its
    store does the first time a client opens an empty database (MLflow's private
    ``mlflow.store.db.utils._initialize_tables``: the initial tables, then every migration), on an
    engine of its own, disposed of afterwards (no connection is left open). A sqlite database is
    written without a sync per migration (``PRAGMA synchronous=OFF``): the caller builds it in a
    file of its own and syncs it once, whole (``cliptrack.backends.mlflow.creation``)."""
    import sqlalchemy
    from mlflow.store.db import utils
    from sqlalchemy.pool import NullPool

    engine = sqlalchemy.create_engine(database_uri, poolclass=NullPool)
    if engine.dialect.name == "sqlite":

        def no_sync(connection: Any, _: Any) -> None:
            connection.execute("PRAGMA synchronous=OFF")

        sqlalchemy.event.listen(engine, "connect", no_sync)
    try:
        utils._initialize_tables(engine)
    finally:
        engine.dispose()


def check_supported() -> None:
    """Raise ``UnsupportedVersionError`` unless the installed MLflow is in the verified range."""
    check_version(
        "mlflow",
        installed_version(),
        MINIMUM,
        SUPPORTED_BELOW,
        USES,
        seam="tracking/backends/mlflow/_compat.py",
    )


def validation() -> Any:
    """MLflow's private validation module (metric and param name rules, length limits)."""
    if not _checked:
        check_supported()
        _checked.append(True)
    from mlflow.utils import validation as module

    return module


_checked: list[bool] = []


def metric_key_error(key: str) -> str | None:
    """Why MLflow refuses ``key`` as a metric key, or None when it takes it."""
    return _key_error("_validate_metric_name", key)


def param_key_error(key: str) -> str | None:
    """Why MLflow refuses ``key`` as a param name, or None when it takes it."""
    return _key_error("_validate_param_name", key)


def _key_error(validator: str, key: str) -> str | None:
    """Why MLflow's private ``validator`` (or its key-length bound) refuses ``key``, or None."""
    rules = validation()
    try:
        getattr(rules, validator)(key)
    except Exception as exc:  # noqa: BLE001 - MlflowException or whatever a future version raises
        return message(exc)
    if len(key) > rules.MAX_ENTITY_KEY_LENGTH:
        return f"longer than {rules.MAX_ENTITY_KEY_LENGTH} characters"
    return None


def max_param_value_length() -> int:
    """Characters MLflow keeps of a param value."""
    return int(validation().MAX_PARAM_VAL_LENGTH)


MESSAGE_CHARS = 300
"""Characters of a server's error message cliptrack repeats in an error line."""

_SQL_ECHO = re.compile(r"\[SQL: .*|\[parameters: .*|\(Background on this error at: .*", re.DOTALL)
_AUTOFLUSH = re.compile(r"\(raised as a result of Query-invoked autoflush;[^)]*\)\s*")


def message(exc: BaseException) -> str:
    """An MLflow exception's message on one line, at most ``MESSAGE_CHARS`` characters, without
    the SQL statement and parameters a SQL store's error echoes back (SQLAlchemy's ``[SQL: ...]``,
    ``[parameters: ...]``) and with credentials hidden (``cliptrack.core.secrets.redact``)."""
    text = str(getattr(exc, "message", None) or exc)
    text = _AUTOFLUSH.sub("", _SQL_ECHO.sub("", text))
    text = " ".join(redact(text).split())
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."
