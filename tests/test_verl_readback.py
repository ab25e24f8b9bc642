"""Runs logged by verl with a cliptrack mode, read back: each micro-batch's metrics from the
registered twin, reduced by verl's own code (``Metric`` over micro-batches, ``aggregate_dp``,
``reduce_metrics``, the trainer's ``actor/`` prefix) and logged through verl's ``Tracking`` to its
file logger, its console, MLflow (sqlite) and W&B (offline). ``cliptrack`` loads every one with the
exact clip fraction (not approximate), verl's own ``actor/pg_clipfrac`` kept beside it, and the
recipe; ``runs`` lists them and ``compare --group-by`` groups them. Skipped where verl is not
importable (the ``verl`` extra)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install 'cliptrack[verl]', verl==0.9.1)")
torch = pytest.importorskip("torch")
pytest.importorskip("mlflow")
pytest.importorskip("wandb")

import cliptrack.adapters.verl  # noqa: E402, F401  (registers the twins)
from cliptrack.backends.load import load_runs  # noqa: E402
from cliptrack.core import keys  # noqa: E402
from cliptrack.core.recipe import recipe_from_config  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.utils.metric import AggregationType, Metric, reduce_metrics  # noqa: E402
from verl.utils.py_functional import rename_dict  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "verl-readback"
RUNS = {  # experiment name -> (loss_agg_mode, seed)
    "mean-a": ("token-mean", 1),
    "mean-b": ("token-mean", 2),
    "seq-a": ("seq-mean-token-mean", 3),
    "seq-b": ("seq-mean-token-mean", 4),
}
STEPS = 3
TOKENS = ([8, 7], [2, 3])  # two micro-batches of two sequences: 15 and 5 tokens


def _config(agg: str) -> dict[str, Any]:
    """The part of verl's trainer config the trainer logs that names the recipe."""
    return {
        "actor_rollout_ref": {
            "actor": {
                "policy_loss": {"loss_mode": "cliptrack_vanilla"},
                "clip_ratio": 0.2,
                "clip_ratio_low": 0.2,
                "clip_ratio_high": 0.28,
                "clip_ratio_c": 3.0,
                "loss_agg_mode": agg,
            }
        },
        "trainer": {"project_name": PROJECT},
    }


