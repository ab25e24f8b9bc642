"""``cliptrack demo``: train a small policy through both stacks, log both runs, compare them.

A claim about stacks rests on seeds, so the demo trains ``--seeds`` short runs per stack: the
Megatron path with a fresh sampler, the Miles path with a sampler ``--miles-staleness`` steps old
(so more of its tokens are clipped and its mismatch KL is higher), and a control: the Megatron path
with the same staleness as Miles, on other seeds. Each run logs through :class:`cliptrack.Tracker` to
the embedded MLflow store (sqlite, in the output folder), the JSONL spool and, with ``--wandb``, W&B
offline. Then two group comparisons: Miles against Megatron (the demo's question; the table, the
headline and the notes are printed, the HTML dashboard written, a comparison run logged to MLflow
and the W&B panel specs written), and Miles against the control (same staleness, other seeds:
its headline is printed), which tells the staleness from the stack.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cliptrack.backends.mlflow.experiments import CHARTS_VIEW_QUERY, training_experiment
from cliptrack.cli.compare import format_result, worst_of_runs
from cliptrack.cli.demo_view import group_by_stack, show_verdict
from cliptrack.cli.progress import Progress
from cliptrack.core import keys
from cliptrack.core.secrets import redact
from cliptrack.log.tracker import Tracker

EXPERIMENT = "cliptrack-demo"
"""The MLflow experiment of the demo's training runs (its comparison goes to its own experiment)."""
DEFAULT_STEPS = 20
"""Training steps per run. A group comparison takes each seed's window value as one unit, so short
runs suffice: at 20 steps and 3 seeds the stale Miles stack clips about 7 times as often as the
Megatron stack (interval far beyond the margin) and the control is within it, and the whole demo
fits in about two minutes on two busy cores."""
DEFAULT_SEEDS = 3
"""Seeds per stack (a stack-level verdict needs 2 or more)."""
DEFAULT_EPOCHS = 4
"""Optimisation passes per sampled batch: every pass after the first is off-policy."""
DEFAULT_OUT = "cliptrack-demo"
"""The demo's output folder (relative to the working directory) unless ``--out`` names another."""
LOG_FILE = "demo.log"
"""Where, in ``--out``, third-party log records and warnings of the demo go."""
UI_PORT = 5000
"""Port of the ``mlflow ui`` command the demo prints (MLflow's default)."""
PROBE_INPUTS = "probe"
"""Where, in ``--out``, the paired probe's two inputs go (``megatron.json``, ``miles.json``: the
paths' outputs of one batch, read by ``cliptrack probe``)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help=f"training steps per run (default {DEFAULT_STEPS})",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=DEFAULT_SEEDS,
        help=f"seeds per stack, 2 or more for a verdict on the stacks (default {DEFAULT_SEEDS})",
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
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="first seed (default 0): each stack trains seeds SEED.., the control the next ones",
    )
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
    if args.seeds < 1 or args.steps < 1:
        print("--seeds and --steps: 1 or more (2 seeds or more for a verdict)", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with third_party_output_to(out / LOG_FILE):
        return _demo(args, paths, out)


CONTROL = "control"
"""The control group's role: the Megatron path with the Miles run's staleness, on other seeds."""


def plan(
    paths: list[str], seeds: int, first_seed: int, staleness: int
) -> dict[str, list[tuple[str, int, int]]]:
    """The runs to train, by group: ``(path, staleness, seed)``. Each path trains ``seeds`` seeds
    from ``first_seed`` (Miles with ``staleness``); with both paths and a stale Miles, the control
    (the Megatron path, as stale as Miles, on the next seeds) is trained first, so the latest run of
    each backend in the store is a stack's."""
    groups: dict[str, list[tuple[str, int, int]]] = {}
    if {"megatron", "miles"} <= set(paths) and staleness > 0:
        groups[control_name(staleness)] = [
            ("megatron", staleness, first_seed + seeds + i) for i in range(seeds)
        ]
    for path in paths:
        stale = staleness if path == "miles" else 0
        groups[path] = [(path, stale, first_seed + i) for i in range(seeds)]
    return groups


