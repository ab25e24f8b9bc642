"""W&B panels for the comparison, built with ``wandb-workspaces``.

- ``build_workspace``: a workspace with one section per section of ``panels.PANELS`` (*clipping*:
  clip fraction, clipped and loss tokens, low/high split; *reward*; *throughput*: throughput and
  step time); every line plot uses ``trainer/step`` as x axis and runs are grouped by backend.
- ``build_report``: a report comparing chosen runs (one panel grid, its runset filtered to the
  run ids), with the verdict summary as text when one is given.

Grouping uses the run's W&B *group*, which the tracker sets to the backend label: the same value
as the ``cliptrack.backend`` config key. (``wandb-workspaces`` reads a dot in a config key as
nesting, turning ``cliptrack.backend`` into ``cliptrack.value.backend``, so the config key cannot
be named in a grouping.)

Building the models needs no network except the report runset's project-id lookup, which
``Runset._to_model`` performs through the W&B API; ``offline_project_ids`` stands in for it when
specs are written without an API key. Every use of ``wandb-workspaces`` internals lives in
``_compat_wandb_workspaces`` (checked against the supported versions).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tracking import keys
from tracking.compare._compat_wandb_workspaces import OFFLINE_PROJECT_ID, model_json, offline_project_ids
from tracking.compare.panels import Panel, sections

__all__ = [
    "GROUP_BY",
    "OFFLINE_PROJECT_ID",
    "build_report",
    "build_workspace",
    "offline_project_ids",
    "report_spec",
    "save_or_write",
    "workspace_spec",
]

GROUP_BY = "Group"
"""Run attribute the panels group by (the W&B group = the backend label)."""


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

    filters: Any = expr.And(expr.Metric("ID").isin(list(run_ids))) if run_ids else ""
    runset = wr.Runset(
        entity=entity, project=project, name="compared runs", filters=filters, groupby=["group"]
    )
    blocks: list[Any] = [
        wr.H1("Clip fraction, reward and throughput by backend"),
        wr.P(
            "Token-weighted clip fraction (clipped_tokens:sum / loss_tokens:sum) per trainer step, "
            "grouped by backend (the run group)."
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
    report = build_report(entity, project, run_ids, summary)
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
    path.write_text(json.dumps(specs, indent=2), encoding="utf-8")
    return {"saved": False, "path": str(path)}
