"""Dashboard size, render time and peak memory: the 150-step demo and 2 runs x 1,000,000 steps,
against the previous dashboard (every point through ``plotly.graph_objects``, full plotly.js).

Data: two runs logging ``loss_tokens:sum``, ``clipped_tokens:sum``, ``clip_fraction:mean``,
``reward:mean`` and ``tokens_per_second:mean`` per step (``benchmarks.compare``'s generator),
built in memory (``frame.Columns``) and compared with ``compare`` before the timed render.

Every measurement runs in a fresh process, so each peak resident memory is its own:

- ``compare``: build the runs and compare them, no dashboard (the floor under the peaks below);
- ``render``: the same, then ``render_dashboard`` (timed) and its size in bytes;
- ``render-previous``: the same with the previous dashboard (``_dashboard_previous``).

Targets (issue: a dashboard that reads well and scales): demo <= 1.5 MB; 1M steps <= 15 MB and
<= 2 GiB peak. Run: ``python benchmarks/dashboard.py`` (``--quick``: the demo size only).
``run()`` returns the rows for ``run_all``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._timing import Row, markdown  # noqa: E402 - importable once ROOT is on sys.path

if TYPE_CHECKING:
    from cliptrack.compare import RunSet

SIZES = (150, 1_000_000)
"""Steps per run: the demo's length and a long run."""
RUNS = ("bench-a", "bench-b")


def _runset(steps: int) -> RunSet:
    import numpy as np
    from cliptrack.compare import LoadedRun, RunSet
    from cliptrack.store.frame import Columns
    from cliptrack.store.records import RunInfo

    from benchmarks.compare import KEYS, _series

    items = []
    for seed, name in enumerate(RUNS):
        data = _series(seed, steps)
        step = np.repeat(np.arange(steps, dtype=np.int64), len(KEYS))
        wall = np.repeat(np.asarray(data["wall_time"], dtype=float), len(KEYS))
        metric = np.tile(np.asarray(KEYS, dtype=object), steps)
        value = np.column_stack([np.asarray(data[k], dtype=float) for k in KEYS]).ravel()
        info = LoadedRun(RunInfo(name, name, name, {"seed": seed}), "bench")
        items.append((info, Columns(step, wall, metric, value)))
    return RunSet.from_points(items)


def _child(what: str, steps: int) -> dict[str, float]:
    """One measurement in this process: render seconds, dashboard bytes, peak RSS (MiB)."""
    from cliptrack.compare import compare

    runset = _runset(steps)
    result = compare(runset)
    seconds, size = 0.0, 0
    if what != "compare":
        if what == "render-previous":
            from benchmarks._dashboard_previous import render_dashboard
        else:
            from cliptrack.compare.views.dashboard import render_dashboard
        started = time.perf_counter()
        text = render_dashboard(runset, result)
        seconds = time.perf_counter() - started
        size = len(text.encode("utf-8"))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "bytes": size, "peak_mib": peak}


def _measure(what: str, steps: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, __file__, "--child", what, str(steps)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child {what} {steps} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{what} {steps}: {out}", file=sys.stderr, flush=True)
    return out


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


def run(sizes: tuple[int, ...] = SIZES) -> list[Row]:
    rows = []
    for steps in sizes:
        new = _measure("render", steps)
        old = _measure("render-previous", steps)
        floor = _measure("compare", steps)
        size = f"2 runs x {steps:,} steps"
        target = "<= 1.5 MB" if steps <= 1000 else "<= 15 MB, peak <= 2 GiB"
        memory = (
            f" [peak {new['peak_mib'] / 1024:.2f} GiB, previous {old['peak_mib'] / 1024:.2f} GiB, "
            f"compare alone {floor['peak_mib'] / 1024:.2f} GiB]"
        )
        anchor = f"previous dashboard, {size}"
        rows.append(
            Row(
                f"dashboard size, {size}{memory}",
                new["bytes"],
                anchor,
                new["bytes"] / old["bytes"],
                target,
                shown=f"{_mb(new['bytes'])} (previous {_mb(old['bytes'])})",
            )
        )
        rows.append(
            Row(f"render_dashboard, {size}", new["seconds"], anchor, new["seconds"] / old["seconds"], "")
        )
        rows.append(
            Row(anchor, old["seconds"], anchor, 1.0, shown=f"{old['seconds']:.2f} s, {_mb(old['bytes'])}")
        )
    return rows


def main() -> int:
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        print(json.dumps(_child(sys.argv[2], int(sys.argv[3]))))
        return 0
    sizes = SIZES[:1] if "--quick" in sys.argv else SIZES
    print(markdown(run(sizes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
