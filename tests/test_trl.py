"""cliptrack's TRL trainer (``cliptrack.adapters.trl``) in TRL's real ``GRPOTrainer`` runs on CPU.

The runs (``tests/_trl_harness.py``): a tiny Qwen2 and a tokenizer built here, 6 optimizer steps,
two iterations per generation so that clipping bites. Each is checked against a plain TRL run from
the same seed (the same losses and parameters, bit for bit, and TRL's own metrics unchanged) and
against a per-token reference recomputed from the step's tensors (the exact clip counts and the
fraction formed once per logging step). TRL lives in its own environment (the ``trl`` extra):
without it every test here is skipped.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "trl",
    reason="TRL is not installed: the trl extra runs in its own environment (pip install 'cliptrack[trl]', docs/TRL.md)",
)

import torch
from cliptrack.adapters import trl as ct_trl
from cliptrack.core import keys

from tests import _trl_harness as harness

ROOT = Path(__file__).resolve().parent.parent
TIMINGS = ("step_time", "train_runtime", "train_samples_per_second", "train_steps_per_second")
"""TRL log entries that are wall times: they differ between any two runs."""


# ---- the per-token reference: TRL's own formulas, written out ----------------------------------------


def reference_by_step(
    micro_steps: list[dict[str, Any]], loss_type: str = "grpo", eps: float = 0.2
) -> dict[int, tuple[int, ...]]:
    """The reference counts summed over each optimizer step's micro-steps."""
    out: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for micro in micro_steps:
        for i, n in enumerate(harness.reference_bites(micro, loss_type, eps, eps)):
            out[micro["step"]][i] += n
    return {step: tuple(v) for step, v in out.items()}


def logged_steps(trainer: Any) -> list[dict[str, Any]]:
    return [entry for entry in trainer.state.log_history if "loss" in entry]


def assert_exact(logged: list[dict[str, Any]], reference: dict[int, tuple[int, ...]]) -> None:
    """Each logged step's counts are the reference's, and its fraction is formed from them."""
    assert [e["step"] for e in logged] == sorted(reference)
    for entry in logged:
        tokens, clipped, low, high = reference[entry["step"]]
        got = (
            entry[keys.LOSS_TOKENS],
            entry[keys.CLIPPED_TOKENS],
            entry[keys.CLIPPED_LOW_TOKENS],
            entry[keys.CLIPPED_HIGH_TOKENS],
        )
        assert got == (tokens, clipped, low, high), entry["step"]
        assert entry[keys.CLIP_FRACTION] == clipped / tokens


def assert_same_run(ours: Any, plain: Any) -> None:
    """The same losses, parameters and TRL metrics, bit for bit; cliptrack's keys added."""
    ours_log, plain_log = logged_steps(ours), logged_steps(plain)
    assert len(ours_log) == len(plain_log) >= 5
    for a, b in zip(ours_log, plain_log, strict=True):
        theirs = {k: v for k, v in b.items() if k not in TIMINGS}
        assert {k: v for k, v in a.items() if k in theirs} == theirs  # TRL's own metrics untouched
        assert set(a) - set(b) >= {keys.CLIP_FRACTION, keys.CLIPPED_TOKENS, keys.LOSS_TOKENS}
    for (name, p), (other, q) in zip(
        harness.parameters(ours).items(), harness.parameters(plain).items(), strict=True
    ):
        assert name == other and torch.equal(p, q), name


def test_recipe_of_each_loss_type_and_refusals():
    assert ct_trl.recipe_of(
        harness.config("/tmp/u", loss_type="dapo", epsilon=0.2, epsilon_high=0.28)
    ).recipe().as_config() == {
        "loss_recipe": {
            "loss": "ppo",
            "clip_low": 0.8,
            "clip_high": 1.28,
            "clip_reference": "old",
            "ratio_outside_low": 0.5,
            "ratio_outside_high": 2.0,
            "aggregation": "trl:dapo",
        }
    }
    cispo = ct_trl.recipe_of(harness.config("/tmp/u", loss_type="cispo", epsilon_high=5.0))
    assert (cispo.loss, cispo.clip_low, cispo.clip_high) == ("cispo", 0.0, 5.0)  # TRL: min(r, epsilon_high)
    for never in ("sapo", "vespo"):
        assert ct_trl.recipe_of(harness.config("/tmp/u", loss_type=never)).clip_high is None
    assert (
        ct_trl.recipe_of(harness.config("/tmp/u")).config()["loss_recipe"]["importance_sampling_correction"]
        is False
    )
    with pytest.raises(ValueError, match="importance_sampling_level='sequence' is not supported"):
        ct_trl.recipe_of(harness.config("/tmp/u", importance_sampling_level="sequence"))
    with pytest.raises(ValueError, match="delta=1.1 is at or below 1 \\+ epsilon_high"):
        ct_trl.recipe_of(harness.config("/tmp/u", delta=1.1))


