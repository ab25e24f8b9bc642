"""Cost of tracking: ``Tracker.log`` on the training thread, and end-to-end delivery to MLflow.

Side by side, in one process, medians:
- per-step cost on the training thread of ``Tracker.log`` (MLflow sqlite + JSONL sinks, 5 metrics)
  against calling ``mlflow.log_metrics`` per step (sqlite) and ``wandb.log`` (offline) directly,
  interleaved step by step. Targets: <= 50 µs median, >= 100x cheaper than ``mlflow.log_metrics``;
- end to end, 10,000 steps x 5 metrics into a sqlite MLflow store: from the first ``log`` to
  ``close()`` returning (everything acknowledged by MLflow and on disk) against one hand-rolled
  ``MlflowClient.log_batch`` of all 50,000 points. Target: within 1.5x.
Run: ``python benchmarks/cliptrack.py``; ``run()`` returns the rows as dicts.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cliptrack.core import keys
from cliptrack.log.tracker import Tracker

from benchmarks._timing import Row, markdown


def _metrics(step: int) -> dict[str, float]:
    """The clip series of one step: 5 metrics (the tracker re-derives the fraction from the counts)."""
    low, high = step % 13, step % 29
    return {
        keys.LOSS_TOKENS: 4096.0,
        keys.CLIPPED_TOKENS: float(low + high),
        keys.CLIPPED_LOW_TOKENS: float(low),
        keys.CLIPPED_HIGH_TOKENS: float(high),
        keys.CLIP_FRACTION: (low + high) / 4096,
    }


def _quiet() -> None:
    os.environ.setdefault("WANDB_SILENT", "true")
    os.environ["WANDB_MODE"] = "offline"
    import mlflow  # noqa: F401 - configures its loggers on import; quieten them afterwards

    for name in ("cliptrack", "mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


def per_step(work: Path, steps: int) -> dict[str, float]:
    """Median seconds per step on the calling thread, the three loggers interleaved step by step."""
    import mlflow
    import wandb

    tracker_db = f"sqlite:///{work / 'tracker.db'}"
    fluent_db = f"sqlite:///{work / 'fluent.db'}"
    tracker = Tracker(
        "bench-per-step", sinks=(tracker_db, "jsonl"), spool_dir=work / "spool", handle_signals=False
    )
    mlflow.set_tracking_uri(fluent_db)
    mlflow.set_experiment("bench")
    fluent = mlflow.start_run()
    wb = wandb.init(project="bench", mode="offline", dir=str(work), settings=wandb.Settings(console="off"))
    samples: dict[str, list[float]] = {"tracker": [], "mlflow": [], "wandb": []}
    clock = time.perf_counter
    try:
        for step in range(steps):
            metrics = _metrics(step)
            start = clock()
            tracker.log(step, metrics)
            samples["tracker"].append(clock() - start)
            start = clock()
            mlflow.log_metrics(metrics, step=step)
            samples["mlflow"].append(clock() - start)
            start = clock()
            wb.log({**metrics, "step": step})
            samples["wandb"].append(clock() - start)
    finally:
        tracker.close()
        mlflow.end_run()
        wb.finish()
    assert fluent.info.run_id
    return {name: statistics.median(values) for name, values in samples.items()}


def end_to_end(work: Path, steps: int, repeats: int) -> dict[str, float]:
    """Median seconds to get ``steps`` x 5 metrics into sqlite MLflow: Tracker vs one log_batch."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    uri = f"sqlite:///{work / 'e2e.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("e2e")
    times: dict[str, list[float]] = {"tracker": [], "log_batch": []}
    for _ in range(repeats):
        tracker = Tracker(
            "bench-e2e", sinks=(uri,), experiment="e2e", spool_dir=work / "spool", handle_signals=False
        )
        start = time.perf_counter()
        for step in range(steps):
            tracker.log(step, _metrics(step))
        tracker.close()
        times["tracker"].append(time.perf_counter() - start)
        assert tracker.pending() == {"mlflow": 0}

        run_id = client.create_run(experiment).info.run_id
        start = time.perf_counter()
        now = int(time.time() * 1000)
        points = [Metric(k, v, now, step) for step in range(steps) for k, v in _metrics(step).items()]
        client.log_batch(run_id, metrics=points)
        times["log_batch"].append(time.perf_counter() - start)
        client.set_terminated(run_id)
    return {name: statistics.median(values) for name, values in times.items()}


def run(steps_per_step: int = 400, e2e_steps: int = 10_000, repeats: int = 3) -> list[dict[str, object]]:
    _quiet()
    with tempfile.TemporaryDirectory(prefix="cliptrack-bench-") as tmp:
        work = Path(tmp)
        per = per_step(work, steps_per_step)
        e2e = end_to_end(work, e2e_steps, repeats)
    anchor = "mlflow.log_metrics per step (sqlite)"
    rows = [
        Row(
            "Tracker.log per step, training thread (MLflow sqlite + JSONL)",
            per["tracker"],
            anchor,
            per["tracker"] / per["mlflow"],
            "<= 50 µs and <= 0.01x",
        ),
        Row("wandb.log per step (offline)", per["wandb"], anchor, per["wandb"] / per["mlflow"]),
        Row(anchor, per["mlflow"], anchor, 1.0),
        Row(
            f"Tracker end to end, {e2e_steps:,} steps x 5 metrics -> sqlite MLflow",
            e2e["tracker"],
            "one MlflowClient.log_batch of all points",
            e2e["tracker"] / e2e["log_batch"],
            "<= 1.5x",
        ),
        Row(
            "one MlflowClient.log_batch of all points",
            e2e["log_batch"],
            "one MlflowClient.log_batch of all points",
            1.0,
        ),
    ]
    print(markdown(rows))
    return [row.as_dict() for row in rows]


if __name__ == "__main__":
    run()
