"""The one registry of tracking backends: each declared once, with where its parts live.

A ``Backend`` names a backend, the URI schemes that reach it, and where its parts are, as
``"module:attribute"`` targets imported on first use (so a backend's vendor library is imported
only when that backend is used):

- ``sink``: a ``Sink`` subclass (the tracker writes through it; replay rebuilds it);
- ``reader``: ``read(refs, **store) -> RunSet``, the runs ``cliptrack compare`` and ``load_runs`` read;
- ``listing``: ``list_runs(*, include_comparisons, **store) -> list[RunEntry]``, for ``cliptrack runs``;
- ``options``: a module holding ``STORE_OPTIONS`` (the flags that name its store for reading) and
  ``TARGET_OPTIONS`` (the flags that re-target its sink for replay), tuples of
  ``cliptrack.backends.options.StoreOption``; it must import nothing heavy (``--help`` reads it).

Every consumer goes through this registry: the tracker (``make_sink``), replay
(``sink_from_state``, ``target_options``), ``load_runs`` (``reader``), ``cliptrack runs``
(``listing``) and the command lines' store flags (``store_options``). Adding a backend is one folder
and one ``register_backend`` call (or one entry in ``BACKENDS``); see docs/ARCHITECTURE.md.

Older spellings stay: ``SINKS`` (name -> ``"module:Class"``, a live view of the sinks declared
here, writable) and ``register_sink``; ``SCHEMES`` (URI scheme -> backend name, read-only).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlparse

from cliptrack.backends.base import Sink

__all__ = [
    "BACKENDS",
    "SCHEMES",
    "SINKS",
    "Backend",
    "backend",
    "is_jsonl",
    "jsonl_root",
    "make_sink",
    "register_backend",
    "register_sink",
    "resolve",
    "sink_class",
    "sink_from_state",
]

Target = Any
"""A part of a backend: ``"module:attribute"`` (imported on first use) or the object itself."""


@dataclass(frozen=True)
class Backend:
    """One backend as declared: ``name`` (the spec ``"<name>"`` / ``"<name>:<argument>"`` and the
    key of a sink's replay state in run.json), ``schemes`` (URI schemes whose bare URIs name it, the
    whole URI its argument), ``sink``, ``reader``, ``listing`` and ``options`` (see the module
    docstring; None where the backend has no such part) and ``extra`` (the pip extra its vendor
    library comes with)."""

    name: str
    schemes: tuple[str, ...] = ()
    sink: Target = None
    reader: Target = None
    listing: Target = None
    options: Target = None
    extra: str | None = None


BACKENDS: dict[str, Backend] = {
    backend.name: backend
    for backend in (
        Backend(
            "mlflow",
            schemes=("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks"),
            sink="cliptrack.backends.mlflow.sink:MlflowSink",
            reader="cliptrack.backends.mlflow.reader:read",
            listing="cliptrack.backends.mlflow.listing:list_runs",
            options="cliptrack.backends.mlflow.options",
            extra="mlflow",
        ),
        Backend(
            "jsonl",
            reader="cliptrack.backends.jsonl.reader:read",
            listing="cliptrack.backends.jsonl.listing:list_runs",
            options="cliptrack.backends.jsonl.options",
        ),
        Backend(
            "wandb",
            sink="cliptrack.backends.wandb.sink:WandbSink",
            reader="cliptrack.backends.wandb.reader:read",
            listing="cliptrack.backends.wandb.listing:list_runs",
            options="cliptrack.backends.wandb.options",
            extra="wandb",
        ),
        Backend(
            "csv",
            sink="cliptrack.backends.csv.sink:CsvSink",
            reader="cliptrack.backends.csv.reader:read",
            listing="cliptrack.backends.csv.listing:list_runs",
            options="cliptrack.backends.csv.options",
        ),
    )
}
"""Backend name -> its declaration, in the order the command lines show their flags."""


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"backend name {name!r} must be a non-empty string without ':'")
    return name


def _dotted(name: str, what: str, target: Target) -> Target:
    """``target`` as ``"module:attribute"`` where it is a class or function (so that replay, in
    another process, imports it by name); other objects are kept as they are."""
    if isinstance(target, str):
        if target.count(":") != 1 and what != "options":
            raise ValueError(f"backend {name!r}: {what} {target!r} is not 'module:attribute'")
        return target
    module, qualname = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if module and qualname and "<" not in qualname:
        return f"{module}:{qualname}"
    return target


def register_backend(
    name: str,
    *,
    schemes: tuple[str, ...] = (),
    sink: Target = None,
    reader: Target = None,
    listing: Target = None,
    options: Target = None,
    extra: str | None = None,
) -> Backend:
    """Declare (or replace) the backend ``name``: its URI schemes and its parts, each a
    ``"module:attribute"`` target or the object itself (a class or function is kept by its dotted
    name; ``options`` may be a module). One call makes it reachable from ``Tracker(backends=[...])``,
    replay, ``load_runs``, ``cliptrack runs`` and ``cliptrack compare``."""
    _check_name(name)
    if isinstance(sink, type) and not issubclass(sink, Sink):
        raise ValueError(f"backend {name!r}: {sink.__name__} does not derive from cliptrack.backends.Sink")
    for scheme in schemes:
        owner = next((b.name for b in BACKENDS.values() if scheme in b.schemes and b.name != name), None)
        if owner is not None:
            raise ValueError(f"backend {name!r}: URI scheme {scheme!r} already names backend {owner!r}")
    declared = Backend(
        name,
        tuple(schemes),
        _dotted(name, "sink", sink) if sink is not None else None,
        _dotted(name, "reader", reader) if reader is not None else None,
        _dotted(name, "listing", listing) if listing is not None else None,
        _dotted(name, "options", options) if options is not None else None,
        extra,
    )
    BACKENDS[name] = declared
    return declared


def backend(name: str) -> Backend:
    """The backend registered as ``name``; ValueError listing the names otherwise."""
    found = BACKENDS.get(name)
    if found is None:
        raise ValueError(f"unknown backend {name!r}: registered backends are {sorted(BACKENDS)}")
    return found


def resolve(declared: Backend, part: str) -> Any:
    """The object ``part`` (``"sink"``, ``"reader"``, ``"listing"``, ``"options"``) of a backend,
    imported on first use; ValueError when the backend has no such part, ModuleNotFoundError naming
    the extra to install when its vendor library is missing."""
    target = getattr(declared, part)
    if target is None:
        raise ValueError(f"backend {declared.name!r} has no {part}")
    if not isinstance(target, str):
        return target
    module_name, colon, attribute = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise  # the backend's own module is missing: a registration error, shown as it is
        raise ModuleNotFoundError(
            f"tracking backend {declared.name!r} needs {exc.name!r}: "
            f"pip install 'cliptrack[{declared.extra or declared.name}]'",
            name=exc.name,
        ) from exc
    return getattr(module, attribute) if colon else module


# ------------------------------------------------------------------------------------------ sinks


class _SinkTable(MutableMapping[str, Any]):
    """``SINKS``: sink name -> ``"module:Class"`` of every backend that has a sink, read from and
    written to ``BACKENDS`` (setting a name declares or updates that backend's sink; deleting it
    removes the sink, and the backend when it had nothing else)."""

    def __getitem__(self, name: str) -> Any:
        found = BACKENDS.get(name)
        if found is None or found.sink is None:
            raise KeyError(name)
        return found.sink

    def __setitem__(self, name: str, target: Any) -> None:
        _check_name(name)
        found = BACKENDS.get(name)
        BACKENDS[name] = Backend(name, sink=target) if found is None else replace(found, sink=target)

    def __delitem__(self, name: str) -> None:
        found = BACKENDS.get(name)
        if found is None or found.sink is None:
            raise KeyError(name)
        rest = replace(found, sink=None)
        if rest.reader is None and rest.listing is None and rest.options is None and not rest.schemes:
            del BACKENDS[name]
        else:
            BACKENDS[name] = rest

    def __iter__(self) -> Iterator[str]:
        return iter([name for name, found in BACKENDS.items() if found.sink is not None])

    def __len__(self) -> int:
        return sum(1 for found in BACKENDS.values() if found.sink is not None)

    def __repr__(self) -> str:
        return repr(dict(self))


class _SchemeTable(Mapping[str, str]):
    """``SCHEMES``: URI scheme -> the backend a bare URI of that scheme names (read-only)."""

    def _table(self) -> dict[str, str]:
        return {scheme: found.name for found in BACKENDS.values() for scheme in found.schemes}

    def __getitem__(self, scheme: str) -> str:
        return self._table()[scheme]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        return repr(self._table())


SINKS: MutableMapping[str, Any] = _SinkTable()
"""Sink name -> ``module:Class`` (a ``Sink`` subclass), imported on first use: the sinks of ``BACKENDS``."""

SCHEMES: Mapping[str, str] = _SchemeTable()
"""URI scheme -> the backend a bare URI of that scheme names (the whole URI its argument)."""


def sink_class(name: str) -> type[Sink]:
    """The registered sink class called ``name``; ValueError listing the names otherwise, and
    ModuleNotFoundError naming the extra to install when its dependency is missing."""
    found = BACKENDS.get(name)
    if found is None or found.sink is None:
        raise ValueError(f"unknown sink {name!r}: registered sinks are {sorted(SINKS)}")
    cls: type[Sink] = resolve(found, "sink")
    return cls


def register_sink(name: str, target: str | type[Sink]) -> None:
    """Register a sink under ``name``: ``"module:Class"`` (imported on first use) or the class
    itself (which must then be importable as ``module:Class`` for replay to rebuild it)."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"sink name {name!r} must be a non-empty string without ':'")
    if isinstance(target, type):
        if not issubclass(target, Sink):
            raise ValueError(f"sink {name!r}: {target.__name__} does not derive from cliptrack.backends.Sink")
        target = f"{target.__module__}:{target.__qualname__}"
    if not isinstance(target, str) or target.count(":") != 1:
        raise ValueError(f"sink {name!r}: {target!r} is not 'module:Class'")
    SINKS[name] = target


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
    """True for the specs that name the spool directory: ``"jsonl"``, ``"jsonl:/dir"``, ``"file:///dir"``."""
    return isinstance(spec, str) and (spec == "jsonl" or spec.startswith(("jsonl:", "file:")))