# ---- TRL's real trainer ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs() -> dict[int, tuple[Any, Any]]:
    """(cliptrack, plain TRL) trainers after 6 steps from seed 0, by gradient accumulation steps."""
    from trl import GRPOTrainer as Plain

    return {
        ga: (
            harness.train(ct_trl.GRPOTrainer, gradient_accumulation_steps=ga),
            harness.train(Plain, gradient_accumulation_steps=ga),
        )
        for ga in (1, 2)
    }


@pytest.mark.slow
def test_trl_run_equals_plain_trl_and_counts_exactly(runs):
    ours, plain = runs[1]
    assert_same_run(ours, plain)
    logged = logged_steps(ours)
    assert_exact(logged, reference_by_step(ours.micro_steps))
    assert sum(e[keys.CLIPPED_TOKENS] for e in logged) > 0  # clipping bites on the second iterations
    for entry in logged:  # one micro-step per log: TRL's exact-per-micro-step ratio is ours
        assert math.isclose(
            entry["clip_ratio/region_mean"], entry[keys.CLIP_FRACTION], rel_tol=1e-6, abs_tol=1e-7
        )
        assert keys.KL_K3_MEAN not in entry  # no sampler log-probs without vLLM: no gauge


@pytest.mark.slow
def test_trl_run_with_gradient_accumulation_counts_the_window(runs):
    ours, plain = runs[2]
    assert_same_run(ours, plain)
    logged = logged_steps(ours)
    assert_exact(logged, reference_by_step(ours.micro_steps))
    by_step: dict[int, list[tuple[int, ...]]] = defaultdict(list)
    for micro in ours.micro_steps:
        by_step[micro["step"]].append(harness.reference_bites(micro, "grpo", 0.2, 0.2))
    gaps = []
    for entry in logged:
        parts = by_step[entry["step"]]
        assert len(parts) == 2
        trl_mean = sum(c / n for n, c, _, _ in parts) / 2  # TRL's log(): the micro-steps' mean
        assert math.isclose(entry["clip_ratio/region_mean"], trl_mean, rel_tol=1e-6, abs_tol=1e-7)
        gaps.append(entry["clip_ratio/region_mean"] - entry[keys.CLIP_FRACTION])
    assert any(abs(g) > 1e-4 for g in gaps), gaps  # the mean of micro-step ratios is not the ratio of sums


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["bnpo", "dr_grpo", "dapo", "cispo", "sapo"])
def test_each_loss_type_equals_plain_trl(loss_type):
    from trl import GRPOTrainer as Plain

    options = {"loss_type": loss_type, "max_steps": 2}
    if loss_type == "cispo":
        options["epsilon_high"] = 1.1
    ours, plain = harness.train(ct_trl.GRPOTrainer, **options), harness.train(Plain, **options)
    assert [e["loss"] for e in logged_steps(ours)] == [e["loss"] for e in logged_steps(plain)]
    for p, q in zip(harness.parameters(ours).values(), harness.parameters(plain).values(), strict=True):
        assert torch.equal(p, q)
    logged = logged_steps(ours)
    if loss_type == "sapo":  # a soft gate never clips: no clip keys, never a made-up 0
        assert all(keys.CLIPPED_TOKENS not in e and e[keys.LOSS_TOKENS] > 0 for e in logged)
        return
    eps_high = 1.1 if loss_type == "cispo" else 0.2
    reference: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for micro in ours.micro_steps:
        for i, n in enumerate(harness.reference_bites(micro, loss_type, 0.2, eps_high)):
            reference[micro["step"]][i] += n
    assert_exact(logged, {s: tuple(v) for s, v in reference.items()})


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_two_processes_and_two_micro_steps_reduce_exactly(tmp_path):
    """``accelerate launch`` of two CPU processes (gloo), gradient accumulation 2: every process
    logs the sums over both processes and both micro-steps of each step."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GA": "2"}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    command += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    command += [
        "--main_process_port",
        str(_free_port()),
        str(ROOT / "tests" / "_trl_harness.py"),
        str(tmp_path),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    both = reference_by_step(ranks[0]["micro_steps"] + ranks[1]["micro_steps"])
    for rank in ranks:
        assert_exact([e for e in rank["log_history"] if "loss" in e], both)
    alone = reference_by_step(ranks[0]["micro_steps"])
    assert all(alone[s][0] < both[s][0] for s in both)  # the other process's tokens are in the sums
    assert sum(v[1] for v in both.values()) > 0
    for name, p in ranks[0]["parameters"].items():
        assert torch.equal(p, ranks[1]["parameters"][name]), name


def _readme_snippet() -> str:
    """The README's TRL example: the python block after its announcing line."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    after = text[text.index("### TRL") :]
    start = after.index("```python\n") + len("```python\n")
    return after[start : after.index("```", start)]


