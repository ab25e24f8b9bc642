"""``cliptrack runs``: list a store's runs, latest first, with both ids, status, start time and steps.

The ids listed are the ones every command accepts: cliptrack's id (what the tracker and the demo
print) and, for MLflow, MLflow's run id (what the MLflow UI shows). Comparison runs are left out
unless ``--all``. ``--json`` prints the listing as a JSON array instead. The store is named by any
registered backend's store flag (``--tracking-uri``, ``--jsonl``, ``--wandb-dir``, ``--csv``) and
listed by that backend's listing (``cliptrack.backends.registry``).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from typing import Any

from cliptrack.backends.catalog import list_runs
from cliptrack.backends.options import add_source_arguments, source_arguments
from cliptrack.cli.errors import error_text
from cliptrack.core.text import printable


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the runs as a JSON array")
    parser.add_argument("--all", action="store_true", help="include comparison runs (MLflow)")


def _table(entries: list[Any]) -> str:
    """The runs as aligned columns; every cell ``printable`` (a run name is one line, no escape codes)."""
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
    rows = [tuple(printable(cell) for cell in row) for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def run(args: argparse.Namespace) -> int:
    try:
        entries = list_runs(include_comparisons=args.all, **source_arguments(args))
    except (LookupError, FileNotFoundError, ValueError) as exc:  # ValueError: a hostile store (two
        # directories claiming one run id, a special file)
        if getattr(args, "debug", False):  # the traceback, and the same exit code
            traceback.print_exc()
        else:
            print(error_text("runs", exc), file=sys.stderr)
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
