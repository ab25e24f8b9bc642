"""The comparison as an MLflow run (``cliptrack panels mlflow``): a comparison run holding the verdict, figures, table and dashboard.

``log_comparison`` creates one run tagged ``cliptrack.kind=comparison`` in an experiment of its own
(``<experiment of the reference run>-comparisons``, or ``cliptrack-comparisons``), so ``mlflow ui``
never charts the comparison's numbers beside the training series. It holds

- tags: ``cliptrack.compared_runs`` (ids, reference first), ``cliptrack.verdict`` (the on-policy
  verdict), ``cliptrack.verdict.<quantity>`` per compared pair (``.stacks`` per compared group
  of seeds), and the summary as the run description (``mlflow.note.content``);
- params: alignment, window, confidence, method, minimum units and effective sample size,
  margins, the runs, and per quantity and pair the difference, its interval, the paired units,
  lag-1 autocorrelation, effective sample size and verdict;
- metrics (step 0, so the MLflow UI shows and sorts them): the same numbers, one metric per
  quantity and pair (``comparison_metrics``: ``<quantity>.difference``, ``.ci_low``, ``.ci_high``,
  ``.margin``, ``.paired_units``, ``.lag1``, ``.ess``, ``.reference_value``, ``.run_value``), and per
  quantity and group of seeds ``<quantity>.stacks.difference``, ``.ci_low``, ``.ci_high``,
  ``.margin``, ``.seeds_reference``, ``.seeds_run``, ``.probability_greater``, ``.seeds_needed``,
  ``.reference_value``, ``.run_value`` (means over seeds); their names share nothing with the
  training series, so no training chart draws them;
- artifacts: ``comparison.json`` (every estimate, interval, ESS, verdict and note),
  ``comparison.csv``, ``comparison.md``, ``dashboard.html`` (the self-contained dashboard) and
  ``figures/<panel>.png`` (one per entry of ``panels.PANELS``, matplotlib).

Artifacts go where the caller says: ``artifact_dir`` is the artifact location of the comparisons
experiment when this call creates it (default for a ``sqlite:///`` store: ``comparison-artifacts``
beside the database file — never ``./mlruns`` of the working directory). An experiment that already
exists keeps the location it was created with.

The compared runs are linked by tag on both sides: each compared MLflow run in the same store gets
the comparison's id appended to its ``cliptrack.compared_in`` tag, and a compared run without a
description gets one linking to the comparison run in the MLflow UI (``mlflow.note.content``). ``mlflow.parentRunId`` is not
used: the compared runs exist before the comparison, may sit in other experiments and can take part
in several comparisons, while a run has only one parent.

The MLflow UI renders a description as markdown with HTML allowed (images, links, iframes), so
every run-provided text in one (run names and labels, reasons and notes quoting them) goes through
``cliptrack.core.text.markdown_text``: it renders as itself, fetches nothing and links nowhere; the one
link is the "Compared in" link, built here from the comparison run's ids. Tags, params and
artifacts hold no credential of a store address or the environment (``cliptrack.core.secrets``).
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from cliptrack.backends.mlflow.experiments import (
    EXPERIMENT_KIND_TAG,
    TRAINING_EXPERIMENT_KIND,
    artifacts_beside,
)
from cliptrack.compare import report
from cliptrack.compare.findings import GroupDifference
from cliptrack.compare.result import ComparisonResult
from cliptrack.compare.stats import MIN_ESS, MIN_UNITS
from cliptrack.compare.views.dashboard import write_dashboard
from cliptrack.core import keys
from cliptrack.core.secrets import redact, redact_value
from cliptrack.core.text import markdown_lines, markdown_text
from cliptrack.store.frame import RunSet

DEFAULT_EXPERIMENT = "cliptrack-comparisons"
COMPARISONS_SUFFIX = "-comparisons"
ARTIFACT_DIR = "comparison-artifacts"
"""The artifact directory of a comparisons experiment created on a sqlite store, beside its database."""


def write_figures(runset: RunSet, result: ComparisonResult, directory: str | Path) -> list[Path]:
    """Write ``<panel id>.png`` for every panel of ``panels.PANELS`` into ``directory``, drawn by
    ``plots_matplotlib`` (Agg) from the same panel figures as the dashboard."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from cliptrack.compare.views.plots_matplotlib import draw_all

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for panel_id, fig in draw_all(runset, result).items():
        path = directory / f"{panel_id}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths


def default_artifact_dir(tracking_uri: str) -> Path | None:
    """``comparison-artifacts`` beside a ``sqlite:///`` store's database file; None for other stores."""
    return artifacts_beside(tracking_uri, ARTIFACT_DIR)


def _param_value(x: Any) -> str:
    if isinstance(x, float):
        return "nan" if not math.isfinite(x) else f"{x:.6g}"
    return str(x)


