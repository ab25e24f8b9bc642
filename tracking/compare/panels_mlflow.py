"""MLflow panels: a comparison run holding the verdict, figures, table and dashboard.

``log_comparison`` creates one run tagged ``cliptrack.kind=comparison`` with

- tags: ``cliptrack.compared_runs`` (ids, reference first), ``cliptrack.verdict``, and the summary
  as the run description (``mlflow.note.content``);
- params: alignment, window, confidence, bootstrap replicates, seed, tolerances;
- metrics: per quantity the difference and its interval for each compared pair;
- artifacts: ``figures/*.png`` (matplotlib), ``comparison.csv``, ``comparison.md``,
  ``dashboard.html`` (the self-contained dashboard).

The compared runs are linked by tag on both sides: each compared MLflow run in the same store gets
the comparison's id appended to its ``cliptrack.compared_in`` tag. ``mlflow.parentRunId`` is not
used: the compared runs exist before the comparison, may sit in other experiments and can take part
in several comparisons, while a run has only one parent.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from tracking import keys
from tracking.compare.dashboard import PALETTE, write_dashboard
from tracking.compare.frame import RunSet
from tracking.compare.series import AXIS_TITLES, all_series
from tracking.compare.result import ComparisonResult

DEFAULT_EXPERIMENT = "cliptrack-comparisons"


def write_figures(runset: RunSet, result: ComparisonResult, directory: str | Path) -> list[Path]:
    """Write clip.png, split.png, reward.png and throughput.png (matplotlib, Agg) into ``directory``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    series = all_series(runset, result.runs, result.align, result.window)
    panels = {
        "clip": "Clip fraction (token-weighted, rolling, 90% band)",
        "split": "Clip fraction by side (low dotted, high solid)",
        "reward": "Reward",
        "throughput": "Throughput (loss tokens/s)",
    }
    paths = []
    for key, title in panels.items():
        fig, ax = plt.subplots(figsize=(8, 4.2), dpi=100)
        for i, (label, s) in enumerate(series.items()):
            color = PALETTE[i % len(PALETTE)]
            name = f"{label} [{result.backends.get(label, '')}]"
            if key == "clip":
                ax.fill_between(s["x"], s["band_low"], s["band_high"], color=color, alpha=0.18, linewidth=0)
                ax.plot(s["x"], s["clip_fraction"], ".", color=color, alpha=0.4, markersize=3)
                ax.plot(s["x"], s["clip_rolling"], color=color, label=name)
            elif key == "split":
                ax.plot(s["x"], s["low_fraction"], ":", color=color, label=f"{name} low")
                ax.plot(s["x"], s["high_fraction"], "-", color=color, label=f"{name} high")
            else:
                ax.plot(s["x"], s[key], color=color, label=name)
        if key in ("clip", "split"):
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_title(title)
        ax.set_xlabel(AXIS_TITLES[result.align])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = directory / f"{key}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def log_comparison(runset: RunSet, result: ComparisonResult, tracking_uri: str | None = None,
                   experiment: str | None = None, run_name: str | None = None,
                   dashboard: str | Path | None = None) -> str:
    """Log the comparison as an MLflow run; return its run id.

    ``dashboard``: an HTML dashboard of this comparison already written (by ``write_dashboard``)
    to log as the artifact instead of rendering it again.

    ``experiment`` defaults to the experiment of the reference run when it was loaded from this
    MLflow store, else ``cliptrack-comparisons``.
    """
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    infos = [runset.info(label) for label in result.runs]
    same_store = [i for i in infos if i.source == "mlflow" and i.location == str(client.tracking_uri)]
    if experiment is None and same_store and same_store[0] is infos[0]:
        exp_id = client.get_run(infos[0].run_id).info.experiment_id
    else:
        name = experiment or DEFAULT_EXPERIMENT
        exp = client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp else client.create_experiment(name)
    summary = result.summary()
    tags = {
        keys.TAG_RUN_KIND: keys.RUN_KIND_COMPARISON,
        keys.TAG_COMPARED_RUNS: ",".join(i.run_id for i in infos),
        keys.TAG_VERDICT: result.on_policy_verdict,
        "mlflow.note.content": summary,
    }
    run = client.create_run(exp_id, run_name=run_name or "compare: " + " vs ".join(result.runs), tags=tags)
    run_id = run.info.run_id
    try:
        params = {"align": result.align, "window": str(result.window), "confidence": result.confidence,
                  "n_boot": result.n_boot, "seed": result.seed,
                  **{f"tolerance.{s.name}": f"{s.tolerance:g}{' relative' if s.relative else ''}" for s in result.specs},
                  **{f"run.{i}": f"{info.display} [{info.backend}] {info.source}:{info.run_id}"
                     for i, info in enumerate(infos)}}
        metrics = []
        for n, d in enumerate(result.differences):
            suffix = "" if len(result.runs) == 2 else f".{n}"
            for what, value in (("difference", d.estimate.value), ("ci_low", d.estimate.low),
                                ("ci_high", d.estimate.high)):
                if value == value:
                    metrics.append(Metric(f"{d.metric}.{what}{suffix}", float(value), 0, 0))
        for e in result.estimates:
            idx = result.runs.index(e.run)
            if e.estimate.value == e.estimate.value:
                metrics.append(Metric(f"{e.metric}.run{idx}", float(e.estimate.value), 0, 0))
        client.log_batch(run_id, metrics=metrics, params=[Param(k, str(v)[:6000]) for k, v in params.items()],
                         tags=[RunTag(keys.TAG_BACKEND, ",".join(sorted(set(result.backends.values()))))])
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            write_figures(runset, result, root / "figures")
            result.table().to_csv(root / "comparison.csv", index=False)
            (root / "comparison.md").write_text(result.to_markdown(), encoding="utf-8")
            if dashboard is None:
                write_dashboard(root / "dashboard.html", runset, result)
            else:
                shutil.copyfile(dashboard, root / "dashboard.html")
            client.log_artifacts(run_id, str(root))
        for info in same_store:
            try:
                previous = client.get_run(info.run_id).data.tags.get(keys.TAG_COMPARED_IN, "")
                linked = [x for x in previous.split(",") if x] + [run_id]
                client.set_tag(info.run_id, keys.TAG_COMPARED_IN, ",".join(linked))
            except MlflowException:
                pass
        client.set_terminated(run_id, "FINISHED")
    except Exception:
        client.set_terminated(run_id, "FAILED")
        raise
    return run_id
