"""W&B panels for the comparison, built with ``wandb-workspaces``.

- ``build_workspace``: a workspace with sections *clipping* (clip fraction, clipped vs loss tokens,
  low/high split), *reward* and *throughput*; every line plot uses ``trainer/step`` as x axis and
  runs are grouped by backend.
- ``build_report``: a report comparing chosen runs (one panel grid, its runset filtered to the
  run ids), with the verdict summary as text when one is given.

Grouping uses the run's W&B *group*, which the tracker sets to the backend label: the same value
as the ``cliptrack.backend`` config key. (``wandb-workspaces`` reads a dot in a config key as
nesting, turning ``cliptrack.backend`` into ``cliptrack.value.backend``, so the config key cannot
be named in a grouping.)

Building the models needs no network except the report runset's project-id lookup, which
``Runset._to_model`` performs through the W&B API; ``offline_project_ids`` stands in for it when
specs are written without an API key.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tracking import keys

SECTIONS = {
    "clipping": [
        ("clip fraction (token-weighted)", [keys.CLIP_FRACTION]),
        ("clipped vs loss tokens", [keys.CLIPPED_TOKENS, keys.LOSS_TOKENS]),
        ("clipped tokens: low / high side", [keys.CLIPPED_LOW_TOKENS, keys.CLIPPED_HIGH_TOKENS]),
    ],
    "reward": [("reward", [keys.REWARD])],
    "throughput": [("throughput (loss tokens/s)", [keys.THROUGHPUT]), ("step time (s)", [keys.STEP_TIME])],
}
"""Section name -> [(panel title, metric keys)]."""

GROUP_BY = "Group"
"""Run attribute the panels group by (the W&B group = the backend label)."""

OFFLINE_PROJECT_ID = "offline-unresolved"
"""Placeholder project id written into specs built without the W&B API."""


def _line_plots(panels: Sequence[tuple[str, list[str]]]) -> list[Any]:
    import wandb_workspaces.reports.v2 as wr

    return [wr.LinePlot(title=title, x=keys.WANDB_STEP_METRIC, y=list(ys), groupby=GROUP_BY,
                        groupby_aggfunc="mean", groupby_rangefunc="minmax", title_x="trainer step")
            for title, ys in panels]


def build_workspace(entity: str, project: str, name: str = "cliptrack: megatron vs miles") -> Any:
    """A ``wandb_workspaces.workspaces.Workspace`` with the clipping, reward and throughput sections."""
    import wandb_workspaces.workspaces as ws
    from wandb_workspaces import expr

    sections = [ws.Section(name=section, panels=_line_plots(panels), is_open=True)
                for section, panels in SECTIONS.items()]
    return ws.Workspace(
        entity=entity,
        project=project,
        name=name,
        sections=sections,
        settings=ws.WorkspaceSettings(x_axis=keys.WANDB_STEP_METRIC),
        runset_settings=ws.RunsetSettings(groupby=[expr.Metric(GROUP_BY)]),
    )


def build_report(entity: str, project: str, run_ids: Sequence[str] = (), summary: str = "",
                 title: str = "cliptrack: are both stacks equally on-policy?") -> Any:
    """A ``wandb_workspaces.reports.v2.Report`` comparing ``run_ids`` (all project runs when empty)."""
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces import expr

    filters: Any = expr.And(expr.Metric("ID").isin(list(run_ids))) if run_ids else ""
    runset = wr.Runset(entity=entity, project=project, name="compared runs", filters=filters, groupby=["group"])
    blocks: list[Any] = [
        wr.H1("Clip fraction, reward and throughput by backend"),
        wr.P("Token-weighted clip fraction (clipped_tokens:sum / loss_tokens:sum) per trainer step, "
             "grouped by backend (the run group)."),
    ]
    if summary:
        blocks.append(wr.H2("Verdict"))
        blocks.extend(wr.P(line) for line in summary.splitlines() if line.strip())
    for section, panels in SECTIONS.items():
        blocks.append(wr.H2(section))
        blocks.append(wr.PanelGrid(runsets=[runset], panels=_line_plots(panels)))
    return wr.Report(entity=entity, project=project, title=title, blocks=blocks)


@contextlib.contextmanager
def offline_project_ids(project_id: str = OFFLINE_PROJECT_ID) -> Iterator[None]:
    """Answer the report runset's project-id lookup without the W&B API (nothing else is replaced)."""
    from wandb_workspaces.reports.v2 import gql
    from wandb_workspaces.reports.v2 import interface as wri

    real = wri.execute_graphql

    def lookup(api: Any, query: Any, variables: Any) -> Any:
        if query is gql.projectInternalId:
            return {"project": {"internalId": project_id}}
        return real(api, query, variables)

    saved_api, saved_exec = wri._get_api, wri.execute_graphql
    wri._get_api = lambda: None  # type: ignore[assignment]
    wri.execute_graphql = lookup  # type: ignore[assignment]
    try:
        yield
    finally:
        wri._get_api, wri.execute_graphql = saved_api, saved_exec  # type: ignore[assignment]


def workspace_spec(workspace: Any) -> dict[str, Any]:
    """The workspace's saved-view model as JSON-ready data."""
    return json.loads(workspace._to_model().model_dump_json(by_alias=True, exclude_none=True))


def report_spec(report: Any) -> dict[str, Any]:
    """The report's view model as JSON-ready data (needs the project-id lookup: API or ``offline_project_ids``)."""
    return json.loads(report._to_model().model_dump_json(by_alias=True, exclude_none=True))


def save_or_write(entity: str, project: str, run_ids: Sequence[str] = (), summary: str = "",
                  out: str | Path | None = None, online: bool | None = None) -> dict[str, Any]:
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
        specs = {"workspace": workspace_spec(workspace), "report": report_spec(report),
                 "note": f"built offline; project id placeholder {OFFLINE_PROJECT_ID!r}. "
                         "Run `cliptrack panels wandb` with WANDB_API_KEY set to save."}
    path = Path(out or "cliptrack-wandb-panels.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(specs, indent=2), encoding="utf-8")
    return {"saved": False, "path": str(path)}
