"""The demo's MLflow view: its training runs grouped by stack, and the verdict on the experiment page.

- Grouped: every demo run logs its stack (``megatron``, ``miles``, or the control) as its param
  ``group`` (``STACK_PARAM``); the view the printed address opens (``experiments.CHARTS_VIEW_KEY``)
  groups the runs by it (``experiments.group_charts_view``): the run list shows one row per stack with
  its seeds under it, and the charts draw each stack's mean over its seeds with their range, one
  colour per stack instead of one per run.
- The verdict: the experiment's description, which the MLflow UI shows at the top of the experiment
  page, holds the dashboard's headline (``views.headline``), the control's line when the demo ran
  one, and a link to the comparison run (in its own experiment, so no training chart draws the
  comparison's numbers); the comparison run is named after its verdict.

Every run-provided text in the description renders as itself (``cliptrack.core.text.markdown_text``);
the one link is built here from the comparison run's ids.
"""

from __future__ import annotations

from cliptrack.backends.mlflow.experiments import describe_experiment, group_charts_view
from cliptrack.compare.findings import Findings
from cliptrack.compare.views.headline import Control, control_line, headline_lines, subject
from cliptrack.core.secrets import redact
from cliptrack.core.text import markdown_text

STACK_PARAM = "group"
"""The param every demo run logs its stack under (its config's ``group``)."""
RUN_NAME_TAG = "mlflow.runName"


def group_by_stack(tracking_uri: str, experiment_id: str) -> None:
    """Make the view the printed address opens group experiment ``experiment_id``'s runs by
    ``STACK_PARAM`` (the charts view of ``experiments.charts_view_tags``, grouped)."""
    group_charts_view(tracking_uri, experiment_id, STACK_PARAM)


def description(result: Findings, control: Control | None, link: str) -> str:
    """The experiment's description (markdown): the headline's lines, the control's line, and the
    comparison run's ``link`` (a UI address built from ids)."""
    lines = [f"**{markdown_text(headline_lines(result)[0])}**"]
    lines += [markdown_text(line) for line in headline_lines(result)[1:]]
    if control is not None:
        lines.append(markdown_text(control_line(control, result.on_policy_verdict)))
    lines.append(f"[The comparison run: every number, the dashboard and the figures]({link})")
    return "\n\n".join(lines)


def run_name(result: Findings) -> str:
    """The comparison run's name: its verdict and what it compared."""
    return f"{result.on_policy_verdict}: {subject(result)}"


def show_verdict(
    tracking_uri: str, experiment: str, result: Findings, control: Control | None, comparison_id: str
) -> str:
    """Write the verdict where the page of experiment ``experiment`` (a name) shows it, its
    description, and name the comparison run after it; return the description."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise ValueError(f"no MLflow experiment {experiment!r} in the store to show the verdict on")
    experiment_id = found.experiment_id
    comparison = client.get_run(comparison_id)
    link = f"#/experiments/{comparison.info.experiment_id}/runs/{comparison_id}"
    text = redact(description(result, control, link))
    describe_experiment(tracking_uri, experiment_id, text)
    client.set_tag(comparison_id, RUN_NAME_TAG, redact(run_name(result)))
    return text
