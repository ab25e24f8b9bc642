"""W&B offline: the run's ``.wandb`` transaction log, read back with wandb's own protobuf classes.

No network is used: W&B runs offline (``WANDB_MODE=offline``), its real local writer included.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from cliptrack import Limits
from cliptrack.core import keys
from cliptrack.log.tracker import Tracker

from tests._tracking_wandb_log import history, of_type

pytestmark = pytest.mark.slow


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    return tmp_path


def _wandb_file(root: Path, run_id: str) -> Path:
    (path,) = root.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")
    return path


def _counts(i: int) -> dict[str, float]:
    low, high = i % 3, i % 5
    return {
        keys.LOSS_TOKENS: 100.0 + i,
        keys.CLIPPED_TOKENS: float(low + high),
        keys.CLIPPED_LOW_TOKENS: float(low),
        keys.CLIPPED_HIGH_TOKENS: float(high),
    }


def test_every_step_is_in_the_transaction_log_including_out_of_order_ones(offline):
    steps = [0, 1, 2, 10, 3, 3, 4, 9, 5]  # a resumed run going back, and a repeated step
    with Tracker(
        "wb-order",
        sinks=("wandb",),
        backend_label="miles",
        config={"lr": 0.1},
        spool_dir=offline / "spool",
        sink_options={"wandb": {"dir": offline}},
        limits=Limits(flush_interval_s=0.05),
    ) as tracker:
        assert "wandb offline" in tracker.locations()["wandb"]
        for i, step in enumerate(steps):
            tracker.log(step, {**_counts(i), keys.REWARD: i / 10, keys.LOSS_SUM: math.nan if i == 4 else -i})
    path = _wandb_file(offline, tracker.run_id)

    rows = history(path)
    assert [(r[keys.WANDB_STEP_METRIC], r[keys.REWARD]) for r in rows] == [
        (s, i / 10) for i, s in enumerate(steps)
    ]
    for i, row in enumerate(rows):
        assert row[keys.CLIP_FRACTION] == (i % 3 + i % 5) / (100 + i)  # formed from the sums
        assert row[keys.CLIPPED_TOKENS] == i % 3 + i % 5
        assert math.isnan(row[keys.LOSS_SUM]) if i == 4 else row[keys.LOSS_SUM] == -i
    jsonl = [
        json.loads(line)
        for line in (offline / "spool" / tracker.run_id / keys.POINTS_FILE).read_text().splitlines()
    ]
    assert [r[keys.WANDB_WALL_TIME] for r in rows] == [p["wall_time"] for p in jsonl]

    (run,) = of_type(path, "run")
    assert run.run_id == tracker.run_id and run.display_name == "wb-order" and run.run_group == "miles"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config[keys.TAG_BACKEND] == "miles" and config["lr"] == 0.1
    metrics = of_type(path, "metric")
    assert any(m.glob_name == "*" and m.step_metric == keys.WANDB_STEP_METRIC for m in metrics)
    (fraction,) = [m for m in metrics if m.name == keys.CLIP_FRACTION]
    assert fraction.step_metric == keys.WANDB_STEP_METRIC and fraction.summary.mean and fraction.summary.last
    assert [e.exit_code for e in of_type(path, "exit")][0] == 0


def test_a_failing_training_loop_ends_the_wandb_run_with_a_nonzero_exit_code(offline):
    with pytest.raises(RuntimeError, match="diverged"):
        with Tracker(
            "wb-fail",
            sinks=("wandb",),
            spool_dir=offline / "spool",
            sink_options={"wandb": {"dir": offline}},
        ) as tracker:
            tracker.log(0, {keys.REWARD: 1.0})
            raise RuntimeError("diverged")
    path = _wandb_file(offline, tracker.run_id)
    assert [r[keys.REWARD] for r in history(path)] == [1.0]
    assert of_type(path, "exit")[0].exit_code == 1
    meta = json.loads((offline / "spool" / tracker.run_id / keys.RUN_META_FILE).read_text())
    assert meta["status"] == "FAILED" and meta["sinks"]["wandb"]["status"] == "FAILED"


@pytest.mark.parametrize("acked", [1, 2, 4])
def test_replay_sends_what_the_wandb_file_lacks_whatever_the_acknowledgement_says(offline, acked):
    """A spool as a crash leaves it: six points on disk, two rows in the run's ``.wandb`` file, and an
    acknowledgement that may lag (1: a batch was in flight) or run ahead (4: rows ``run.log`` took
    never reached the file). Replay reads the file back: the four missing rows, once each."""
    import subprocess
    import sys

    from cliptrack.backends.wandb.sink import WandbSink
    from cliptrack.store.records import Point, RunInfo
    from cliptrack.store.spool import Ack, Journal, RunDir

    run = RunInfo("0123456789abcdef0123456789abcdef", "crashed", "megatron", {"lr": 0.5}, started=1.7e9)
    run_dir = RunDir(offline / "spool", run.run_id)
    run_dir.update_meta(**run.to_meta())
    journal = Journal(run_dir)
    journal.open()
    points = [Point(step, 1.7e9 + step, {keys.REWARD: step / 10}) for step in range(6)]
    journal.append(points)
    journal.close()
    ends = [end for _, end in run_dir.read_points()]
    first = WandbSink(dir=offline)  # the crashed process's W&B run: it holds the first two rows
    state = first.open(run)
    first.write(points[:2])
    first.close("KILLED")
    run_dir.update_meta(sinks={"wandb": {**state, "closed": False}})  # what a live lane records
    run_dir.write_ack("wandb", Ack(acked, ends[acked - 1]))

    replay = subprocess.run(
        [sys.executable, "-m", "cliptrack.cli.main", "replay", str(offline / "spool")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert (
        f"run {run.run_id} wandb: replayed, 4 points pushed, status FAILED" in replay.stdout
    )  # died: FAILED
    files = sorted(offline.glob(f"wandb/offline-run-*-{run.run_id}/run-{run.run_id}.wandb"))
    assert len(files) == 2  # the crashed process's and replay's
    rows = [row for path in files for row in history(path)]
    assert sorted((r[keys.WANDB_STEP_METRIC], r[keys.REWARD], r[keys.WANDB_WALL_TIME]) for r in rows) == [
        (s, s / 10, 1.7e9 + s) for s in range(6)
    ]  # every row once: none lost, none twice
    assert [of_type(path, "exit")[0].exit_code for path in files] == [143, 1]
    assert run_dir.read_ack("wandb") == Ack(6, ends[-1])


def test_a_resume_never_starts_in_the_second_of_an_earlier_run_directory(tmp_path):
    """W&B names run directories by the second: a replay in the crash's second would share (and
    overwrite) the crashed process's ``.wandb`` file. The resume waits for the next second."""
    import time as _time

    from cliptrack.backends.wandb import _compat as compat

    run_id = "0123456789abcdef0123456789abcdef"
    for _ in range(3):
        stamp = _time.strftime("%Y%m%d_%H%M%S")
        earlier = tmp_path / "wandb" / f"offline-run-{stamp}-{run_id}"
        earlier.mkdir(parents=True, exist_ok=True)
        (earlier / f"run-{run_id}.wandb").write_bytes(b"")
        compat.leave_the_second_of(tmp_path, run_id)
        assert _time.strftime("%Y%m%d_%H%M%S") != stamp
