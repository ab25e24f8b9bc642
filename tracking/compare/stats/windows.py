"""The windows a scan over a series of units looks at: widths doubling, starts a quarter-width apart."""

from __future__ import annotations

import numpy as np


def scan_windows(n: int, shortest: int, longest: int) -> tuple[np.ndarray, np.ndarray]:
    """``(start, stop)`` of every window of ``n`` units with width ``shortest, 2 shortest, ...`` up to
    ``longest``, at every quarter-width offset (stops clipped at ``n``); empty arrays when
    ``shortest > longest``."""
    starts, stops = [], []
    w = shortest
    while w <= longest:
        s = np.arange(0, max(n - w, 0) + 1, max(1, w // 4))
        starts.append(s)
        stops.append(np.minimum(s + w, n))
        w *= 2
    if not starts:
        return np.zeros(0, int), np.zeros(0, int)
    return np.concatenate(starts), np.concatenate(stops)
