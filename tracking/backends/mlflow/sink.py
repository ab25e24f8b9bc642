"""MLflow sink: one MLflow run per training job, metrics sent with ``MlflowClient.log_batch``.

The embedded default is a local sqlite store, ``sqlite:///mlflow.db`` in the working directory,
unless ``MLFLOW_TRACKING_URI`` or an explicit URI says otherwise; any tracking URI works,
including a remote ``mlflow server`` (``http://host:port``). Metric keys are sent exactly as
given (``:`` and ``/`` survive). Each point's timestamp is its wall time in milliseconds, which the
tracker keeps distinct among the points of one step (``cliptrack.store.stamps``): repeated points with
equal values at one step are distinct rows, each stored once.

MLflow stores NaN as NaN and +/-inf as +/-1.7976931348623157e308 (its sqlite schema cannot hold
infinities); the JSONL log keeps the exact value. Re-sending a batch is harmless: MLflow merges
metric rows identical in (key, value, timestamp, step), which is what makes replay duplicate-free.

The tracking URI is used as given to connect; everything shown or stored (``location``, run.json,
error lines, params) holds it redacted (``cliptrack.core.secrets``: no password, no token). Resuming from
run.json takes the real URI from the sink's own URI or ``MLFLOW_TRACKING_URI`` when it is the same
URI with its secrets (``real_tracking_uri``), and says where to give it otherwise.

Against a remote server cliptrack's own requests are bounded (``_compat_mlflow.bounded_requests``:
2 retries, 5 s per attempt) whatever MLflow's defaults (7 retries, 120 s), so that a dead server is
noticed and reported within seconds; the application's own MLflow calls keep MLflow's settings.
Requests run on the sink's thread, never the training thread.

An experiment the sink creates is tagged ``mlflow.experimentKind = custom_model_development`` so
that ``mlflow ui`` opens it as a training experiment (not a GenAI one). On a local sqlite store its
artifacts go to ``mlartifacts/`` beside the database file (``ARTIFACT_DIR``), not to ``./mlruns``
of whatever directory the training ran in; a server keeps its own artifact default.

Params (the flattened config) and tags are sent until acknowledged (``cliptrack.store.params``), not only
when the run is created: after every (re)open the lane sends what MLflow has not taken. What
MLflow already holds with the same value counts as taken (read back first, never sent twice); a
param it holds with another value is refused by name (MLflow never changes a param's value). A
param MLflow refuses (a bad name, a value over its length limit, a NUL character, which its
PostgreSQL store refuses with an HTTP 500) is refused on its own, named in the summary; the others
are delivered; the whole config stays in run.json. A batch the server refuses is sent again one
entry at a time. A run name or label MLflow cannot store (over 250 / 8000 characters, a NUL) is
made storable (``storable``: cut, NUL written ``\\x00``), with one warning.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from cliptrack.backends.base import Alert, Sink, SinkError, SinkRejected
from cliptrack.backends.mlflow import _compat as compat
from cliptrack.backends.mlflow import creation
from cliptrack.backends.mlflow.experiments import charts_view_tags
from cliptrack.backends.preflight import sqlite_catalog
from cliptrack.core import keys, secrets
from cliptrack.core.text import printable
from cliptrack.core.worst import Worst
from cliptrack.store import worst as worst_store
from cliptrack.store.params import PARAM, TAG
from cliptrack.store.records import Point, RunInfo
from cliptrack.store.stamps import millisecond

LOG = logging.getLogger("cliptrack")

ARTIFACT_DIR = "mlartifacts"
"""Artifact directory, beside the database file, of an experiment the sink creates on a sqlite store."""
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
"""Embedded default store, relative to the working directory at ``open`` time."""

_PERMANENT_CODES = {"INVALID_PARAMETER_VALUE", "BAD_REQUEST", "INVALID_STATE", "RESOURCE_DOES_NOT_EXIST"}

MAX_TAG_VALUE_LENGTH = 8000
"""Characters of a tag value MLflow's SQL stores keep."""
MAX_RUN_NAME_LENGTH = 250
"""Characters of a run name MLflow's SQL stores keep (``runs.name`` is ``VARCHAR(250)``; PostgreSQL
refuses a longer one)."""


