"""A store's runs as one listing (``cliptrack runs``) and the choice among runs sharing a name.

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
from dataclasses import asdict, dataclass, replace
from typing import Any

FINISHED = "FINISHED"


class RunNotFoundError(LookupError):
    """A run reference matched no run (or several, none of them finished) in the named store."""


class RunChoiceWarning(UserWarning):
    """A run name matched several runs; the latest finished one was taken."""


@dataclass(frozen=True)
class RunEntry:
    """One run of a store as listed: ``started`` in unix seconds (0: unknown), ``steps`` the number
    of logged steps (None: not counted)."""

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


def mlflow_entry(client: Any, run: Any, count_key: str) -> RunEntry:
    """An MLflow run (``mlflow.entities.Run``) as listed; steps are the points of ``count_key``."""
    from cliptrack.backends.mlflow._rest import history_length
    from cliptrack.core import keys

    tags = run.data.tags
    steps: int | None = 0
    if count_key in run.data.metrics:  # a server's history in bounded pages, else through the client
        steps = history_length(str(client.tracking_uri), run.info.run_id, count_key)
        if steps is None:
            steps = len(client.get_metric_history(run.info.run_id, count_key))
    return RunEntry(
        cliptrack_id=tags.get(keys.TAG_RUN_ID, run.info.run_id),
        store_id=run.info.run_id,
        name=run.info.run_name or "",
        backend=tags.get(keys.TAG_BACKEND, ""),
        status=run.info.status,
        started=(run.info.start_time or 0) / 1000.0,
        steps=steps,
        experiment=run.info.experiment_id,
    )


def spool_entry(run_dir: Any) -> RunEntry:
    """A spool run directory (``cliptrack.store.spool.RunDir``) as listed; steps are its points' lines."""
    info = run_dir.read_run()
    steps = run_dir.count_points()  # complete lines, counted in bounded chunks (a FIFO refused)
    return RunEntry(
        cliptrack_id=info.run_id,
        store_id=info.run_id,
        name=info.run_name,
        backend=info.backend_label or "",
        status=info.status,
        started=info.started,
        steps=steps,
        experiment=info.experiment,
    )


def mlflow_entries(
    tracking_uri: str | None, experiment: str | None = None, include_comparisons: bool = False
) -> list[RunEntry]:
    """Every run of the MLflow store (of ``experiment`` when named), as ``RunEntry``, comparison
    runs only with ``include_comparisons``; requests to a server are a reader's, as ``compare``'s
    (``_compat_mlflow.bounded_requests(reads=True)``)."""
    from cliptrack.backends.mlflow._compat import bounded_requests

    with bounded_requests(reads=True):
        return _mlflow_entries(tracking_uri, experiment, include_comparisons)


def _mlflow_entries(
    tracking_uri: str | None, experiment: str | None, include_comparisons: bool
) -> list[RunEntry]:
    from cliptrack.backends.preflight import resolve_tracking_uri
    from cliptrack.core import keys
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=resolve_tracking_uri(tracking_uri))
    experiments = list(client.search_experiments(view_type=ViewType.ACTIVE_ONLY))
    if experiment is not None:
        experiments = [e for e in experiments if experiment in (e.name, e.experiment_id)]
        if not experiments:
            raise LookupError(
                f"no experiment named or with id {experiment!r} in MLflow store {client.tracking_uri}"
            )
    names = {e.experiment_id: e.name for e in experiments}
    runs = client.search_runs(list(names), max_results=50000) if names else []
    entries = []
    for run in runs:
        if not include_comparisons and run.data.tags.get(keys.TAG_RUN_KIND) == keys.RUN_KIND_COMPARISON:
            continue
        entry = mlflow_entry(client, run, keys.LOSS_TOKENS)
        entries.append(replace(entry, experiment=names[run.info.experiment_id]))
    return entries


def spool_entries(directory: str) -> list[Any]:
    """Every run of a JSONL spool directory, as ``catalog.RunEntry``."""
    from pathlib import Path

    from cliptrack.store.spool import spool_runs

    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"JSONL run directory {directory!r} does not exist")
    return [spool_entry(run_dir) for run_dir in spool_runs(root)]


def latest_by_backend(entries: Sequence[RunEntry]) -> list[RunEntry]:
    """The latest FINISHED run of each backend, by backend name (``megatron`` before ``miles``)."""
    latest: dict[str, RunEntry] = {}
    for entry in entries:
        if entry.status != FINISHED:
            continue
        if entry.backend not in latest or entry.started > latest[entry.backend].started:
            latest[entry.backend] = entry
    return [latest[backend] for backend in sorted(latest)]
