"""Side-by-side timing: candidates and their anchor interleaved in one process, medians, ratios."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Row:
    """One benchmark row: ``median_s`` seconds per call; ``ratio`` = median / anchor's median."""

    name: str
    median_s: float
    anchor: str
    ratio: float
    target: str = ""
    shown: str = ""
    """Text for the value column when the value is not a time (a size, say); empty: ``median_s``."""

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "median_s": self.median_s,
            "anchor": self.anchor,
            "ratio": self.ratio,
            "target": self.target,
        }


def interleaved_medians(
    fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 2
) -> dict[str, float]:
    """Median seconds per call of each function, measured round-robin so drift hits all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in samples.items()}


def markdown(rows: list[Row]) -> str:
    """A markdown table of rows."""
    lines = ["| benchmark | median | anchor | ratio | target |", "|---|---:|---|---:|---|"]
    for row in rows:
        value = row.shown or _fmt(row.median_s)
        lines.append(f"| {row.name} | {value} | {row.anchor} | {row.ratio:.3f}× | {row.target} |")
    return "\n".join(lines)


def _fmt(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"