def make_sink(spec: Any, options: Mapping[str, Mapping[str, Any]] | None = None, **common: Any) -> Sink:
    """The sink a spec names (see ``cliptrack.backends``); JSONL specs name the spool and are refused.

    ``options``: per sink name, that sink's vendor options (``Tracker(sink_options=...)``:
    ``{"mlflow": {"tracking_uri": ...}, "wandb": {"project": ..., "mode": ..., "dir": ...}}``);
    ``common``: options every sink is offered (the tracker's ``experiment``). Both are handed to
    the sink class's ``from_spec``, the sink's own options winning.
    """
    if isinstance(spec, Sink):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"backend {spec!r} is neither a name, a URI nor a Sink")
    name, colon, argument = spec.partition(":")
    if name not in SINKS:
        scheme = urlparse(spec).scheme.split("+")[0]
        target = SCHEMES.get(scheme) or SCHEMES.get(spec)
        if target is None or target not in SINKS:
            schemes = ", ".join(s + "://" for s, n in SCHEMES.items() if n == "mlflow")
            raise ValueError(
                f"unknown tracking backend {spec!r}: use a registered sink {sorted(SINKS)} (optionally "
                f"'name:argument'), 'jsonl', an MLflow tracking URI ({schemes}) or 'jsonl:/dir'"
            )
        name, argument, colon = target, spec, ":"
    own = (options or {}).get(name) or {}
    return sink_class(name).from_spec(argument if colon else None, {**common, **own})


def sink_from_state(name: str, state: Mapping[str, Any], **overrides: Any) -> Sink:
    """The sink ``name`` rebuilt from the replay state recorded in run.json (``overrides``, such
    as ``tracking_uri``, replace recorded options)."""
    return sink_class(name).from_state(state, **overrides)
