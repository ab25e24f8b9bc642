"""``cliptrack demo``: train a small policy through both stacks, log both runs, compare them.

Each run logs through :class:`cliptrack.Tracker` to the embedded MLflow store (sqlite, in the output
folder), the JSONL spool and, with ``--wandb``, W&B offline. Then the comparison runs: the verdict
table is printed, the HTML dashboard written, a comparison run logged to MLflow and the W&B
panel specs written. The two paths differ in off-policyness: the Miles run samples from a policy
``--miles-staleness`` steps old, so more of its tokens are clipped.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cliptrack.cli.compare import format_result
from cliptrack.cli.progress import Progress
from cliptrack.compare.stats import MIN_UNITS
from cliptrack.core import keys
from cliptrack.core.secrets import redact
from cliptrack.log.tracker import Tracker

EXPERIMENT = "cliptrack-demo"
"""The MLflow experiment of the demo's training runs (its comparison goes to its own experiment)."""
DEFAULT_STEPS = 150
"""Training steps per run: the comparison's minimum of paired steps (:data:`MIN_UNITS`) with
margin, so that the default demo reaches a verdict on the clip fraction."""
DEFAULT_EPOCHS = 4
"""Optimisation passes per sampled batch: every pass after the first is off-policy."""
DEFAULT_OUT = "cliptrack-demo"
"""The demo's output folder (relative to the working directory) unless ``--out`` names another."""
LOG_FILE = "demo.log"
"""Where, in ``--out``, third-party log records and warnings of the demo go."""
UI_PORT = 5000
"""Port of the ``mlflow ui`` command the demo prints (MLflow's default)."""


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
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default ./{DEFAULT_OUT})")
    parser.add_argument("--wandb", action="store_true", help="also log to W&B (offline without credentials)")
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress (default: a bar on a terminal, a plain line per quarter otherwise)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        from cliptrack.adapters.demo.train import PATHS
    except ImportError as exc:
        print(f"cliptrack demo needs torch: pip install 'cliptrack[all]' ({exc})", file=sys.stderr)
        return 2
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = [p for p in paths if p not in PATHS]
    if unknown or not paths:
        print(f"--paths: unknown path(s) {unknown}; choose from {', '.join(PATHS)}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with third_party_output_to(out / LOG_FILE):
        return _demo(args, paths, out)


def _demo(args: argparse.Namespace, paths: list[str], out: Path) -> int:
    from cliptrack.adapters.demo.train import OnPolicy, RunConfig, train

    tracking_uri = f"sqlite:///{out / 'mlflow.db'}"
    backends = ["mlflow", "jsonl"] + (["wandb"] if args.wandb else [])
    experiment_id = _training_experiment(tracking_uri, out)
    started = time.perf_counter()
    run_ids: dict[str, str] = {}
    schedules: dict[str, str] = {}
    on_policy: dict[str, OnPolicy] = {}
    last: dict[str, Any] = {}
    for path in paths:
        config = RunConfig(
            path=path,
            loss=args.loss,
            steps=args.steps,
            epochs=args.epochs,
            staleness=args.miles_staleness if path == "miles" else 0,
            seed=args.seed,
        )
        with (
            Tracker(
                run_name=f"demo-{path}-{args.loss}-seed{args.seed}",
                backends=backends,
                backend_label=path,
                config=config.as_config(),
                sink_options={
                    "mlflow": {"tracking_uri": tracking_uri},
                    "wandb": {"project": "cliptrack-demo", "dir": out},
                },
                experiment=EXPERIMENT,
                spool_dir=out / "spool",
            ) as tracker,
            Progress(config.steps, f"{path:>8}", enabled=not args.no_progress) as bar,
        ):
            for result in train(config):
                if result.step == 0:  # which schedule ran the micro-batches: printed and an MLflow param
                    tracker.log_config({"schedule": result.schedule})
                    schedules[path] = result.schedule
                tracker.log_output(result.step, result.output, extra=result.metrics)
                bar.advance(
                    clip=result.output.metrics.get(keys.CLIP_FRACTION, 0.0),
                    reward=result.metrics[keys.REWARD],
                )
                on_policy[path] = on_policy.get(path, OnPolicy(config.staleness)).add(result)
                if result.checkpoint is not None:
                    last[path] = (result, config)
            assert tracker.run_id is not None
            run_ids[path] = tracker.run_id
    training_s = time.perf_counter() - started

    print()
    summary_lines = [f"trained {len(paths)} run(s) in {training_s:.1f} s"]
    summary_lines += [f"{path} path ran through: {schedule}" for path, schedule in schedules.items()]
    summary_lines += [f"{path} run: {summary.describe()}" for path, summary in on_policy.items()]
    if len(run_ids) >= 2:
        summary_lines += _compare(list(run_ids.values()), tracking_uri, out)
        summary_lines += _probe(last[paths[0]])
    print("\n".join(summary_lines))
    print()
    print(where_everything_is(out, tracking_uri, run_ids, wandb=args.wandb))
    print()
    print(next_steps(out, tracking_uri, experiment_id, list(run_ids.values())))
    return 0


def where_everything_is(out: Path, tracking_uri: str, run_ids: dict[str, str], *, wandb: bool) -> str:
    """The demo's outputs, one per line (no credential of the store: ``cliptrack.core.secrets``)."""
    lines = [
        "where everything is:",
        f"  MLflow store   {tracking_uri}   (artifacts in {out / 'mlruns'})",
        f"  JSONL spool    {out / 'spool'}",
        f"  log            {out / LOG_FILE}   (MLflow, Megatron and W&B messages and warnings)",
    ]
    if wandb:
        lines.append(
            f"  W&B offline    {out / 'wandb'}   (push later: wandb sync {out / 'wandb'}/offline-run-*)"
        )
    if len(run_ids) >= 2:
        lines += [
            f"  dashboard      {out / 'dashboard.html'}",
            f"  comparison     MLflow experiment {EXPERIMENT}-comparisons, artifacts in "
            f"{out / 'comparison-artifacts'}",
            f"  W&B panels     {out / 'wandb-panels.json'}",
        ]
    lines += [
        f"  run {path:<9}  {run_id}   (cliptrack id, accepted by every command)"
        for path, run_id in run_ids.items()
    ]
    return redact("\n".join(lines))


def next_steps(out: Path, tracking_uri: str, experiment_id: str, run_ids: list[str]) -> str:
    """The exact commands that continue from this demo's runs (each line after ``$ `` runs as is)."""
    store = f"--tracking-uri {tracking_uri}"
    lines = ["next steps:"]
    if len(run_ids) >= 2:
        compared = " ".join(run_ids)
        lines += [
            "  compare the runs again (table and verdict):",
            f"    $ cliptrack compare {compared} {store}",
            "  every number as JSON:",
            f"    $ cliptrack compare {compared} {store} --json",
        ]
    lines += [
        "  list the store's runs (ids, status, start time, steps):",
        f"    $ cliptrack runs {store}",
        "  browse the runs and their charts in MLflow (then open the address below):",
        f"    $ mlflow ui --backend-store-uri {tracking_uri} --port {UI_PORT}",
        f"    {mlflow_ui_url(experiment_id)}",
    ]
    if len(run_ids) >= 2:
        lines += ["  the dashboard (open in a browser):", f"    {(out / 'dashboard.html').as_uri()}"]
    lines += [
        "  the notebook on these runs (jupyter lab notebooks/compare_backends.ipynb to open it):",
        f"    $ CLIPTRACK_DEMO_OUT={out} jupyter execute notebooks/compare_backends.ipynb",
    ]
    return redact("\n".join(lines))  # a store's password is never printed (cliptrack.core.secrets)


def mlflow_ui_url(experiment_id: str, port: int | None = None) -> str:
    """The MLflow UI address of an experiment's runs and charts.

    MLflow 3.17's UI picks the GenAI or the model-training view from its ``workflowType`` setting
    (the URL parameter, else the browser's saved choice, default GenAI), not from the experiment's
    ``mlflow.experimentKind`` tag; ``workflowType=machine_learning`` and ``compareRunsMode=CHART``
    open the runs with their charts in any browser.
    """
    return (
        f"http://127.0.0.1:{port or UI_PORT}/#/experiments/{experiment_id}/runs"
        "?workflowType=machine_learning&compareRunsMode=CHART"
    )


THIRD_PARTY_LOGGERS = ("mlflow", "alembic", "megatron", "wandb", "urllib3", "git", "torch")
"""Loggers whose records go to the demo's log file instead of the terminal."""


@contextlib.contextmanager
def third_party_output_to(log_path: Path) -> Iterator[None]:
    """Within the block, send the records of ``THIRD_PARTY_LOGGERS`` and every warning raised outside
    this project (from installed packages: MLflow, Megatron, W&B, torch) to ``log_path``; warnings
    of ``tracking``/``adapters`` still reach stderr."""
    import logging

    import mlflow  # noqa: F401 - configures its loggers on import; replaced below, restored after

    os.environ.setdefault("WANDB_SILENT", "true")
    handle = log_path.open("a", encoding="utf-8")
    handler = logging.StreamHandler(handle)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    saved = []
    for name in THIRD_PARTY_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate))
        logger.handlers, logger.propagate = [handler], False
    shown = warnings.showwarning
    here = Path(__file__).resolve().parent
    ours = (str(here) + os.sep, str(here.parent / "adapters") + os.sep)

    def show(
        message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        if str(Path(filename).resolve()).startswith(ours):
            shown(message, category, filename, lineno, file, line)
        else:
            handle.write(f"{filename}:{lineno}: {category.__name__}: {message}\n")
            handle.flush()

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown
        for logger, handlers, propagate in saved:
            logger.handlers, logger.propagate = handlers, propagate
        handle.close()


def find_output(out: str | Path = DEFAULT_OUT, *, near: Path | None = None) -> Path:
    """The demo's output folder ``out``: as given when absolute, else in ``near`` (default: the
    working directory) or its parent (a notebook runs in ``notebooks/``, the demo from the root)."""
    path = Path(out)
    here = near or Path.cwd()
    candidates = [path] if path.is_absolute() else [here / path, here.parent / path]
    for candidate in candidates:
        if (candidate / "mlflow.db").is_file():
            return candidate.resolve()
    tried = " or ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"no demo output (mlflow.db) in {tried}: run `cliptrack demo` from the repository root first "
        f"(or pass the folder the demo wrote with --out)"
    )