def storable(text: str, limit: int, what: str) -> str:
    """``text`` as MLflow's stores can hold it: a NUL written ``\\x00`` (PostgreSQL refuses NUL),
    cut to ``limit`` characters; a change is warned about once, naming ``what``."""
    out = text.replace("\x00", "\\x00")
    if len(out) > limit:
        out = out[: limit - 3] + "..."
    if out != text:
        LOG.warning(
            "MLflow cannot store the %s %r as it is (%d characters%s); it is stored as %r",
            what,
            printable(text[:60]) + ("..." if len(text) > 60 else ""),
            len(text),
            ", a NUL character" if "\x00" in text else "",
            printable(out[:60]) + ("..." if len(out) > 60 else ""),
        )
    return out


def resolve_tracking_uri(uri: str | None) -> str:
    """The explicit URI, else ``MLFLOW_TRACKING_URI``, else the local sqlite default; relative
    sqlite paths made absolute so that ``cliptrack replay`` finds the same store from anywhere."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/") and ":memory:" not in uri:
        uri = prefix + os.path.abspath(uri[len(prefix) :])
    return uri


def real_tracking_uri(recorded: str, given: str | None) -> str:
    """The URI to connect to for a ``recorded`` one (run.json holds it redacted: ``user:***@``,
    ``?token=***``): ``recorded`` when it hides nothing, else ``given`` (the sink's own URI,
    ``--tracking-uri``) or ``MLFLOW_TRACKING_URI`` when it is the same URI with its secrets.
    Raises ``SinkRejected`` saying where to give it when neither is."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    real = secrets.restore(recorded, (given, resolve_tracking_uri(env) if env else None))
    if real is None:
        raise SinkRejected(
            f"run.json stores the MLflow tracking URI without its password or token ({recorded}); "
            "set MLFLOW_TRACKING_URI to the full URI, or pass it (cliptrack replay --tracking-uri URI, "
            "Tracker(sink_options={'mlflow': {'tracking_uri': URI}}))"
        )
    return real


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """``{"a": {"b": 1}}`` -> ``("a.b", "1")``: nested dicts joined with ``.``, values stringified."""
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flatten_config(value, name + ".")
        else:
            yield name, str(value)


