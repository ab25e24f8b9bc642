"""One pair of real demo-trainer runs, verdict by verdict: same-recipe pairs (two seeds, staleness 0)
over windows of 300 / 1,000 / 3,000 steps, and a sampler 2 steps stale against a fresh one over
150 / 300 / 1,000 steps, each pair's clip fraction and mismatch KL compared by ``compare`` (the
shipped pair verdict: default relative margins).

The runs are generated once (``--generate``, slow: about 0.1-0.3 s per step on a shared 2-core
machine) into ``CACHE`` as one ``.npz`` per run (every per-step metric of ``train``), saved every 100
steps so that a partial run is usable; a window of ``n`` steps is the first ``n`` steps of a run.

Run: ``python benchmarks/demo_pairs.py --generate same`` (4 runs of 3,000 steps),
``--generate stale`` (staleness 2, 1,000 steps), then ``python benchmarks/demo_pairs.py`` prints
the table (docs/STATISTICS.md, "Real runs").
"""

from __future__ import annotations

import argparse
import itertools
import os
from pathlib import Path

import numpy as np
from cliptrack.core import keys

CACHE = Path(os.environ.get("CLIPTRACK_DEMO_CACHE", Path(__file__).resolve().parent / ".demo_runs"))
SAME = {"seeds": (0, 1, 2, 3, 4, 5), "steps": 3000, "windows": (300, 1000, 3000)}
STALE = {"seeds": (0, 1, 2, 3, 4, 5), "steps": 1000, "windows": (150, 300, 1000)}
QUANTITIES = ("clip_fraction", "kl_k3")
SUMS = {
    "clip_fraction": (keys.CLIPPED_TOKENS, keys.LOSS_TOKENS),
    "kl_k3": (keys.KL_K3_SUM, keys.LOSS_TOKENS),
}
"""Each quantity's numerator and denominator keys in a run's metrics."""


def _path(staleness: int, seed: int) -> Path:
    return CACHE / f"miles-s{staleness}-seed{seed}.npz"


def load(staleness: int, seed: int) -> dict[str, np.ndarray] | None:
    path = _path(staleness, seed)
    if not path.exists():
        return None
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def generate(staleness: int, seed: int, steps: int) -> None:
    """Train one miles-path run and save its per-step metrics every 100 steps."""
    from cliptrack.adapters.demo.train import RunConfig, train

    have = load(staleness, seed)
    if have is not None and len(next(iter(have.values()))) >= steps:
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, float]] = []
    for r in train(RunConfig(path="miles", steps=steps, staleness=staleness, seed=seed)):
        rows.append({k: float(v) for k, v in r.output.metrics.items()})
        if len(rows) % 100 == 0 or len(rows) == steps:
            keys = sorted(set().union(*rows))
            tmp = _path(staleness, seed).with_suffix(".tmp.npz")
            np.savez(tmp, **{k: np.array([row.get(k, np.nan) for row in rows]) for k in keys})
            tmp.replace(_path(staleness, seed))
            print(f"staleness {staleness} seed {seed}: {len(rows)} steps", flush=True)


def _runset(runs: list[tuple[str, dict[str, np.ndarray]]], n: int):  # -> RunSet
    from cliptrack.store.frame import LoadedRun, Point, RunInfo, RunSet

    out = []
    for name, data in runs:
        points = [
            Point(step, 1000.0 + step, {k: float(v[step]) for k, v in data.items() if np.isfinite(v[step])})
            for step in range(n)
        ]
        out.append((LoadedRun(RunInfo(name, name, "miles"), "bench"), points))
    return RunSet.from_points(out)


def verdicts(a: dict[str, np.ndarray], b: dict[str, np.ndarray], n: int) -> dict[str, object]:
    from cliptrack.compare import compare

    result = compare(_runset([("a", a), ("b", b)], n))
    return {q: result.difference(q) for q in QUANTITIES}


def _steps(data: dict[str, np.ndarray]) -> int:
    return len(next(iter(data.values())))


def _window_value(data: dict[str, np.ndarray], q: str, n: int) -> float:
    """One run's window value of ``q`` over its first ``n`` steps: the ratio of sums for the clip
    fraction, the token-weighted mean for the KL."""
    num, den = SUMS[q]
    return float(np.nansum(data[num][:n]) / np.nansum(data[den][:n]))


def _truth(pairs: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]], q: str, n: int) -> str:
    """The seed means' ratio b / a over the window (the truth the verdicts are read against)."""
    a = np.mean([_window_value(x, q, n) for x, _ in pairs])
    b = np.mean([_window_value(y, q, n) for _, y in pairs])
    return f"{b / a:.2f}×"


