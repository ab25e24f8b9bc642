"""The main job end to end: ``cliptrack demo`` trains both paths, logs them, compares them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tracking import keys

STEPS = 6


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("demo")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    proc = subprocess.run(
        [sys.executable, "-m", "tracking.cli", "demo", "--steps", str(STEPS), "--out", str(out), "--no-progress",
         "--wandb"],
        capture_output=True, text=True, timeout=300, env=env, cwd=out,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, proc.stdout


def test_both_runs_are_in_mlflow_with_every_clip_series(demo):
    from mlflow.tracking import MlflowClient

    out, _ = demo
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cliptrack-demo")
    runs = client.search_runs([experiment.experiment_id], f"tags.`{keys.TAG_RUN_KIND}` = '{keys.RUN_KIND_TRAINING}'")
    assert sorted(r.data.tags[keys.TAG_BACKEND] for r in runs) == ["megatron", "miles"]
    for run in runs:
        assert run.info.status == "FINISHED"
        for key in keys.CLIP_SERIES_KEYS + (keys.REWARD, keys.THROUGHPUT):
            history = client.get_metric_history(run.info.run_id, key)
            assert sorted(m.step for m in history) == list(range(STEPS)), (run.info.run_name, key)
        clipped = sum(m.value for m in client.get_metric_history(run.info.run_id, keys.CLIPPED_TOKENS))
        tokens = sum(m.value for m in client.get_metric_history(run.info.run_id, keys.LOSS_TOKENS))
        assert 0 < clipped / tokens < 1, run.info.run_name
        low = sum(m.value for m in client.get_metric_history(run.info.run_id, keys.CLIPPED_LOW_TOKENS))
        high = sum(m.value for m in client.get_metric_history(run.info.run_id, keys.CLIPPED_HIGH_TOKENS))
        assert low + high == clipped


def test_dashboard_panels_and_verdict_are_produced(demo):
    out, stdout = demo
    html = (out / "dashboard.html").read_text(encoding="utf-8")
    assert "demo-megatron-ppo-seed0" in html and "demo-miles-ppo-seed0" in html
    assert (out / "wandb-panels.json").is_file()
    assert "verdict:" in stdout and "clip_fraction" in stdout
    assert "mlflow ui --backend-store-uri" in stdout
    assert list((out / "wandb").glob("offline-run-*/run-*.wandb"))
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cliptrack-demo")
    assert not client.search_runs([experiment.experiment_id],
                                  f"tags.`{keys.TAG_RUN_KIND}` = '{keys.RUN_KIND_COMPARISON}'")
    comparisons = client.get_experiment_by_name("cliptrack-demo-comparisons")
    [comparison] = client.search_runs([comparisons.experiment_id],
                                      f"tags.`{keys.TAG_RUN_KIND}` = '{keys.RUN_KIND_COMPARISON}'")
    assert comparison.data.metrics == {}  # numbers are params and tags, not charted metrics
    assert comparison.data.tags[keys.TAG_VERDICT] == "insufficient data"  # 6 steps are too few
    assert comparison.info.artifact_uri.startswith((out / "comparison-artifacts").resolve().as_uri())
    artifacts = {a.path for a in client.list_artifacts(comparison.info.run_id)}
    assert {"dashboard.html", "comparison.csv", "comparison.json"} <= artifacts
    assert any((out / "comparison-artifacts").rglob("comparison.json"))


def test_miles_run_is_more_off_policy_than_megatron_run(demo):
    from tracking.compare import load_runs

    out, _ = demo
    runs = load_runs(jsonl_dir=out / "spool")
    frame = runs.frame
    sums = frame[frame.metric.isin([keys.CLIPPED_TOKENS, keys.LOSS_TOKENS])].groupby(["backend", "metric"]).value.sum()
    fraction = {b: sums[b, keys.CLIPPED_TOKENS] / sums[b, keys.LOSS_TOKENS] for b in ("megatron", "miles")}
    assert fraction["miles"] > fraction["megatron"] > 0


def test_megatron_core_schedule_and_plain_loop_give_the_same_step(tmp_path):
    """The demo's Megatron path through Megatron-Core's own schedule (CPU shim) equals the plain loop."""
    pytest.importorskip("megatron.core")
    from adapters.demo.train import RunConfig, train
    from tests._harness import megatron_one_rank

    config = RunConfig(path="megatron", steps=1, epochs=1, seed=3)
    loop = [r.output.metrics for r in train(config, use_schedule=False)]
    with megatron_one_rank():
        scheduled = [r.output.metrics for r in train(config, use_schedule=True)]
    assert len(loop) == len(scheduled) == 1
    for key in (keys.LOSS_TOKENS, keys.CLIPPED_TOKENS, keys.CLIPPED_LOW_TOKENS, keys.CLIPPED_HIGH_TOKENS):
        assert loop[0][key] == scheduled[0][key]
    assert loop[0][keys.LOSS_SUM] == pytest.approx(scheduled[0][keys.LOSS_SUM], rel=1e-6)


def test_demo_refuses_bad_settings():
    from adapters.demo.train import RunConfig

    with pytest.raises(ValueError, match="clipping loss"):
        RunConfig(path="miles", loss="dro")
    with pytest.raises(ValueError, match="path must be one of"):
        RunConfig(path="vllm")
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        RunConfig(path="miles", staleness=-1)
    proc = subprocess.run([sys.executable, "-m", "tracking.cli", "demo", "--paths", "nope"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown path" in proc.stderr


def test_group_advantages_are_normalised_per_group():
    from adapters.demo.task import group_advantages

    reward = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.2, 0.4, 0.6, 0.8])
    adv = group_advantages(reward, 4).view(2, 4)
    assert torch.allclose(adv.mean(dim=1), torch.zeros(2), atol=1e-6)
    assert torch.allclose(adv.std(dim=1, unbiased=False), torch.ones(2), atol=1e-4)
