"""Tracking backends behind one protocol, selected by name or URI, imported only when used.

==============================================  =================================================
spec                                            sink
==============================================  =================================================
``"mlflow"``                                    MLflow at ``tracking_uri`` / ``MLFLOW_TRACKING_URI``
                                                / ``sqlite:///mlflow.db``
``"sqlite:///x.db"``, ``"http://host:5000"``,   MLflow at that tracking URI
``"https://…"``, ``"postgresql://…"``,
``"mysql://…"``, ``"databricks"``
``"wandb"``, ``"wandb:project"``,               W&B (online with credentials, else offline)
``"wandb:entity/project"``
``"jsonl"``, ``"jsonl:/some/dir"``,             the JSONL run directory (under ``spool_dir`` unless
``"file:///some/dir"``                          a directory is given)
a ``Sink`` instance                             itself
==============================================  =================================================
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlparse

from tracking.sinks.base import (
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

MLFLOW_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")

__all__ = [
    "EXIT_CODES",
    "FAILED",
    "FINISHED",
    "KILLED",
    "RUNNING",
    "PartialWrite",
    "Point",
    "RunInfo",
    "Sink",
    "SinkError",
    "SinkRejected",
    "jsonl_root",
    "make_sink",
]


def jsonl_root(spec: Any) -> str | None:
    """The directory a ``jsonl`` spec names (``None``: the tracker's ``spool_dir``); raises if not jsonl."""
    if not isinstance(spec, str):
        raise ValueError(f"{spec!r} is not a JSONL backend spec")
    if spec == "jsonl":
        return None
    if spec.startswith("jsonl:"):
        rest = spec[len("jsonl:") :]
        return rest[2:] if rest.startswith("//") else rest
    if spec.startswith("file:"):
        return urlparse(spec).path or None
    raise ValueError(f"{spec!r} is not a JSONL backend spec")


def is_jsonl(spec: Any) -> bool:
    return isinstance(spec, str) and (spec == "jsonl" or spec.startswith(("jsonl:", "file:")))


def make_sink(spec: Any, **options: Any) -> Any:
    """The remote sink a spec names (see the table above); JSONL specs are handled by the tracker.

    ``options``: ``tracking_uri``, ``experiment`` (MLflow), ``wandb_project``, ``wandb_mode``,
    ``wandb_dir`` (W&B). A missing optional dependency is reported with the extra to install.
    """
    try:
        return _make_sink(spec, **options)
    except ModuleNotFoundError as exc:
        extra = "wandb" if "wandb" in str(exc.name) else "mlflow"
        raise ModuleNotFoundError(
            f"tracking backend {spec!r} needs {exc.name!r}: pip install 'cliptrack[{extra}]'", name=exc.name
        ) from exc


def _make_sink(
    spec: Any,
    *,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    wandb_project: str | None = None,
    wandb_mode: str | None = None,
    wandb_dir: str | os.PathLike[str] | None = None,
) -> Any:
    if not isinstance(spec, str):
        if all(hasattr(spec, attr) for attr in ("name", "open", "write", "close", "check_key")):
            return spec
        raise ValueError(f"backend {spec!r} is neither a name, a URI nor a Sink")
    if spec == "mlflow":
        from tracking.sinks.mlflow_sink import MlflowSink

        return MlflowSink(tracking_uri, experiment)
    if spec == "wandb" or spec.startswith("wandb:"):
        from tracking.sinks.wandb_sink import WandbSink

        project, entity = wandb_project, None
        rest = spec[len("wandb:") :].strip("/") if spec != "wandb" else ""
        if rest:
            entity, _, project = rest.rpartition("/")
        return WandbSink(project, entity=entity or None, mode=wandb_mode, dir=wandb_dir)
    scheme = urlparse(spec).scheme.split("+")[0]
    if scheme in MLFLOW_SCHEMES or spec == "databricks":
        from tracking.sinks.mlflow_sink import MlflowSink

        return MlflowSink(spec, experiment)
    raise ValueError(
        f"unknown tracking backend {spec!r}: use 'mlflow', 'wandb', 'jsonl', an MLflow tracking URI "
        f"({', '.join(s + '://' for s in MLFLOW_SCHEMES)}) or 'jsonl:/dir'"
    )
