"""``cliptrack runs``: list a store's runs, latest first, with both ids, status, start time and steps.

The ids listed are the ones every command accepts: cliptrack's id (what the tracker and the demo
print) and, for MLflow, MLflow's run id (what the MLflow UI shows). Comparison runs are left out
unless ``--all``. ``--json`` prints the listing as a JSON array instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tracking.compare.options import add_source_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the runs as a JSON array")
    parser.add_argument("--all", action="store_true", help="include comparison runs (MLflow)")


def mlflow_entries(tracking_uri: str | None, experiment: str | None, include_comparisons: bool) -> list[Any]:
    """Every run of the MLflow store (of ``experiment`` when named), as ``catalog.RunEntry``."""
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    from tracking import keys
    from tracking.compare.catalog import mlflow_entry
    from tracking.compare.preflight import resolve_tracking_uri

    client = MlflowClient(tracking_uri=resolve_tracking_uri(tracking_uri))
    experiments = client.search_experiments(view_type=ViewType.ACTIVE_ONLY)
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
        entries.append(type(entry)(**{**entry.as_dict(), "experiment": names[run.info.experiment_id]}))
    return entries


def spool_entries(directory: str) -> list[Any]:
    """Every run of a JSONL spool directory, as ``catalog.RunEntry``."""
    from pathlib import Path

    from tracking.compare.catalog import spool_entry
    from tracking.spool import spool_runs

    root = Path(directory)
    if not root.is_dir():
        raise FileNotFoundError(f"JSONL run directory {directory!r} does not exist")
    return [spool_entry(run_dir) for run_dir in spool_runs(root)]


def wandb_entries(directory: str) -> list[Any]:
    """Every run found in W&B run files under ``directory`` (W&B files keep no status: ``-``)."""
    from tracking.compare.catalog import RunEntry
    from tracking.compare.load import load_wandb_offline

    runset = load_wandb_offline([], directory)
    entries = []
    for info in runset.runs:
        steps = runset.frame.loc[runset.frame["run_id"] == info.run.run_id, "step"].nunique()
        run = info.run
        entries.append(
            RunEntry(
                run.run_id, run.run_id, run.run_name, run.backend_label or "", "-", run.started, int(steps)
            )
        )
    return entries


def _table(entries: list[Any]) -> str:
    header = ("started (UTC)", "status", "steps", "name", "backend", "cliptrack id", "store id", "experiment")
    rows = [header] + [
        (
            e.started_text(),
            e.status,
            "?" if e.steps is None else str(e.steps),
            e.name,
            e.backend,
            e.cliptrack_id,
            "=" if e.store_id == e.cliptrack_id else e.store_id,
            e.experiment,
        )
        for e in entries
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def run(args: argparse.Namespace) -> int:
    try:
        if args.jsonl:
            entries = spool_entries(args.jsonl)
        elif args.wandb_dir:
            entries = wandb_entries(args.wandb_dir)
        else:
            entries = mlflow_entries(args.tracking_uri, args.experiment, args.all)
    except (LookupError, FileNotFoundError) as exc:
        print(f"cliptrack runs: {exc}", file=sys.stderr)
        return 2
    entries.sort(key=lambda e: -e.started)
    if args.json:
        print(json.dumps([e.as_dict() for e in entries], indent=1))
        return 0
    if not entries:
        print("no runs")
        return 0
    print(_table(entries))
    print("\nany id above (or a name: the latest FINISHED run of that name) is accepted by cliptrack compare")
    return 0
