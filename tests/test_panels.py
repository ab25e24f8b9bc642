"""W&B workspace/report models and the MLflow comparison run.

The W&B models are built offline with the real ``wandb-workspaces`` classes; the only thing
replaced is the report runset's project-id lookup (a W&B cloud API call), via ``unittest.mock``.
"""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pytest

from tests._compare_fixtures import megatron_vs_miles, write_mlflow
from tracking import keys
from tracking.cli import main
from tracking.compare import compare, load_mlflow
from tracking.compare.panels import PANELS
from tracking.compare.panels_mlflow import log_comparison
from tracking.compare.panels_wandb import build_report, build_workspace, report_spec, workspace_spec

EXPECTED = {
    "clipping": [
        [keys.CLIP_FRACTION],
        [keys.CLIPPED_TOKENS, keys.LOSS_TOKENS],
        [keys.CLIPPED_LOW_TOKENS, keys.CLIPPED_HIGH_TOKENS],
    ],
    "reward": [[keys.REWARD]],
    "throughput": [[keys.THROUGHPUT], [keys.STEP_TIME]],
}


def test_workspace_model_builds_offline_with_expected_panels():
    spec = workspace_spec(build_workspace("ent", "proj"))
    assert spec["entity"] == "ent" and spec["project"] == "proj"
    section = spec["spec"]["section"]
    sections = section["panelBankConfig"]["sections"]
    assert [s["name"] for s in sections] == list(EXPECTED)
    for s in sections:
        configs = [p["config"] for p in s["panels"]]
        assert [c["metrics"] for c in configs] == EXPECTED[s["name"]]
        assert all(p["viewType"] == "Run History Line Plot" for p in s["panels"])
        assert all(c["xAxis"] == keys.WANDB_STEP_METRIC and c["groupBy"] == "group" for c in configs)
    assert section["settings"]["xAxis"] == keys.WANDB_STEP_METRIC
    assert section["runSets"][0]["grouping"] == [{"section": "run", "name": "group"}]


def test_report_model_builds_with_only_the_project_lookup_patched():
    from wandb_workspaces.reports.v2 import gql
    from wandb_workspaces.reports.v2 import interface as wri

    calls = []

    def lookup(api, query, variables):
        assert query is gql.projectInternalId, "only the project-id lookup may reach the API"
        calls.append(variables)
        return {"project": {"internalId": "UHJvamVjdDox"}}

    report = build_report("ent", "proj", ["megatron0001", "miles0000002"], summary="Equally on-policy: test.")
    with mock.patch.object(wri, "_get_api", lambda: None), mock.patch.object(wri, "execute_graphql", lookup):
        spec = report_spec(report)
    assert calls and all(c == {"entityName": "ent", "projectName": "proj"} for c in calls)
    grids = [b for b in spec["spec"]["blocks"] if b["type"] == "panel-grid"]
    assert len(grids) == 3
    metrics = [
        p["config"]["metrics"] for g in grids for p in g["metadata"]["panelBankSectionConfig"]["panels"]
    ]
    assert metrics == [m for section in EXPECTED.values() for m in section]
    runset = grids[0]["metadata"]["runSets"][0]
    assert runset["project"] == {"name": "proj", "entityName": "ent", "id": "UHJvamVjdDox"}
    assert runset["filters"]["filters"][0]["value"] == ["megatron0001", "miles0000002"]
    assert runset["grouping"] == [{"section": "run", "name": "group"}]
    texts = json.dumps(spec["spec"]["blocks"])
    assert "Equally on-policy: test." in texts


