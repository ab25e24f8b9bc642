"""Real runs as the test of grouped comparisons: demo-trainer runs, 3 seeds per stack, compared with
``compare(runset, groups=...)``; prints a markdown table of what the tool says beside the truth
(docs/STATISTICS.md, "Stacks judged on seeds: real runs").

The truth is by construction: staleness 2 against 0 is a different recipe (stale samples clip
more: the seed means show by how much); the same recipe with other seeds, and the Megatron path
against the Miles path at one recipe, are the same algorithm (equivalent).

Run: ``python -m benchmarks.group_runs [--steps 60]`` (about 10-20 s per run on two cores);
``--same-recipe`` runs the held-out same-recipe cases instead (Megatron at staleness 0, 3 vs 3 and
6 vs 6 seeds: equivalent by construction; at ``--steps 1000`` about 5 minutes per run, 12 runs).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from cliptrack.adapters.demo.train import RunConfig, train
from cliptrack.compare import RunSet, compare
from cliptrack.store.frame import LoadedRun, Point
from cliptrack.store.records import RunInfo


def _run(path: str, staleness: int, seed: int, steps: int) -> tuple[LoadedRun, list[Point]]:
    config = RunConfig(path=path, steps=steps, staleness=staleness, seed=seed)
    metrics = [out.output.metrics for out in train(config)]
    points = [Point(step, 1000.0 + step, dict(m)) for step, m in enumerate(metrics)]
    name = f"{path}-stale{staleness}-seed{seed}"
    return LoadedRun(RunInfo(name, name, path), "demo"), points


CASES = (
    ("staleness 2 vs 0 (Megatron)", ("megatron", 0, (0, 1, 2)), ("megatron", 2, (0, 1, 2)), "different"),
    (
        "same recipe, other seeds (Megatron)",
        ("megatron", 0, (0, 1, 2)),
        ("megatron", 0, (3, 4, 5)),
        "equivalent",
    ),
    ("Megatron vs Miles, staleness 0", ("megatron", 0, (0, 1, 2)), ("miles", 0, (0, 1, 2)), "equivalent"),
)

SAME_RECIPE_CASES = (
    ("same recipe, 3 vs 3 seeds", ("megatron", 0, (0, 1, 2)), ("megatron", 0, (6, 7, 8)), "equivalent"),
    (
        "same recipe, 3 vs 3 other seeds",
        ("megatron", 0, (3, 4, 5)),
        ("megatron", 0, (9, 10, 11)),
        "equivalent",
    ),
    (
        "same recipe, 6 vs 6 seeds",
        ("megatron", 0, (0, 1, 2, 3, 4, 5)),
        ("megatron", 0, (6, 7, 8, 9, 10, 11)),
        "equivalent",
    ),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--same-recipe", action="store_true", help="the 3 vs 3 and 6 vs 6 same-recipe cases")
    args = parser.parse_args(argv)
    cache: dict[tuple[str, int, int], tuple[LoadedRun, list[Point]]] = {}
    lines = [
        "| case | truth | seed means (pp) | tool: difference (90 % CI) | P(b > a) | verdict | seeds needed | right | time |",
        "|---|---|---|---|---:|---|---:|---|---:|",
    ]
    for name, (pa, sa, seeds_a), (pb, sb, seeds_b), truth in SAME_RECIPE_CASES if args.same_recipe else CASES:
        for path, stale, seeds in ((pa, sa, seeds_a), (pb, sb, seeds_b)):
            for seed in seeds:
                if (path, stale, seed) not in cache:
                    cache[path, stale, seed] = _run(path, stale, seed, args.steps)
        a = [cache[pa, sa, s] for s in seeds_a]
        b = [cache[pb, sb, s] for s in seeds_b]
        rs = RunSet.from_points(a + b)
        start = time.perf_counter()
        result = compare(rs, groups={"a": [x.run.run_id for x, _ in a], "b": [x.run.run_id for x, _ in b]})
        took = time.perf_counter() - start
        d = result.group_difference("clip_fraction")
        means = [
            np.mean([result.run_estimate("clip_fraction", r).estimate.value for r in members]) * 100
            for members in result.groups.values()
        ]
        e = d.estimate
        unit = "log-ratio" if d.scale == "log-ratio" else "abs"
        lines.append(
            f"| {name} | {truth} | {means[0]:.2f} → {means[1]:.2f} | {e.value:+.3f} ({e.low:+.3f}, {e.high:+.3f}) {unit} | "
            f"{d.probability_greater * 100:.1f}% | {d.verdict} | {d.seeds_needed} | "
            f"{'yes' if d.verdict == truth else 'no' if d.verdict in ('equivalent', 'different') else 'no verdict'} | "
            f"{took:.2f} s |"
        )
        print(lines[-1], flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
