"""The one registry of tracking backends: each declared once, with where its parts live.

A ``Backend`` names a backend, the URI schemes that reach it, and where its parts are, as
``"module:attribute"`` targets (``"module"`` for ``options`` and ``panels``) imported on first use
(so a backend's vendor library is imported only when that backend is used), or the objects
themselves. Every part is optional:

- ``sink``: a ``Sink`` subclass (the tracker writes through it; replay rebuilds it);
- ``reader``: ``read(refs, **store) -> cliptrack.store.frame.RunSet``, the runs ``cliptrack compare``
  and ``load_runs`` read;
- ``listing``: ``list_runs(*, include_comparisons, **store) -> list[RunEntry]``, for ``cliptrack runs``;
- ``options``: a module holding ``STORE_OPTIONS`` (the flags that name its store for reading) and
  ``TARGET_OPTIONS`` (the flags that re-target its sink for replay), tuples of
  ``cliptrack.backends.options.StoreOption``; it must import nothing heavy (``--help`` reads it);
- ``worst``: ``read_worst(run: LoadedRun) -> list[Worst]``, the worst-sequence tables a run it read
  logged (``load_worst``);
- ``panels``: the ``cliptrack panels <name>`` command: an object (a module) with ``HELP`` (one
  line), ``add_arguments(parser)`` and ``run(args) -> int`` (the exit status); it must import
  nothing heavy at import (``--help`` builds its flags).

Every consumer goes through this registry: the tracker (``make_sink``), replay
(``sink_from_state``, ``target_options``), ``load_runs`` (``reader``), ``load_worst`` (``worst``),
``cliptrack runs`` (``listing``), ``cliptrack panels`` (``panels``) and the command lines' store
flags (``store_options``). Adding a backend is one folder and one ``register_backend`` call (or one
entry in ``BACKENDS``); see docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any
from urllib.parse import urlparse

from cliptrack.backends.base import Sink

__all__ = [
    "BACKENDS",
    "PARTS",
    "Backend",
    "backend",
    "is_jsonl",
    "jsonl_root",
    "make_sink",
    "register_backend",
    "resolve",
    "scheme_backend",
    "sink_class",
    "sink_from_state",
    "sink_names",
]

Target = Any
"""A part of a backend: ``"module:attribute"`` (imported on first use) or the object itself."""

PARTS = ("sink", "reader", "listing", "options", "worst", "panels")
"""The optional parts of a backend, each a field of ``Backend`` (see the module docstring)."""
MODULE_PARTS = ("options", "panels")
"""The parts that may be named as a whole module (``"module"``, no attribute)."""


@dataclass(frozen=True)
class Backend:
    """One backend as declared: ``name`` (the spec ``"<name>"`` / ``"<name>:<argument>"`` and the
    key of a sink's replay state in run.json), then, by keyword only: ``schemes`` (URI schemes whose
    bare URIs name it, the whole URI its argument), its parts ``sink``, ``reader``, ``listing``,
    ``options``, ``worst`` and ``panels`` (see the module docstring; None where the backend has no
    such part) and ``extra`` (the pip extra its vendor library comes with)."""

    name: str
    _: KW_ONLY
    schemes: tuple[str, ...] = ()
    sink: Target = None
    reader: Target = None
    listing: Target = None
    options: Target = None
    worst: Target = None
    panels: Target = None
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
            worst="cliptrack.backends.mlflow.reader:read_worst",
            panels="cliptrack.cli.mlflow_panels",
            extra="mlflow",
        ),
        Backend(
            "jsonl",
            reader="cliptrack.backends.jsonl.reader:read",
            listing="cliptrack.backends.jsonl.listing:list_runs",
            options="cliptrack.backends.jsonl.options",
            worst="cliptrack.backends.jsonl.reader:read_worst",
        ),
        Backend(
            "wandb",
            sink="cliptrack.backends.wandb.sink:WandbSink",
            reader="cliptrack.backends.wandb.reader:read",
            listing="cliptrack.backends.wandb.listing:list_runs",
            options="cliptrack.backends.wandb.options",
            worst="cliptrack.backends.wandb.reader:read_worst",
            panels="cliptrack.cli.wandb_panels",
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
    another process, imports it by name); other objects (a module, a namespace) are kept as they are."""
    if isinstance(target, str):
        if target.count(":") != 1 and not (what in MODULE_PARTS and ":" not in target):
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
    worst: Target = None,
    panels: Target = None,
    extra: str | None = None,
) -> Backend:
    """Declare (or replace) the backend ``name``: its URI schemes and its parts (``PARTS``), each a
    ``"module:attribute"`` target or the object itself (a class or function is kept by its dotted
    name; ``options`` and ``panels`` may be a module). One call makes it reachable from
    ``Tracker(sinks=[...])``, replay, ``load_runs``, ``load_worst``, ``cliptrack runs``,
    ``cliptrack compare`` and ``cliptrack panels``."""
    _check_name(name)
    if isinstance(sink, type) and not issubclass(sink, Sink):
        raise ValueError(f"backend {name!r}: {sink.__name__} does not derive from cliptrack.backends.Sink")
    for scheme in schemes:
        owner = next((b.name for b in BACKENDS.values() if scheme in b.schemes and b.name != name), None)
        if owner is not None:
            raise ValueError(f"backend {name!r}: URI scheme {scheme!r} already names backend {owner!r}")
    given = {
        "sink": sink,
        "reader": reader,
        "listing": listing,
        "options": options,
        "worst": worst,
        "panels": panels,
    }
    parts = {part: None if target is None else _dotted(name, part, target) for part, target in given.items()}
    declared = Backend(name, schemes=tuple(schemes), extra=extra, **parts)
    BACKENDS[name] = declared
    return declared


