"""Per-run series for plots: per-step clip fraction with a rolling token-weighted band, the
low/high split, reward and throughput, on the chosen alignment axis.

The band is the rolling ratio ``sum(clipped) / sum(loss_tokens)`` over ``w`` steps with a 90 %
ratio-estimator (delta-method) interval from the between-step spread inside the window. It is a
visual aid; the verdict's intervals come from ``stats``.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import NormalDist

import numpy as np
import pandas as pd
from cliptrack.compare.align import ALIGNMENTS
from cliptrack.compare.notes.words import AXIS_WORDS
from cliptrack.compare.window import Window
from cliptrack.core import keys
from cliptrack.store.frame import RunSet

AXIS_TITLES = {axis: words.title for axis, words in AXIS_WORDS.items()}
"""An alignment as a plot's axis title (``cliptrack.compare.notes.words``)."""
SERIES_COLUMNS = (
    "x",
    "clip_fraction",
    "clip_rolling",
    "band_low",
    "band_high",
    "clipped_tokens",
    "loss_tokens",
    "low_fraction",
    "high_fraction",
    "reward",
    "throughput",
    "step_time",
    "kl_k3",
    "abs_log_ratio",
    "engine_kl_k3",
    "drift_kl_k3",
)


def rolling_window(n_steps: int) -> int:
    """Default rolling window in steps: about a fifteenth of the run, at least 5."""
    return max(5, n_steps // 15)


def _col(wide: pd.DataFrame, key: str) -> pd.Series:
    return wide[key] if key in wide else pd.Series(np.nan, index=wide.index)


def run_series(
    runset: RunSet,
    label: str,
    align: str = "step",
    window: Window | None = None,
    rolling: int | None = None,
    confidence: float = 0.90,
) -> pd.DataFrame:
    """One run's plot series, indexed by step, with the columns of ``SERIES_COLUMNS``."""
    wide = runset.wide(label)
    axis = ALIGNMENTS[align]
    out = pd.DataFrame(index=wide.index)
    out["x"] = wide.index.to_numpy(dtype=float) if axis == "step" else wide[axis]
    out = out[(window or Window()).mask(out["x"])]
    wide = wide.loc[out.index]
    clipped, tokens = _col(wide, keys.CLIPPED_TOKENS), _col(wide, keys.LOSS_TOKENS)
    valid = pd.Series(
        np.isfinite(clipped.to_numpy(dtype=float)) & np.isfinite(tokens.to_numpy(dtype=float)),
        index=wide.index,
    ) & (tokens > 0)
    c, t = clipped.where(valid), tokens.where(valid)
    out["clip_fraction"] = c / t
    w = rolling or rolling_window(len(out))
    roll = (
        pd.DataFrame({"c": c, "t": t, "cc": c * c, "ct": c * t, "tt": t * t}).rolling(w, min_periods=2).sum()
    )
    count = valid.astype(float).rolling(w, min_periods=2).sum()
    ratio = roll["c"] / roll["t"]
    resid = (roll["cc"] - 2 * ratio * roll["ct"] + ratio * ratio * roll["tt"]).clip(lower=0)
    se = np.sqrt(resid / (count - 1).where(count > 1) * count) / roll["t"]
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    out["clip_rolling"] = ratio
    out["band_low"] = (ratio - z * se).clip(lower=0)
    out["band_high"] = ratio + z * se
    out["clipped_tokens"] = clipped
    out["loss_tokens"] = tokens
    out["low_fraction"] = _col(wide, keys.CLIPPED_LOW_TOKENS).where(valid) / t
    out["high_fraction"] = _col(wide, keys.CLIPPED_HIGH_TOKENS).where(valid) / t
    out["reward"] = _col(wide, keys.REWARD)
    out["throughput"] = _col(wide, keys.THROUGHPUT)
    if out["throughput"].isna().all() and keys.STEP_TIME in wide:
        out["throughput"] = tokens / _col(wide, keys.STEP_TIME)
    out["step_time"] = _col(wide, keys.STEP_TIME)
    for column, total, mean in (
        ("kl_k3", keys.KL_K3_SUM, keys.KL_K3_MEAN),
        ("abs_log_ratio", keys.ABS_LOG_RATIO_SUM, keys.ABS_LOG_RATIO_MEAN),
        ("engine_kl_k3", keys.ENGINE_KL_K3_SUM, keys.ENGINE_KL_K3_MEAN),
        ("drift_kl_k3", keys.DRIFT_KL_K3_SUM, keys.DRIFT_KL_K3_MEAN),
    ):  # per token, from the step's sum where logged (another tracker's mean otherwise)
        out[column] = _col(wide, total) / tokens.where(tokens > 0) if total in wide else _col(wide, mean)
    return out


def all_series(
    runset: RunSet, labels: Sequence[str], align: str = "step", window: Window | None = None
) -> dict[str, pd.DataFrame]:
    """``run_series`` for each label."""
    return {label: run_series(runset, label, align, window) for label in labels}
