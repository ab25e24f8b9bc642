"""Run comparison: load runs from MLflow, W&B or the JSONL spool into one tidy frame, align them,
estimate token-weighted clip fractions, reward and throughput with intervals that stay honest under
autocorrelation (``stats``), state an equivalence verdict — or ``insufficient data`` — and show it
all as a table, a summary, JSON, panels or a dashboard.

Parts: ``result`` (the model), ``compute`` (``compare``), ``render`` (text, markdown, HTML, JSON),
``panels`` (the one panel list) drawn by ``dashboard``, ``panels_mlflow`` and ``panels_wandb``.

Nothing here imports torch. Plotting libraries, MLflow and wandb are imported only by the modules
that need them.
"""

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {
    "ALIGNMENTS": "align",
    "Window": "align",
    "parse_window": "align",
    "unit_table": "align",
    "DEFAULT_CONFIDENCE": "compute",
    "DEFAULT_TOLERANCES": "compute",
    "compare": "compute",
    "COLUMNS": "frame",
    "LoadedRun": "frame",
    "Point": "frame",
    "RunSet": "frame",
    "build_frame": "frame",
    "load_jsonl": "load",
    "load_mlflow": "load",
    "load_runs": "load",
    "load_wandb_offline": "load",
    "load_wandb_online": "load",
    "QUANTITIES": "quantities",
    "Quantity": "quantities",
    "ComparisonResult": "result",
    "Difference": "result",
    "DifferenceSegment": "result",
    "GroupDifference": "result",
    "Note": "result",
    "RunEstimate": "result",
    "MIN_ESS": "stats",
    "MIN_UNITS": "stats",
    "Estimate": "stats",
    "wilson_interval": "stats",
}
"""Public name -> the module of this package that holds it (imported on first use, so that
``cliptrack compare --help`` does not import pandas)."""

if TYPE_CHECKING:
    from tracking.compare.align import ALIGNMENTS, Window, parse_window, unit_table
    from tracking.compare.compute import DEFAULT_CONFIDENCE, DEFAULT_TOLERANCES, compare
    from tracking.compare.frame import COLUMNS, LoadedRun, Point, RunSet, build_frame
    from tracking.compare.load import (
        load_jsonl,
        load_mlflow,
        load_runs,
        load_wandb_offline,
        load_wandb_online,
    )
    from tracking.compare.quantities import QUANTITIES, Quantity
    from tracking.compare.result import (
        ComparisonResult,
        Difference,
        DifferenceSegment,
        GroupDifference,
        Note,
        RunEstimate,
    )
    from tracking.compare.stats import MIN_ESS, MIN_UNITS, Estimate, wilson_interval


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tracking.compare' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tracking.compare.{home}"), name)


__all__ = [
    "ALIGNMENTS",
    "COLUMNS",
    "ComparisonResult",
    "DEFAULT_CONFIDENCE",
    "DEFAULT_TOLERANCES",
    "Difference",
    "DifferenceSegment",
    "Estimate",
    "GroupDifference",
    "LoadedRun",
    "MIN_ESS",
    "MIN_UNITS",
    "Note",
    "Point",
    "QUANTITIES",
    "Quantity",
    "RunEstimate",
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
