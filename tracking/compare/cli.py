"""``cliptrack compare RUN_A RUN_B [...]``: load runs, print the verdict table and summary.

Runs are named by id or name in one store: ``--tracking-uri`` (MLflow, the default store),
``--jsonl DIR`` (the spool) or ``--wandb-dir DIR`` (W&B run files); ``entity/project/run_id``
references with no store named go through the W&B public API.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tracking.compare.align import ALIGNMENTS, parse_window
from tracking.compare.metrics import CLIP_TOLERANCE, RELATIVE_TOLERANCE, REWARD_ABS_TOLERANCE


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """The store options shared by ``compare`` and ``panels mlflow``."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--tracking-uri", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI or sqlite:///mlflow.db)"
    )
    source.add_argument("--jsonl", metavar="DIR", help="JSONL spool directory (<DIR>/<run_id>/points.jsonl)")
    source.add_argument("--wandb-dir", metavar="DIR", help="directory holding W&B run files (offline runs)")
    parser.add_argument("--experiment", help="MLflow experiment (name or id) to look runs up in")


def add_comparison_arguments(parser: argparse.ArgumentParser) -> None:
    """Alignment, window, margins and confidence."""
    parser.add_argument(
        "--align",
        choices=sorted(ALIGNMENTS),
        default="step",
        help="pair runs by trainer step, by tokens seen, or by wall time (default: step)",
    )
    parser.add_argument(
        "--window", metavar="A:B", help="keep A <= x < B on the alignment axis (steps, tokens or s)"
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=CLIP_TOLERANCE,
        help=f"clip-fraction equivalence margin, absolute (default {CLIP_TOLERANCE})",
    )
    parser.add_argument(
        "--reward-tolerance",
        type=float,
        default=RELATIVE_TOLERANCE,
        help=f"reward margin, relative (log-ratio scale) when both rewards are clearly away from "
        f"zero (default {RELATIVE_TOLERANCE})",
    )
    parser.add_argument(
        "--reward-abs-tolerance",
        type=float,
        default=REWARD_ABS_TOLERANCE,
        help=f"reward margin in reward units, used when the rewards are near zero "
        f"(default {REWARD_ABS_TOLERANCE})",
    )
    parser.add_argument(
        "--throughput-tolerance",
        type=float,
        default=RELATIVE_TOLERANCE,
        help=f"throughput margin on the log-ratio scale: 0.05 means |log(B/A)| < log(1.05) "
        f"(default {RELATIVE_TOLERANCE})",
    )
    parser.add_argument("--confidence", type=float, default=0.90, help="interval confidence (default 0.90)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run ids or names; the first is the reference")
    add_source_arguments(parser)
    add_comparison_arguments(parser)
    parser.add_argument("--html", metavar="OUT", help="also write the self-contained HTML dashboard here")
    parser.add_argument("--markdown", metavar="OUT", help="also write summary and table as markdown here")
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        metavar="FILE",
        help="every estimate, interval, effective sample size, verdict and note as JSON: "
        "printed alone on stdout, or written to FILE",
    )


def load_and_compare(args: argparse.Namespace) -> tuple[Any, Any]:
    """Load the named runs and compare them as the arguments say; return (runset, result)."""
    from tracking.compare.compute import compare
    from tracking.compare.load import load_runs

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
    result = compare(
        runset,
        align=args.align,
        window=parse_window(args.window),
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
