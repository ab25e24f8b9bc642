"""Tracking backends behind one base class and one registry, imported only when used.

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
``"<name>"``, ``"<name>:<argument>"``           the sink registered as ``<name>`` in ``SINKS``
``"jsonl"``, ``"jsonl:/some/dir"``,             not a sink: names the spool directory (the JSONL
``"file:///some/dir"``                          run directory is always written)
a ``Sink`` instance                             itself
==============================================  =================================================

The registry (``SINKS``: name -> "module:Class") is the one place a sink name is resolved, by the
tracker (``make_sink``, from a spec: ``Class.from_spec(argument, options)``) and by replay
(``sink_from_state``, from run.json: ``Class.from_state``). Adding a sink is one module and one
entry here (or ``register_sink`` from the application); see docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

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

SINKS: dict[str, str] = {
    "mlflow": "cliptrack.backends.mlflow.sink:MlflowSink",
    "wandb": "cliptrack.backends.wandb.sink:WandbSink",
}
"""Sink name -> ``module:Class`` (a ``Sink`` subclass), imported on first use."""

SCHEMES: dict[str, str] = {
    scheme: "mlflow" for scheme in ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")
}
"""URI scheme -> the registered sink a bare URI of that scheme names (the whole URI its argument)."""

MLFLOW_SCHEMES = tuple(scheme for scheme, name in SCHEMES.items() if name == "mlflow")

_EXTRAS = {"mlflow": "mlflow", "wandb": "wandb"}

__all__ = [
    "EXIT_CODES",
    "FAILED",
    "FINISHED",
    "KILLED",
    "RUNNING",
    "SCHEMES",
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
    "register_sink",
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


def register_sink(name: str, target: str | type[Sink]) -> None:
    """Register a sink under ``name``: ``"module:Class"`` (imported on first use) or the class
    itself (which must then be importable as ``module:Class`` for replay to rebuild it)."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"sink name {name!r} must be a non-empty string without ':'")
    if isinstance(target, type):
        if not issubclass(target, Sink):
            raise ValueError(f"sink {name!r}: {target.__name__} does not derive from cliptrack.backends.Sink")
        target = f"{target.__module__}:{target.__qualname__}"
    if target.count(":") != 1:
        raise ValueError(f"sink {name!r}: {target!r} is not 'module:Class'")
    SINKS[name] = target


def make_sink(spec: Any, **options: Any) -> Sink:
    """The sink a spec names (see the table above); JSONL specs name the spool and are refused here.

    ``options`` are the tracker's vendor options, handed to the sink class's ``from_spec``:
    ``tracking_uri``, ``experiment`` (MLflow); ``wandb_project``, ``wandb_mode``, ``wandb_dir`` (W&B).
    """
    if isinstance(spec, Sink):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"backend {spec!r} is neither a name, a URI nor a Sink")
    name, colon, argument = spec.partition(":")
    if name in SINKS:
        return sink_class(name).from_spec(argument if colon else None, options)
    scheme = urlparse(spec).scheme.split("+")[0]
    target = SCHEMES.get(scheme) or SCHEMES.get(spec)
    if target is not None:
        return sink_class(target).from_spec(spec, options)
    raise ValueError(
        f"unknown tracking backend {spec!r}: use a registered sink {sorted(SINKS)} (optionally "
        f"'name:argument'), 'jsonl', an MLflow tracking URI ({', '.join(s + '://' for s in MLFLOW_SCHEMES)}) "
        "or 'jsonl:/dir'"
    )


def sink_from_state(name: str, state: Mapping[str, Any], **overrides: Any) -> Sink:
    """The sink ``name`` rebuilt from the replay state recorded in run.json (``overrides``, such
    as ``tracking_uri``, replace recorded options)."""
    return sink_class(name).from_state(state, **overrides)


_CLASSES = {"MlflowSink": "mlflow", "WandbSink": "wandb"}


def __getattr__(attribute: str) -> type[Sink]:
    """``from cliptrack.backends import MlflowSink, WandbSink``: the registered classes, imported on use."""
    if attribute in _CLASSES:
        return sink_class(_CLASSES[attribute])
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")
