"""The MLflow UI opens the demo's training experiment on its runs and charts, in a real browser.

MLflow 3.17's UI chooses between its GenAI view (an "Overview" of traces) and its model-training
view from its ``workflowType`` setting — the URL parameter, else the browser's saved choice,
GenAI by default — not from the experiment's ``mlflow.experimentKind`` tag. The address the demo
prints (``cliptrack.cli.demo.mlflow_ui_url``) names the model-training view and the charts; a fresh
headless Chromium (no saved choice) must land there, against a real ``mlflow server``.
"""

from __future__ import annotations

import json
import re

import pytest
from cliptrack.backends.mlflow.experiments import CHARTS_FIRST, CHARTS_VIEW_KEY, training_experiment
from cliptrack.cli.demo import EXPERIMENT, _training_experiment, mlflow_ui_url
from cliptrack.cli.demo_view import STACK_PARAM
from cliptrack.core import keys
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from tests._compare_fixtures import megatron_vs_miles, write_mlflow
from tests._mlflow_ui import mlflow_server, settled_text
from tests._tools import needs_chromium, needs_mlflow_command

OTHER_KEYS = (keys.KL_K3_MEAN, keys.ABS_LOG_RATIO_MEAN)
"""Metrics the fixture's runs log beside those of ``megatron_vs_miles``."""

pytestmark = [
    pytest.mark.slow,
    needs_chromium,
    needs_mlflow_command,
]


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """A demo-like store (the demo's training experiment, two runs, each with its stack as the demo
    logs it: the param the view groups by) behind a real ``mlflow server``."""
    out = tmp_path_factory.mktemp("ui")
    uri = f"sqlite:///{out / 'mlflow.db'}"
    experiment_id = _training_experiment(uri, out)
    client = MlflowClient(tracking_uri=uri)
    for run in megatron_vs_miles(n_megatron=30, n_miles=30):
        run_id = write_mlflow(uri, run, experiment=EXPERIMENT)
        client.log_param(run_id, STACK_PARAM, run.backend)
        for key in OTHER_KEYS:  # the mismatch KL, and a metric of the gauge the view leaves out
            client.log_batch(
                run_id, metrics=[Metric(key, 0.01 * (1 + step % 3), 0, step) for step in range(30)]
            )
    with mlflow_server(uri, out / "server.log") as port:
        yield port, experiment_id, out


def _is_genai_overview(text: str) -> bool:
    return "Overview - Experiment" in text and "Detect Issues" in text and "Traces" in text


def test_the_printed_address_opens_the_runs_and_their_charts(ui, tmp_path):
    port, experiment_id, _ = ui
    text = settled_text(
        mlflow_ui_url(experiment_id, port),
        tmp_path,
        lambda t: "Model metrics (" in t and "clip_fraction:mean" in t,
    )
    assert not _is_genai_overview(text), text[:600]
    assert f"Runs - Experiment {experiment_id}" in text, text[:600]
    assert "megatron-run" in text and "miles-run" in text
    assert re.search(r"Model metrics \(\d+\)", text) and "clip_fraction:mean" in text, text[:1500]


def test_a_fresh_browser_without_the_parameter_lands_on_the_genai_overview(ui, tmp_path):
    """Why the demo prints the full address: MLflow 3.17's default view ignores the experiment-kind tag."""
    port, experiment_id, _ = ui
    url = f"http://127.0.0.1:{port}/#/experiments/{experiment_id}"
    text = settled_text(url, tmp_path, lambda t: _is_genai_overview(t) or "Model metrics (" in t)
    assert _is_genai_overview(text), text[:600]


def test_the_printed_address_opens_on_the_clip_fraction_the_kl_reward_and_throughput_alone(ui, tmp_path):
    """The view cliptrack writes for its experiments (``charts_view_tags``), named by the printed
    address: the four charts first, alone (every other metric's chart filtered out by the charts'
    search box), their full names as titles; the runs still drawn in them."""
    port, experiment_id, _ = ui
    url = mlflow_ui_url(experiment_id, port)
    assert f"viewStateShareKey={CHARTS_VIEW_KEY}" in url
    # settled once every one of the four charts is drawn (grouped by stack, a chart takes longer)
    text = settled_text(
        url, tmp_path, lambda t: "Model metrics (4)" in t and all(k in t for k in CHARTS_FIRST)
    )
    assert "You're viewing a shared view" in text and "Model metrics (4)" in text, text[:1500]
    shown = [text.index(key) for key in CHARTS_FIRST]
    assert shown == sorted(shown), text[:3000]  # in that order
    for left_out in (keys.ABS_LOG_RATIO_MEAN, keys.LOSS_TOKENS, keys.CLIPPED_TOKENS, keys.STEP_TIME):
        assert left_out not in text, left_out
    assert "megatron-run" in text and "miles-run" in text


def test_every_training_experiment_cliptrack_makes_holds_the_view(tmp_path):
    """The tracker's experiments and the demo's (also one an older cliptrack made without it)."""
    from cliptrack import Tracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    tag = f"mlflow.sharedViewState.{CHARTS_VIEW_KEY}"
    with Tracker(
        "r", sinks=["mlflow"], sink_options={"mlflow": {"tracking_uri": uri}}, spool_dir=tmp_path / "spool"
    ) as tracker:
        tracker.log(0, {keys.LOSS_TOKENS: 1.0})
    [made] = [e for e in client.search_experiments() if e.name != "Default"]
    older = client.create_experiment("older", artifact_location=(tmp_path / "a").as_uri())
    assert training_experiment(uri, "older", (tmp_path / "a").as_uri()) == older
    candidates = [*keys.CLIP_SERIES_KEYS, *OTHER_KEYS, keys.REWARD, keys.THROUGHPUT, keys.STEP_TIME]
    candidates += [keys.KL_K3_SUM, keys.ENGINE_KL_K3_MEAN, keys.DRIFT_KL_K3_MEAN]  # near misses
    for experiment in (made, client.get_experiment(older)):
        view = json.loads(client.get_experiment(experiment.experiment_id).tags[tag])
        pattern = re.compile(view["chartsSearchFilter"], re.IGNORECASE)  # the UI's new RegExp(s, "i")
        assert {key for key in candidates if pattern.search(key)} == set(CHARTS_FIRST)
        assert view["runListHidden"] is True
