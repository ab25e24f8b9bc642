"""Tracking backends behind one base class and one registry, imported only when used.

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
``"jsonl"``, ``"jsonl:/some/dir"``,             not a sink: names the spool directory (the JSONL
``"file:///some/dir"``                          run directory is always written)
a ``Sink`` instance                             itself
==============================================  =================================================

The registry (``SINKS``: name -> "module:Class") is the one place a sink name is resolved, by the
tracker (``make_sink``, from a spec) and by replay (``sink_from_state``, from run.json).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
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

SINKS: dict[str, str] = {
    "mlflow": "tracking.sinks.mlflow_sink:MlflowSink",
    "wandb": "tracking.sinks.wandb_sink:WandbSink",
}
"""Sink name -> ``module:Class`` (a ``Sink`` subclass), imported on first use."""

_EXTRAS = {"mlflow": "mlflow", "wandb": "wandb"}

__all__ = [
    "EXIT_CODES",
    "FAILED",
    "FINISHED",
    "KILLED",
    "RUNNING",
    "SINKS",
    "PartialWrite",
    "Point",
    "RunInfo",
    "Sink",
    "SinkError",
    "SinkRejected",
    "is_jsonl",
    "jsonl_root",
    "make_sink",
    "sink_class",
    "sink_from_state",
]


def sink_class(name: str) -> type[Sink]:
    """The registered sink class called ``name``; ValueError listing the names otherwise, and
    ModuleNotFoundError naming the extra to install when its dependency is missing."""
    target = SINKS.get(name)
    if target is None:
        raise ValueError(f"unknown sink {name!r}: registered sinks are {sorted(SINKS)}")
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"tracking backend {name!r} needs {exc.name!r}: pip install 'cliptrack[{_EXTRAS.get(name, name)}]'",
            name=exc.name,
        ) from exc
    cls: type[Sink] = getattr(module, class_name)
    return cls


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


def make_sink(
    spec: Any,
    *,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    wandb_project: str | None = None,
    wandb_mode: str | None = None,
    wandb_dir: str | os.PathLike[str] | None = None,
) -> Sink:
    """The sink a spec names (see the table above); JSONL specs name the spool and are refused here.

    ``tracking_uri``, ``experiment``: MLflow; ``wandb_project``, ``wandb_mode``, ``wandb_dir``: W&B.
    """
    if not isinstance(spec, str):
        if isinstance(spec, Sink):
            return spec
        raise ValueError(f"backend {spec!r} is neither a name, a URI nor a Sink")
    if spec == "mlflow":
        return sink_class("mlflow")(tracking_uri, experiment)  # type: ignore[call-arg]
    if spec == "wandb" or spec.startswith("wandb:"):
        project, entity = wandb_project, None
        rest = spec[len("wandb:") :].strip("/") if spec != "wandb" else ""
        if rest:
            entity, _, project = rest.rpartition("/")
        return sink_class("wandb")(project, entity=entity or None, mode=wandb_mode, dir=wandb_dir)  # type: ignore[call-arg]
    scheme = urlparse(spec).scheme.split("+")[0]
    if scheme in MLFLOW_SCHEMES or spec == "databricks":
        return sink_class("mlflow")(spec, experiment)  # type: ignore[call-arg]
    raise ValueError(
        f"unknown tracking backend {spec!r}: use 'mlflow', 'wandb', 'jsonl', an MLflow tracking URI "
        f"({', '.join(s + '://' for s in MLFLOW_SCHEMES)}) or 'jsonl:/dir'"
    )


def sink_from_state(name: str, state: Mapping[str, Any], **overrides: Any) -> Sink:
    """The sink ``name`` rebuilt from the replay state recorded in run.json (``overrides``, such
    as ``tracking_uri``, replace recorded options)."""
    return sink_class(name).from_state(state, **overrides)