def _step(agg: str, generator: torch.Generator) -> tuple[dict[str, Any], int, int]:
    """One step: the twin on each micro-batch, reduced by verl's code; with the exact clipped and
    eligible tokens of the step, counted here token by token."""
    actor = ActorConfig(
        strategy="fsdp2",
        rollout_n=1,
        ppo_mini_batch_size=4,
        ppo_micro_batch_size_per_gpu=2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        loss_agg_mode=agg,
    )
    actor.global_batch_info.update(
        dp_size=1, batch_num_tokens=20, global_batch_size=4, loss_scale_factor=None
    )
    merged: dict[str, Metric] = {}
    clipped = tokens = 0
    for lengths in TOKENS:
        mask = torch.arange(8) < torch.tensor(lengths)[:, None]
        old = -2.0 + torch.randn(2, 8, generator=generator)
        current = old + 0.4 * torch.randn(2, 8, generator=generator)
        adv = torch.randn(2, 8, generator=generator)
        _, metrics = core_algos.get_policy_loss_fn("cliptrack_vanilla")(old, current, adv, mask, agg, actor)
        for key, metric in Metric.from_dict(metrics, aggregation=AggregationType.MEAN).items():
            merged.setdefault(key, Metric(AggregationType.MEAN)).extend(metric)
        r = torch.exp(current - old)
        bites = ((adv > 0) & (r > 1.28)) | ((adv < 0) & (r < 0.8))
        clipped += int((bites & mask).sum())
        tokens += int(mask.sum())
    per_mini_batch = {key: [Metric.aggregate_dp([metric])] for key, metric in merged.items()}
    return rename_dict(reduce_metrics(per_mini_batch), "actor/"), clipped, tokens


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Four runs logged through verl's Tracking (file, console, MLflow, W&B offline); the exact
    fraction of each step by run."""
    from verl.utils.tracking import Tracking

    root = tmp_path_factory.mktemp("verl-logs")
    env = {
        "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(root),
        "WANDB_SILENT": "true",
        "VERL_FILE_LOGGER_ROOT": str(root / "file"),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    exact: dict[str, list[float]] = {}
    try:
        (root / "console").mkdir()
        for name, (agg, seed) in RUNS.items():
            generator = torch.Generator().manual_seed(seed)
            with (root / "console" / f"{name}.log").open("w") as out, contextlib.redirect_stdout(out):
                tracker = Tracking(PROJECT, name, ["file", "console", "mlflow", "wandb"], config=_config(agg))
                exact[name] = []
                for step in range(1, STEPS + 1):
                    metrics, clipped, tokens = _step(agg, generator)
                    tracker.log(metrics, step)
                    exact[name].append(clipped / tokens)
                tracker.finish()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {"root": root, "exact": exact}


def _stores(root: Path) -> dict[str, dict[str, Any]]:
    return {
        "file": {"jsonl_dir": str(root / "file" / PROJECT)},
        "console": {"jsonl_dir": str(root / "console")},
        "mlflow": {"tracking_uri": f"sqlite:///{root / 'mlflow.db'}", "experiment": PROJECT},
        "wandb": {"wandb_dir": str(root / "wandb")},
    }


@pytest.mark.parametrize("store", ["file", "console", "mlflow", "wandb"])
def test_exact_clip_fraction_loaded(logged: dict[str, Any], store: str) -> None:
    runs = load_runs(**_stores(logged["root"])[store])
    assert len(runs.labels) == len(RUNS)
    for label in runs.labels:
        info = runs.info(label)
        name = next(n for n in RUNS if label.endswith(n) or info.run.run_name.endswith(n))
        wide = runs.wide(label)
        assert keys.CLIP_FRACTION not in info.approximate
        fractions = wide[keys.CLIP_FRACTION].tolist()
        assert fractions == pytest.approx(logged["exact"][name], rel=1e-12, abs=0)
        # verl's own mean of micro-batch means is kept beside the exact value, and differs from it
        verl = wide["actor/pg_clipfrac"].tolist()
        assert verl != pytest.approx(fractions, rel=1e-6)


@pytest.mark.parametrize("store", ["file", "console", "mlflow", "wandb"])
def test_recipe_recorded(logged: dict[str, Any], store: str) -> None:
    runs = load_runs(**_stores(logged["root"])[store])
    for label in runs.labels:
        info = runs.info(label)
        name = next(n for n in RUNS if info.run.run_name.endswith(n))
        recipe = recipe_from_config(info.run.config)
        assert recipe is not None, info.run.config
        assert (recipe.loss, recipe.clip_low, recipe.clip_high, recipe.dual_clip, recipe.aggregation) == (
            "cliptrack_vanilla",
            pytest.approx(0.8),
            pytest.approx(1.28),
            3.0,
            RUNS[name][0],
        )


def test_runs_and_compare_group_by_on_verls_file_logs(logged: dict[str, Any]) -> None:
    directory = str(logged["root"] / "file" / PROJECT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    listed = subprocess.run(
        [sys.executable, "-m", "cliptrack.cli.main", "runs", "--jsonl", directory],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert listed.returncode == 0, listed.stderr
    for name in RUNS:
        assert name in listed.stdout
    compared = subprocess.run(
        [
            sys.executable,
            "-m",
            "cliptrack.cli.main",
            "compare",
            "--jsonl",
            directory,
            "--group-by",
            "loss_recipe.aggregation",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert compared.returncode == 0, compared.stderr
    assert "token-mean" in compared.stdout and "seq-mean-token-mean" in compared.stdout
    on_mlflow = subprocess.run(
        [
            sys.executable,
            "-m",
            "cliptrack.cli.main",
            "compare",
            "--tracking-uri",
            f"sqlite:///{logged['root'] / 'mlflow.db'}",
            "--experiment",
            PROJECT,
            "--group-by",
            "actor_rollout_ref/actor/loss_agg_mode",
            "--json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert on_mlflow.returncode == 0, on_mlflow.stderr
    assert "seq-mean-token-mean" in on_mlflow.stdout
