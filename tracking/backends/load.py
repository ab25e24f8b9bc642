"""Load runs into a ``RunSet`` from any registered backend's store, through the registry.

Every backend's reader turns what it reads into ``Point``s (or columns) and hands them to
``RunSet.from_points``, so the same run loaded from any store gives the same frame.

Runs are named by id (cliptrack's or the store's) or by run name. A name that matches several runs
picks the latest FINISHED one and says so (``catalog.choose_by_name``; W&B run files give their
status by their exit record); a reference that matches nothing is an error that lists what is there.
Reading never writes (``preflight``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cliptrack.backends.catalog import RunNotFoundError
from cliptrack.backends.options import choose_backend
from cliptrack.backends.registry import BACKENDS, resolve
from cliptrack.core.secrets import redacted_errors
from cliptrack.core.worst import Worst
from cliptrack.store.frame import LoadedRun, RunSet

__all__ = ["RunNotFoundError", "load_runs", "load_worst"]


@redacted_errors()
def load_runs(refs: Iterable[str] = (), **store: Any) -> RunSet:
    """Load runs from exactly one store, named by the ``store`` keywords of the registered backends.

    ``jsonl_dir``: the JSONL spool; ``csv_dir``: a CSV backend directory; ``wandb_dir``: W&B run
    files on disk (``wandb_api``: the W&B API object for online runs); ``tracking_uri`` and
    ``experiment``: MLflow. Refs of the form ``entity/project/run_id`` with no store named go through
    the W&B public API; otherwise MLflow at its default store (``MLFLOW_TRACKING_URI`` or
    ``sqlite:///mlflow.db``). Keywords of two stores are refused (ValueError), an unknown keyword
    too (TypeError, naming the known ones). No error's message holds a credential of the store
    (``cliptrack.core.secrets.redacted_errors``: a client library's echo of the URI included).
    """
    refs = list(refs)
    found, own = choose_backend(refs, store)
    runset: RunSet = resolve(found, "reader")(refs, **own)
    return runset


@redacted_errors()
def load_worst(runs: RunSet | LoadedRun) -> dict[str, list[Worst]]:
    """The worst-sequence tables each run logged (``Tracker.log_worst``), by run label, one table per
    step (the last logged), by step; ``[]`` for a run that logged none or whose store cannot hold
    them. Read by the ``worst`` part of the backend the run was read from (JSONL: the run's
    ``worst.jsonl``; MLflow: its ``worst_sequences/`` artifacts; W&B: the tables in its run files);
    a backend that declares none has none."""
    loaded = [runs] if isinstance(runs, LoadedRun) else list(runs.runs)
    out: dict[str, list[Worst]] = {}
    for run in loaded:
        declared = BACKENDS.get(run.source)
        if declared is None or declared.worst is None:
            out[run.display] = []
        else:
            out[run.display] = list(resolve(declared, "worst")(run))
    return out
