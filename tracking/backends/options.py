"""The store options shared by ``cliptrack compare``, ``runs`` and ``panels mlflow``, and the
alignment names, importable without numpy or pandas (so every ``--help`` starts fast)."""

from __future__ import annotations

import argparse

ALIGNMENTS = {"step": "step", "tokens": "tokens_seen", "time": "elapsed_s"}
"""Alignment name -> the frame column that is its axis (trainer steps, tokens, seconds)."""


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