def control_name(staleness: int) -> str:
    """The control group's name: the Megatron path at the Miles run's staleness."""
    return f"megatron-stale{staleness}"


def run_name(path: str, loss: str, staleness: int, seed: int) -> str:
    """A training run's name; a stack's fresh Megatron and stale Miles runs keep the short form."""
    stale = f"-stale{staleness}" if path == "megatron" and staleness else ""
    return f"demo-{path}-{loss}{stale}-seed{seed}"


@dataclass
class _Trained:
    """What the demo's training gathered: cliptrack run ids by group, the schedule each path ran
    through, each group's on-policy summary, and each group's last checkpointed step."""

    groups: dict[str, list[str]] = field(default_factory=dict)
    schedules: dict[str, str] = field(default_factory=dict)
    on_policy: dict[str, Any] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)
    worst: dict[str, Any] = field(default_factory=dict)
    """Each group's first run's last step's worst sequences (a ``cliptrack.core.worst.Worst``)."""


def _train_run(
    args: argparse.Namespace, config: Any, group: str, out: Path, bar: Progress, seen: _Trained
) -> None:
    """Train one run of ``group`` and log it through a Tracker (MLflow, JSONL, W&B when asked)."""
    from cliptrack.adapters.demo.train import OnPolicy, train

    tracking_uri = f"sqlite:///{out / 'mlflow.db'}"
    with Tracker(
        run_name=run_name(config.path, args.loss, config.staleness, config.seed),
        sinks=["mlflow", "jsonl"] + (["wandb"] if args.wandb else []),
        backend_label=config.path,
        config={**config.as_config(), "group": group},
        sink_options={
            "mlflow": {"tracking_uri": tracking_uri},
            "wandb": {"project": "cliptrack-demo", "dir": out},
        },
        experiment=EXPERIMENT,
        spool_dir=out / "spool",
    ) as tracker:
        for result in train(config):
            if result.step == 0:  # which schedule ran the micro-batches: printed and an MLflow param
                tracker.log_config({"schedule": result.schedule})
                seen.schedules[config.path] = result.schedule
            tracker.log_output(result.step, result.output, extra=result.metrics)
            if result.worst is not None:
                tracker.log_worst(result.step, result.worst)
                if result.checkpoint is not None:
                    seen.worst.setdefault(group, result.worst)
            bar.advance(
                clip=result.output.metrics.get(keys.CLIP_FRACTION, 0.0),
                reward=result.metrics[keys.REWARD],
            )
            seen.on_policy[group] = seen.on_policy.get(group, OnPolicy(config.staleness)).add(result)
            if result.checkpoint is not None:
                seen.last[group] = (result, config)
        assert tracker.run_id is not None
        seen.groups.setdefault(group, []).append(tracker.run_id)


WORST_SHOWN = 3
"""Worst sequences printed per group."""


def worst_line(group: str, worst: Any) -> str:
    """One line: a group's worst sequences at its first run's last step, by summed ``|log ratio|``
    (datum: the completion's index in the step's batch)."""
    shown = worst.by["abs_log_ratio"][:WORST_SHOWN]
    listed = "; ".join(
        f"#{s.datum} sum |log ratio| {s.abs_log_ratio:.3f} over {s.tokens} tokens, worst token {s.worst_token} "
        f"(|log ratio| {s.max_abs_log_ratio:.3f})"
        for s in shown
    )
    return f"{group} worst sequences (step {worst.step} of its first seed): {listed or 'none'}"


