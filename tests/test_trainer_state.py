"""TRL's own log read back without TRL: ``trainer_state.json`` as transformers 5.25's
``TrainerState.save_to_json`` writes it (the dataclass's fields, ``indent=2, sort_keys=True``), its
``log_history`` entries as TRL 1.16's ``GRPOTrainer.log`` makes them (the window's metrics averaged
over its micro-steps, ``epoch``, then ``Trainer.log``'s ``step``; ``trl/trainer/grpo_trainer.py``
``_compute_loss`` and ``log``), the closing entry ``train()`` logs, and cliptrack's sums where
``cliptrack.adapters.trl`` logged them. Read through ``--jsonl DIR`` beside verl's file logs
(tests/test_trl_state.py reads real TRL runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cliptrack.backends.catalog import list_runs
from cliptrack.backends.load import load_runs
from cliptrack.cli.main import main
from cliptrack.compare import compare
from cliptrack.core import keys

MICRO = ((40, 4, 1, 3), (10, 5, 2, 3))
"""(loss tokens, clipped, clipped low, clipped high) of the two micro-steps of each logged step."""


def micro_steps(step: int, seed: int = 0) -> tuple[tuple[int, int, int, int], ...]:
    """A step's micro-steps: unequal token counts, so TRL's mean of their fractions differs from
    the ratio of their sums."""
    return tuple(
        (n + step + seed, c + (step + seed) % 3, lo, c + (step + seed) % 3 - lo) for n, c, lo, _ in MICRO
    )


def trl_entry(step: int, parts: tuple[tuple[int, int, int, int], ...], *, ours: bool) -> dict[str, Any]:
    """One ``log_history`` entry of TRL 1.16's GRPOTrainer (``_metrics`` averaged over the
    window's micro-steps in ``log``), with cliptrack's window sums when ``ours``."""

    def mean(i: int) -> float:
        return sum(p[i] / p[0] for p in parts) / len(parts)

    logs: dict[str, Any] = {"loss": 0.01 * step, "grad_norm": 1.2, "learning_rate": 3e-2}
    if ours:
        n, c, lo, hi = (sum(p[i] for p in parts) for i in range(4))
        logs |= {
            "loss_tokens:sum": float(n),
            "clipped_tokens:sum": float(c),
            "clipped_low_tokens:sum": float(lo),
            "clipped_high_tokens:sum": float(hi),
            "clip_fraction:mean": c / n,
        }
    logs |= {
        "num_tokens": 42.0 * step,
        "completions/mean_length": 7.5,
        "reward": 0.25 * step,
        "reward_std": 0.9,
        "frac_reward_zero_std": 0.0,
        "entropy": 2.7,
        "clip_ratio/low_mean": mean(2),
        "clip_ratio/high_mean": mean(3),
        "clip_ratio/region_mean": mean(1),
        "clip_ratio/low_min": 0.0,
        "clip_ratio/high_max": 0.625,
        "rewards/accuracy/mean": None,  # a reward with no valid value in the window: TRL logs None
        "step_time": 0.5,
        "epoch": 0.015625 * step,
    }
    return {**logs, "step": step}  # transformers' Trainer.log


def closing_entry(step: int) -> dict[str, Any]:
    """What ``Trainer.train`` logs when it completes (speed metrics, total_flos, train_loss)."""
    return {
        "train_runtime": 0.8948,
        "train_samples_per_second": 26.821,
        "train_steps_per_second": 6.705,
        "total_flos": 0.0,
        "train_loss": -0.02,
        "epoch": 0.015625 * step,
        "step": step,
    }


def save_state(path: Path, history: list[dict[str, Any]], *, global_step: int, max_steps: int) -> Path:
    """``TrainerState.save_to_json`` of a state with ``history`` (transformers 5.25's fields)."""
    state = {
        "epoch": 0.015625 * global_step,
        "global_step": global_step,
        "max_steps": max_steps,
        "logging_steps": 1,
        "eval_steps": 500,
        "save_steps": 2,
        "train_batch_size": 4,
        "num_train_epochs": 1,
        "num_input_tokens_seen": 0,
        "total_flos": 0.0,
        "log_history": history,
        "best_metric": None,
        "best_global_step": None,
        "best_model_checkpoint": None,
        "is_local_process_zero": True,
        "is_world_process_zero": True,
        "is_hyper_param_search": False,
        "trial_name": None,
        "trial_params": None,
        "stateful_callbacks": {"TrainerControl": {"args": {"should_training_stop": True}, "attributes": {}}},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def trl_run(output_dir: Path, steps: int = 4, *, seed: int = 0, ours: bool = True, save: bool = True) -> None:
    """A finished run's output directory: ``trainer.save_state()``'s file (``save``) and a
    checkpoint every two steps."""
    history = [trl_entry(s, micro_steps(s, seed), ours=ours) for s in range(1, steps + 1)]
    for s in range(2, steps + 1, 2):
        save_state(
            output_dir / f"checkpoint-{s}" / "trainer_state.json", history[:s], global_step=s, max_steps=steps
        )
    if save:
        save_state(
            output_dir / "trainer_state.json",
            history + [closing_entry(steps)],
            global_step=steps,
            max_steps=steps,
        )


def verl_run(path: Path, steps: int = 4, *, seed: int = 0) -> None:
    """verl 0.9.1's file logger (``verl/utils/tracking.py`` ``FileLogger``): one compact
    ``{"step": n, "data": {...}}`` per line; verl's clip fraction a mean of micro-batch means."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for s in range(1, steps + 1):
        parts = micro_steps(s, seed + 7)
        data = {
            "actor/pg_clipfrac": sum(p[1] / p[0] for p in parts) / len(parts),
            "actor/ppo_kl": 0.001,
            "critic/score/mean": 0.5,
            "timing_s/step": 2.0,
        }
        lines.append(json.dumps({"step": s, "data": data}, separators=(",", ":")))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_a_trl_output_dir_reads_exact_with_trls_own_fraction_beside(tmp_path: Path) -> None:
    trl_run(tmp_path / "trl-seed0")
    runs = load_runs(jsonl_dir=str(tmp_path))
    (label,) = runs.labels
    info, wide = runs.info(label), runs.wide(label)
    assert (label, info.run.backend_label, info.run.status, info.framework) == (
        "trl-seed0",
        "trl",
        "FINISHED",
        "trl",
    )
    assert wide.index.tolist() == [1, 2, 3, 4]
    exact = [sum(p[1] for p in micro_steps(s)) / sum(p[0] for p in micro_steps(s)) for s in (1, 2, 3, 4)]
    trls = [sum(p[1] / p[0] for p in micro_steps(s)) / 2 for s in (1, 2, 3, 4)]
    assert wide[keys.CLIP_FRACTION].tolist() == pytest.approx(exact, rel=1e-12)
    assert wide["clip_ratio/region_mean"].tolist() == pytest.approx(trls, rel=1e-12)
    assert all(abs(a - b) > 0.01 for a, b in zip(exact, trls, strict=True))  # the two reductions differ here
    assert keys.CLIP_FRACTION not in info.approximate
    assert (keys.CLIP_FRACTION, "clip_ratio/region_mean") in info.audited
    assert "rewards/accuracy/mean" not in wide  # TRL's null: no value, never a made-up one
    assert wide["train_runtime"].dropna().tolist() == [0.8948]  # the closing entry joins its step
    assert wide[keys.REWARD].tolist() == pytest.approx([0.25 * s for s in (1, 2, 3, 4)])  # TRL's reward
    assert runs.frame.groupby("step").wall_time.first().tolist() == [0.0, 0.5, 1.0, 1.5]


def test_a_plain_trl_run_reads_its_fraction_as_approximate(tmp_path: Path) -> None:
    trl_run(tmp_path / "plain", ours=False)
    runs = load_runs(jsonl_dir=str(tmp_path))
    info, wide = runs.info("plain"), runs.wide("plain")
    assert keys.CLIP_FRACTION in info.approximate
    trls = [sum(p[1] / p[0] for p in micro_steps(s)) / 2 for s in (1, 2, 3, 4)]
    assert wide[keys.CLIP_FRACTION].tolist() == pytest.approx(trls, rel=1e-12)
    assert keys.CLIPPED_TOKENS not in wide


def test_the_latest_state_of_an_output_dir_is_read(tmp_path: Path) -> None:
    """Without save_state's file, the last checkpoint's (a run still going or stopped: RUNNING);
    with one older than the last checkpoint (a resumed run), the checkpoint's."""
    trl_run(tmp_path / "stopped", steps=6, save=False)
    trl_run(tmp_path / "resumed", steps=4)
    history = [trl_entry(s, micro_steps(s), ours=True) for s in range(1, 7)]
    save_state(
        tmp_path / "resumed" / "checkpoint-6" / "trainer_state.json", history, global_step=6, max_steps=6
    )
    (tmp_path / "resumed" / "checkpoint-10").mkdir()  # a checkpoint folder being written: no state yet
    entries = {e.name: e for e in list_runs(jsonl_dir=str(tmp_path))}
    assert {n: (e.backend, e.status, e.steps) for n, e in entries.items()} == {
        "resumed": ("trl", "RUNNING", 6),
        "stopped": ("trl", "RUNNING", 6),
    }
    assert entries["stopped"].store_id == str(tmp_path / "stopped" / "checkpoint-6" / "trainer_state.json")


def test_one_output_dir_given_as_the_folder(tmp_path: Path) -> None:
    trl_run(tmp_path / "only")
    runs = load_runs(jsonl_dir=str(tmp_path / "only"))
    assert runs.labels == ["only"]


def test_a_damaged_state_file_is_named(tmp_path: Path) -> None:
    trl_run(tmp_path / "run")
    (tmp_path / "run" / "trainer_state.json").write_text('{"global_step": 4, "log_history": {}}')
    with pytest.raises(
        ValueError, match=r"run/trainer_state.json: not a trainer_state.json .*no log_history"
    ):
        load_runs(jsonl_dir=str(tmp_path))
    (tmp_path / "run" / "trainer_state.json").write_text('{"global_step": 4, "log_history": [{"loss": 1}]}')
    with pytest.raises(ValueError, match=r"log_history\[0\] is not a log entry with an integer step"):
        load_runs(jsonl_dir=str(tmp_path))


def test_runs_and_compare_group_trl_against_verl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder of TRL output dirs and verl file logs: listed, and compared as two stacks over seeds."""
    for seed in (0, 1):
        trl_run(tmp_path / f"trl-seed{seed}", seed=seed)
        verl_run(tmp_path / "verl" / f"seed{seed}.jsonl", seed=seed)
    assert main(["runs", "--jsonl", str(tmp_path), "--json"]) == 0
    listed = {e["name"]: (e["backend"], e["steps"]) for e in json.loads(capsys.readouterr().out)}
    assert listed == {
        "trl-seed0": ("trl", 4),
        "trl-seed1": ("trl", 4),
        "verl/seed0": ("verl", 4),
        "verl/seed1": ("verl", 4),
    }
    runs = load_runs(jsonl_dir=str(tmp_path))
    result = compare(runs, sorted(runs.labels), group_by="stack")
    assert {g: sorted(m) for g, m in result.groups.items()} == {
        "trl": ["trl-seed0", "trl-seed1"],
        "verl": ["verl/seed0", "verl/seed1"],
    }
    approximate = {e.run: e.approximate for e in result.estimates if e.metric == "clip_fraction"}
    assert approximate == {"trl-seed0": False, "trl-seed1": False, "verl/seed0": True, "verl/seed1": True}
    assert {(a.run, a.name) for a in result.audits} == {
        ("trl-seed0", "clip_ratio/region_mean"),
        ("trl-seed1", "clip_ratio/region_mean"),
    }
    assert main(["compare", "--jsonl", str(tmp_path), "--group-by", "stack"]) == 0
    text = capsys.readouterr().out
    assert "TRL's clip_ratio/region_mean" in text and "trl" in text and "verl" in text
