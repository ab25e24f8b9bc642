"""What a live watch's reference run costs ``Tracker()``: a spool run directory whose journal is
``--mb`` megabytes (234 by default: 195,000 points of 30 keys), watched for one key at the
default window (100 points) and at ``window=20000``, against the previous read.

Each row is one fresh ``python`` process (its peak resident memory is its own): the seconds
``Tracker(..., watch=Watch(key, reference=RUN_DIR, window=W))`` takes, and the process's peak
resident memory above a process that imported the same modules and opened a tracker without a
watch. The anchor of
each row is the previous read in the same conditions: every point of the journal parsed and held
(``journal.load_points``), then the band's moving median one ``numpy.median`` per slice. Target:
within twice the journal's size in memory, a few seconds. Run: ``python benchmarks/watch_reference.py
[--mb 234]``.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._timing import Row, markdown  # noqa: E402 - importable once ROOT is on sys.path

KEY = "kl_k3:mean"
KEYS = [KEY, "clip_fraction:mean", "abs_log_ratio:mean", "loss_tokens:sum", "clipped_tokens:sum"]
KEYS += [f"metric_{i}:mean" for i in range(25)]
WINDOWS = (100, 20_000)

MEASURE = """
import json, resource, sys, time
from pathlib import Path
import numpy as np
from cliptrack.compare.stats import watch as rule
from cliptrack.log import watch as live
from cliptrack.log.tracker import Tracker
from cliptrack.store import journal

variant, reference, spool, window, key = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
if variant == "current":
    tracker = Tracker("w", sinks=["jsonl"], spool_dir=spool, watch=live.Watch(key, reference=reference, window=window))
    took = time.perf_counter() - start
    tracker.close()
elif variant == "previous":
    steps, values = [], []
    for point in journal.load_points(Path(reference) / "points.jsonl"):
        if key in point.metrics:
            steps.append(point.step)
            values.append(point.metrics[key])
    kept = [(s, z) for s, v in zip(steps, values) if (z := rule.watched(v, "log", 1e-5)) is not None]
    arr = np.asarray([z for _, z in kept])
    half = max(1, min(window, arr.size) // 2)
    smooth = np.array([np.median(arr[max(0, i - half) : i + half + 1]) for i in range(arr.size)])
    took = time.perf_counter() - start
else:  # the baseline: the same imports, a tracker without a watch
    Tracker("w", sinks=["jsonl"], spool_dir=spool).close()
    took = 0.0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"seconds": took, "before_kb": before, "peak_kb": peak}))
"""
"""One measurement in a fresh process: ``variant`` ("current", "previous" or "baseline": a tracker
without a watch) over the reference run directory, at a window."""


def write_reference(run_dir: Path, megabytes: float, seed: int = 0) -> int:
    """A spool run directory whose journal holds about ``megabytes`` MB of 30-key points; its size."""
    from cliptrack.store import journal

    rng = random.Random(seed)
    run_dir.mkdir(parents=True)
    path = run_dir / "points.jsonl"
    with open(path, "wb") as fh:
        step = 0
        while fh.tell() < megabytes * 1e6:
            batch = []
            for _ in range(1000):
                batch.append((step, 1.7e9 + 0.1 * step, {k: 1e-3 * (0.5 + rng.random()) for k in KEYS}))
                step += 1
            fh.write(b"".join(journal.encode_points(batch)))
    return path.stat().st_size


def _measure(variant: str, reference: Path, spool: Path, window: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, variant, str(reference), str(spool), str(window), KEY],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run(megabytes: float = 234.0) -> list[Row]:
    with tempfile.TemporaryDirectory() as tmp:
        reference = Path(tmp) / "reference"
        size = write_reference(reference, megabytes)
        base = _measure("baseline", reference, Path(tmp) / "spool", WINDOWS[0])["peak_kb"]
        rows = []
        for window in WINDOWS:
            got = {v: _measure(v, reference, Path(tmp) / "spool", window) for v in ("current", "previous")}
            memory = {v: max(0.0, got[v]["peak_kb"] - base) * 1024 for v in got}
            name = f"Tracker() with a {size / 1e6:.0f} MB reference, window={window}"
            rows.append(
                Row(
                    f"{name}: seconds",
                    got["current"]["seconds"],
                    f"previous {got['previous']['seconds']:.1f} s",
                    got["current"]["seconds"] / got["previous"]["seconds"],
                    "a few seconds",
                )
            )
            rows.append(
                Row(
                    f"{name}: peak memory above the imports",
                    memory["current"],
                    f"previous {memory['previous'] / 1e6:.0f} MB",
                    memory["current"] / memory["previous"] if memory["previous"] else float("nan"),
                    f"<= {2 * size / 1e6:.0f} MB (twice the journal)",
                    f"{memory['current'] / 1e6:.0f} MB",
                )
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=234.0, help="the reference journal's size, MB")
    args = parser.parse_args()
    print(markdown(run(args.mb)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
