"""A store's runs as one listing (``cliptrack runs``) and the choice among runs sharing a name.

Each backend lists its own runs (its folder's ``listing``); ``list_runs`` reaches the one a store
option names through the registry. ``choose_runs`` picks runs by id or name for every reader.

Each run has two ids where a store mints its own (MLflow): cliptrack's id (printed by the tracker
and the demo, the spool's folder name, tag ``cliptrack.run_id``) and the store's id (MLflow's run
id, shown by the MLflow UI). Both are listed and both are accepted wherever a run is named.

A name matching several runs picks the latest FINISHED one (by start time) and says so in a
``RunChoiceWarning`` that lists the others with status, start time, steps and ids; with no
FINISHED run among them the name is an error listing them all.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cliptrack.backends.options import choose_backend
from cliptrack.backends.registry import resolve
from cliptrack.core.secrets import RedactedError, redacted_errors
from cliptrack.core.text import printable

FINISHED = "FINISHED"


class RunNotFoundError(RedactedError, LookupError):
    """A run reference matched no run (or several, none of them finished) in the named store (its
    message redacted: no password or token of the store's URI)."""


class RunChoiceWarning(UserWarning):
    """A run name matched several runs; the latest finished one was taken."""


@dataclass(frozen=True, kw_only=True)
class RunEntry:
    """One run of a store as listed, every field by keyword: ``started`` in unix seconds (0:
    unknown), ``steps`` the number of logged steps (None: not counted)."""

    cliptrack_id: str
    store_id: str
    name: str
    backend: str
    status: str
    started: float
    steps: int | None
    experiment: str = ""

    def started_text(self) -> str:
        """Start time as UTC ``YYYY-MM-DD HH:MM:SS`` ("-" when unknown)."""
        if not self.started:
            return "-"
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.started))

    def describe(self) -> str:
        """One line: status, start time, steps and both ids."""
        ids = (
            self.cliptrack_id
            if self.store_id in ("", self.cliptrack_id)
            else (f"cliptrack id {self.cliptrack_id}, store id {self.store_id}")
        )
        steps = "?" if self.steps is None else str(self.steps)
        return f"{self.status} started {self.started_text()} UTC, {steps} steps ({ids})"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_by_name(ref: str, matches: Sequence[Any], entry: Callable[[Any], RunEntry], where: str) -> Any:
    """The latest FINISHED of ``matches`` (runs named ``ref``), with a RunChoiceWarning listing the
    others; LookupError listing them all when none finished."""
    entries = [(entry(match), match) for match in matches]
    finished = [pair for pair in entries if pair[0].status == FINISHED]
    listing = "; ".join(e.describe() for e, _ in sorted(entries, key=lambda p: -p[0].started))
    if not finished:
        raise RunNotFoundError(
            f"run name {ref!r} matches {len(matches)} runs in {where}, none FINISHED: {listing}; pass a run id"
        )
    chosen_entry, chosen = max(finished, key=lambda pair: pair[0].started)
    others = "; ".join(
        e.describe() for e, _ in sorted(entries, key=lambda p: -p[0].started) if e != chosen_entry
    )
    warnings.warn(
        f"run name {ref!r} matches {len(matches)} runs in {where}: took the latest FINISHED, "
        f"{chosen_entry.describe()}; the others: {others} (pass an id to choose)",
        RunChoiceWarning,
        stacklevel=3,
    )
    return chosen


SHORT_LIST = 5
"""Most names a not-found error lists (the rest counted)."""


def short_list(names: Sequence[str]) -> str:
    """The first :data:`SHORT_LIST` names, comma-separated, and how many more: ``a, b and 7 more``
    (each name printable: a name cannot break the message into lines of its own)."""
    shown = ", ".join(printable(name) for name in names[:SHORT_LIST])
    return shown + (f" and {len(names) - SHORT_LIST} more" if len(names) > SHORT_LIST else "")


def choose_runs(
    refs: Sequence[str], candidates: list[tuple[Any, str, str]], where: str, entry: Any = None
) -> list[Any]:
    """Pick candidates (item, id, name) by id first, then by name, in the order of ``refs`` (no
    refs: every candidate). Several runs of one name: the latest FINISHED (``entry`` lists an item
    as a ``RunEntry``), or an error without ``entry``; a ref matching nothing is an error listing
    the runs of ``where``."""
    if not refs:
        if not candidates:
            raise RunNotFoundError(f"no runs in {where}")
        return [item for item, _, _ in candidates]
    return [_choose_one(ref, candidates, where, entry) for ref in refs]


def _choose_one(ref: str, candidates: list[tuple[Any, str, str]], where: str, entry: Any) -> Any:
    """The candidate ``ref`` names: by id, else by name (see ``choose_runs``)."""
    by_id = [item for item, run_id, _ in candidates if run_id == ref]
    if by_id:
        return by_id[0]
    by_name = [(item, run_id) for item, run_id, name in candidates if name == ref]
    if len(by_name) > 1 and entry is not None:
        return choose_by_name(ref, [item for item, _ in by_name], entry, where)
    if len(by_name) > 1:
        ids = ", ".join(run_id for _, run_id in by_name)
        raise RunNotFoundError(
            f"run name {ref!r} matches {len(by_name)} runs in {where} ({ids}): pass a run id"
        )
    if not by_name:
        known = (
            short_list([f"{run_id} ({name})" if name else run_id for _, run_id, name in candidates]) or "none"
        )
        raise RunNotFoundError(f"no run with id or name {ref!r} in {where}\nruns there: {known}")
    return by_name[0][0]


@redacted_errors()
def list_runs(*, include_comparisons: bool = False, **store: Any) -> list[RunEntry]:
    """Every run of the store the ``store`` keywords name (``load_runs``'s: ``tracking_uri``,
    ``experiment``, ``jsonl_dir``, ``wandb_dir``, ``csv_dir``, or a registered backend's own), as
    listed by that backend's listing; comparison runs only with ``include_comparisons``. An error's
    message holds no credential of the store (``cliptrack.core.secrets.redacted_errors``)."""
    found, own = choose_backend((), store)
    listing = resolve(found, "listing")
    entries: list[RunEntry] = listing(include_comparisons=include_comparisons, **own)
    return entries


def latest_by_backend(entries: Sequence[RunEntry]) -> list[RunEntry]:
    """The latest FINISHED run of each backend, by backend name (``megatron`` before ``miles``)."""
    latest: dict[str, RunEntry] = {}
    for entry in entries:
        if entry.status != FINISHED:
            continue
        if entry.backend not in latest or entry.started > latest[entry.backend].started:
            latest[entry.backend] = entry
    return [latest[backend] for backend in sorted(latest)]