def backend(name: str) -> Backend:
    """The backend registered as ``name``; ValueError listing the names otherwise."""
    found = BACKENDS.get(name)
    if found is None:
        raise ValueError(f"unknown backend {name!r}: registered backends are {sorted(BACKENDS)}")
    return found


def resolve(declared: Backend, part: str) -> Any:
    """The object ``part`` (one of ``PARTS``) of a backend,
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


def sink_names() -> list[str]:
    """The names of the registered backends that have a sink, in registry order."""
    return [name for name, found in BACKENDS.items() if found.sink is not None]


def scheme_backend(scheme: str) -> str | None:
    """The backend a bare URI of ``scheme`` names (the whole URI its argument); None for none."""
    return next((found.name for found in BACKENDS.values() if scheme in found.schemes), None)


def sink_class(name: str) -> type[Sink]:
    """The registered sink class called ``name``; ValueError listing the names otherwise, and
    ModuleNotFoundError naming the extra to install when its dependency is missing."""
    found = BACKENDS.get(name)
    if found is None or found.sink is None:
        raise ValueError(f"unknown sink {name!r}: registered sinks are {sorted(sink_names())}")
    cls: type[Sink] = resolve(found, "sink")
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
    sinks = sink_names()
    if name not in sinks:
        target = scheme_backend(urlparse(spec).scheme.split("+")[0]) or scheme_backend(spec)
        if target is None or target not in sinks:
            schemes = ", ".join(f"{s}:// ({b.name})" for b in BACKENDS.values() for s in b.schemes)
            raise ValueError(
                f"unknown tracking backend {spec!r}: use a registered sink {sorted(sinks)} (optionally "
                f"'name:argument'), 'jsonl', a URI of a registered scheme ({schemes}) or 'jsonl:/dir'"
            )
        name, argument, colon = target, spec, ":"
    own = (options or {}).get(name) or {}
    return sink_class(name).from_spec(argument if colon else None, {**common, **own})


def sink_from_state(name: str, state: Mapping[str, Any], **overrides: Any) -> Sink:
    """The sink ``name`` rebuilt from the replay state recorded in run.json (``overrides``, such
    as ``tracking_uri``, replace recorded options)."""
    return sink_class(name).from_state(state, **overrides)
