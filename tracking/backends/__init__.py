"""Tracking backends: one folder each, declared once in one registry, imported only when used.

==============================================  =================================================
spec                                            sink
==============================================  =================================================
``"mlflow"``, ``"mlflow:<tracking URI>"``       MLflow at ``tracking_uri`` / ``MLFLOW_TRACKING_URI``
                                                / ``sqlite:///mlflow.db``
``"sqlite:///x.db"``, ``"http://host:5000"``,   MLflow at that tracking URI (``SCHEMES``)
``"https://…"``, ``"postgresql://…"``,
``"mysql://…"``, ``"databricks"``
``"wandb"``, ``"wandb:project"``,               W&B (online with credentials, else offline)
``"wandb:entity/project"``
``"csv"``, ``"csv:/some/dir"``                  one CSV file per run in that directory
``"<name>"``, ``"<name>:<argument>"``           the sink of the backend registered as ``<name>``
``"jsonl"``, ``"jsonl:/some/dir"``,             not a sink: names the spool directory (the JSONL
``"file:///some/dir"``                          run directory is always written)
a ``Sink`` instance                             itself
==============================================  =================================================

Each backend is a folder (``mlflow/``, ``wandb/``, ``jsonl/``, ``csv/``) holding its sink, its
reader (``load_runs``), its listing (``cliptrack runs``), its options (the command lines' store
flags) and its panels where it has them; ``registry`` declares each once (``BACKENDS``,
``register_backend``) and serves the tracker (``make_sink``), replay (``sink_from_state``),
``load_runs`` and ``list_runs``. See docs/ARCHITECTURE.md, "Adding a backend".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cliptrack.backends.base import (
    EXIT_CODES,
    FAILED,
    FINISHED,
    KILLED,
    RUNNING,
    PartialWrite,
    Point,
    RunInfo,
    Sink,
    SinkError,
    SinkRejected,
)
from cliptrack.backends.registry import (
    BACKENDS,
    SCHEMES,
    SINKS,
    Backend,
    is_jsonl,
    jsonl_root,
    make_sink,
    register_backend,
    register_sink,
    sink_class,
    sink_from_state,
)
from cliptrack.core.lazy import lazy_attribute

if TYPE_CHECKING:
    from cliptrack.backends.catalog import (
        RunChoiceWarning,
        RunEntry,
        RunNotFoundError,
        latest_by_backend,
        list_runs,
    )
    from cliptrack.backends.csv.reader import load_csv
    from cliptrack.backends.jsonl.reader import load_jsonl
    from cliptrack.backends.load import load_runs, load_worst
    from cliptrack.backends.mlflow.reader import load_mlflow
    from cliptrack.backends.wandb.reader import load_wandb_offline, load_wandb_online

__all__ = [
    "BACKENDS",
    "EXIT_CODES",
    "FAILED",
    "FINISHED",
    "KILLED",
    "RUNNING",
    "SCHEMES",
    "SINKS",
    "Backend",
    "PartialWrite",
    "Point",
    "RunChoiceWarning",
    "RunEntry",
    "RunInfo",
    "RunNotFoundError",
    "Sink",
    "SinkError",
    "SinkRejected",
    "is_jsonl",
    "jsonl_root",
    "latest_by_backend",
    "list_runs",
    "load_csv",
    "load_jsonl",
    "load_mlflow",
    "load_runs",
    "load_wandb_offline",
    "load_wandb_online",
    "load_worst",
    "make_sink",
    "register_backend",
    "register_sink",
    "sink_class",
    "sink_from_state",
]

_SINK_CLASSES = {"MlflowSink": "mlflow", "WandbSink": "wandb", "CsvSink": "csv"}
"""Class name -> the backend whose sink it is (``from cliptrack.backends import MlflowSink``)."""

_HOMES = {
    "RunChoiceWarning": "cliptrack.backends.catalog",
    "RunEntry": "cliptrack.backends.catalog",
    "RunNotFoundError": "cliptrack.backends.catalog",
    "latest_by_backend": "cliptrack.backends.catalog",
    "list_runs": "cliptrack.backends.catalog",
    "load_csv": "cliptrack.backends.csv.reader",
    "load_jsonl": "cliptrack.backends.jsonl.reader",
    "load_mlflow": "cliptrack.backends.mlflow.reader",
    "load_runs": "cliptrack.backends.load",
    "load_worst": "cliptrack.backends.load",
    "load_wandb_offline": "cliptrack.backends.wandb.reader",
    "load_wandb_online": "cliptrack.backends.wandb.reader",
}
"""Public name -> the module that holds it, imported on first use (readers import numpy/pandas)."""


def __getattr__(attribute: str) -> Any:
    """The registered sink classes and the readers, imported on use."""
    if attribute in _SINK_CLASSES:
        return sink_class(_SINK_CLASSES[attribute])
    return lazy_attribute(__name__, _HOMES, attribute)
