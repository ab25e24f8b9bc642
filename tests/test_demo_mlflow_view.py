"""The demo's MLflow view in a real browser: the runs grouped by stack, the verdict on the
experiment's page (``cliptrack.cli.demo_view``), against a real ``mlflow ui`` on a demo-like store."""

from __future__ import annotations

import json

import pytest
from cliptrack.backends.mlflow.experiments import CHARTS_VIEW_KEY
from cliptrack.cli.demo import EXPERIMENT, _training_experiment, mlflow_ui_url
from cliptrack.cli.demo_view import STACK_PARAM, show_verdict
from cliptrack.compare import LoadedRun, RunSet, compare
from cliptrack.compare.views.headline import Control, headline_lines
from cliptrack.store.records import RunInfo
from mlflow.tracking import MlflowClient

from tests._compare_fixtures import synthetic_run, write_mlflow
from tests._mlflow_ui import mlflow_server, settled_text
from tests._tools import needs_chromium, needs_mlflow_command

STACKS = {"megatron": ("m0", "m1"), "miles": ("l0", "l1")}
"""The fixture's stacks and their seeds' run names."""


def _runs():
    runs = [
        synthetic_run(name, name, "megatron", seed=i, n_steps=30) for i, name in enumerate(STACKS["megatron"])
    ]
    runs += [
        synthetic_run(name, name, "miles", seed=5 + i, n_steps=30, clip_p=0.3)
        for i, name in enumerate(STACKS["miles"])
    ]
    return runs


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """The demo's training experiment with two stacks of two seeds (each run's stack as its param
    ``group``), a comparison run in another experiment, and the verdict shown as the demo shows it."""
    out = tmp_path_factory.mktemp("view")
    uri = f"sqlite:///{out / 'mlflow.db'}"
    experiment_id = _training_experiment(uri, out)
    client = MlflowClient(tracking_uri=uri)
    runs = _runs()
    for run in runs:
        run_id = write_mlflow(uri, run, experiment=EXPERIMENT)
        client.log_param(run_id, STACK_PARAM, run.backend)
    rs = RunSet.from_points(
        [(LoadedRun(RunInfo(r.run_id, r.run_name, r.backend, r.config), "test"), r.points) for r in runs]
    )
    result = compare(rs, groups={stack: list(names) for stack, names in STACKS.items()})
    control = Control(result, "megatron-stale (as stale as miles) vs miles", "staleness")
    comparisons = client.create_experiment(
        f"{EXPERIMENT}-comparisons", artifact_location=(out / "c").as_uri()
    )
    comparison_id = client.create_run(comparisons).info.run_id
    text = show_verdict(uri, EXPERIMENT, result, control, comparison_id)
    return uri, experiment_id, result, comparison_id, text, out


def test_the_view_groups_by_the_stack_param(store):
    uri, experiment_id, *_ = store
    tags = MlflowClient(tracking_uri=uri).get_experiment(experiment_id).tags
    view = json.loads(tags[f"mlflow.sharedViewState.{CHARTS_VIEW_KEY}"])
    assert view["groupBy"]["groupByKeys"] == [{"mode": "param", "groupByData": "group"}]


def test_the_comparison_run_is_named_after_its_verdict_and_the_description_holds_it(store):
    uri, experiment_id, result, comparison_id, text, _ = store
    client = MlflowClient(tracking_uri=uri)
    assert result.on_policy_verdict == "different"
    name = client.get_run(comparison_id).info.run_name
    assert name == "different: miles vs megatron (2 seeds each)"
    description = client.get_experiment(experiment_id).tags["mlflow.note.content"]
    assert description == text
    assert "Not equally on-policy" in description and "Control: different" in description
    assert f"#/experiments/{client.get_run(comparison_id).info.experiment_id}/runs/{comparison_id}" in text


@pytest.mark.slow
@needs_chromium
@needs_mlflow_command
def test_the_printed_address_shows_the_stacks_grouped_and_the_verdict(store, tmp_path):
    """``mlflow ui`` (what the demo prints) at the printed address: the run list grouped by stack
    (one group row per stack, each with its seeds), and the verdict at the top of the page."""
    uri, experiment_id, result, _, _, out = store
    first = headline_lines(result)[0]
    with mlflow_server(uri, out / "ui.log", command="ui") as port:
        text = settled_text(
            mlflow_ui_url(experiment_id, port), tmp_path, lambda t: "Group: miles" in t and "Control:" in t
        )
    assert "Group by: group" in text, text[:2000]
    for stack, names in STACKS.items():
        assert f"Group: {stack} {len(names)}" in text, text[:2000]
        assert all(name in text for name in names)
    assert first in text, text[:2000]
    assert "Control: different — megatron-stale" in text
    assert text.index(first) < text.index("Group: ")  # the verdict above the runs