def table() -> str:
    """Verdict counts per study, window and quantity over the pairs in the cache: same recipe, every
    pair of two seeds (truth: equal); staleness 2 against 0 on the same seed (truth: the ratio of
    the seed means, printed)."""
    lines = [
        "| study | steps | pairs | quantity | truth: seed means b / a | equivalent | different | inconclusive | insufficient data | median ESS |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    same = [load(0, s) for s in SAME["seeds"]]
    have = [r for r in same if r is not None]
    studies = {
        "same recipe (two seeds)": (list(itertools.combinations(have, 2)), SAME["windows"]),
        "staleness 2 vs 0": ([(same[i], load(2, s)) for i, s in enumerate(STALE["seeds"])], STALE["windows"]),
    }
    for study, (pairs, windows) in studies.items():
        for n in windows:
            ready = [
                (a, b) for a, b in pairs if a is not None and b is not None and min(_steps(a), _steps(b)) >= n
            ]
            if not ready:
                continue
            found = [verdicts(a, b, n) for a, b in ready]
            for q in QUANTITIES:
                ds = [f[q] for f in found]
                count = {
                    v: sum(d.verdict == v for d in ds)
                    for v in ("equivalent", "different", "inconclusive", "insufficient data")
                }
                ess = float(np.median([d.estimate.ess for d in ds]))
                truth = "1 (same recipe)" if study.startswith("same") else _truth(ready, q, n)
                lines.append(
                    f"| {study} | {n} | {len(ds)} | {q} | {truth} | {count['equivalent']} | {count['different']} | "
                    f"{count['inconclusive']} | {count['insufficient data']} | {ess:.1f} |"
                )
    return "\n".join(lines)


def _direction_low(a: dict[str, np.ndarray], b: dict[str, np.ndarray], q: str, n: int, degree: int | None):
    """``(log ratio b / a, the direction interval's side nearest 0)`` over the first ``n`` steps, with
    the trend removed by the shipped rule (``degree=None``) or always at ``degree``."""
    from cliptrack.compare.stats.intervals import difference_series, direction_rows
    from cliptrack.compare.stats.lrv import long_run_variance

    num, den = SUMS[q]
    value, z = difference_series(a[num][:n], a[den][:n], b[num][:n], b[den][:n], "log-ratio")
    low, high = direction_rows(np.array([value]), n, long_run_variance(z, degree=degree), np.array([z.std()]))
    return value, float(low[0] if value > 0 else -high[0])


def trend_table(degree: int) -> str:
    """Whole-window direction intervals (log ratio b / a; "different" needs the side nearest 0 beyond
    the margin log 1.25 = 0.223) with the shipped trend rule and with a trend of ``degree`` always
    removed: the stale-sampler pairs and the same-recipe pairs (docs/STATISTICS.md, "A trend is not
    taken out on trust")."""
    lines = [
        f"| study | steps | quantity | pairs | log ratio b / a | nearest side, shipped | nearest side, degree {degree} |",
        "|---|---:|---|---:|---|---|---|",
    ]
    same = [load(0, s) for s in SAME["seeds"]]
    have = [r for r in same if r is not None]
    studies = {
        "staleness 2 vs 0": ([(same[i], load(2, s)) for i, s in enumerate(STALE["seeds"])], STALE["windows"]),
        "same recipe (two seeds)": (list(itertools.combinations(have, 2)), SAME["windows"]),
    }
    fmt = lambda xs: ", ".join(f"{x:+.2f}" for x in xs)  # noqa: E731
    for study, (pairs, windows) in studies.items():
        for n in windows:
            ready = [
                (a, b) for a, b in pairs if a is not None and b is not None and min(_steps(a), _steps(b)) >= n
            ]
            for q in QUANTITIES if ready else ():
                shipped = [_direction_low(a, b, q, n, None) for a, b in ready]
                forced = [_direction_low(a, b, q, n, degree) for a, b in ready]
                lines.append(
                    f"| {study} | {n} | {q} | {len(ready)} | {fmt(v for v, _ in shipped)} | "
                    f"{fmt(lo for _, lo in shipped)} | {fmt(lo for _, lo in forced)} |"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generate", choices=("same", "stale"))
    parser.add_argument("--seeds", type=int, default=len(SAME["seeds"]), help="generate the first N seeds")
    parser.add_argument(
        "--trend-degree",
        type=int,
        help="print the direction intervals with this trend always removed instead",
    )
    args = parser.parse_args(argv)
    if args.trend_degree is not None:
        print(trend_table(args.trend_degree))
    elif args.generate == "same":
        for seed in SAME["seeds"][: args.seeds]:
            generate(0, seed, SAME["steps"])
    elif args.generate == "stale":
        for seed in STALE["seeds"][: args.seeds]:
            generate(2, seed, STALE["steps"])
    else:
        print(table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