def _wandb_offline(directory: Path) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """The config and the rows carrying cliptrack's keys (by TRL's step) of the one offline W&B run
    under ``directory``, read from its ``.wandb`` transaction log."""
    from cliptrack.backends.wandb import _compat as wandb_log

    [path] = [p for p in directory.rglob("run-*.wandb") if "latest-run" not in p.parts]
    config: dict[str, Any] = {}
    steps: dict[int, dict[str, Any]] = {}
    for record in wandb_log.records(path, strict=True):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            config.update(wandb_log.items(record.run.config.update))
        elif kind == "config":
            config.update(wandb_log.items(record.config.update))
        elif kind == "history":
            row = wandb_log.items(record.history.item)
            if f"train/{keys.CLIP_FRACTION}" in row:
                steps[int(row["train/global_step"])] = row
    return config, steps


@pytest.mark.slow
def test_readme_snippet_logs_to_report_to_and_the_tracker(tmp_path, monkeypatch):
    """The README's snippet as it stands, with ``report_to=["mlflow", "wandb"]`` (a sqlite store,
    W&B offline): cliptrack's keys and the recipe reach MLflow, W&B and the tracker's run."""
    import mlflow
    import wandb
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "trl")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    args = harness.config(str(tmp_path / "out"), report_to=["mlflow", "wandb"])
    namespace = {
        "model": harness.model(),
        "reward": harness.reward,
        "args": args,
        "dataset": harness.dataset(),
        "tokenizer": harness.tokenizer(),
    }
    code = _readme_snippet()
    assert "from cliptrack.adapters.trl import GRPOTrainer" in code and "tracker=tracker" in code
    try:
        exec(compile(code, "README.md", "exec"), namespace)
    finally:
        wandb.finish()
        mlflow.end_run()
    trainer = namespace["trainer"]
    logged = logged_steps(trainer)
    assert len(logged) == 6 and sum(e[keys.CLIPPED_TOKENS] for e in logged) > 0
    fractions = {e["step"]: e[keys.CLIP_FRACTION] for e in logged}

    client = MlflowClient(tracking_uri=uri)
    [run] = client.search_runs([client.get_experiment_by_name("trl").experiment_id])
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, keys.CLIP_FRACTION)}
    assert history == pytest.approx(fractions, rel=1e-12)
    assert "clip_ratio/region_mean" in run.data.metrics  # TRL's own beside it
    params = run.data.params
    assert (params["loss_recipe.loss"], params["loss_recipe.clip_reference"]) == ("ppo", "old")
    assert (params["loss_recipe.aggregation"], params["loss_recipe.importance_sampling_correction"]) == (
        "trl:dapo",  # TRL 1.16's default loss_type
        "False",
    )

    config, steps = _wandb_offline(tmp_path / "wandb")
    recipe = config["loss_recipe"]
    recipe = recipe.get("value", recipe)  # W&B may wrap a config value
    assert (recipe["loss"], recipe["clip_reference"]) == ("ppo", "old")
    assert {step: row[f"train/{keys.CLIP_FRACTION}"] for step, row in steps.items()} == fractions
    assert all("train/clip_ratio/region_mean" in row for row in steps.values())

    [run_dir] = [p for p in (tmp_path / "my-runs").iterdir() if (p / keys.POINTS_FILE).exists()]
    points = [json.loads(line) for line in (run_dir / keys.POINTS_FILE).read_text().splitlines()]
    assert {p["step"]: p["metrics"][keys.CLIP_FRACTION] for p in points} == fractions
    rewards = {e["step"]: e["reward"] for e in logged if "reward" in e}  # generation steps only
    assert (
        rewards
        and {p["step"]: p["metrics"][keys.REWARD] for p in points if keys.REWARD in p["metrics"]} == rewards
    )
    meta = json.loads((run_dir / keys.RUN_META_FILE).read_text())
    assert meta["config"]["loss_recipe"]["clip_reference"] == "old"
