"""docs/FRAMEWORKS.md's "Compare verl with TRL", run as written: each ``cliptrack`` command of the
section, in a folder holding two seeds of each stack logged the three ways the section gives, in
the frameworks' own formats (verl 0.9.1's file logger and TRL's ``trainer_state.json``:
tests/test_trainer_state.py; verl's W&B and MLflow loggers and transformers' own callbacks for TRL:
tests/test_frameworks.py)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from cliptrack.cli.main import main

from tests import test_frameworks as fw
from tests.test_trainer_state import trl_run, verl_run

pytestmark = pytest.mark.slow  # real W&B offline runs and an MLflow store, then the command line

pytest.importorskip("mlflow")
pytest.importorskip("wandb")

DOC = Path(__file__).resolve().parents[1] / "docs" / "FRAMEWORKS.md"
SEEDS = (0, 1)


def section_commands() -> list[str]:
    """The ``cliptrack`` lines of the section's shell blocks, in order."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Compare verl with TRL", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.startswith("cliptrack ")]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two seeds of verl and of TRL, logged to files, to one MLflow store and to one W&B directory
    as the section's exports say (project/experiment ``stacks``, WANDB_DIR the folder)."""
    import os

    root = tmp_path_factory.mktemp("stacks")
    os.environ.setdefault("WANDB_SILENT", "true")
    here, project = os.getcwd(), fw.PROJECT
    os.chdir(root)  # a writer's default store lands here, never in the checkout
    fw.PROJECT = "stacks"
    uri = f"sqlite:///{root / 'mlflow.db'}"
    try:
        for seed in SEEDS:
            verl_run(root / "runs" / "verl" / f"seed{seed}.jsonl", seed=seed)
            trl_run(root / "runs" / f"trl-seed{seed}", seed=seed)
            rows = [fw.batches(seed, step) for step in range(fw.STEPS)]
            fw.write_step_keyword(root, f"verl-seed{seed}", uri, [fw.verl_rows(mbs) for mbs in rows])
            fw.write_trl(root, f"trl-seed{seed}", uri, [fw.trl_rows(mbs) for mbs in rows])
    finally:
        fw.PROJECT = project
        os.chdir(here)
    return root


def test_the_section_gives_one_command_per_store():
    assert section_commands() == [
        "cliptrack runs --jsonl runs",
        "cliptrack compare --jsonl runs --group-by stack",
        "cliptrack compare --tracking-uri sqlite:///mlflow.db --experiment stacks --group-by stack",
        "cliptrack compare --wandb-dir wandb --group-by stack",
    ]


def _stacks(text: str) -> set[str]:
    """The stacks and their seeds the comparison's note names."""
    found = re.search(r"stacks compared over seeds \(([^)]*)\)", text)
    assert found is not None, text
    return set(found.group(1).split(", "))


@pytest.mark.parametrize("command", section_commands())
def test_each_command_of_the_section_runs(folder, command, monkeypatch, capsys):
    monkeypatch.chdir(folder)
    assert main(shlex.split(command)[1:]) == 0
    text = capsys.readouterr().out
    if command.startswith("cliptrack runs"):
        rows = [line.split() for line in text.splitlines()]
        listed = {row[4]: row[5] for row in rows if len(row) > 5 and row[2] == "FINISHED"}
        assert listed == {"trl-seed0": "trl", "trl-seed1": "trl", "verl/seed0": "verl", "verl/seed1": "verl"}
        return
    assert _stacks(text) == {"verl: 2 seeds", "trl: 2 seeds"}
    assert "clip_fraction is approximate" in text  # verl's own loss: a mean of micro-batch means
    if "--jsonl" in command:  # cliptrack's TRL trainer logged its sums there: exact, TRL's beside
        assert "Audit: trl-seed0: TRL's clip_ratio/region_mean" in text
        assert "trl-seed0: clip_fraction is approximate" not in text


def test_a_folder_of_links_reads_the_same(folder, monkeypatch, capsys):
    """Logs kept elsewhere, linked into one folder (the section's last sentence of the first way)."""
    linked = folder / "linked"
    linked.mkdir(exist_ok=True)
    for source in (folder / "runs").iterdir():
        if not (linked / source.name).exists():
            (linked / source.name).symlink_to(source, target_is_directory=True)
    monkeypatch.chdir(folder)
    assert main(["compare", "--jsonl", "linked", "--group-by", "stack"]) == 0
    assert _stacks(capsys.readouterr().out) == {"verl: 2 seeds", "trl: 2 seeds"}


def test_two_stores_in_one_call_are_refused(folder, monkeypatch, capsys):
    monkeypatch.chdir(folder)
    with pytest.raises(SystemExit) as exit_:
        main(["compare", "--jsonl", "runs", "--tracking-uri", "sqlite:///mlflow.db", "--group-by", "stack"])
    assert exit_.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