def test_panels_wandb_command_writes_specs_offline(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    out = tmp_path / "specs.json"
    assert (
        main(
            ["panels", "wandb", "--entity", "ent", "--project", "proj", "--runs", "a", "b", "--out", str(out)]
        )
        == 0
    )
    assert "wrote workspace and report specs" in capsys.readouterr().out
    specs = json.loads(out.read_text())
    assert set(specs) >= {"workspace", "report"}
    names = [s["name"] for s in specs["workspace"]["spec"]["section"]["panelBankConfig"]["sections"]]
    assert names == list(EXPECTED)


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    megatron, miles = megatron_vs_miles(miles_clip_p=0.15)
    ids = [write_mlflow(uri, megatron), write_mlflow(uri, miles)]
    return uri, ids


def test_mlflow_comparison_run(mlflow_store, tmp_path):
    from mlflow.tracking import MlflowClient

    uri, ids = mlflow_store
    runset = load_mlflow(ids, tracking_uri=uri)
    result = compare(runset)
    run_id = log_comparison(runset, result, tracking_uri=uri)
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    tags = run.data.tags
    assert tags[keys.TAG_RUN_KIND] == "comparison"
    assert tags[keys.TAG_COMPARED_RUNS] == ",".join(ids)
    assert tags[keys.TAG_VERDICT] == "different" == result.on_policy_verdict
    assert tags[f"{keys.TAG_VERDICT}.clip_fraction"] == "different"
    assert tags["mlflow.note.content"] == result.summary()
    # its own experiment, named after the compared runs' experiment, artifacts beside the store
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.name == "cliptrack-tests-comparisons"
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert run.info.artifact_uri.startswith(
        (Path(uri.removeprefix("sqlite:///")).parent / "comparison-artifacts").as_uri()
    )
    d = result.difference("clip_fraction")
    # the numbers are metrics too (step 0), named apart from every training series
    assert run.data.metrics["clip_fraction.difference"] == pytest.approx(d.estimate.value, rel=1e-12)
    assert run.data.metrics["clip_fraction.paired_units"] == d.estimate.n_units
    assert not set(run.data.metrics) & set(client.get_run(ids[0]).data.metrics)
    params = run.data.params
    assert params["align"] == "step" and params["tolerance.clip_fraction"] == "0.02 absolute"
    assert float(params["clip_fraction.difference"]) == pytest.approx(d.estimate.value, rel=1e-5)
    assert float(params["clip_fraction.ess"]) == pytest.approx(d.estimate.ess, rel=1e-5)
    assert params["clip_fraction.verdict"] == "different" and params["min_units"] == "100"
    for compared in ids:
        assert run_id in client.get_run(compared).data.tags[keys.TAG_COMPARED_IN].split(",")
    listed = {a.path for a in client.list_artifacts(run_id)} | {
        a.path for a in client.list_artifacts(run_id, "figures")
    }
    assert {"comparison.csv", "comparison.md", "comparison.json", "dashboard.html"} <= listed
    assert {f"figures/{panel.id}.png" for panel in PANELS} <= listed  # the one panel list
    saved = json.loads(open(client.download_artifacts(run_id, "comparison.json", str(tmp_path))).read())
    assert saved == result.to_dict()
    local = client.download_artifacts(run_id, "figures/clip.png", str(tmp_path))
    with open(local, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    # the comparison run is not itself loaded as a training run of the experiment
    again = load_mlflow([], tracking_uri=uri, experiment="cliptrack-tests")
    assert sorted(i.run.run_id for i in again.runs) == sorted(ids)


def test_panels_mlflow_command(mlflow_store, capsys, tmp_path):
    from mlflow.tracking import MlflowClient

    uri, ids = mlflow_store
    artifacts = tmp_path / "chosen"
    assert (
        main(
            [
                "panels",
                "mlflow",
                "megatron-run",
                "miles-run",
                "--tracking-uri",
                uri,
                "--log-experiment",
                "elsewhere",
                "--artifact-dir",
                str(artifacts),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "comparison run:" in out and "Not equally on-policy" in out
    run_id = out.strip().rsplit(" ", 1)[-1]
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert client.get_experiment(run.info.experiment_id).name == "elsewhere"
    assert run.info.artifact_uri.startswith(artifacts.resolve().as_uri())
    assert list(artifacts.rglob("dashboard.html"))


def test_wandb_workspaces_version_is_checked():
    from tracking.compare import _compat_wandb_workspaces as compat

    assert compat.check_version() == compat.installed_version()  # the installed one is supported
    low, high = compat.SUPPORTED
    assert compat.check_version(".".join(map(str, low))) == ".".join(map(str, low))
    for unsupported in (".".join(map(str, high)), "0.1.9", "1.0.0"):
        with pytest.raises(
            compat.UnsupportedVersionError, match=f"wandb-workspaces {unsupported} is not supported"
        ):
            compat.check_version(unsupported)
