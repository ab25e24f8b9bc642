"""TRL's own log of real runs read back: TRL 1.16's ``GRPOTrainer`` (tests/_trl_harness.py, CPU,
gradient accumulation 2 so that TRL's mean of micro-step fractions differs from the ratio of
sums) writes ``trainer_state.json`` into its checkpoints and, with ``trainer.save_state()``, into
its output directory; ``cliptrack runs`` and ``cliptrack compare --jsonl`` read those directories
beside the tracker's own spool run (:mod:`cliptrack.backends.jsonl.trl_state`). TRL lives in its
own environment (the ``trl`` extra): without it every test here is skipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "trl",
    reason="TRL is not installed: the trl extra runs in its own environment (pip install 'cliptrack[trl]', docs/TRL.md)",
)

import trl
from cliptrack import Tracker
from cliptrack.adapters import trl as ct_trl
from cliptrack.backends.load import load_runs
from cliptrack.cli.main import main
from cliptrack.core import keys

from tests import _trl_harness as harness

STEPS = 6
SAVE = dict(gradient_accumulation_steps=2, save_strategy="steps", save_steps=3, max_steps=STEPS)


def trained_steps(trainer: Any, key: str) -> dict[int, float]:
    """``key`` of each training log entry the trainer kept, by step."""
    return {e["step"]: e[key] for e in trainer.state.log_history if "loss" in e and key in e}


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    """One folder: the tracker's spool run, cliptrack's trainer's output dir (save_state called)
    and a plain TRL run's output dir (its checkpoints only), trained from the same seed."""
    root = tmp_path_factory.mktemp("runs")
    with Tracker("tracked-seed0", sinks=["jsonl"], backend_label="trl", spool_dir=str(root)) as tracker:
        ours = harness.train(ct_trl.GRPOTrainer, str(root / "trl-seed0"), tracker=tracker, **SAVE)
        ours.save_state()
    plain = harness.train(trl.GRPOTrainer, str(root / "plain-seed0"), **SAVE)
    return root, ours, plain


def test_trls_state_reads_the_exact_fraction_the_tracker_logged(runs_dir: tuple[Path, Any, Any]) -> None:
    root, ours, _ = runs_dir
    assert sorted(p.name for p in (root / "trl-seed0").iterdir()) == [
        "README.md",
        "checkpoint-3",
        "checkpoint-6",
        "trainer_state.json",
    ]
    runs = load_runs(jsonl_dir=str(root))
    assert sorted(runs.labels) == ["plain-seed0", "tracked-seed0", "trl-seed0"]
    info, wide = runs.info("trl-seed0"), runs.wide("trl-seed0")
    assert (info.run.backend_label, info.run.status, info.framework) == ("trl", "FINISHED", "trl")
    assert wide.index.tolist() == list(range(1, STEPS + 1))
    tracked = runs.wide("tracked-seed0")[keys.CLIP_FRACTION].dropna().to_dict()
    exact = wide[keys.CLIP_FRACTION].to_dict()
    assert exact == tracked  # the same numbers, read from TRL's file and from the tracker's spool
    assert sum(wide[keys.CLIPPED_TOKENS]) > 0 and keys.CLIP_FRACTION not in info.approximate
    theirs = wide["clip_ratio/region_mean"].to_dict()
    assert theirs == trained_steps(ours, "clip_ratio/region_mean")  # TRL's own, shown beside
    assert (keys.CLIP_FRACTION, "clip_ratio/region_mean") in info.audited
    assert any(abs(theirs[s] - exact[s]) > 1e-3 for s in exact)  # micro-steps of unequal sizes


def test_a_plain_trl_runs_checkpoint_reads_approximate(runs_dir: tuple[Path, Any, Any]) -> None:
    root, ours, plain = runs_dir
    runs = load_runs(["plain-seed0"], jsonl_dir=str(root))
    info, wide = runs.info("plain-seed0"), runs.wide("plain-seed0")
    assert info.run.status == "RUNNING"  # checkpoint-6 is saved before train() logs its closing entry
    assert keys.CLIP_FRACTION in info.approximate and keys.CLIPPED_TOKENS not in wide
    fraction = wide[keys.CLIP_FRACTION].to_dict()
    assert fraction == trained_steps(plain, "clip_ratio/region_mean")
    assert fraction == trained_steps(ours, "clip_ratio/region_mean")  # cliptrack's trainer leaves TRL's alone


def test_runs_and_compare_read_the_folder(
    runs_dir: tuple[Path, Any, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _, _ = runs_dir
    assert main(["runs", "--jsonl", str(root), "--json"]) == 0
    listed = {e["name"]: (e["backend"], e["status"], e["steps"]) for e in json.loads(capsys.readouterr().out)}
    assert listed == {
        "tracked-seed0": ("trl", "FINISHED", STEPS),
        "trl-seed0": ("trl", "FINISHED", STEPS),
        "plain-seed0": ("trl", "RUNNING", STEPS),
    }
    assert main(["compare", "--jsonl", str(root), "trl-seed0", "plain-seed0"]) == 0
    text = capsys.readouterr().out
    assert "Audit: trl-seed0: TRL's clip_ratio/region_mean" in text
    assert "plain-seed0: clip_fraction is approximate" in text
