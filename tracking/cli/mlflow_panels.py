"""``cliptrack panels mlflow RUN_A RUN_B [...] [--tracking-uri URI | --jsonl DIR | --wandb-dir DIR | --csv DIR]``:
the MLflow comparison run (figures, table, JSON, dashboard as artifacts,
``cliptrack.compare.views.mlflow_run``) in ``--log-uri`` (default: the tracking URI the runs came
from), in its own ``<experiment>-comparisons`` experiment, artifacts under ``--artifact-dir``.

The MLflow backend's ``panels`` part (``cliptrack.backends.registry``); imports nothing heavy until
it runs.
"""

from __future__ import annotations

import argparse

from cliptrack.backends.preflight import plain_path_uri
from cliptrack.cli.compare import add_comparison_arguments, add_source_arguments, load_and_compare

HELP = "MLflow comparison run with figures, table and dashboard"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run ids or names; the first is the reference")
    add_source_arguments(parser)
    add_comparison_arguments(parser)
    parser.add_argument(
        "--log-uri", help="MLflow tracking URI to log the comparison run to (default: --tracking-uri)"
    )
    parser.add_argument(
        "--log-experiment",
        help="experiment for the comparison run (default: <experiment of the first run>-comparisons)",
    )
    parser.add_argument(
        "--artifact-dir",
        metavar="DIR",
        help="artifact location of the comparisons experiment when it is created "
        "(default for a sqlite store: comparison-artifacts beside the database)",
    )


def run(args: argparse.Namespace) -> int:
    """Compare the runs, log the comparison run, print the summary and its id; 0."""
    from cliptrack.compare.views.mlflow_run import log_comparison

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
