"""W&B panels for the comparison (``cliptrack panels wandb``), built with ``wandb-workspaces``.

- ``build_workspace``: a workspace with one section per section of ``panels.PANELS`` (*clipping*:
  clip fraction, its difference over training, clipped and loss tokens, low/high split; *reward*
  and its difference; *throughput*, its difference, step time); every line plot uses
  ``trainer/step`` as x axis and runs are grouped by backend.
- ``build_report``: a report comparing chosen runs (one panel grid per section, its runset filtered
  to the run ids and the comparison's W&B run), with the verdict summary as text when one is given.
- ``log_comparison``: the comparison as a W&B run of its own (job type and group ``comparison``)
  whose history holds the difference panels' keys (``panels.difference_keys``): per quantity, the
  difference of the first compared run (or group) from the reference at each segment's first and
  last step, its interval and the ± margin, so the W&B difference panels draw what the dashboard
  draws. Its summary holds the verdicts.

Grouping uses the run's W&B *group*, which the tracker sets to the backend label: the same value
as the ``cliptrack.backend`` config key. (``wandb-workspaces`` reads a dot in a config key as
nesting, turning ``cliptrack.backend`` into ``cliptrack.value.backend``, so the config key cannot
be named in a grouping.)

Building the models needs no network except the report runset's project-id lookup, which
``Runset._to_model`` performs through the W&B API; ``offline_project_ids`` stands in for it when
specs are written without an API key. Every use of ``wandb-workspaces`` internals lives in
``_wandb_workspaces`` (checked against the supported versions).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cliptrack.backends import wandb as wandb_backend
from cliptrack.compare.result import ComparisonResult
from cliptrack.compare.views._wandb_workspaces import OFFLINE_PROJECT_ID, model_json, offline_project_ids
from cliptrack.compare.views.panels import DIFFERENCE_PREFIX, PANELS, Panel, difference_keys, sections
from cliptrack.compare.views.plots import SegmentView, plot_series, segment_views, x_range_of
from cliptrack.core import keys
from cliptrack.core.secrets import redact, redact_value
from cliptrack.store.frame import RunSet

__all__ = [
    "COMPARISON_GROUP",
    "GROUP_BY",
    "OFFLINE_PROJECT_ID",
    "build_report",
    "build_workspace",
    "difference_rows",
    "log_comparison",
    "offline_project_ids",
    "report_spec",
    "save_or_write",
    "workspace_spec",
]

GROUP_BY = "Group"
"""Run attribute the panels group by (the W&B group = the backend label)."""
COMPARISON_GROUP = "comparison"
"""W&B group and job type of a comparison's run (its difference panels' data)."""


def _line_plots(panels: Sequence[Panel]) -> list[Any]:
    import wandb_workspaces.reports.v2 as wr

    return [
        wr.LinePlot(
            title=panel.title,
            x=keys.WANDB_STEP_METRIC,
            y=list[Any](panel.wandb_keys),
            groupby=GROUP_BY,
            groupby_aggfunc="mean",
            groupby_rangefunc="minmax",
            title_x="trainer step",
        )
        for panel in panels
    ]


def build_workspace(entity: str, project: str, name: str = "cliptrack: megatron vs miles") -> Any:
    """A ``wandb_workspaces.workspaces.Workspace`` with the clipping, reward and throughput sections."""
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces import expr

    built = [
        ws.Section(name=section, panels=_line_plots(panels), is_open=True)
        for section, panels in sections().items()
    ]
    return ws.Workspace(
        entity=entity,
        project=project,
        name=name,
        sections=built,
        settings=ws.WorkspaceSettings(x_axis=keys.WANDB_STEP_METRIC),
        runset_settings=ws.RunsetSettings(groupby=[expr.Metric(GROUP_BY)]),
    )


def build_report(
    entity: str,
    project: str,
    run_ids: Sequence[str] = (),
    summary: str = "",
    title: str = "cliptrack: are both stacks equally on-policy?",
) -> Any:
    """A ``wandb_workspaces.reports.v2.Report`` comparing ``run_ids`` (all project runs when empty)."""
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces import expr

    filters: Any = (
        expr.Or(expr.Metric("ID").isin(list(run_ids)), expr.Metric(GROUP_BY) == COMPARISON_GROUP)
        if run_ids
        else ""
    )
    runset = wr.Runset(
        entity=entity, project=project, name="compared runs", filters=filters, groupby=["group"]
    )
    blocks: list[Any] = [
        wr.H1("Clip fraction, reward and throughput by backend"),
        wr.P(
            "Token-weighted clip fraction (clipped_tokens:sum / loss_tokens:sum) per trainer step, "
            "grouped by backend (the run group). Each difference-over-training panel shows the "
            "comparison run's per-segment difference (run minus reference) with its interval and "
            "the ± margin."
        ),
    ]
    if summary:
        blocks.append(wr.H2("Verdict"))
        blocks.extend(wr.P(line) for line in summary.splitlines() if line.strip())
    for section, panels in sections().items():
        blocks.append(wr.H2(section))
        blocks.append(wr.PanelGrid(runsets=[runset], panels=_line_plots(panels)))
    return wr.Report(entity=entity, project=project, title=title, blocks=blocks)


def workspace_spec(workspace: Any) -> dict[str, Any]:
    """The workspace's saved-view model as JSON-ready data."""
    return model_json(workspace)