def _demo(args: argparse.Namespace, paths: list[str], out: Path) -> int:
    from cliptrack.adapters.demo.train import RunConfig

    tracking_uri = f"sqlite:///{out / 'mlflow.db'}"
    experiment_id = _training_experiment(tracking_uri, out)
    started = time.perf_counter()
    seen = _Trained()
    for group, runs in plan(paths, args.seeds, args.seed, args.miles_staleness).items():
        with Progress(
            args.steps * len(runs), f"{group:>8}", enabled=not args.no_progress, run_steps=args.steps
        ) as bar:
            for path, staleness, seed in runs:
                config = RunConfig(
                    path=path,
                    loss=args.loss,
                    steps=args.steps,
                    epochs=args.epochs,
                    staleness=staleness,
                    seed=seed,
                )
                _train_run(args, config, group, out, bar, seen)
    groups, schedules, on_policy, last = seen.groups, seen.schedules, seen.on_policy, seen.last
    training_s = time.perf_counter() - started

    print()
    runs_trained = sum(len(ids) for ids in groups.values())
    summary_lines = [f"trained {runs_trained} runs ({args.seeds} seed(s) per group) in {training_s:.1f} s"]
    summary_lines += [f"{path} path ran through: {schedule}" for path, schedule in schedules.items()]
    summary_lines += [
        f"{group} ({len(groups[group])} seeds): {summary.describe()}" for group, summary in on_policy.items()
    ]
    summary_lines += [worst_line(group, worst) for group, worst in seen.worst.items()]
    stacks = {p: groups[p] for p in paths if p in groups}
    probe_inputs = None
    if len(stacks) >= 2 and args.seeds >= 2:
        summary_lines += _compare(stacks, groups, tracking_uri, out, control_name(args.miles_staleness))
        probe_line, probe_inputs = _probe(last[paths[0]], out / PROBE_INPUTS)
        summary_lines.append(probe_line)
    elif len(stacks) >= 2:
        summary_lines.append("no stack-level verdict with one seed per stack (--seeds 2 or more)")
    print("\n".join(summary_lines))
    print()
    print(where_everything_is(out, tracking_uri, groups, wandb=args.wandb, probe=probe_inputs is not None))
    print()
    print(next_steps(out, tracking_uri, experiment_id, stacks, groups, probe=probe_inputs))
    print(f"\nthe demo took {time.perf_counter() - started:.1f} s")
    return 0


def where_everything_is(
    out: Path, tracking_uri: str, groups: dict[str, list[str]], *, wandb: bool, probe: bool = False
) -> str:
    """The demo's outputs, one per line (no credential of the store: ``cliptrack.core.secrets``);
    ``probe``: whether the paired probe's inputs were written."""
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
    if len(groups) >= 2:
        lines += [
            f"  dashboard      {out / 'dashboard.html'}",
            f"  comparison     MLflow experiment {EXPERIMENT}-comparisons, artifacts in "
            f"{out / 'comparison-artifacts'}",
            f"  W&B panels     {out / 'wandb-panels.json'}",
        ]
    if probe:
        lines.append(f"  probe inputs   {out / PROBE_INPUTS}   (one batch through both paths, per datum)")
    lines += [f"  runs {group:<15} {' '.join(ids)}" for group, ids in groups.items()]
    lines.append("  (cliptrack ids, accepted by every command)")
    return redact("\n".join(lines))


