"""The tidy frame every loader produces: one row per (run, step, metric).

Columns (units):

- ``run``: display label of the run (its run name; made unique with the run id when two runs share
  a name);
- ``run_id``: the id the run has in the store it was loaded from;
- ``backend``: the training stack (``cliptrack.backend``), e.g. ``"megatron"`` or ``"miles"``;
- ``step``: the trainer's own step (int);
- ``tokens_seen``: cumulative ``loss_tokens:sum`` up to and including this step, in tokens
  (NaN when the run logs no token counts);
- ``wall_time``: unix seconds of the point as handed to the tracker;
- ``elapsed_s``: seconds since the run's first point;
- ``metric``: the metric key (``name:reduction``);
- ``value``: float.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from tracking import keys
from tracking.records import Point

COLUMNS = ("run", "run_id", "backend", "step", "tokens_seen", "wall_time", "elapsed_s", "metric", "value")
"""Column order of the tidy frame."""


@dataclass(frozen=True)
class RunInfo:
    """What is known about a run besides its series.

    ``source`` names where it was loaded from (``"mlflow"``, ``"wandb"``, ``"jsonl"``) and
    ``location`` the tracking URI, directory or W&B path.
    """

    run_id: str
    run_name: str
    backend: str
    source: str
    location: str = ""
    config: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""

    @property
    def display(self) -> str:
        """The label used in the frame's ``run`` column."""
        return self.label or self.run_name or self.run_id


def _empty_frame() -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series(dtype="float64") for c in COLUMNS})
    return frame.astype({"run": "object", "run_id": "object", "backend": "object", "metric": "object",
                         "step": "int64"})


def build_frame(info: RunInfo, points: Iterable[Point]) -> pd.DataFrame:
    """Turn one run's points into tidy rows.

    Points are sorted by step; a step logged more than once is merged (a later value of a key wins,
    the latest wall time is kept), as W&B merges repeated logs at one step. Non-finite values are
    kept (NaN stays NaN); non-numeric values raise ValueError naming the run, step and key.
    """
    by_step: dict[int, dict[str, Any]] = {}
    for point in points:
        step = int(point.step)
        slot = by_step.setdefault(step, {"wall_time": float("nan"), "metrics": {}})
        wall = float(point.wall_time)
        if not np.isnan(wall) and (np.isnan(slot["wall_time"]) or wall > slot["wall_time"]):
            slot["wall_time"] = wall
        for key, value in point.metrics.items():
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise ValueError(
                    f"run {info.display!r} step {step}: metric {key!r} has non-numeric value {value!r}"
                )
            slot["metrics"][key] = float(value)
    if not by_step:
        return _empty_frame()
    steps = sorted(by_step)
    first_wall = np.nanmin([by_step[s]["wall_time"] for s in steps])
    cumulative = 0.0
    has_tokens = False
    rows = []
    for step in steps:
        slot = by_step[step]
        tokens = slot["metrics"].get(keys.LOSS_TOKENS)
        if tokens is not None and not np.isnan(tokens):
            cumulative += tokens
            has_tokens = True
        tokens_seen = cumulative if has_tokens else float("nan")
        for key, value in slot["metrics"].items():
            rows.append((info.display, info.run_id, info.backend, step, tokens_seen, slot["wall_time"],
                         slot["wall_time"] - first_wall, key, value))
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    return frame.astype({"step": "int64", "tokens_seen": "float64", "wall_time": "float64",
                         "elapsed_s": "float64", "value": "float64"})


@dataclass
class RunSet:
    """Runs loaded for comparison: the tidy ``frame`` and one ``RunInfo`` per run, in load order."""

    frame: pd.DataFrame
    runs: list[RunInfo]

    @classmethod
    def from_points(cls, items: Iterable[tuple[RunInfo, Iterable[Point]]]) -> RunSet:
        """Build a RunSet from (info, points) pairs, giving each run a unique label."""
        pairs = [(info, list(points)) for info, points in items]
        names = [info.run_name or info.run_id for info, _ in pairs]
        infos = []
        for (info, _), name in zip(pairs, names, strict=True):
            label = name if names.count(name) == 1 else f"{name} ({info.run_id})"
            infos.append(RunInfo(info.run_id, info.run_name, info.backend, info.source, info.location,
                                 dict(info.config), label))
        frames = [build_frame(info, points) for info, (_, points) in zip(infos, pairs, strict=True)]
        frame = pd.concat(frames, ignore_index=True) if frames else _empty_frame()
        return cls(frame=frame, runs=infos)

    @property
    def labels(self) -> list[str]:
        """Run labels, in load order."""
        return [info.display for info in self.runs]

    def info(self, label: str) -> RunInfo:
        """The RunInfo whose label, name or id is ``label``; KeyError listing the runs otherwise."""
        for info in self.runs:
            if label in (info.display, info.run_id):
                return info
        for info in self.runs:
            if label == info.run_name:
                return info
        raise KeyError(f"no run {label!r} among {self.labels}")

    def metrics(self) -> list[str]:
        """Metric keys present in any run, sorted."""
        return sorted(self.frame["metric"].unique().tolist())

    def wide(self, label: str) -> pd.DataFrame:
        """One run as a step-indexed table: columns tokens_seen, wall_time, elapsed_s and one per metric."""
        rows = self.frame[self.frame["run"] == self.info(label).display]
        axes = rows.groupby("step")[["tokens_seen", "wall_time", "elapsed_s"]].first()
        values = rows.pivot_table(index="step", columns="metric", values="value", aggfunc="last",
                                  dropna=False)
        values.columns.name = None
        return axes.join(values).sort_index()
