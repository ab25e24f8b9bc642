"""``cliptrack runs --wandb-dir DIR`` lists W&B runs as the MLflow listing does: start time and status
read from each run's file (real W&B offline runs), latest first; a name matching several runs
takes the latest FINISHED one."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest
from cliptrack.backends import RunChoiceWarning, load_runs
from cliptrack.backends.wandb import _compat as compat_wandb
from cliptrack.backends.wandb.reader import run_status
from cliptrack.cli.main import main
from cliptrack.core import keys

STEPS = 5
"""Steps each run logs."""


def _wandb_run(root: Path, run_id: str, name: str, exit_code: int) -> tuple[float, float, Path]:
    """Log a W&B offline run of ``STEPS`` steps ending with ``exit_code``; the unix seconds just
    before it started and just after it finished, and its ``.wandb`` file."""
    import wandb

    os.environ.setdefault("WANDB_SILENT", "true")
    before = time.time()
    run = wandb.init(
        mode="offline",
        dir=str(root),
        project="cliptrack-tests",
        id=run_id,
        name=name,
        group="megatron",
        settings=wandb.Settings(console="off", x_disable_stats=True),
    )
    run.define_metric(keys.WANDB_STEP_METRIC)
    run.define_metric("*", step_metric=keys.WANDB_STEP_METRIC)
    for step in range(STEPS):
        run.log({keys.WANDB_STEP_METRIC: step, keys.LOSS_TOKENS: 100.0, keys.CLIPPED_TOKENS: 10.0})
    run.finish(exit_code=exit_code)
    [path] = Path(run.dir).parent.glob("run-*.wandb")
    return before, time.time(), path


def _has_exit(path: Path) -> bool:
    return any(r.WhichOneof("record_type") == "exit" for r in compat_wandb.records(path))


def _cut_before_the_exit_record(path: Path) -> None:
    """Cut ``path`` to its longest prefix without the exit record: a run whose process was killed
    before W&B could write one (the reader ends a file cut short quietly)."""
    data = path.read_bytes()
    probe = path.with_name("probe.wandb")
    low, high = 0, len(data)  # data[:low] has no exit record, data[:high] has one
    while high - low > 1:
        middle = (low + high) // 2
        probe.write_bytes(data[:middle])
        low, high = (low, middle) if _has_exit(probe) else (middle, high)
    probe.unlink()
    path.write_bytes(data[:low])
    assert not _has_exit(path)


@pytest.fixture(scope="module")
def wandb_dir(tmp_path_factory) -> tuple[Path, dict[str, tuple[float, float]]]:
    """Four W&B offline runs, one after the other: ``done`` (FINISHED), ``failed`` (exit code 1, the
    same name as ``done``), ``killed`` (143) and ``cut`` (its file cut before the exit record);
    each run id -> the seconds around its start."""
    root = tmp_path_factory.mktemp("wandb-runs")
    spans = {}
    for run_id, name, code in (
        ("done", "ppo-run", 0),
        ("failed", "ppo-run", 1),
        ("killed", "killed-run", 143),
        ("cut", "cut-run", 0),
    ):
        if run_id == "cut":  # its start is its directory's stamp, to the second: a second of its own
            time.sleep(max(0.0, math.floor(max(after for _, after in spans.values())) + 1 - time.time()))
        before, after, path = _wandb_run(root, run_id, name, code)
        spans[run_id] = (before, after)
        if run_id == "cut":
            _cut_before_the_exit_record(path)
    return root, spans


def test_runs_lists_status_and_start_latest_first(wandb_dir, capsys):
    root, spans = wandb_dir
    assert main(["runs", "--wandb-dir", str(root), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["cliptrack_id"] for r in rows] == ["cut", "killed", "failed", "done"]  # latest first
    status = {r["cliptrack_id"]: r["status"] for r in rows}
    assert status == {"done": "FINISHED", "failed": "FAILED", "killed": "KILLED", "cut": "RUNNING"}
    for row in rows:
        before, after = spans[row["cliptrack_id"]]
        # the run record's start, in unix seconds; a run cut before W&B wrote its run record has only
        # its directory's stamp, to the second
        assert math.floor(before) <= row["started"] <= after, row
    assert {r["steps"] for r in rows if r["cliptrack_id"] != "cut"} == {STEPS}
    assert main(["runs", "--wandb-dir", str(root)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["started", "(UTC)", "status"]
    assert [line.split()[2] for line in table[1:5]] == ["RUNNING", "KILLED", "FAILED", "FINISHED"]
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(rows[-1]["started"]))
    assert table[4].startswith(started)  # the start as the MLflow listing shows it


def test_a_name_of_several_runs_takes_the_latest_finished(wandb_dir):
    root, _ = wandb_dir
    with pytest.warns(RunChoiceWarning, match="took the latest FINISHED"):
        runset = load_runs(["ppo-run"], wandb_dir=root)
    assert [info.run.run_id for info in runset.runs] == ["done"]
    assert runset.runs[0].run.status == "FINISHED"


def test_exit_codes_map_to_the_statuses_the_sink_writes():
    assert [run_status(code) for code in (None, 0, 1, 143, 2)] == [
        "RUNNING",
        "FINISHED",
        "FAILED",
        "KILLED",
        "FAILED",
    ]