def notebooks_installed() -> bool:
    """Whether the notebook extra (nbclient, nbformat, ipykernel) is installed."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("nbclient", "nbformat", "ipykernel"))


def group_arguments(groups: dict[str, list[str]]) -> str:
    """``--group NAME=ID,ID ...`` for ``cliptrack compare``."""
    return " ".join(f"--group {name}={','.join(ids)}" for name, ids in groups.items())


def next_steps(
    out: Path,
    tracking_uri: str,
    experiment_id: str,
    stacks: dict[str, list[str]],
    groups: dict[str, list[str]],
    *,
    probe: tuple[Path, Path] | None = None,
) -> str:
    """The exact commands that continue from this demo's runs (each line after ``$ `` runs as is);
    ``probe``: the paired probe's two inputs (Megatron's, Miles'), when written."""
    store = f"--tracking-uri {tracking_uri}"
    lines = ["next steps:"]
    if len(stacks) >= 2 and min(len(ids) for ids in stacks.values()) >= 2:
        compared = group_arguments(stacks)
        lines += [
            "  compare the stacks again (table, headline, notes; --verbose: every column):",
            f"    $ cliptrack compare {compared} {store}",
            "  every number as JSON:",
            f"    $ cliptrack compare {compared} {store} --json",
        ]
        control = [g for g in groups if g not in stacks]
        if control and "miles" in stacks:
            lines += [
                "  the control: Miles against the Megatron path as stale as Miles (other seeds):",
                f"    $ cliptrack compare {group_arguments({control[0]: groups[control[0]], 'miles': stacks['miles']})} {store}",
            ]
    if probe is not None:
        lines += [
            "  the paired probe: one batch through both paths' losses at the same weights, compared per",
            "  datum (the stacks' numerics alone, answered from one step):",
            f"    $ cliptrack probe {shlex.quote(str(probe[0]))} {shlex.quote(str(probe[1]))} --labels megatron,miles",
        ]
    lines += [
        "  list the store's runs (ids, status, start time, steps):",
        f"    $ cliptrack runs {store}",
        "  browse the runs and their charts in MLflow (then open the address below):",
        f"    $ mlflow ui --backend-store-uri {tracking_uri} --port {UI_PORT} --workers 1",
        f"    {mlflow_ui_url(experiment_id)}",
    ]
    if len(stacks) >= 2:
        lines += ["  the dashboard (open in a browser):", f"    {(out / 'dashboard.html').as_uri()}"]
    lines.append(
        "  the notebook on these runs, executed with its outputs (from any folder; it prints where):"
    )
    if not notebooks_installed():
        lines.append("  (first: pip install 'cliptrack[notebooks]', which `make demo` installs)")
    lines.append(f"    $ cliptrack notebook --demo-out {out}")
    return redact("\n".join(lines))  # a store's password is never printed (cliptrack.core.secrets)


def mlflow_ui_url(experiment_id: str, port: int | None = None) -> str:
    """The MLflow UI address of an experiment's runs and charts.

    MLflow 3.17's UI picks the GenAI or the model-training view from its ``workflowType`` setting
    (the URL parameter, else the browser's saved choice, default GenAI), not from the experiment's
    ``mlflow.experimentKind`` tag; ``workflowType=machine_learning`` and ``compareRunsMode=CHART``
    open the runs with their charts in any browser, and ``viewStateShareKey`` the view cliptrack
    wrote for the experiment (``experiments.charts_view_tags``): the clip fraction, the mismatch KL,
    reward and throughput alone, full width, the runs grouped by stack (``demo_view.group_by_stack``).
    """
    return (
        f"http://127.0.0.1:{port or UI_PORT}/#/experiments/{experiment_id}/runs"
        f"?workflowType=machine_learning&compareRunsMode=CHART&{CHARTS_VIEW_QUERY}"
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
    ui``, its artifact store under ``out`` (MLflow's default would be ./mlruns of the working directory),
    its view grouping the runs by stack (``demo_view.group_by_stack``)."""
    experiment_id = training_experiment(tracking_uri, EXPERIMENT, (out / "mlruns").as_uri())
    group_by_stack(tracking_uri, experiment_id)
    return experiment_id


def _probe(last: tuple[Any, Any], folder: Path) -> tuple[str, tuple[Path, Path]]:
    """The paired probe at the first path's last checkpoint (the same weights and the same batch
    through both paths): its two inputs written to ``folder`` (for ``cliptrack probe``), its
    answer printed; the line that sets it beside the training comparison's, and the inputs' paths."""
    from cliptrack.adapters.demo.probe import probe, write_inputs
    from cliptrack.compare.probe import compare_outputs

    result, config = last
    started = time.perf_counter()
    outputs = probe(result.checkpoint, result.sampler, config)
    inputs = write_inputs(outputs, folder)
    found = compare_outputs(outputs.megatron, outputs.miles, labels=("megatron", "miles"))
    print()
    print(
        f"the same batch through both paths at the {config.path} run's step-{result.step} checkpoint "
        f"({time.perf_counter() - started:.1f} s):"
    )
    print(found.summary())
    return (
        f"paired probe (numerics, same batch and weights): {found.verdict}; training runs (the loop, "
        "staleness included): the verdict above. A gap in the runs with an equivalent probe comes "
        "from the training loop, not from the stacks' numerics"
    ), inputs


def _labelled(runs: Any, groups: dict[str, list[str]]) -> dict[str, list[str]]:
    """The groups with each run id replaced by the run's label in ``runs`` (loaded in the groups'
    order: a loaded run set keeps the order of the references it was given)."""
    ids = [run_id for members in groups.values() for run_id in members]
    label = dict(zip(ids, runs.labels, strict=True))
    return {group: [label[run_id] for run_id in ids] for group, ids in groups.items()}


def stacks_verdict_line(result: Any) -> str:
    """The demo's line of the stacks' verdict (``result``: Megatron against Miles over seeds);
    the notebook prints the same line from its own comparison of the stored runs."""
    return f"verdict on the stacks: {result.on_policy_verdict}"


def control_heading(control: str) -> str:
    """The line above the control comparison's headline."""
    return f"the control: {control} (the Megatron path as stale as Miles, other seeds) against miles:"


