"""Run comparison: load runs from MLflow, W&B or the JSONL spool into one tidy frame, align them,
estimate token-weighted clip fractions, reward and throughput with intervals that stay honest under
autocorrelation (``stats``), state an equivalence verdict — or ``insufficient data`` — and show it
all as a table, a summary, JSON, panels or a dashboard.

Parts: ``result`` (the model), ``compute`` (``compare``), ``render`` (text, markdown, HTML, JSON),
``panels`` (the one panel list) drawn by ``dashboard``, ``panels_mlflow`` and ``panels_wandb``.

Nothing here imports torch. Plotting libraries, MLflow and wandb are imported only by the modules
that need them.
"""

from tracking.compare.align import ALIGNMENTS, Window, parse_window, unit_table
from tracking.compare.compute import DEFAULT_CONFIDENCE, DEFAULT_TOLERANCES, compare
from tracking.compare.frame import COLUMNS, LoadedRun, Point, RunSet, build_frame
from tracking.compare.load import load_jsonl, load_mlflow, load_runs, load_wandb_offline, load_wandb_online
from tracking.compare.metrics import MetricSpec
from tracking.compare.result import ComparisonResult, Difference, Note, RunEstimate
from tracking.compare.stats import MIN_ESS, MIN_UNITS, Estimate, wilson_interval

__all__ = [
    "ALIGNMENTS",
    "COLUMNS",
    "DEFAULT_CONFIDENCE",
    "DEFAULT_TOLERANCES",
    "MIN_ESS",
    "MIN_UNITS",
    "ComparisonResult",
    "Difference",
    "Estimate",
    "MetricSpec",
    "Note",
    "Point",
    "RunEstimate",
    "LoadedRun",
    "RunSet",
    "Window",
    "build_frame",
    "compare",
    "load_jsonl",
    "load_mlflow",
    "load_runs",
    "load_wandb_offline",
    "load_wandb_online",
    "parse_window",
    "unit_table",
    "wilson_interval",
]
