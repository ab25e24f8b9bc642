"""Downsampling series for plotting only: min and max per bucket, so spikes stay visible.

A plot of a million steps cannot show more than a few thousand distinct x positions, and a file
carrying every point is hundreds of megabytes. Beyond ``MAX_POINTS`` points a line is cut into
``MAX_POINTS // 2`` buckets of consecutive points and each bucket keeps its lowest and its highest
point, in step order (so the drawn line reaches every extreme the full line reaches). A bucket
with no finite value becomes one gap. A band keeps, per bucket, the lowest lower edge and the
highest upper edge (the drawn band covers the full band). The numbers in the tables come from the
full series; only the figures are downsampled.
"""

from __future__ import annotations

import numpy as np

MAX_POINTS = 4000
"""Points per line drawn without downsampling; longer lines keep min and max of ``MAX_POINTS // 2`` buckets."""


def _buckets(n: int, max_points: int) -> np.ndarray:
    """Start index of each of the ``k = max_points // 2`` buckets: bucket ``b`` holds the points
    ``floor(b n / k) .. floor((b + 1) n / k) - 1`` (called with ``n > max_points``: none is empty)."""
    count = max(1, max_points // 2)
    return (np.arange(count, dtype=np.int64) * n) // count


def _check(x: np.ndarray, ys: tuple[np.ndarray, ...], max_points: int) -> None:
    if max_points < 2:
        raise ValueError(f"max_points must be at least 2, got {max_points}")
    for y in ys:
        if y.shape != x.shape:
            raise ValueError(f"x and y differ in length: {x.shape[0]} x values, {y.shape[0]} y values")


def line(x: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` with at most ``max_points`` points: unchanged when short, else each bucket's
    minimum and maximum in step order (NaN where a bucket has no finite value)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    _check(x, (y,), max_points)
    if len(x) <= max_points:
        return x, y
    starts = _buckets(len(x), max_points)
    finite = np.isfinite(y)
    low_idx = _arg_extreme(np.where(finite, y, np.inf), starts, np.minimum)
    high_idx = _arg_extreme(np.where(finite, y, -np.inf), starts, np.maximum)
    first, second = np.minimum(low_idx, high_idx), np.maximum(low_idx, high_idx)
    idx = np.column_stack([first, second]).ravel()
    out_x, out_y = x[idx], y[idx].copy()
    empty = np.repeat(np.add.reduceat(finite, starts) == 0, 2)
    out_y[empty] = np.nan
    return out_x, out_y


def band(
    x: np.ndarray, low: np.ndarray, high: np.ndarray, max_points: int = MAX_POINTS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x, low, high)`` with at most ``max_points`` points: per bucket the first x, the lowest
    ``low`` and the highest ``high`` (NaN where the bucket has none), so the band is never narrower."""
    x, low, high = (np.asarray(a, dtype=float) for a in (x, low, high))
    _check(x, (low, high), max_points)
    if len(x) <= max_points:
        return x, low, high
    starts = _buckets(len(x), max_points)
    lo = np.minimum.reduceat(np.where(np.isfinite(low), low, np.inf), starts)
    hi = np.maximum.reduceat(np.where(np.isfinite(high), high, -np.inf), starts)
    lo[~np.isfinite(lo)] = np.nan
    hi[~np.isfinite(hi)] = np.nan
    return x[starts], lo, hi


def _arg_extreme(values: np.ndarray, starts: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
    """Index of the first point of each bucket equal to the bucket's ``ufunc`` extreme."""
    extreme = ufunc.reduceat(values, starts)
    sizes = np.diff(np.append(starts, len(values)))
    bucket = np.repeat(np.arange(len(starts)), sizes)
    hit = values == extreme[bucket]
    # the first hit per bucket: hits ordered by position; keep the first of each bucket
    positions = np.flatnonzero(hit)
    first = np.unique(bucket[positions], return_index=True)[1]
    return positions[first]
