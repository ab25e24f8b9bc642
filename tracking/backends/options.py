"""The backends' command-line options, gathered from the registry: the store flags of
``cliptrack compare``, ``runs`` and ``panels mlflow`` (which store to read) and the re-target flags
of ``cliptrack replay`` (where to deliver instead of the recorded place).

Each backend declares its own in its folder's ``options`` module (``STORE_OPTIONS``,
``TARGET_OPTIONS``); nothing here imports numpy, pandas or a vendor library (so every ``--help``
starts fast).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cliptrack.backends.registry import BACKENDS, Backend, resolve

STORE = "store"
"""A store option names its backend's store: options of two backends' stores are refused together."""
SCOPE = "scope"
"""A scope option narrows the lookup inside its backend's store, and picks that backend when no
store option is given (MLflow's ``--experiment``)."""
EXTRA = "extra"
"""An extra option is handed to its backend when that backend is chosen, and never chooses it."""


@dataclass(frozen=True)
class StoreOption:
    """One option of a backend.

    ``keyword``: its name in ``load_runs(**store)`` / ``list_runs(**store)`` (a store option) or in
    ``from_state(**overrides)`` (a replay target option); ``flag``: its command-line flag (None: a
    keyword only, such as a W&B API object); ``dest``: the argparse attribute (default: from the
    flag); ``role``: ``STORE``, ``SCOPE`` or ``EXTRA`` (store options only); ``convert``: applied
    to a value given on the command line (a directory made absolute).
    """

    keyword: str
    flag: str | None = None
    help: str = ""
    metavar: str | None = None
    role: str = STORE
    dest: str | None = None
    convert: Callable[[str], Any] | None = None

    @property
    def attribute(self) -> str:
        """The argparse ``dest`` of the flag."""
        if self.dest:
            return self.dest
        if self.flag is None:
            raise ValueError(f"option {self.keyword!r} has no command-line flag")
        return self.flag.lstrip("-").replace("-", "_")


def absolute_dir(path: str) -> str:
    """A directory given on the command line, with ``~`` expanded, made absolute."""
    return os.path.abspath(os.path.expanduser(path))


def _declared(found: Backend, which: str) -> tuple[StoreOption, ...]:
    if found.options is None:
        return ()
    return tuple(getattr(resolve(found, "options"), which, ()))


def store_options(found: Backend) -> tuple[StoreOption, ...]:
    """The options that name (or narrow, or go with) ``found``'s store when reading."""
    return _declared(found, "STORE_OPTIONS")


def target_options(found: Backend) -> tuple[StoreOption, ...]:
    """The options that re-target ``found``'s sink in ``cliptrack replay``."""
    return _declared(found, "TARGET_OPTIONS")


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """The store flags of every registered backend (``compare``, ``runs``, ``panels mlflow``):
    flags that name a store exclude each other; scope flags stand beside them."""
    source = parser.add_mutually_exclusive_group()
    scopes: list[tuple[str, StoreOption]] = []
    for found in BACKENDS.values():
        for option in store_options(found):
            if option.flag is None:
                continue
            if option.role == STORE:
                source.add_argument(
                    option.flag, dest=option.attribute, metavar=option.metavar, help=option.help
                )
            else:
                scopes.append((option.flag, option))
    for flag, option in scopes:
        parser.add_argument(flag, dest=option.attribute, metavar=option.metavar, help=option.help)


def source_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The store options given on the command line, as ``load_runs`` / ``list_runs`` keywords."""
    given: dict[str, Any] = {}
    for found in BACKENDS.values():
        for option in store_options(found):
            if option.flag is None:
                continue
            value = getattr(args, option.attribute, None)
            if value is not None:
                given[option.keyword] = option.convert(value) if option.convert else value
    return given


def choose_backend(refs: Sequence[str], store: Mapping[str, Any]) -> tuple[Backend, dict[str, Any]]:
    """The backend the ``store`` keywords (``load_runs``'s) name, and the keywords it takes.

    Store keywords of two backends are refused together; with none, a scope keyword picks its
    backend; with neither, the backend whose reader claims every ref (W&B: ``entity/project/run_id``)
    or else the default one (MLflow). An unknown keyword is refused, naming the known ones.
    """
    owners = _keyword_owners()
    unknown = sorted(k for k in store if k not in owners)
    if unknown:
        raise TypeError(f"load_runs: unknown store keyword(s) {unknown}; known: {sorted(owners)}")
    given = {k: v for k, v in store.items() if v is not None}
    named = _one_backend([k for k in given if owners[k][1].role == STORE], owners)
    if named is None:
        named = _one_backend([k for k in given if owners[k][1].role == SCOPE], owners, sorted(given))
    chosen = named if named is not None else _claiming(refs)
    own = {option.keyword for option in store_options(chosen)}
    return chosen, {k: v for k, v in given.items() if k in own}


def _keyword_owners() -> dict[str, tuple[Backend, StoreOption]]:
    """Every store keyword -> the backend declaring it, and its option (the first declaration wins)."""
    owners: dict[str, tuple[Backend, StoreOption]] = {}
    for found in BACKENDS.values():
        for option in store_options(found):
            owners.setdefault(option.keyword, (found, option))
    return owners


def _one_backend(
    keywords: Sequence[str],
    owners: Mapping[str, tuple[Backend, StoreOption]],
    named: Sequence[str] | None = None,
) -> Backend | None:
    """The one backend ``keywords`` belong to (None for none); ValueError naming ``named`` (default:
    the keywords) when they belong to two."""
    backends = {owners[k][0].name for k in keywords}
    if len(backends) > 1:
        raise ValueError(f"load_runs: name one store, got {', '.join(keywords if named is None else named)}")
    return BACKENDS[backends.pop()] if backends else None


def _claiming(refs: Sequence[str]) -> Backend:
    """With no store named: the backend whose options module claims every ref (``claims(refs)``),
    else the default backend (``DEFAULT = True`` in its options module)."""
    default = None
    for found in BACKENDS.values():
        if found.options is None:
            continue
        module = resolve(found, "options")
        claims = getattr(module, "claims", None)
        if refs and claims is not None and claims(refs):
            return found
        if default is None and getattr(module, "DEFAULT", False):
            default = found
    if default is None:
        raise ValueError("load_runs: name a store (no registered backend is the default)")
    return default


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """The replay re-target flags of every registered backend (``cliptrack replay``)."""
    for found in BACKENDS.values():
        for option in target_options(found):
            if option.flag is not None:
                parser.add_argument(
                    option.flag, dest=option.attribute, metavar=option.metavar, help=option.help
                )


def target_arguments(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The re-target options given on the replay command line: sink name -> its overrides
    (a backend with none given is left out: its recorded target stands)."""
    targets: dict[str, dict[str, Any]] = {}
    for found in BACKENDS.values():
        for option in target_options(found):
            value = getattr(args, option.attribute, None) if option.flag is not None else None
            if value is not None:
                targets.setdefault(found.name, {})[option.keyword] = (
                    option.convert(value) if option.convert else value
                )
    return targets
