"""Comparing two runs of 100,000 steps x 5 series: load from the JSONL spool, load from a sqlite
MLflow store, compare, and the peak memory of each, against the previous method.

Data: two runs of ``STEPS`` steps logging ``loss_tokens:sum`` (5k-50k per step),
``clipped_tokens:sum`` (binomial around 10 % with an AR(1) wobble), ``clip_fraction:mean``,
``reward:mean`` and ``tokens_per_second:mean``, written once to a JSONL spool and to a sqlite MLflow
store (cached in the temp directory between runs).

Every measurement runs in a fresh process (so each one's peak resident memory is its own), the
current method three times (median), the anchor once:

- load JSONL: ``load_runs`` vs the previous path (``RunDir.load_points`` line by line, then the
  per-point frame builder) (target <= 3 s);
- load MLflow: ``load_runs`` (bulk SQL read) vs ``get_metric_history`` per key (target <= 10 s);
- compare: ``compare`` (5 quantities: EWC intervals, segments, the throughout verdict, influence
  screen, lead-lag, step-weighted estimates, bad-data checks) vs the previous block bootstrap with
  2000 x n index arrays on the same 5 quantities, and vs the comparison as it was before the
  verdicts issue ("today": the tree at ``TODAY``, extracted with ``git archive``) (target <= 2 s);
- 2 runs x 1,000,000 steps x 5 series, built in memory (``RunSet.from_points`` from ``Columns``)
  and compared, vs today's code on the same data (target <= 10 s, peak <= 2 GiB);
- 2 groups x 5 runs x 100,000 steps (``compare(..., groups=...)``), vs today's code comparing the
  same 10 runs pairwise with the first (it had no groups) (target <= 5 s);
- peak memory of load + compare (target <= 1 GiB), shown in the row names.

- the paired probe (``compare_outputs``) of two stacks' outputs of one [256 x 8192] batch (per-datum
  outputs with ``probe=True``: log-probs, counts, gauge, loss and per-token clip sides), interleaved
  with the plain PPO loss forward on the same batch as its anchor (target <= 1 s).

Run: ``python benchmarks/compare.py`` (``--today``: only the rows beside today's comparison;
``--probe``: only the probe's row).
``run()`` returns the rows for ``run_all``.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if os.environ.get("CLIPTRACK_BENCH_TREE"):  # a child measuring the code of another commit
    sys.path.insert(0, os.environ["CLIPTRACK_BENCH_TREE"])

from benchmarks._timing import Row, markdown  # noqa: E402 - importable once ROOT is on sys.path

STEPS = 100_000
KEYS = (
    "loss_tokens:sum",
    "clipped_tokens:sum",
    "clip_fraction:mean",
    "reward:mean",
    "tokens_per_second:mean",
)
RUNS = ("bench-a", "bench-b")
TODAY = "ff4088a"
"""The commit whose comparison the new figures stand beside (before the verdicts issue)."""
BIG = 1_000_000
GROUP_RUNS = 5


def _data_dir(steps: int) -> Path:
    return Path(tempfile.gettempdir()) / f"cliptrack-bench-compare-{steps}-v1"


def _series(seed: int, steps: int) -> dict[str, object]:
    import numpy as np
    from scipy.signal import lfilter

    rng = np.random.default_rng(seed)
    wobble = lfilter([1.0], [1.0, -0.9], rng.normal(0, 0.02 * math.sqrt(1 - 0.81), steps))
    tokens = rng.integers(5_000, 50_001, steps)
    clipped = rng.binomial(tokens, np.clip(0.10 + wobble, 0.001, 0.999))
    return {
        "loss_tokens:sum": tokens.astype(float),
        "clipped_tokens:sum": clipped.astype(float),
        "clip_fraction:mean": clipped / tokens,
        "reward:mean": 0.5 + 0.02 * rng.standard_normal(steps),
        "tokens_per_second:mean": 2000.0 * (1 + 0.02 * rng.standard_normal(steps)),
        "wall_time": 1.7e9 + np.arange(steps) * 1.5,
    }


def prepare(steps: int = STEPS) -> Path:
    """Write (once) the JSONL spool and the sqlite MLflow store; return their directory."""
    from cliptrack.core import keys

    root = _data_dir(steps)
    if (root / "ready").exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    from mlflow.entities import Metric
    from mlflow.store.tracking.dbmodels.models import SqlMetric
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("bench", artifact_location=(root / "artifacts").as_uri())
    store = SqlAlchemyStore(uri, None)
    for seed, name in enumerate(RUNS):
        data = _series(seed, steps)
        run_dir = root / "spool" / name
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / keys.RUN_META_FILE).write_text(
            json.dumps(
                {
                    "run_id": name,
                    "run_name": name,
                    "backend": name,
                    "config": {},
                    "started": 1.7e9,
                    "status": "finished",
                }
            ),
            encoding="utf-8",
        )
        walls = data["wall_time"]
        with open(run_dir / keys.POINTS_FILE, "w", encoding="utf-8") as fh:
            for s in range(steps):
                fh.write(
                    json.dumps(
                        {
                            "step": s,
                            "wall_time": float(walls[s]),  # type: ignore[index]
                            "metrics": {k: float(data[k][s]) for k in KEYS},
                        }
                    )
                    + "\n"
                )  # type: ignore[index]
        run = client.create_run(experiment, run_name=name, tags={keys.TAG_BACKEND: name})
        run_id = run.info.run_id
        # The first step through the client (latest metrics, the run's metric keys) ...
        client.log_batch(
            run_id,
            metrics=[
                Metric(k, float(data[k][0]), int(walls[0] * 1000), 0)  # type: ignore[index]
                for k in KEYS
            ],
        )
        # ... the rest inserted in bulk into MLflow's metrics table (log_batch would take minutes).
        rows = [
            {
                "key": k,
                "value": float(data[k][s]),
                "timestamp": int(walls[s] * 1000),  # type: ignore[index]
                "step": s,
                "is_nan": False,
                "run_uuid": run_id,
            }
            for s in range(1, steps)
            for k in KEYS
        ]
        with store.engine.begin() as conn:
            conn.execute(SqlMetric.__table__.insert(), rows)
        client.set_terminated(run_id)
    (root / "ready").write_text("ok")
    return root


def _module(today: str, now: str):  # type: ignore[no-untyped-def]
    """The module ``now`` of this checkout, or ``today`` (its name before the cliptrack namespace)
    in a child measuring the tree at ``TODAY``."""
    return importlib.import_module(today if os.environ.get("CLIPTRACK_BENCH_TREE") else now)


def _in_memory(runs: int, steps: int):  # type: ignore[no-untyped-def]
    """``runs`` runs of ``steps`` steps x 5 series as ``Columns`` (the bulk loaders' form)."""
    import numpy as np

    frame = _module("tracking.compare.frame", "cliptrack.store.frame")
    Columns, LoadedRun = frame.Columns, frame.LoadedRun
    RunInfo = _module("tracking.records", "cliptrack.store.records").RunInfo

    items = []
    for seed in range(runs):
        data = _series(seed, steps)
        step = np.repeat(np.arange(steps), len(KEYS))
        value = np.stack([np.asarray(data[k], dtype=float) for k in KEYS], axis=1).reshape(-1)
        metric = np.tile(np.array(KEYS, dtype=object), steps)
        walls = np.repeat(np.asarray(data["wall_time"], dtype=float), len(KEYS))
        info = LoadedRun(RunInfo(f"run-{seed}", f"run-{seed}", "a" if seed < runs // 2 else "b"), "memory")
        items.append((info, Columns(step, walls, metric, value)))
    return items


def _child_memory(what: str) -> float:
    """The in-memory measurements: build + compare; seconds."""
    package = _module("tracking.compare", "cliptrack.compare")
    RunSet, compare = package.RunSet, package.compare

    runs, steps = (2, BIG) if what.startswith("big") else (2 * GROUP_RUNS, STEPS)
    items = _in_memory(runs, steps)
    started = time.perf_counter()
    runset = RunSet.from_points(items)
    labels = runset.labels
    if what == "groups" and not os.environ.get("CLIPTRACK_BENCH_TREE"):
        result = compare(runset, groups={"a": labels[:GROUP_RUNS], "b": labels[GROUP_RUNS:]})
        assert result.group_differences
    elif what == "groups":  # today's code had no groups: every run against the first
        assert len(compare(runset).differences) == 5 * (2 * GROUP_RUNS - 1)
    else:
        result = compare(runset)
        assert result.difference("clip_fraction").estimate.n_units == steps
    return time.perf_counter() - started


def _child(what: str, root: Path) -> dict[str, float]:
    """One measurement in this process: seconds of the timed part and the process's peak RSS (MiB)."""
    if what.startswith(("big", "groups")):
        seconds = _child_memory(what.replace("-today", ""))
        return {"seconds": seconds, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    from cliptrack.backends import load_runs
    from cliptrack.backends.jsonl import reader as jsonl_reader
    from cliptrack.backends.mlflow import reader as mlflow_reader
    from cliptrack.compare import compare
    from cliptrack.store import frame as frame_module

    from benchmarks import _compare_previous as previous

    uri = f"sqlite:///{root / 'mlflow.db'}"
    if what.endswith("previous") and what.startswith("load-jsonl"):
        jsonl_reader._spool_columns = lambda run_dir: run_dir.load_points()  # type: ignore[assignment]
        frame_module.build_frame = previous.build_frame  # type: ignore[assignment]
    if what == "load-mlflow-previous":
        mlflow_reader.bulk_columns = lambda uri, ids: None  # type: ignore[assignment]
    if what.startswith("load-mlflow"):
        import mlflow  # noqa: F401 - imported first: its import time is not the loader's
    started = time.perf_counter()
    if what.startswith("load-jsonl"):
        runset = load_runs(list(RUNS), jsonl_dir=root / "spool")
    elif what.startswith("load-mlflow"):
        runset = load_runs(list(RUNS), tracking_uri=uri)
    else:
        runset = load_runs(list(RUNS), jsonl_dir=root / "spool")
        started = time.perf_counter()
        if what in ("compare", "compare-today"):
            result = compare(runset)
            assert result.difference("clip_fraction").estimate.n_units == len(runset.wide(RUNS[0]))
        else:
            previous.compare_bootstrap(
                runset,
                [
                    ("clipped_tokens:sum", "loss_tokens:sum"),
                    ("reward:mean", None),
                    ("tokens_per_second:mean", None),
                    ("clipped_tokens:sum", "loss_tokens:sum"),
                    ("clipped_tokens:sum", "loss_tokens:sum"),
                ],
            )
    seconds = time.perf_counter() - started
    assert len(runset.frame) == 2 * len(KEYS) * len(runset.wide(RUNS[0]))
    return {"seconds": seconds, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _today_tree() -> Path:
    """The ``tracking`` package as of ``TODAY``, extracted once into the temp directory."""
    tree = Path(tempfile.gettempdir()) / f"cliptrack-bench-today-{TODAY}"
    if not (tree / "tracking").exists():
        tree.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", TODAY, "tracking"], capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def _measure(what: str, root: Path, repeats: int) -> tuple[float, float]:
    seconds, peaks = [], []
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if what.endswith("-today"):
        env["CLIPTRACK_BENCH_TREE"] = str(_today_tree())
    for _ in range(repeats):
        proc = subprocess.run(
            [sys.executable, __file__, "--child", what, str(root)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"benchmark child {what} failed:\n{proc.stderr[-3000:]}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        seconds.append(out["seconds"])
        peaks.append(out["peak_mib"])
    return statistics.median(seconds), max(peaks)


def run(steps: int = STEPS) -> list[Row]:
    root = prepare(steps)
    size = f"2 runs x {steps:,} steps x {len(KEYS)} series"
    rows = []
    for what, name, anchor_name, target in (
        ("load-jsonl", f"load_jsonl, {size}", "previous: load_points + per-point frame builder", "<= 3 s"),
        (
            "load-mlflow",
            f"load_mlflow (bulk SQL read), sqlite, {size}",
            "get_metric_history per key",
            "<= 10 s",
        ),
        (
            "compare",
            f"compare, 5 quantities (EWC, segments, influence, groups-ready), {size}",
            "previous block bootstrap, 2000 x n index arrays",
            "<= 2 s",
        ),
    ):
        new_s, new_mib = _measure(what, root, 3)
        old_s, old_mib = _measure(f"{what}-previous", root, 1)
        memory = f" [peak {new_mib / 1024:.2f} GiB, previous {old_mib / 1024:.2f} GiB]"
        rows.append(Row(name + memory, new_s, anchor_name, new_s / old_s, target + ", peak <= 1 GiB"))
        rows.append(Row(anchor_name, old_s, anchor_name, 1.0))
    rows += _rows_against_today(root, size)
    rows += probe_rows()
    return rows


def _rows_against_today(root: Path, size: str) -> list[Row]:
    """The new comparison beside the comparison as it was at ``TODAY``, one run each side."""
    rows = []
    for what, name, target in (
        ("compare", f"compare, {size}", "<= 2 s, peak <= 1 GiB"),
        ("big", f"build + compare, 2 runs x {BIG:,} steps x {len(KEYS)} series", "<= 10 s, peak <= 2 GiB"),
        (
            "groups",
            f"build + compare, 2 groups x {GROUP_RUNS} runs x {STEPS:,} steps (today: 10 runs pairwise)",
            "<= 5 s",
        ),
    ):
        new_s, new_mib = _measure(what, root, 1)
        old_s, old_mib = _measure(f"{what}-today", root, 1)
        anchor = f"today ({TODAY}): {name}"
        memory = f" [peak {new_mib / 1024:.2f} GiB, today {old_mib / 1024:.2f} GiB]"
        rows.append(Row(name + memory, new_s, anchor, new_s / old_s, target))
        rows.append(Row(anchor, old_s, anchor, 1.0))
    return rows


PROBE_BATCH = (256, 8192)
"""Datums x tokens of the probe benchmark's batch."""


def probe_rows(repeats: int = 5) -> list[Row]:
    """The paired probe on two outputs of one [256 x 8192] batch vs the PPO loss forward on it."""
    import torch
    from cliptrack.adapters.losses.builtin import ppo
    from cliptrack.adapters.miles import forward_backward_loss
    from cliptrack.compare.probe import compare_outputs

    from benchmarks._timing import interleaved_medians

    datums_n, tokens = PROBE_BATCH
    g = torch.Generator().manual_seed(0)
    slp = -2 * torch.rand(datums_n, tokens, generator=g)
    adv = torch.randn(datums_n, 1, generator=g).expand(datums_n, tokens).contiguous()
    mask = (torch.rand(datums_n, tokens, generator=g) > 0.1).float()
    lp = slp + 0.2 * torch.randn(datums_n, tokens, generator=g)
    datums = [{"logprobs": slp[i], "advantages": adv[i], "mask": mask[i]} for i in range(datums_n)]
    a = forward_backward_loss(datums, list(lp), "ppo", probe=True).output
    b = forward_backward_loss(datums, list(lp + 1e-6), "ppo", probe=True).output
    name = f"compare_outputs (paired probe), {datums_n} x {tokens} batch"
    anchor = f"ppo loss forward, {datums_n} x {tokens}"
    times = interleaved_medians(
        {name: lambda: compare_outputs(a, b), anchor: lambda: ppo(lp, slp, adv, mask)}, repeats, warmup=1
    )
    return [
        Row(name, times[name], anchor, times[name] / times[anchor], "<= 1 s"),
        Row(anchor, times[anchor], anchor, 1.0),
    ]


def main() -> int:
    if len(sys.argv) >= 2 and sys.argv[1] == "--probe":
        print(markdown(probe_rows()))
        return 0
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        print(json.dumps(_child(sys.argv[2], Path(sys.argv[3]))))
        return 0
    if len(sys.argv) >= 2 and sys.argv[1] == "--today":  # only the rows beside today's comparison
        print(markdown(_rows_against_today(prepare(STEPS), f"2 runs x {STEPS:,} steps x {len(KEYS)} series")))
        return 0
    print(markdown(run()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