def control_verdict_line(control: str, check: Any, result: Any) -> str:
    """The demo's line of the control's verdict (``check``: the control against Miles), read
    beside the stacks' (``result``)."""
    line = f"control verdict ({control} vs miles): {check.on_policy_verdict}"
    if check.on_policy_verdict != "different" and result.on_policy_verdict == "different":
        line += (
            ". A gap between the stacks that the control does not show comes from the staleness, "
            "not from the path"
        )
    return line


def _compare(
    stacks: dict[str, list[str]], groups: dict[str, list[str]], tracking_uri: str, out: Path, control: str
) -> list[str]:
    """Compare the stacks over seeds: print the table, the headline and the notes, write the
    dashboard and the panels; then the control (Miles against the Megatron path as stale as Miles,
    on other seeds): its headline."""
    from cliptrack.backends.load import load_runs
    from cliptrack.compare.engine import compare
    from cliptrack.compare.views.dashboard import Control, write_dashboard
    from cliptrack.compare.views.mlflow_run import log_comparison
    from cliptrack.compare.views.wandb_panels import save_or_write

    names = [run_id for ids in stacks.values() for run_id in ids]
    runs = load_runs(names, tracking_uri=tracking_uri)
    result = compare(runs, groups=_labelled(runs, stacks))
    result.worst = worst_of_runs(runs)  # the sequences that recur as worst: the dashboard shows them
    print(format_result(result))
    lines = [stacks_verdict_line(result)]
    shown = None  # the control, on the dashboard and the experiment's page
    if control in groups and "miles" in stacks:
        both = load_runs(groups[control] + stacks["miles"], tracking_uri=tracking_uri)
        check = compare(both, groups=_labelled(both, {control: groups[control], "miles": stacks["miles"]}))
        print()
        print(control_heading(control))
        print("\n".join(check.headline_lines()))
        lines.append(control_verdict_line(control, check, result))
        shown = Control(check, f"{control} (the Megatron path as stale as Miles) vs miles", "staleness")
    dashboard = write_dashboard(
        out / "dashboard.html",
        runs,
        result,
        title="cliptrack demo: megatron vs miles over seeds",
        control=shown,
    )
    comparison_id = log_comparison(
        runs,
        result,
        tracking_uri=tracking_uri,
        dashboard=dashboard,
        artifact_dir=out / "comparison-artifacts",
    )
    show_verdict(tracking_uri, EXPERIMENT, result, shown, comparison_id)  # on the experiment's page
    panels: dict[str, Any] = save_or_write(
        "cliptrack", "cliptrack-demo", names, result.summary(), out=out / "wandb-panels.json", online=False
    )
    return [*lines, f"MLflow comparison run {comparison_id}; W&B panel specs in {panels.get('path')}"]
