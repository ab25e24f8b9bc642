"""Synthetic megatron-vs-miles runs with known clip counts, reward and throughput, written to every store.

Counts are integers drawn per step (clipped ~ Binomial(loss_tokens, p_t), with p_t drifting as an
AR(1) process so steps are autocorrelated as in training); the totals are known exactly from the
points, so tests check estimates against sums computed here, not by the code under test.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from cliptrack.core import keys
from cliptrack.store.frame import Point

T0 = 1_767_225_600.0
"""Wall time of the first step (unix seconds, 2026-01-01)."""


@dataclass
class SyntheticRun:
    run_id: str
    run_name: str
    backend: str
    points: list[Point]
    config: dict[str, Any] = field(default_factory=dict)

    def total(self, key: str, steps: set[int] | None = None) -> float:
        return float(
            sum(
                p.metrics[key] for p in self.points if key in p.metrics and (steps is None or p.step in steps)
            )
        )

    def clip_fraction(self, steps: set[int] | None = None) -> float:
        return self.total(keys.CLIPPED_TOKENS, steps) / self.total(keys.LOSS_TOKENS, steps)

    @property
    def steps(self) -> list[int]:
        return [p.step for p in self.points]


def _ar1(rng: np.random.Generator, n: int, phi: float, sd: float) -> np.ndarray:
    out = np.empty(n)
    x = 0.0
    for i in range(n):
        x = phi * x + rng.normal(0.0, sd * np.sqrt(1 - phi * phi))
        out[i] = x
    return out


def synthetic_run(
    run_id: str,
    run_name: str,
    backend: str,
    *,
    seed: int,
    n_steps: int = 200,
    clip_p: float = 0.10,
    clip_sd: float = 0.01,
    reward: float = 0.5,
    throughput: float = 2000.0,
    low_share: float = 0.4,
    missing: tuple[int, ...] = (),
    step_time_s: float | None = None,
) -> SyntheticRun:
    """One run of ``n_steps`` steps (0..n-1 minus ``missing``) with known integer clip counts."""
    rng = np.random.default_rng(seed)
    drift = _ar1(rng, n_steps, 0.8, clip_sd)
    reward_drift = _ar1(rng, n_steps, 0.8, 0.02 * abs(reward))
    points = []
    wall = T0
    for step in range(n_steps):
        loss_tokens = int(rng.integers(2000, 4000))
        p = float(np.clip(clip_p + drift[step], 0.001, 0.9))
        clipped = int(rng.binomial(loss_tokens, p))
        low = int(rng.binomial(clipped, low_share))
        tps = throughput * (1.0 + rng.normal(0.0, 0.02))
        seconds = round(loss_tokens / tps, 3)
        wall = round(wall + seconds, 3)
        if step in missing:
            continue
        metrics = {
            keys.LOSS_TOKENS: float(loss_tokens),
            keys.CLIPPED_TOKENS: float(clipped),
            keys.CLIPPED_LOW_TOKENS: float(low),
            keys.CLIPPED_HIGH_TOKENS: float(clipped - low),
            keys.CLIP_FRACTION: clipped / loss_tokens,
            keys.REWARD: float(reward + reward_drift[step]),
            keys.THROUGHPUT: float(tps),
        }
        if step_time_s is not None:
            metrics[keys.STEP_TIME] = seconds
        points.append(Point(step, wall, metrics))
    config = {"seed": seed, "loss": "ppo", "clip_high_threshold": 1.2, "backend_label": backend}
    return SyntheticRun(run_id, run_name, backend, points, config)


def megatron_vs_miles(
    *,
    miles_clip_p: float = 0.10,
    n_megatron: int = 200,
    n_miles: int = 200,
    miles_missing: tuple[int, ...] = (),
    miles_name: str = "miles-run",
    miles_reward: float = 0.5,
    miles_throughput: float = 2000.0,
) -> tuple[SyntheticRun, SyntheticRun]:
    """The two stacks: megatron at clip 10 %, miles at ``miles_clip_p`` (defaults: no difference)."""
    megatron = synthetic_run("megatron0001", "megatron-run", "megatron", seed=1, n_steps=n_megatron)
    miles = synthetic_run(
        "miles0000002",
        miles_name,
        "miles",
        seed=2,
        n_steps=n_miles,
        clip_p=miles_clip_p,
        missing=miles_missing,
        reward=miles_reward,
        throughput=miles_throughput,
    )
    return megatron, miles


# ----------------------------------------------------------------------------------- writers


def write_jsonl(root: Path, run: SyntheticRun) -> Path:
    """The JSONL spool layout: ``<root>/<run_id>/run.json`` and ``points.jsonl``."""
    run_dir = Path(root) / run.run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "run_id": run.run_id,
        "run_name": run.run_name,
        "backend": run.backend,
        "config": run.config,
        "started": run.points[0].wall_time if run.points else T0,
        "status": "finished",
    }
    (run_dir / keys.RUN_META_FILE).write_text(json.dumps(meta), encoding="utf-8")
    with open(run_dir / keys.POINTS_FILE, "w", encoding="utf-8") as fh:
        for p in run.points:
            fh.write(
                json.dumps({"step": p.step, "wall_time": p.wall_time, "metrics": dict(p.metrics)}) + "\n"
            )
    return run_dir


def write_mlflow(tracking_uri: str, run: SyntheticRun, experiment: str = "cliptrack-tests") -> str:
    """Log the run with the real MLflow client as the sink does; return the MLflow run id."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(experiment)
    created = client.create_run(
        exp_id, run_name=run.run_name, tags={keys.TAG_BACKEND: run.backend, keys.TAG_RUN_KIND: "training"}
    )
    run_id = created.info.run_id
    metrics = [
        Metric(k, v, int(round(p.wall_time * 1000)), p.step) for p in run.points for k, v in p.metrics.items()
    ]
    params = [Param(k, str(v)) for k, v in run.config.items()]
    for i in range(0, len(metrics), 1000):
        client.log_batch(
            run_id,
            metrics=metrics[i : i + 1000],
            params=params if i == 0 else [],
            tags=[RunTag(keys.TAG_RUN_ID, run.run_id)] if i == 0 else [],
        )
    client.set_terminated(run_id)
    return run_id


