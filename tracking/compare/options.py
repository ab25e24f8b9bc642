"""The ``cliptrack compare`` options and their defaults, importable without numpy or pandas.

``cliptrack compare --help`` declares these arguments without loading the comparison itself, so
the names and defaults the options show live here; ``align`` and ``metrics`` take them from here.
"""

from __future__ import annotations

import argparse

ALIGNMENTS = {"step": "step", "tokens": "tokens_seen", "time": "elapsed_s"}
"""Alignment name -> the frame column that is its axis (trainer steps, tokens, seconds)."""
CLIP_TOLERANCE = 0.02
"""Default absolute tolerance on the clip-fraction difference (fraction of tokens)."""
RELATIVE_TOLERANCE = 0.05
"""Default relative tolerance of reward and throughput (±5 %, on the log-ratio scale)."""
REWARD_ABS_TOLERANCE = 0.02
"""Default absolute reward tolerance (reward units), used when the rewards are near zero."""


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """The store options shared by ``compare``, ``runs`` and ``panels mlflow``."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--tracking-uri",
        help="MLflow tracking URI: sqlite:///PATH/mlflow.db or http://HOST:PORT "
        "(default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db if that file exists)",
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
    parser.add_argument(
        "--confidence",
        type=float,
        default=0.90,
        help="interval confidence (default 0.90)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every ``cliptrack compare`` argument."""
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="run ids (cliptrack's or the store's) or names; the first is the reference",
    )
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
