"""MLflow sink: one MLflow run per training job, metrics sent with ``MlflowClient.log_batch``.

The embedded default is a local sqlite store, ``sqlite:///mlflow.db`` in the working directory,
unless ``MLFLOW_TRACKING_URI`` or an explicit URI says otherwise; any tracking URI works,
including a remote ``mlflow server`` (``http://host:port``). Metric keys are sent exactly as
given (``:`` and ``/`` survive). Each point's timestamp is its wall time in milliseconds, which the
tracker keeps distinct among the points of one step (``tracking.stamps``): repeated points with
equal values at one step are distinct rows, each stored once.

MLflow stores NaN as NaN and +/-inf as +/-1.7976931348623157e308 (its sqlite schema cannot hold
infinities); the JSONL log keeps the exact value. Re-sending a batch is harmless: MLflow merges
metric rows identical in (key, value, timestamp, step), which is what makes replay duplicate-free.

Against a remote server cliptrack's own requests are bounded (``_compat_mlflow.bounded_requests``:
2 retries, 5 s per attempt) whatever MLflow's defaults (7 retries, 120 s), so that a dead server is
noticed and reported within seconds; the application's own MLflow calls keep MLflow's settings.
Requests run on the sink's thread, never the training thread.

An experiment the sink creates is tagged ``mlflow.experimentKind = custom_model_development`` so
that ``mlflow ui`` opens it as a training experiment (not a GenAI one). On a local sqlite store its
artifacts go to ``mlartifacts/`` beside the database file (``ARTIFACT_DIR``), not to ``./mlruns``
of whatever directory the training ran in; a server keeps its own artifact default. Config MLflow refuses as
params (bad names, values longer than its limit) is reported once in a warning and listed in
``params_refused``; the whole config stays in run.json.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from tracking import keys
from tracking.records import Point, RunInfo, printable
from tracking.sinks import _compat_mlflow as compat
from tracking.sinks.base import Sink, SinkError, SinkRejected
from tracking.stamps import millisecond

LOG = logging.getLogger("cliptrack")

ARTIFACT_DIR = "mlartifacts"
"""Artifact directory, beside the database file, of an experiment the sink creates on a sqlite store."""
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
"""Embedded default store, relative to the working directory at ``open`` time."""

_PERMANENT_CODES = {"INVALID_PARAMETER_VALUE", "BAD_REQUEST", "INVALID_STATE", "RESOURCE_DOES_NOT_EXIST"}


def resolve_tracking_uri(uri: str | None) -> str:
    """The explicit URI, else ``MLFLOW_TRACKING_URI``, else the local sqlite default; relative
    sqlite paths made absolute so that ``cliptrack replay`` finds the same store from anywhere."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/") and ":memory:" not in uri:
        uri = prefix + os.path.abspath(uri[len(prefix) :])
    return uri


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
        self.params_refused: dict[str, str] = {}
        self.holds_nothing = False
        """True once ``open`` created the MLflow run: the store holds none of its points yet."""
        self._client: Any = None

    @classmethod
    def from_spec(cls, argument: str | None, options: Mapping[str, Any]) -> MlflowSink:
        """``"mlflow"`` (the ``tracking_uri`` option or the default), ``"mlflow:<URI>"`` or a bare URI."""
        return cls(argument or options.get("tracking_uri"), options.get("experiment"))

    @classmethod
    def from_state(cls, state: Mapping[str, Any], **overrides: Any) -> MlflowSink:
        return cls(overrides.get("tracking_uri") or state.get("tracking_uri"), state.get("experiment"))

    @property
    def location(self) -> str:
        run = self.mlflow_run_id or "(not created yet)"
        return f"mlflow {self.tracking_uri} experiment {self.experiment!r} run {run}"

    def settings(self) -> dict[str, Any]:
        """What replay needs to reach this store before any run was created."""
        return {"tracking_uri": self.tracking_uri, "experiment": self.experiment}

    def check_key(self, key: str) -> None:
        """Refuse keys MLflow refuses (bad characters, non-normal paths, > 250 characters)."""
        error = compat.metric_key_error(key)
        if error is not None:
            raise ValueError(f"MLflow refuses metric key {key!r}: {error}")

    def open(self, run: RunInfo, state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        from mlflow import MlflowClient

        state = dict(state or {})
        self.tracking_uri = state.get("tracking_uri") or self.tracking_uri
        self.experiment = self.experiment or state.get("experiment") or run.experiment
        try:
            with compat.bounded_requests():
                client = MlflowClient(tracking_uri=self.tracking_uri)
                run_id = self._recorded_run(client, state.get("mlflow_run_id")) or self._find_run(client, run)
                if run_id is None:
                    experiment_id = self._experiment_id(client)
                    tags = {
                        keys.TAG_RUN_KIND: keys.RUN_KIND_TRAINING,
                        keys.TAG_RUN_ID: run.run_id,
                    }
                    if run.backend_label is not None:
                        tags[keys.TAG_BACKEND] = run.backend_label
                    created = client.create_run(
                        experiment_id, start_time=int(run.started * 1000), tags=tags, run_name=run.run_name
                    )
                    run_id = created.info.run_id
                    params = self._params(run.config)
                    if params:
                        client.log_batch(run_id, params=params)
                    self.holds_nothing = True
        except Exception as exc:
            raise _classify(exc, f"could not open the MLflow run at {self.tracking_uri}") from exc
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

    def _params(self, config: Mapping[str, Any]) -> list[Any]:
        """Config as MLflow params: flattened and stringified. What MLflow would refuse (a bad name)
        or cut (a value over its length limit) is left out, recorded in ``params_refused`` and
        reported in one warning; the full config stays in run.json."""
        from mlflow.entities import Param

        params = []
        limit = compat.max_param_value_length()
        refused: dict[str, str] = {}
        for key, value in flatten_config(config):
            error = compat.param_key_error(key)
            if error is None and len(value) > limit:
                error = f"value of {len(value)} characters, over MLflow's limit of {limit}"
            if error is not None:
                refused[key] = error
                continue
            params.append(Param(key, value))
        if refused:
            self.params_refused.update(refused)
            LOG.warning(
                "MLflow refuses %d config entr%s as params (kept whole in run.json): %s",
                len(refused),
                "y" if len(refused) == 1 else "ies",
                "; ".join(f"{printable(k)!r}: {v}" for k, v in refused.items()),
            )
        return params

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Log more config as params (MLflow refuses changing an already logged param's value)."""
        if self._client is None or self.mlflow_run_id is None:
            raise SinkError("MLflow run is not open")
        params = self._params(config)
        if params:
            with compat.bounded_requests():
                self._client.log_batch(self.mlflow_run_id, params=params)

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
                    tags={compat.EXPERIMENT_KIND_TAG: compat.TRAINING_EXPERIMENT_KIND},
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

    def close(self, status: str) -> None:
        if self._client is None or self.mlflow_run_id is None:
            raise SinkError("MLflow run is not open")
        try:
            with compat.bounded_requests():
                self._client.set_terminated(self.mlflow_run_id, status=status)
        except Exception as exc:
            raise _classify(exc, "could not mark the MLflow run ended") from exc


def _message(exc: BaseException) -> str:
    return compat.message(exc)


def _classify(exc: BaseException, what: str) -> SinkError:
    code = getattr(exc, "error_code", None)
    if code in _PERMANENT_CODES:
        return SinkRejected(f"{what}: {code}: {_message(exc)}")
    return SinkError(f"{what}: {type(exc).__name__}: {_message(exc)}")
