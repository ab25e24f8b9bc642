"""``cliptrack demo``: train a small policy through both stacks, log both runs, compare them.

Each run logs through :class:`tracking.Tracker` to the embedded MLflow store (sqlite, in the output
folder), the JSONL spool and, with ``--wandb``, W&B offline. Then the comparison runs: the verdict
table is printed, the HTML dashboard written, a comparison run logged to MLflow and the W&B
panel specs written. The two paths differ in off-policyness: the Miles run samples from a policy
``--miles-staleness`` steps old, so more of its tokens are clipped.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from tracking import keys
from tracking.compare.stats import MIN_UNITS

EXPERIMENT = "cliptrack-demo"
"""The MLflow experiment of the demo's training runs (its comparison goes to its own experiment)."""
DEFAULT_STEPS = 150
"""Training steps per run: the comparison's minimum of paired steps (:data:`MIN_UNITS`) with
margin, so that the default demo reaches a verdict on the clip fraction."""
DEFAULT_EPOCHS = 4
"""Optimisation passes per sampled batch: every pass after the first is off-policy."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help=f"training steps per run (default {DEFAULT_STEPS}; the comparison gives no verdict "
        f"below {MIN_UNITS} paired steps)",
    )
    parser.add_argument(
        "--loss", choices=("ppo", "cispo"), default="ppo", help="loss of both runs (default ppo)"
    )
    parser.add_argument(
        "--paths",
        default="megatron,miles",
        help="backend paths to train, comma-separated (default megatron,miles)",
    )
    parser.add_argument(
        "--epochs",
        type=int,
        default=DEFAULT_EPOCHS,
        help=f"optimisation passes per sampled batch (default {DEFAULT_EPOCHS})",
    )
    parser.add_argument(
        "--miles-staleness",
        type=int,
        default=2,
        help="steps the Miles run's sampler lags its policy (default 2; Megatron: 0)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of both runs (default 0)")
    parser.add_argument("--out", default="cliptrack-demo", help="output folder (default ./cliptrack-demo)")
    parser.add_argument("--wandb", action="store_true", help="also log to W&B (offline without credentials)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")
    try:
        from adapters.demo.train import PATHS, OnPolicy, RunConfig, train
    except ImportError as exc:
        print(f"cliptrack demo needs torch: pip install 'cliptrack[all]' ({exc})", file=sys.stderr)
        return 2
    from tqdm import tqdm

    from tracking import Tracker

    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = [p for p in paths if p not in PATHS]
    if unknown or not paths:
        print(f"--paths: unknown path(s) {unknown}; choose from {', '.join(PATHS)}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tracking_uri = f"sqlite:///{out / 'mlflow.db'}"
    backends = ["mlflow", "jsonl"] + (["wandb"] if args.wandb else [])
    _training_experiment(tracking_uri, out)
    started = time.perf_counter()
    run_ids: dict[str, str] = {}
    finals: dict[str, dict[str, float]] = {}
    schedules: dict[str, str] = {}
    on_policy: dict[str, OnPolicy] = {}
    for path in paths:
        config = RunConfig(
            path=path,
            loss=args.loss,
            steps=args.steps,
            epochs=args.epochs,
            staleness=args.miles_staleness if path == "miles" else 0,
            seed=args.seed,
        )
        with Tracker(
            run_name=f"demo-{path}-{args.loss}-seed{args.seed}",
            backends=backends,
            backend_label=path,
            config=config.as_config(),
            tracking_uri=tracking_uri,
            experiment=EXPERIMENT,
            spool_dir=out / "spool",
            wandb_project="cliptrack-demo",
            wandb_dir=out,
        ) as tracker:
            bar = tqdm(
                train(config),
                total=config.steps,
                desc=f"{path:>8}",
                unit="step",
                disable=args.no_progress,
                file=sys.stdout,
                leave=True,
            )
            for result in bar:
                if result.step == 0:  # which schedule ran the micro-batches: printed and an MLflow param
                    tracker.log_config({"schedule": result.schedule})
                    schedules[path] = result.schedule
                tracker.log_output(result.step, result.output, extra=result.metrics)
                bar.set_postfix(
                    clip=f"{result.output.metrics.get(keys.CLIP_FRACTION, 0.0):.3f}",
                    reward=f"{result.metrics[keys.REWARD]:.3f}",
                )
                finals[path] = {**result.output.metrics, **result.metrics}
                on_policy[path] = on_policy.get(path, OnPolicy(config.staleness)).add(result)
            assert tracker.run_id is not None
            run_ids[path] = tracker.run_id
    training_s = time.perf_counter() - started

    print()
    summary_lines = [f"trained {len(paths)} run(s) in {training_s:.1f} s"]
    summary_lines += [f"{path} path ran through: {schedule}" for path, schedule in schedules.items()]
    summary_lines += [f"{path} run: {summary.describe()}" for path, summary in on_policy.items()]
    if len(run_ids) >= 2:
        summary_lines += _compare(list(run_ids.values()), tracking_uri, out)
    print("\n".join(summary_lines))
    print()
    print("where everything is:")
    print(f"  MLflow store   {tracking_uri}")
    print(f"    open the UI: mlflow ui --backend-store-uri {tracking_uri}")
    print(f"  JSONL spool    {out / 'spool'}")
    if args.wandb:
        print(f"  W&B offline    {out / 'wandb'}   (push later: wandb sync {out / 'wandb'}/offline-run-*)")
    if len(run_ids) >= 2:
        print(f"  dashboard      {out / 'dashboard.html'}")
        print(
            f"  comparison     MLflow experiment cliptrack-demo-comparisons, artifacts in {out / 'comparison-artifacts'}"
        )
        print(f"  W&B panels     {out / 'wandb-panels.json'}")
    for path, run_id in run_ids.items():
        print(f"  run {path:<9} {run_id}")
    return 0


def _training_experiment(tracking_uri: str, out: Path) -> None:
    """Create the demo's MLflow experiment (unless it exists) as a training experiment for ``mlflow
    ui``, its artifact store under ``out`` (MLflow's default would be ./mlruns of the working directory)."""
    from mlflow.tracking import MlflowClient

    from tracking.sinks._compat_mlflow import EXPERIMENT_KIND_TAG, TRAINING_EXPERIMENT_KIND

    client = MlflowClient(tracking_uri=tracking_uri)
    if client.get_experiment_by_name(EXPERIMENT) is None:
        client.create_experiment(
            EXPERIMENT,
            artifact_location=(out / "mlruns").as_uri(),
            tags={EXPERIMENT_KIND_TAG: TRAINING_EXPERIMENT_KIND},
        )


def _compare(run_ids: list[str], tracking_uri: str, out: Path) -> list[str]:
    """Compare the runs: print the table and verdict, write the dashboard and the panels."""
    from tracking.compare import compare, load_runs
    from tracking.compare.cli import format_result
    from tracking.compare.dashboard import write_dashboard
    from tracking.compare.panels_mlflow import log_comparison
    from tracking.compare.panels_wandb import save_or_write

    runs = load_runs(run_ids, tracking_uri=tracking_uri)
    result = compare(runs)
    print(format_result(result))
    dashboard = write_dashboard(
        out / "dashboard.html", runs, result, title="cliptrack demo: megatron vs miles"
    )
    comparison_id = log_comparison(
        runs,
        result,
        tracking_uri=tracking_uri,
        dashboard=dashboard,
        artifact_dir=out / "comparison-artifacts",
    )
    panels: dict[str, Any] = save_or_write(
        "cliptrack", "cliptrack-demo", run_ids, result.summary(), out=out / "wandb-panels.json", online=False
    )
    return [
        f"verdict: {result.on_policy_verdict}",
        f"MLflow comparison run {comparison_id}; W&B panel specs in {panels.get('path')}",
    ]