def write_wandb_offline(directory: Path, run: SyntheticRun, project: str = "cliptrack-tests") -> Path:
    """Log the run with real wandb in offline mode, step metric declared; return the run directory."""
    import wandb

    os.environ.setdefault("WANDB_SILENT", "true")
    wb = wandb.init(
        mode="offline",
        dir=str(directory),
        project=project,
        id=run.run_id,
        name=run.run_name,
        group=run.backend,
        config={keys.TAG_BACKEND: run.backend, **run.config},
        settings=wandb.Settings(console="off", x_disable_stats=True),
    )
    wb.define_metric(keys.WANDB_STEP_METRIC)
    wb.define_metric("*", step_metric=keys.WANDB_STEP_METRIC)
    for p in run.points:
        wb.log({keys.WANDB_STEP_METRIC: p.step, keys.WANDB_WALL_TIME: p.wall_time, **p.metrics})
    wb.finish()
    return Path(wb.dir).parent


def log_with_tracker(run: SyntheticRun, *, tracking_uri: str, spool_dir: Path, wandb_dir: Path) -> str:
    """Log the run's points through ``cliptrack.Tracker`` to MLflow, W&B (offline) and the spool.

    The tracker stamps its own wall times, so only steps and values match ``run.points``.
    Returns the tracker's run id (the spool directory name and the W&B run id).
    """
    from cliptrack.log.tracker import Tracker

    os.environ.setdefault("WANDB_SILENT", "true")
    with Tracker(
        run_name=run.run_name,
        sinks=["mlflow", "wandb"],
        backend_label=run.backend,
        config=run.config,
        sink_options={
            "mlflow": {"tracking_uri": tracking_uri},
            "wandb": {"mode": "offline", "dir": wandb_dir, "project": "cliptrack-tests"},
        },
        experiment="cliptrack-tests",
        spool_dir=spool_dir,
        handle_signals=False,
    ) as tracker:
        for p in run.points:
            tracker.log(p.step, dict(p.metrics))
        run_id = tracker.run_id
    assert run_id is not None
    return run_id


def run_from_curves(
    run_id: str,
    backend: str,
    *,
    seed: int,
    clip_p: np.ndarray,
    loss_tokens: np.ndarray | None = None,
    reward: np.ndarray | None = None,
    steps: np.ndarray | None = None,
    extra: dict[str, np.ndarray] | None = None,
) -> SyntheticRun:
    """A run whose per-step clip probability (and optionally token counts, reward, logged steps and
    extra keys) is given: clipped ~ Binomial(loss_tokens, clip_p[step]) as integers, so the totals
    are plain sums of the points."""
    rng = np.random.default_rng(seed)
    n = len(clip_p)
    tokens = rng.integers(2000, 4000, n) if loss_tokens is None else np.asarray(loss_tokens)
    clipped = rng.binomial(tokens.astype(np.int64), np.clip(clip_p, 0.0, 1.0))
    logged = range(n) if steps is None else [int(s) for s in steps]
    points = []
    for step in logged:
        metrics = {keys.LOSS_TOKENS: float(tokens[step]), keys.CLIPPED_TOKENS: float(clipped[step])}
        if reward is not None:
            metrics[keys.REWARD] = float(reward[step])
        for key, values in (extra or {}).items():
            metrics[key] = float(values[step])
        points.append(Point(step, T0 + step, metrics))
    return SyntheticRun(run_id, run_id, backend, points, {"seed": seed, "backend_label": backend})