def report_spec(report: Any) -> dict[str, Any]:
    """The report's view model as JSON-ready data (needs the project-id lookup: API or ``offline_project_ids``)."""
    return model_json(report)


def save_or_write(
    entity: str,
    project: str,
    run_ids: Sequence[str] = (),
    summary: str = "",
    out: str | Path | None = None,
    online: bool | None = None,
) -> dict[str, Any]:
    """Save the workspace and report to W&B when ``online`` (default: ``WANDB_API_KEY`` is set);
    otherwise write both specs to ``out`` (default ``cliptrack-wandb-panels.json``).

    Returns ``{"saved": bool, "workspace_url"/"report_url" or "path": ...}``.
    """
    import os

    if online is None:
        online = bool(os.environ.get("WANDB_API_KEY"))
    workspace = build_workspace(entity, project)
    report = build_report(entity, project, run_ids, redact(summary))
    if online:
        workspace.save()
        report.save()
        return {"saved": True, "workspace_url": workspace.url, "report_url": report.url}
    with offline_project_ids():
        specs = {
            "workspace": workspace_spec(workspace),
            "report": report_spec(report),
            "note": f"built offline; project id placeholder {OFFLINE_PROJECT_ID!r}. "
            "Run `cliptrack panels wandb` with WANDB_API_KEY set to save.",
        }
    path = Path(out or "cliptrack-wandb-panels.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(redact_value(specs), indent=2), encoding="utf-8")
    return {"saved": False, "path": str(path)}


def _value_at(views: Sequence[SegmentView], x: float) -> SegmentView | None:
    for view in views:
        if view.start <= x <= view.stop:
            return view
    return None


def difference_rows(runset: RunSet, result: ComparisonResult) -> list[dict[str, float]]:
    """The difference panels' data as W&B history rows, in step order: one row per x where a
    segment of some quantity starts or ends, holding ``trainer/step`` and, for every quantity with
    a segment there, its ``difference_keys`` (difference, interval low/high, −/+ margin). Only
    finite values are written (a segment without an interval has no low/high)."""
    x_range = x_range_of(plot_series(runset, result))
    per_quantity: dict[str, list[SegmentView]] = {}
    margins: dict[str, float] = {}
    for q in dict.fromkeys(p.quantity for p in PANELS if p.quantity):
        found = _first_views(result, q, x_range)
        if found:
            per_quantity[q], margins[q] = found
    xs = sorted({x for views in per_quantity.values() for v in views for x in (v.start, v.stop)})
    rows = []
    for x in xs:
        row: dict[str, float] = {keys.WANDB_STEP_METRIC: x}
        for q, views in per_quantity.items():
            view = _value_at(views, x)
            if view is None:
                continue
            values = (view.value, view.low, view.high, -margins[q], margins[q])
            row.update(
                {k: float(v) for k, v in zip(difference_keys(q), values, strict=True) if math.isfinite(v)}
            )
        rows.append(row)
    return rows


def _first_views(
    result: ComparisonResult, quantity: str, x_range: tuple[float, float]
) -> tuple[list[SegmentView], float] | None:
    """Segments of the first compared run's (or group's) difference on ``quantity``, and its margin."""
    if result.groups:
        for g in result.group_differences:
            if g.metric == quantity:
                e = g.estimate
                return [SegmentView(x_range[0], x_range[1], e.value, e.low, e.high, g.verdict)], g.tolerance
        return None
    for d in result.differences:
        if d.metric == quantity:
            return segment_views(d, x_range), d.tolerance
    return None


def log_comparison(
    runset: RunSet,
    result: ComparisonResult,
    project: str,
    entity: str | None = None,
    directory: str | Path | None = None,
    mode: str | None = None,
) -> str:
    """Log the comparison as a W&B run (``difference_rows`` as history, verdicts in the summary);
    ``mode`` as ``wandb.init`` takes it (default: ``online`` when ``WANDB_API_KEY`` is set, else
    ``offline``). Returns the run's directory (offline) or URL."""
    import os

    import wandb

    wandb_backend.check_supported()
    wandb_backend.own_service()  # not a service another process started (it may outlive this run)
    mode = mode or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
    run = wandb.init(
        project=project,
        entity=entity,
        dir=str(directory) if directory is not None else None,
        mode=mode,  # type: ignore[arg-type]
        group=COMPARISON_GROUP,
        job_type=COMPARISON_GROUP,
        name="compare: " + " vs ".join(result.groups or result.runs),
        config={"compared_runs": [runset.info(label).run.run_id for label in result.runs]},
        settings=wandb.Settings(console="off", x_disable_stats=True),
    )
    try:
        run.define_metric(keys.WANDB_STEP_METRIC)
        run.define_metric(f"{DIFFERENCE_PREFIX}/*", step_metric=keys.WANDB_STEP_METRIC)
        for row in difference_rows(runset, result):
            run.log(row)
        run.summary["verdict"] = result.on_policy_verdict
        for d in result.group_differences if result.groups else result.differences:
            run.summary[f"verdict/{d.metric}"] = d.verdict
    finally:
        run.finish()
    return str(Path(run.dir).parent) if mode == "offline" else str(run.url)
