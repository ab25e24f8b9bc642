"""Run comparison: load runs from MLflow, W&B or the JSONL spool into one tidy frame, align them,
estimate token-weighted clip fractions, reward and throughput with honest (block-bootstrap)
intervals, state an equivalence verdict, and show it all as panels, a dashboard or a table.

Nothing here imports torch. Plotting libraries, MLflow and wandb are imported only by the modules
that need them.
"""

from tracking.compare.align import ALIGNMENTS, Window, parse_window, unit_table
from tracking.compare.frame import COLUMNS, Point, RunInfo, RunSet, build_frame
from tracking.compare.load import load_jsonl, load_mlflow, load_runs, load_wandb_offline, load_wandb_online
from tracking.compare.stats import Estimate, block_bootstrap_indices, default_block_length, wilson_interval
from tracking.compare.verdict import (
    DEFAULT_CONFIDENCE,
    DEFAULT_TOLERANCES,
    ComparisonResult,
    Difference,
    MetricSpec,
    RunEstimate,
    compare,
)

__all__ = [
    "ALIGNMENTS",
    "COLUMNS",
    "DEFAULT_CONFIDENCE",
    "DEFAULT_TOLERANCES",
    "ComparisonResult",
    "Difference",
    "Estimate",
    "MetricSpec",
    "Point",
    "RunEstimate",
    "RunInfo",
    "RunSet",
    "Window",
    "block_bootstrap_indices",
    "build_frame",
    "compare",
    "default_block_length",
    "load_jsonl",
    "load_mlflow",
    "load_runs",
    "load_wandb_offline",
    "load_wandb_online",
    "parse_window",
    "unit_table",
    "wilson_interval",
]
