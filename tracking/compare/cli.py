"""``cliptrack compare RUN_A RUN_B [...]``: load runs, print the verdict table and summary.

Runs are named by id or name in one store: ``--tracking-uri`` (MLflow, the default store),
``--jsonl DIR`` (the spool) or ``--wandb-dir DIR`` (W&B run files); ``entity/project/run_id``
references with no store named go through the W&B public API.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tracking.compare.options import add_arguments, add_comparison_arguments, add_source_arguments

__all__ = ["add_arguments", "add_comparison_arguments", "add_source_arguments", "format_result", "run"]


def load_and_compare(args: argparse.Namespace) -> tuple[Any, Any]:
    """Load the named runs and compare them as the arguments say; return (runset, result)."""
    from tracking.compare.align import parse_window
    from tracking.compare.compute import compare
    from tracking.compare.load import load_runs
    from tracking.compare.preflight import check_window

    runset = load_runs(
        args.runs,
        tracking_uri=args.tracking_uri,
        experiment=args.experiment,
        jsonl_dir=args.jsonl,
        wandb_dir=args.wandb_dir,
    )
    tolerances = {
        "clip_fraction": args.tolerance,
        "reward": args.reward_tolerance,
        "throughput": args.throughput_tolerance,
    }
    window = parse_window(args.window)
    check_window(runset, args.align, window)
    result = compare(
        runset,
        align=args.align,
        window=window,
        tolerances=tolerances,
        reward_abs_tolerance=args.reward_abs_tolerance,
        confidence=args.confidence,
    )
    return runset, result


def format_result(result: Any) -> str:
    """The verdict table and the plain-language summary, as printed in the terminal."""
    import pandas as pd

    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_colwidth", 40):
        table = result.formatted_table().to_string(index=False)
    return f"{table}\n\n{result.summary()}"


def run(args: argparse.Namespace) -> int:
    if len(args.runs) < 2 and not args.experiment:
        print("cliptrack compare: name at least two runs (RUN_A RUN_B ...)", file=sys.stderr)
        return 2
    try:
        runset, result = load_and_compare(args)
    except (LookupError, ValueError, FileNotFoundError) as exc:
        if getattr(args, "debug", False):
            raise
        print(f"cliptrack compare: {exc}", file=sys.stderr)
        return 2
    if args.json == "-":
        print(result.to_json())
        return 0
    print(format_result(result))
    if args.json:
        from pathlib import Path

        Path(args.json).write_text(result.to_json() + "\n", encoding="utf-8")
        print(f"json: {args.json}")
    if args.html:
        from tracking.compare.dashboard import write_dashboard

        path = write_dashboard(args.html, runset, result)
        print(f"\ndashboard: {path}")
    if args.markdown:
        from pathlib import Path

        Path(args.markdown).write_text(result.to_markdown(), encoding="utf-8")
        print(f"markdown: {args.markdown}")
    return 0