def _training_experiment(tracking_uri: str, out: Path) -> str:
    """Create the demo's MLflow experiment (unless it exists) as a training experiment for ``mlflow
    ui``, its artifact store under ``out`` (MLflow's default would be ./mlruns of the working directory)."""
    from cliptrack.backends.mlflow.experiments import training_experiment

    return training_experiment(tracking_uri, EXPERIMENT, (out / "mlruns").as_uri())


def _probe(last: tuple[Any, Any]) -> list[str]:
    """The paired probe at the first run's last checkpoint (the same weights and the same batch
    through both paths), its answer set beside the training comparison's."""
    from cliptrack.adapters.demo.probe import probe
    from cliptrack.compare.probe import compare_outputs

    result, config = last
    started = time.perf_counter()
    outputs = probe(result.checkpoint, result.sampler, config)
    found = compare_outputs(outputs.megatron, outputs.miles, labels=("megatron", "miles"))
    print()
    print(
        f"the same batch through both paths at the {config.path} run's step-{result.step} checkpoint "
        f"({time.perf_counter() - started:.1f} s):"
    )
    print(found.summary())
    return [
        f"paired probe (numerics, same batch and weights): {found.verdict}; training runs (the loop, "
        "staleness included): the verdict above. A gap in the runs with an equivalent probe comes "
        "from the training loop, not from the stacks' numerics",
    ]


def _compare(run_ids: list[str], tracking_uri: str, out: Path) -> list[str]:
    """Compare the runs: print the table and verdict, write the dashboard and the panels."""
    from cliptrack.backends.load import load_runs
    from cliptrack.backends.mlflow.panels import log_comparison
    from cliptrack.backends.wandb.panels import save_or_write
    from cliptrack.compare.engine import compare
    from cliptrack.compare.views.dashboard import write_dashboard

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
