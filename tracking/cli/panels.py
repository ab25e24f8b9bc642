"""``cliptrack panels wandb|mlflow``: build the comparison panels.

- ``cliptrack panels wandb --entity E --project P [--runs ID ...] [--out specs.json]``: the W&B
  workspace and report; saved when ``WANDB_API_KEY`` is set, written as specs (model JSON) otherwise.
- ``cliptrack panels mlflow RUN_A RUN_B [...] [--tracking-uri URI | --jsonl DIR | --wandb-dir DIR | --csv DIR]``:
  the MLflow comparison run (figures, table, JSON, dashboard as artifacts) in ``--log-uri``
  (default: the tracking URI the runs came from), in its own ``<experiment>-comparisons``
  experiment, artifacts under ``--artifact-dir``.
"""

from __future__ import annotations

import argparse
import sys

from cliptrack.backends.preflight import plain_path_uri
from cliptrack.cli.compare import add_comparison_arguments, add_source_arguments, load_and_compare
from cliptrack.cli.errors import error_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="target", required=True, metavar="TARGET")
    wb = sub.add_parser("wandb", help="W&B workspace and report (saved online, specs file offline)")
    wb.add_argument("--entity", required=True, help="W&B entity")
    wb.add_argument("--project", required=True, help="W&B project")
    wb.add_argument("--runs", nargs="*", default=[], metavar="RUN_ID", help="run ids the report compares")
    wb.add_argument(
        "--summary-from",
        metavar="DIR",
        help="W&B run directory to compute the verdict summary for the report from (offline files)",
    )
    wb.add_argument("--out", default="cliptrack-wandb-panels.json", help="specs file written when offline")
    wb.add_argument("--offline", action="store_true", help="write specs even when WANDB_API_KEY is set")
    ml = sub.add_parser("mlflow", help="MLflow comparison run with figures, table and dashboard")
    ml.add_argument("runs", nargs="+", metavar="RUN", help="run ids or names; the first is the reference")
    add_source_arguments(ml)
    add_comparison_arguments(ml)
    ml.add_argument(
        "--log-uri", help="MLflow tracking URI to log the comparison run to (default: --tracking-uri)"
    )
    ml.add_argument(
        "--log-experiment",
        help="experiment for the comparison run (default: <experiment of the first run>-comparisons)",
    )
    ml.add_argument(
        "--artifact-dir",
        metavar="DIR",
        help="artifact location of the comparisons experiment when it is created "
        "(default for a sqlite store: comparison-artifacts beside the database)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        if args.target == "wandb":
            from cliptrack.backends.wandb.panels import save_or_write

            summary = ""
            if args.summary_from and len(args.runs) >= 2:
                from cliptrack.backends.wandb.reader import load_wandb_offline
                from cliptrack.compare.engine import compare

                summary = compare(load_wandb_offline(args.runs, args.summary_from)).summary()
            outcome = save_or_write(
                args.entity,
                args.project,
                args.runs,
                summary,
                out=args.out,
                online=False if args.offline else None,
            )
            if outcome["saved"]:
                print(f"workspace: {outcome['workspace_url']}\nreport: {outcome['report_url']}")
            else:
                print(f"no WANDB_API_KEY: wrote workspace and report specs to {outcome['path']}")
            return 0
        from cliptrack.backends.mlflow.panels import log_comparison

        runset, result = load_and_compare(args)
        read_from = args.tracking_uri and (plain_path_uri(args.tracking_uri) or args.tracking_uri)
        run_id = log_comparison(
            runset,
            result,
            tracking_uri=args.log_uri or read_from,  # a plain path to a file: the store it was read as
            experiment=args.log_experiment,
            artifact_dir=args.artifact_dir,
        )
        print(result.summary())
        print(f"\ncomparison run: {run_id}")
        return 0
    except (LookupError, ValueError, FileNotFoundError) as exc:
        print(error_text("panels", exc), file=sys.stderr)
        return 2
