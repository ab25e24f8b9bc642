"""``cliptrack panels wandb --entity E --project P [--runs ID ...] [--out specs.json]``: the W&B
workspace and report (``cliptrack.compare.views.wandb_panels``); saved when ``WANDB_API_KEY`` is
set, written as specs (model JSON) otherwise.

The W&B backend's ``panels`` part (``cliptrack.backends.registry``); imports nothing heavy until it
runs.
"""

from __future__ import annotations

import argparse

HELP = "W&B workspace and report (saved online, specs file offline)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--entity", required=True, help="W&B entity")
    parser.add_argument("--project", required=True, help="W&B project")
    parser.add_argument("--runs", nargs="*", default=[], metavar="RUN_ID", help="run ids the report compares")
    parser.add_argument(
        "--summary-from",
        metavar="DIR",
        help="W&B run directory to compute the verdict summary for the report from (offline files)",
    )
    parser.add_argument(
        "--out", default="cliptrack-wandb-panels.json", help="specs file written when offline"
    )
    parser.add_argument("--offline", action="store_true", help="write specs even when WANDB_API_KEY is set")


def run(args: argparse.Namespace) -> int:
    """Build the workspace and report, save or write them, say where; 0."""
    from cliptrack.compare.views.wandb_panels import save_or_write

    summary = ""
    if args.summary_from and len(args.runs) >= 2:
        from cliptrack.backends.load import load_runs
        from cliptrack.compare.engine import compare

        summary = compare(load_runs(args.runs, wandb_dir=args.summary_from)).summary()
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