def comparison_params(runset: RunSet, result: ComparisonResult) -> dict[str, str]:
    """The params of the comparison run: settings, margins, runs and every difference's numbers."""
    params: dict[str, Any] = {
        "align": result.align,
        "window": str(result.window),
        "confidence": result.confidence,
        "method": result.method,
        "min_units": MIN_UNITS,
        "min_ess": MIN_ESS,
    }
    for q in result.quantities:
        params[f"tolerance.{q.name}"] = f"{q.margin:g} {q.scale}"
        if q.abs_margin == q.abs_margin:
            params[f"abs_tolerance.{q.name}"] = f"{q.abs_margin:g}"
    for i, label in enumerate(result.runs):
        info = runset.info(label)
        params[f"run.{i}"] = (
            f"{info.display} [{info.run.backend_label or ''}] {info.source}:{info.run.run_id}"
        )
    params.update(_difference_fields(result))
    return {k: _param_value(v)[:6000] for k, v in params.items()}


def _difference_fields(result: ComparisonResult) -> dict[str, Any]:
    """Per quantity (and pair, beyond two runs): the difference, its interval, scale, margin, paired
    units, lag-1 autocorrelation, ESS, verdict and both runs' values, keyed ``<quantity>.<what>``."""
    out: dict[str, Any] = {}
    for d in result.differences:
        suffix = "" if len(result.runs) == 2 else f".{result.runs.index(d.run)}"
        e = d.estimate
        for what, value in (
            ("difference", e.value),
            ("ci_low", e.low),
            ("ci_high", e.high),
            ("scale", d.scale),
            ("margin", d.margin),
            ("paired_units", e.n_units),
            ("lag1", e.lag1),
            ("ess", e.ess),
            ("verdict", d.verdict),
            ("reference_value", d.reference_paired.value),
            ("run_value", d.run_paired.value),
        ):
            out[f"{d.metric}.{what}{suffix}"] = value
    for g in result.group_differences:
        out.update(_group_fields(result, g))
    return out


def _group_suffix(result: ComparisonResult, g: GroupDifference) -> str:
    """What a group difference's keys end with: nothing between two groups, else ``.<index>`` of
    the group among them."""
    names = list(result.groups)
    return "" if len(names) == 2 else f".{names.index(g.group)}"


def _group_fields(result: ComparisonResult, g: GroupDifference) -> dict[str, Any]:
    """One group difference (stacks over seeds), keyed ``<quantity>.stacks.<what>`` (and the
    group's index among the groups, beyond two): the difference and its interval over seeds,
    scale, margin, seeds per stack, P(group > reference), seeds needed, verdict and both stacks'
    mean per-seed values."""
    suffix = _group_suffix(result, g)
    e = g.estimate
    fields = (
        ("difference", e.value),
        ("ci_low", e.low),
        ("ci_high", e.high),
        ("scale", g.scale),
        ("margin", g.margin),
        ("seeds_reference", e.seeds_a),
        ("seeds_run", e.seeds_b),
        ("probability_greater", g.probability_greater),
        ("seeds_needed", g.seeds_needed),
        ("verdict", g.verdict),
        ("reference_value", result.group_mean(g.reference, g.metric)),
        ("run_value", result.group_mean(g.group, g.metric)),
    )
    return {f"{g.metric}.stacks.{what}{suffix}": value for what, value in fields if value is not None}