class MlflowSink(Sink):
    """Logs to MLflow; ``tracking_uri=None`` means the default above, ``experiment=None`` the run's."""

    name = "mlflow"

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None) -> None:
        compat.validation()  # imported here, on the constructing thread, once
        import mlflow.tracking  # noqa: F401 - the client's modules too, before the tracker freezes the heap

        self.tracking_uri = resolve_tracking_uri(tracking_uri)
        self.experiment = experiment
        self.mlflow_run_id: str | None = None
        self.holds_nothing = False
        """True once ``open`` created the MLflow run: the store holds none of its points yet."""
        self._client: Any = None
        self._worst_tagged = False
        """Whether this sink set the run's ``worst_store.TAG`` (after its first table)."""

    @classmethod
    def from_spec(cls, argument: str | None, options: Mapping[str, Any]) -> MlflowSink:
        """``"mlflow"`` (the ``tracking_uri`` option or the default), ``"mlflow:<URI>"`` or a bare URI;
        the ``experiment`` option names the experiment (``Tracker(sink_options={"mlflow": {...}})``,
        else the tracker's ``experiment``)."""
        return cls(argument or options.get("tracking_uri"), options.get("experiment"))

    @classmethod
    def from_state(cls, state: Mapping[str, Any], **overrides: Any) -> MlflowSink:
        """Rebuilt for replay: ``overrides["tracking_uri"]`` (``--tracking-uri``) or the recorded URI,
        its secrets restored from ``MLFLOW_TRACKING_URI`` (run.json holds it redacted)."""
        recorded = state.get("tracking_uri")
        uri = overrides.get("tracking_uri") or (real_tracking_uri(recorded, None) if recorded else None)
        return cls(uri, state.get("experiment"))

    @property
    def location(self) -> str:
        run = self.mlflow_run_id or "(not created yet)"
        return f"mlflow {secrets.redact(self.tracking_uri)} experiment {self.experiment!r} run {run}"

    def settings(self) -> dict[str, Any]:
        """What replay needs to reach this store before any run was created."""
        return {"tracking_uri": self.tracking_uri, "experiment": self.experiment}

    def check_key(self, key: str) -> None:
        """Refuse keys MLflow refuses (bad characters, non-normal paths, > 250 characters)."""
        error = compat.metric_key_error(key)
        if error is not None:
            shown = key if len(key) <= 300 else f"{key[:60]}... ({len(key)} characters)"
            raise ValueError(f"MLflow refuses metric key {shown!r}: {error}")

    def open(self, run: RunInfo, state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        from mlflow import MlflowClient

        state = dict(state or {})
        if state.get("tracking_uri"):  # recorded redacted: the real one is this sink's or the environment's
            self.tracking_uri = real_tracking_uri(state["tracking_uri"], self.tracking_uri)
        self.experiment = self.experiment or state.get("experiment") or run.experiment
        try:
            with compat.bounded_requests():
                with creation.creating(self.tracking_uri):  # a new store: one process migrates it
                    client = MlflowClient(tracking_uri=self.tracking_uri)
                run_id = self._recorded_run(client, state.get("mlflow_run_id")) or self._find_run(client, run)
                if run_id is None:
                    experiment_id = self._experiment_id(client)
                    created = client.create_run(
                        experiment_id,
                        start_time=int(run.started * 1000),
                        tags=self._tags(run),
                        run_name=storable(run.run_name, MAX_RUN_NAME_LENGTH, "run name"),
                    )
                    run_id = created.info.run_id
                    self.holds_nothing = True  # params are sent by the lane (send_attributes)
        except Exception as exc:
            what = f"could not open the MLflow run at {self.tracking_uri}"
            stuck = _left_mid_migration(self.tracking_uri)
            raise (SinkError(f"{what}: the store {stuck}") if stuck else _classify(exc, what)) from exc
        self._client = client
        self.mlflow_run_id = run_id
        return {"tracking_uri": self.tracking_uri, "experiment": self.experiment, "mlflow_run_id": run_id}

    def _recorded_run(self, client: Any, run_id: str | None) -> str | None:
        """The recorded MLflow run, when the store still has it; None when it does not (a store
        emptied or replaced: the run is then found by its cliptrack tag, or created anew)."""
        if not run_id:
            return None
        try:
            client.get_run(run_id)
        except Exception as exc:
            if getattr(exc, "error_code", None) != "RESOURCE_DOES_NOT_EXIST":
                raise
            LOG.warning(
                "MLflow run %s is not in %s (an emptied or new store): the run is created there "
                "again and every point is sent",
                run_id,
                printable(self.tracking_uri),
            )
            return None
        return run_id

    def delivered(self, run: RunInfo, journal: Iterable[tuple[Point, int]]) -> int | None:
        """0 when ``open`` had to create the MLflow run (the store holds none of its points);
        otherwise ``None``: the acknowledgements are trusted (a re-sent row is merged by the store)."""
        return 0 if self.holds_nothing else None

    def _tags(self, run: RunInfo) -> dict[str, str]:
        """The run's tags: its kind, its cliptrack id and its label (made storable)."""
        tags = {keys.TAG_RUN_KIND: keys.RUN_KIND_TRAINING, keys.TAG_RUN_ID: run.run_id}
        if run.backend_label is not None:
            limit = compat.validation().MAX_TAG_VAL_LENGTH
            tags[keys.TAG_BACKEND] = storable(run.backend_label, limit, "backend label")
        return tags

    def attributes(self, run: RunInfo) -> dict[str, str]:
        """The flattened config as params (``param:<key>``, credentials in values redacted:
        ``cliptrack.core.secrets``) and the run's tags (``tag:<key>``)."""
        out = {PARAM + key: secrets.redact(value) for key, value in flatten_config(run.config)}
        out.update((TAG + key, value) for key, value in self._tags(run).items())
        return out

    def send_attributes(self, attributes: Mapping[str, str]) -> dict[str, str]:
        """Send params and tags to the open run: what MLflow refuses by its rules is refused here
        (not sent); what the run already holds with the same value is taken without sending; a
        param it holds with another value is refused; the rest goes in one batch, and entry by
        entry when the server refuses the batch. Returns the refused, name -> short reason."""
        if self._client is None or self.mlflow_run_id is None:
            raise SinkError("MLflow run is not open")
        wanted, refused = _entries(attributes)
        try:
            with compat.bounded_requests():
                if wanted:
                    refused.update(self._held_already(wanted))
                if wanted:
                    self._log(list(wanted.values()))
        except SinkRejected:  # the server refused the batch: each entry on its own
            with compat.bounded_requests():
                for name, entry in wanted.items():
                    try:
                        self._log([entry])
                    except SinkRejected as exc:
                        refused[name] = str(exc)
        except SinkError:
            raise
        except Exception as exc:
            raise _classify(exc, f"could not send params and tags to {self.tracking_uri}") from exc
        return refused

    def _held_already(self, wanted: dict[str, Any]) -> dict[str, str]:
        """Take out of ``wanted`` what the run already holds (read back): with the same value it is
        taken; a param with another value is refused (returned, name -> why)."""
        from mlflow.entities import Param

        held = self._client.get_run(self.mlflow_run_id).data
        refused = {}
        for name, entry in list(wanted.items()):
            param = isinstance(entry, Param)
            stored = (held.params if param else held.tags).get(entry.key)
            if stored == entry.value:
                del wanted[name]
            elif stored is not None and param:
                del wanted[name]
                refused[name] = (
                    f"already logged with another value ({_shown(stored)}); MLflow never changes a param"
                )
        return refused

    def _log(self, entries: list[Any]) -> None:
        """One ``log_batch`` of params and tags; a refusal is a ``SinkRejected`` with MLflow's reason."""
        from mlflow.entities import Param

        try:
            self._client.log_batch(
                self.mlflow_run_id,
                params=[e for e in entries if isinstance(e, Param)],
                tags=[e for e in entries if not isinstance(e, Param)],
            )
        except Exception as exc:
            code = getattr(exc, "error_code", None)
            if code in _PERMANENT_CODES:
                raise SinkRejected(f"{code}: {_message(exc)}") from exc
            raise _classify(exc, f"could not send params and tags to {self.tracking_uri}") from exc

    def _experiment_id(self, client: Any) -> str:
        found = client.get_experiment_by_name(self.experiment)
        if found is not None:
            return str(found.experiment_id)
        directory = compat.artifacts_beside(self.tracking_uri, ARTIFACT_DIR)
        try:
            return str(
                client.create_experiment(
                    self.experiment,
                    artifact_location=None if directory is None else directory.as_uri(),
                    tags={compat.EXPERIMENT_KIND_TAG: compat.TRAINING_EXPERIMENT_KIND, **charts_view_tags()},
                )
            )
        except Exception:  # created concurrently by another process
            found = client.get_experiment_by_name(self.experiment)
            if found is None:
                raise
            return str(found.experiment_id)

    def _find_run(self, client: Any, run: RunInfo) -> str | None:
        """A run created earlier for this cliptrack run (its creation was not recorded locally)."""
        found = client.get_experiment_by_name(self.experiment)
        if found is None:
            return None
        runs = client.search_runs(
            [found.experiment_id], filter_string=f"tags.`{keys.TAG_RUN_ID}` = '{run.run_id}'", max_results=1
        )
        return runs[0].info.run_id if runs else None

    def write(self, points: Sequence[Point]) -> None:
        from mlflow.entities import Metric

        if self._client is None or self.mlflow_run_id is None:
            raise SinkError("MLflow run is not open")
        metrics = [
            Metric(key, value, millisecond(point.wall_time), point.step)
            for point in points
            for key, value in point.metrics.items()
        ]
        try:
            with compat.bounded_requests():
                self._client.log_batch(self.mlflow_run_id, metrics=metrics, synchronous=True)
        except Exception as exc:
            raise _classify(exc, f"MLflow log_batch to {self.tracking_uri} failed") from exc

    def alert(self, alert: Alert) -> None:
        """A live watch's breach: the tag ``watch_tag(key)`` (the alert's text: the last breach of
        the key) and the metric ``watch_metric(key)`` = 1 at the breach's step."""
        from mlflow.entities import Metric, RunTag

        if self._client is None or self.mlflow_run_id is None:
            raise SinkError("MLflow run is not open")
        tag = RunTag(watch_tag(alert.key), storable(alert.text, MAX_TAG_VALUE_LENGTH, "alert text"))
        metric = Metric(watch_metric(alert.key), 1.0, int(time.time() * 1000), alert.step)
        try:
            with compat.bounded_requests():
                self._client.log_batch(self.mlflow_run_id, metrics=[metric], tags=[tag], synchronous=True)
        except Exception as exc:
            raise _classify(exc, f"MLflow alert to {self.tracking_uri} failed") from exc

    def log_worst(self, worst: Worst) -> None:
        """A step's worst sequences as the artifact ``worst_store.artifact_path(step)``: MLflow's
        table layout (``{"columns": [...], "data": [...]}``) written with ``log_dict``, which replaces
        the file, so a table sent again (a retry) stays one table. ``log_table`` is not used: it
        appends to an existing file (a retry would double the rows) and lists every file in one run
        tag, which a long run would outgrow."""
        if self._client is None or self.mlflow_run_id is None:
            raise SinkError("MLflow run is not open")
        table = {"columns": list(worst_store.TABLE_COLUMNS), "data": worst_store.table_rows(worst)}
        try:
            with compat.bounded_requests():
                self._client.log_dict(self.mlflow_run_id, table, worst_store.artifact_path(worst.step))
                if not self._worst_tagged:  # readers list the artifacts only once this is set
                    self._client.set_tag(self.mlflow_run_id, worst_store.TAG, "1", synchronous=True)
                    self._worst_tagged = True
        except Exception as exc:
            raise _classify(exc, f"MLflow artifact to {self.tracking_uri} failed") from exc

    def close(self, status: str) -> None:
        if self._client is None or self.mlflow_run_id is None:
            raise SinkError("MLflow run is not open")
        try:
            with compat.bounded_requests():
                self._client.set_terminated(self.mlflow_run_id, status=status)
        except Exception as exc:
            raise _classify(exc, "could not mark the MLflow run ended") from exc


def watch_tag(key: str) -> str:
    """The MLflow tag holding the last breach of the watched ``key``."""
    return f"{keys.TAG_WATCH}.{key}"


def watch_metric(key: str) -> str:
    """The MLflow metric marking each breach of the watched ``key`` (1 at the breach's step)."""
    return f"watch.{key}.breach"


def _message(exc: BaseException) -> str:
    return compat.message(exc)


def _shown(value: str) -> str:
    """A param value for a one-line reason: printable, at most 60 characters."""
    return repr(printable(value if len(value) <= 60 else value[:57] + "..."))


def _entries(attributes: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """``attributes`` as MLflow entities (name -> ``Param`` / ``RunTag``), and the params MLflow
    would refuse by its rules (name -> why), left out."""
    from mlflow.entities import Param, RunTag

    entries: dict[str, Any] = {}
    refused: dict[str, str] = {}
    for name, value in attributes.items():
        kind, _, key = name.partition(":")
        if kind + ":" != PARAM:
            entries[name] = RunTag(key, value)
        elif (why := _param_error(key, value)) is not None:
            refused[name] = why
        else:
            entries[name] = Param(key, value)
    return entries, refused


def _param_error(key: str, value: str) -> str | None:
    """Why MLflow would refuse the param ``key`` = ``value`` (bad name, over-long value, a NUL
    character, which MLflow's PostgreSQL store refuses), or None."""
    error = compat.param_key_error(key)
    if error is not None:
        return error
    if "\x00" in key or "\x00" in value:
        return "a NUL character (MLflow's PostgreSQL store refuses it)"
    limit = compat.max_param_value_length()
    if len(value) > limit:
        return f"value of {len(value)} characters, over MLflow's limit of {limit}"
    return None


def _left_mid_migration(tracking_uri: str) -> str | None:
    """Why the local sqlite store of ``tracking_uri`` cannot be opened when an interrupted
    migration left it behind, with its repair (``creation``); None otherwise, or for another store."""
    database = creation.database_file(tracking_uri)
    if database is None or not database.is_file():
        return None
    try:
        tables, revision = sqlite_catalog(database)
    except sqlite3.Error:
        return None
    if "alembic_version" not in tables or revision == compat.schema_revision():
        return None
    stuck = creation.mid_migration(tables, revision)
    if stuck is None:
        return None
    shown = secrets.redact(tracking_uri)
    return f"was left mid-migration ({stuck}); {creation.repair(shown, database, tables)}"


def _classify(exc: BaseException, what: str) -> SinkError:
    code = getattr(exc, "error_code", None)
    if code in _PERMANENT_CODES:
        return SinkRejected(f"{what}: {code}: {_message(exc)}")
    return SinkError(f"{what}: {type(exc).__name__}: {_message(exc)}")
