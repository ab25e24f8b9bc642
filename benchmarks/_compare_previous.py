"""The comparison as it was computed before the current method, kept as the benchmark's anchor.

- ``build_frame``: the per-point Python loop that built the tidy frame (from ``RunDir.load_points``,
  one ``json.loads`` per line);
- ``compare_bootstrap``: per quantity, each run's ratio and the paired difference resampled with a
  circular block bootstrap of 2000 replicates, blocks of ``ceil(n^(1/3))`` steps, through
  ``(n_boot, n)`` index arrays (the indices and the gathered values both materialised);
- MLflow histories read with ``MlflowClient.get_metric_history``, one metric key at a time (the
  fallback path of ``load_runs``, used by the benchmark directly).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from cliptrack.core import keys
from cliptrack.store.frame import COLUMNS, RunSet


def build_frame(info: Any, points: list[Any]) -> pd.DataFrame:
    by_step: dict[int, dict[str, Any]] = {}
    for point in points:
        step = int(point.step)
        slot = by_step.setdefault(step, {"wall_time": float("nan"), "metrics": {}})
        wall = float(point.wall_time)
        if not np.isnan(wall) and (np.isnan(slot["wall_time"]) or wall > slot["wall_time"]):
            slot["wall_time"] = wall
        for key, value in point.metrics.items():
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise ValueError(f"step {step}: metric {key!r} has non-numeric value {value!r}")
            slot["metrics"][key] = float(value)
    steps = sorted(by_step)
    first_wall = np.nanmin([by_step[s]["wall_time"] for s in steps])
    cumulative, has_tokens, rows = 0.0, False, []
    for step in steps:
        slot = by_step[step]
        tokens = slot["metrics"].get(keys.LOSS_TOKENS)
        if tokens is not None and not np.isnan(tokens):
            cumulative += tokens
            has_tokens = True
        tokens_seen = cumulative if has_tokens else float("nan")
        for key, value in slot["metrics"].items():
            rows.append(
                (
                    info.display,
                    info.run.run_id,
                    info.run.backend_label or "",
                    step,
                    tokens_seen,
                    slot["wall_time"],
                    slot["wall_time"] - first_wall,
                    key,
                    value,
                )
            )
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _indices(n: int, n_boot: int, block: int, rng: np.random.Generator) -> np.ndarray:
    n_blocks = math.ceil(n / block)
    starts = rng.integers(0, n, size=(n_boot, n_blocks))
    idx = (starts[:, :, None] + np.arange(block)[None, None, :]) % n
    return idx.reshape(n_boot, n_blocks * block)[:, :n]


def compare_bootstrap(runset: RunSet, pairs: list[tuple[str, str | None]], n_boot: int = 2000) -> list[float]:
    """For each (numerator, denominator) key pair: both runs' intervals and the paired difference's."""
    rng = np.random.default_rng(0)
    a, b = (runset.wide(label) for label in runset.labels[:2])
    common = a.index.intersection(b.index)
    bounds = []
    for num_key, den_key in pairs:
        arrays = []
        for wide in (a, b):
            num = wide.loc[common, num_key].to_numpy(dtype=float)
            den = wide.loc[common, den_key].to_numpy(dtype=float) if den_key else np.ones_like(num)
            arrays += [num, den]
        n = common.size
        block = max(1, math.ceil(n ** (1 / 3)))
        for i in (0, 2):
            idx = _indices(n, n_boot, block, rng)
            reps = arrays[i][idx].sum(axis=1) / arrays[i + 1][idx].sum(axis=1)
            bounds += list(np.quantile(reps, [0.05, 0.95]))
        idx = _indices(n, n_boot, block, rng)
        sums = [x[idx].sum(axis=1) for x in arrays]
        reps = sums[2] / sums[3] - sums[0] / sums[1]
        bounds += list(np.quantile(reps, [0.05, 0.95]))
    return bounds