def comparison_metrics(result: ComparisonResult) -> dict[str, float]:
    """The comparison's numbers as MLflow metrics: the numeric fields of ``_difference_fields``."""
    return {
        key: float(value)
        for key, value in _difference_fields(result).items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def _describe_link(client: Any, compared_id: str, experiment_id: str, run_id: str, name: str) -> None:
    """Give a compared run without a description one that links to its comparison run (its name
    escaped as markdown, the link from the ids MLflow gave)."""
    note = "mlflow.note.content"
    if client.get_run(compared_id).data.tags.get(note):
        return
    link = f"#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"
    client.set_tag(compared_id, note, f"Compared in [{markdown_text(name)}]({link}).")


def _experiment(
    client: Any,
    runset: RunSet,
    result: ComparisonResult,
    experiment: str | None,
    artifact_dir: str | Path | None,
) -> str:
    from mlflow.exceptions import MlflowException

    name = experiment
    reference = runset.info(result.runs[0])
    if name is None and reference.source == "mlflow" and reference.location == str(client.tracking_uri):
        try:
            parent = client.get_experiment(client.get_run(reference.run.run_id).info.experiment_id)
            name = parent.name + COMPARISONS_SUFFIX
        except MlflowException:
            name = None
    name = name or DEFAULT_EXPERIMENT
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    directory = (
        Path(artifact_dir) if artifact_dir is not None else default_artifact_dir(str(client.tracking_uri))
    )
    location = None
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        location = directory.resolve().as_uri()
    return str(
        client.create_experiment(
            name,
            artifact_location=location,
            tags={EXPERIMENT_KIND_TAG: TRAINING_EXPERIMENT_KIND, keys.TAG_RUN_KIND: keys.RUN_KIND_COMPARISON},
        )
    )


def log_comparison(
    runset: RunSet,
    result: ComparisonResult,
    tracking_uri: str | None = None,
    experiment: str | None = None,
    run_name: str | None = None,
    dashboard: str | Path | None = None,
    artifact_dir: str | Path | None = None,
) -> str:
    """Log the comparison as an MLflow run in its comparisons experiment; return the run id.

    ``dashboard``: an HTML dashboard of this comparison already written (by ``write_dashboard``)
    to log as the artifact instead of rendering it again. ``artifact_dir``: where the artifacts of
    a comparisons experiment created by this call are stored (see the module docstring).
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    infos = [runset.info(label) for label in result.runs]
    same_store = [i for i in infos if i.source == "mlflow" and i.location == str(client.tracking_uri)]
    exp_id = _experiment(client, runset, result, experiment, artifact_dir)
    summary = markdown_lines(result.summary())
    tags = {
        keys.TAG_RUN_KIND: keys.RUN_KIND_COMPARISON,
        keys.TAG_COMPARED_RUNS: ",".join(i.run.run_id for i in infos),
        keys.TAG_VERDICT: result.on_policy_verdict,
        "mlflow.note.content": summary,
    }
    tags = redact_value(tags)  # what goes to the store holds no credential (cliptrack.core.secrets)
    run = client.create_run(exp_id, run_name=run_name or "compare: " + " vs ".join(result.runs), tags=tags)
    run_id = run.info.run_id
    try:
        _log_numbers(client, run_id, runset, result)
        _log_artifacts(client, run_id, runset, result, dashboard)
        for info in same_store:
            _link_compared_run(client, info.run.run_id, exp_id, run_id, run.info.run_name or run_id)
        client.set_terminated(run_id, "FINISHED")
    except Exception:
        client.set_terminated(run_id, "FAILED")
        raise
    return run_id


def _log_numbers(client: Any, run_id: str, runset: RunSet, result: ComparisonResult) -> None:
    """The comparison's params, metrics and verdict tags (one per difference), in one batch."""
    from mlflow.entities import Metric, Param, RunTag

    verdict_tags = [
        RunTag(
            f"{keys.TAG_VERDICT}.{d.metric}"
            + ("" if len(result.runs) == 2 else f".{result.runs.index(d.run)}"),
            d.verdict,
        )
        for d in result.differences
    ]
    verdict_tags += [
        RunTag(f"{keys.TAG_VERDICT}.{g.metric}.stacks{_group_suffix(result, g)}", g.verdict)
        for g in result.group_differences
    ]
    client.log_batch(
        run_id,
        params=[Param(k, v) for k, v in redact_value(comparison_params(runset, result)).items()],
        metrics=[Metric(k, v, int(time.time() * 1000), 0) for k, v in comparison_metrics(result).items()],
        tags=[RunTag(keys.TAG_BACKEND, ",".join(sorted(set(result.backends.values())))), *verdict_tags],
    )


def _log_artifacts(
    client: Any, run_id: str, runset: RunSet, result: ComparisonResult, dashboard: str | Path | None
) -> None:
    """The figures, the table (CSV, markdown, JSON) and the dashboard (``dashboard`` when already
    written, else rendered here) as the run's artifacts."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_figures(runset, result, root / "figures")
        (root / "comparison.csv").write_text(
            redact(report.table(result).to_csv(index=False)), encoding="utf-8"
        )
        (root / "comparison.md").write_text(report.markdown(result), encoding="utf-8")
        (root / "comparison.json").write_text(report.as_json(result), encoding="utf-8")
        if dashboard is None:
            write_dashboard(root / "dashboard.html", runset, result)
        else:
            shutil.copyfile(dashboard, root / "dashboard.html")
        client.log_artifacts(run_id, str(root))


def _link_compared_run(client: Any, compared_id: str, exp_id: str, run_id: str, run_name: str) -> None:
    """Tag a compared run of the same store with this comparison and link it from its description;
    a run the store refuses to change is left as it is."""
    from mlflow.exceptions import MlflowException

    try:
        previous = client.get_run(compared_id).data.tags.get(keys.TAG_COMPARED_IN, "")
        linked = [x for x in previous.split(",") if x] + [run_id]
        client.set_tag(compared_id, keys.TAG_COMPARED_IN, ",".join(linked))
        _describe_link(client, compared_id, exp_id, run_id, run_name)
    except MlflowException:
        pass
