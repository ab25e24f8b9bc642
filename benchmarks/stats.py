"""The statistics engine on long runs: 100,000 and 1,000,000 paired steps, against the previous method.

Data: two independent runs of clip counts (AR(1) 0.5 wobble around 10 %, 5k-50k tokens per step).
Rows, each measured interleaved with its anchor in one process (medians of a few calls):

- ``paired_difference`` (EWC long-run variance around the trend, trend test, long-memory check)
  vs the previous fixed-b Bartlett interval with the lag-1 ESS (``simulation.previous_intervals``);
- ``segment_differences`` (segments plus the episode scan) vs ``paired_difference``;
- ``influential_units`` (16 leave-one-out refits plus the robust-outlier set) vs ``paired_difference``;
- ``lead_lag`` (one FFT cross-correlation) vs ``paired_difference``.

Peak memory of the process is shown in the last row's name. Run: ``python benchmarks/stats.py``;
``run()`` returns the rows for ``run_all``.
"""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._timing import Row, interleaved_medians, markdown  # noqa: E402 - importable once ROOT is on sys.path


def _runs(n: int) -> list[np.ndarray]:
    from research.simulation import ar1, counts

    rng = np.random.default_rng(0)
    out: list[np.ndarray] = []
    for _ in range(2):
        c, t = counts(rng, 0.10 + ar1(rng, 1, n, 0.5))
        out += [c[0], t[0]]
    return out


def run(sizes: tuple[int, ...] = (100_000, 1_000_000), repeats: int = 3) -> list[Row]:
    from cliptrack.compare.stats import influential_units, lead_lag, paired_difference, segment_differences

    from research.simulation import linearise_rows, previous_intervals

    rows = []
    for n in sizes:
        arrays = _runs(n)

        def previous(arrays: list[np.ndarray] = arrays) -> object:
            ra, za = linearise_rows(arrays[0][None], arrays[1][None])
            rb, zb = linearise_rows(arrays[2][None], arrays[3][None])
            return previous_intervals(zb - za, rb - ra, 0.90)

        fns = {
            "paired": lambda a=arrays: paired_difference(*a),
            "previous": previous,
            "segments": lambda a=arrays: segment_differences(*a, tolerance=0.02),
            "influential": lambda a=arrays: influential_units(*a, tolerance=0.02),
            "lag": lambda a=arrays: lead_lag(a[0] / a[1], a[2] / a[3]),
        }
        med = interleaved_medians(fns, repeats=repeats, warmup=1)
        label = f"{n:,} paired steps"
        rows += [
            Row(
                f"paired_difference, {label}",
                med["paired"],
                "previous fixed-b + lag-1 ESS",
                med["paired"] / med["previous"],
            ),
            Row(
                f"segment_differences (with episode scan), {label}",
                med["segments"],
                "paired_difference",
                med["segments"] / med["paired"],
            ),
            Row(
                f"influential_units, {label}",
                med["influential"],
                "paired_difference",
                med["influential"] / med["paired"],
            ),
            Row(f"lead_lag, {label}", med["lag"], "paired_difference", med["lag"] / med["paired"]),
        ]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    rows[-1].name += f" [process peak {peak:.2f} GiB]"
    return rows


if __name__ == "__main__":
    print(markdown(run()))
