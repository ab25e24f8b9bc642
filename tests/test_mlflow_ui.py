"""The MLflow UI opens the demo's training experiment on its runs and charts, in a real browser.

MLflow 3.17's UI chooses between its GenAI view (an "Overview" of traces) and its model-training
view from its ``workflowType`` setting — the URL parameter, else the browser's saved choice,
GenAI by default — not from the experiment's ``mlflow.experimentKind`` tag. The address the demo
prints (``cliptrack.cli.demo.mlflow_ui_url``) names the model-training view and the charts; a fresh
headless Chromium (no saved choice) must land there, against a real ``mlflow server``.
"""

from __future__ import annotations

import re

import pytest
from cliptrack.cli.demo import EXPERIMENT, _training_experiment, mlflow_ui_url

from tests._compare_fixtures import megatron_vs_miles, write_mlflow
from tests._mlflow_ui import mlflow_server, settled_text
from tests._tools import needs_chromium, needs_mlflow_command

pytestmark = [
    pytest.mark.slow,
    needs_chromium,
    needs_mlflow_command,
]


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """A demo-like store (the demo's training experiment, two runs) behind a real ``mlflow server``."""
    out = tmp_path_factory.mktemp("ui")
    uri = f"sqlite:///{out / 'mlflow.db'}"
    experiment_id = _training_experiment(uri, out)
    for run in megatron_vs_miles(n_megatron=30, n_miles=30):
        write_mlflow(uri, run, experiment=EXPERIMENT)
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
