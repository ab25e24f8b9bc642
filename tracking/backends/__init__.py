"""Tracking backends: one folder each, declared once in one registry, imported only when used.

==============================================  =================================================
spec                                            sink
==============================================  =================================================
``"mlflow"``, ``"mlflow:<tracking URI>"``       MLflow at ``tracking_uri`` / ``MLFLOW_TRACKING_URI``
                                                / ``sqlite:///mlflow.db``
``"sqlite:///x.db"``, ``"http://host:5000"``,   MLflow at that tracking URI (its ``schemes``)
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
flags) and its worst-sequence table reader where it has them; ``registry`` declares each once, with
its ``panels`` command where it has one (``BACKENDS``, ``register_backend``), and serves the tracker
(``make_sink``), replay (``sink_from_state``), ``load_runs``, ``load_worst`` and ``list_runs``.
Backends stand on ``cliptrack.core`` and ``cliptrack.store`` alone: a reader hands back a
``cliptrack.store.frame.RunSet``. See docs/ARCHITECTURE.md, "Adding a backend".
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
    Backend,
    is_jsonl,
    jsonl_root,
    make_sink,
    register_backend,
    sink_class,
    sink_from_state,
    sink_names,
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
    from cliptrack.backends.load import load_runs, load_worst

__all__ = [
    "BACKENDS",
    "EXIT_CODES",
    "FAILED",
    "FINISHED",
    "KILLED",
    "RUNNING",
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
    "load_runs",
    "load_worst",
    "make_sink",
    "register_backend",
    "sink_class",
    "sink_from_state",
    "sink_names",
]

_HOMES = {
    "RunChoiceWarning": "cliptrack.backends.catalog",
    "RunEntry": "cliptrack.backends.catalog",
    "RunNotFoundError": "cliptrack.backends.catalog",
    "latest_by_backend": "cliptrack.backends.catalog",
    "list_runs": "cliptrack.backends.catalog",
    "load_runs": "cliptrack.backends.load",
    "load_worst": "cliptrack.backends.load",
}
"""Public name -> the module that holds it, imported on first use (the loaders import numpy/pandas)."""


def __getattr__(attribute: str) -> Any:
    """The listing and the loaders, imported on use."""
    return lazy_attribute(__name__, _HOMES, attribute)
