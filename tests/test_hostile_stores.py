"""Hostile stores: what a reader takes from a spool it did not write, and how it refuses the rest.

- a run id claimed by two run directories (a copied folder) is refused by ``compare``, ``runs``
  and ``replay``, naming both;
- journal lines over the reader's limits (``cliptrack.store.journal.MAX_LINE_BYTES``,
  ``cliptrack.core.validation.MAX_KEY_CHARS``) are skipped with a note naming the file and line, never
  read whole; the tracker refuses at ``log`` what would break them, so the reader takes back
  everything it writes;
- a ``points.jsonl`` that is a FIFO or a symlink to a device is refused, never read;
- the memory of reading a journal for a comparison stays within 3x its size plus a fixed 64 MiB;
- replay skips and names the lines its sinks cannot take (nested too deeply, a step past int64)
  and delivers the rest instead of retrying until its timeout;
- steps across the whole int64 range are kept by the frame (steps 0 and 2**62 in one run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from cliptrack import Limits
from cliptrack.backends import load_runs
from cliptrack.cli.main import main
from cliptrack.compare import RunSet
from cliptrack.core import keys
from cliptrack.core.validation import MAX_KEY_CHARS
from cliptrack.log.tracker import Tracker
from cliptrack.store import journal
from cliptrack.store.files import SpecialFileError
from cliptrack.store.frame import LoadedRun, Point
from cliptrack.store.records import FINISHED, RunInfo
from cliptrack.store.spool import DuplicateRunId, RunDir

from tests._harness import closed_port

REPO = Path(__file__).resolve().parents[1]
MEMORY_BASELINE = 64 * 2**20
"""The fixed part of the documented bound (docs/TRACKING.md): chunks, pandas' temporaries."""


def _spool_run(root: Path, folder: str, points: list[tuple[int, float, dict[str, float]]], **meta) -> Path:
    """A run directory as the tracker leaves it: run.json (``RunInfo.to_meta``) and the journal
    written by the journal's own encoder."""
    run = root / folder
    run.mkdir(parents=True)
    info = RunInfo(folder, meta.pop("run_name", folder), "megatron", status=FINISHED, started=1.0)
    (run / keys.RUN_META_FILE).write_text(json.dumps({**info.to_meta(), **meta}))
    (run / keys.POINTS_FILE).write_bytes(b"".join(journal.encode_points(points)))
    return run


def _points(n: int, clipped: float, start: int = 0) -> list[tuple[int, float, dict[str, float]]]:
    return [
        (s, 1000.0 + s, {keys.LOSS_TOKENS: 100.0, keys.CLIPPED_TOKENS: clipped})
        for s in range(start, start + n)
    ]


# ---- a run id claimed by two directories ----------------------------------------------------------
def test_a_run_id_claimed_by_two_directories_is_refused_naming_both(tmp_path, capsys):
    root = tmp_path / "spool"
    real = _spool_run(root, "run-a", _points(30, 10.0))
    copy = _spool_run(root, "run-a-copy", _points(30, 50.0), run_id="run-a")  # a copied folder

    with pytest.raises(DuplicateRunId) as caught:
        load_runs(["run-a"], jsonl_dir=root)
    assert str(real) in str(caught.value) and str(copy) in str(caught.value)

    assert main(["runs", "--jsonl", str(root)]) == 2
    err = capsys.readouterr().err
    assert "run-a" in err and str(real) in err and str(copy) in err

    assert main(["replay", str(root), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert str(real) in err and str(copy) in err and "claimed by two run directories" in err


# ---- lines and keys over the reader's limits --------------------------------------------------------
def test_a_key_or_line_over_the_limits_is_skipped_with_a_note_naming_the_line(tmp_path):
    root = tmp_path / "spool"
    run = _spool_run(root, "r", _points(5, 10.0))
    long_key = "k" * (MAX_KEY_CHARS + 1) + ":mean"
    many = {f"m{i:07d}:sum": 1.0 for i in range(journal.MAX_LINE_BYTES // 20)}  # a line over 16 MiB
    with (run / keys.POINTS_FILE).open("ab") as fh:
        fh.write(b"".join(journal.encode_points([(5, 1005.0, {long_key: 1.0, keys.LOSS_TOKENS: 1.0})])))
        fh.write(b"".join(journal.encode_points([(6, 1006.0, many)])))
        fh.write(b"".join(journal.encode_points(_points(3, 10.0, start=7))))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runset = load_runs([], jsonl_dir=root)
    notes = [str(w.message) for w in caught]
    points = run / keys.POINTS_FILE
    assert any(f"{points}:6:" in n and f"a key of {MAX_KEY_CHARS + 6} characters" in n for n in notes), notes
    assert any(f"{points}:7:" in n and "longer than the 16777216-byte limit" in n for n in notes), notes
    assert sorted(runset.frame["step"].unique().tolist()) == [0, 1, 2, 3, 4, 7, 8, 9]
    assert set(runset.metrics()) == {keys.LOSS_TOKENS, keys.CLIPPED_TOKENS}


def test_the_tracker_refuses_what_the_reader_would_skip_and_the_reader_takes_back_the_rest(tmp_path):
    """The reader's limits accept everything the writer can write: the longest key in its most
    expensive encoding (astral characters, 12 bytes each) and a point just under the line bound."""
    widest = "\U0001f600" * (MAX_KEY_CHARS - 5) + ":mean"  # MAX_KEY_CHARS characters
    size = journal.encoded_key_bytes("k" * 100)
    fits = (journal.MAX_LINE_BYTES - journal.POINT_FRAME_BYTES) // (size + journal.VALUE_FRAME_BYTES)
    big = {f"{i:0>95}:sum": 0.5 for i in range(fits)}
    tracker = Tracker("limits", sinks=("jsonl",), spool_dir=tmp_path, handle_signals=False)
    with tracker:
        with pytest.raises(ValueError, match=f"at most {MAX_KEY_CHARS}"):
            tracker.log(0, {"k" * MAX_KEY_CHARS + ":mean": 1.0})
        with pytest.raises(ValueError, match="a journal line holds at most 16777216"):
            tracker.log(0, {**big, **{f"{i:0>95}:max": 0.5 for i in range(2000)}})
        tracker.log(1, {widest: 1.0})
        tracker.log(2, big)
    path = tmp_path / tracker.run_id / keys.POINTS_FILE
    assert max(len(line) for line in path.read_bytes().splitlines()) <= journal.MAX_LINE_BYTES
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing skipped
        cols = journal.load_columns(path)
        points = journal.load_points(path, strict=True)
    assert [p.step for p in points] == [1, 2]
    assert widest in cols.names and len(cols.value) == 1 + fits


# ---- special files --------------------------------------------------------------------------------
def _load_in_child(root: Path, what: str) -> subprocess.CompletedProcess[str]:
    """``compare``'s loader and ``runs`` on ``root`` in a child bounded in time and memory (the code
    before this fix hung on a FIFO and read /dev/zero without bound)."""
    script = textwrap.dedent(
        f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))
        from cliptrack.backends import load_runs
        from cliptrack.backends.jsonl.listing import spool_entries
        for call in (lambda: load_runs([], jsonl_dir={str(root)!r}), lambda: spool_entries({str(root)!r})):
            try:
                call()
            except ValueError as exc:
                print(type(exc).__name__, exc)
            else:
                print("read {what} without refusing it")
        """
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120
    )


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_journal_that_is_a_fifo_or_a_device_is_refused_never_read(tmp_path, kind):
    root = tmp_path / "spool"
    run = _spool_run(root, "r", [])
    points = run / keys.POINTS_FILE
    points.unlink()
    if kind == "fifo":
        os.mkfifo(points)
        what = "a FIFO (named pipe)"
    else:
        points.symlink_to("/dev/zero")
        what = "a character device"
    try:
        child = _load_in_child(root, kind)
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading a {kind} journal hung")
    assert child.returncode == 0, child.stdout + child.stderr
    lines = child.stdout.splitlines()
    assert len(lines) == 2, child.stdout + child.stderr
    for line in lines:
        assert line.startswith("SpecialFileError") and f"{points} is {what}" in line, line
    with pytest.raises(SpecialFileError):  # and the spool's other readers
        RunDir(root, "r").journal_end()


# ---- memory -----------------------------------------------------------------------------------------
def test_reading_a_journal_for_a_comparison_takes_at_most_three_times_its_size(tmp_path):
    """A journal of the shape a cliptrack run writes (the measured keys, the means, reward, step
    time and throughput at full float precision: 41 bytes a value), read by ``load_runs`` in a
    child: its peak resident memory (VmHWM) over what it held after the imports stays within 3x the
    journal's size plus ``MEMORY_BASELINE``."""
    from cliptrack.core.measures import MEANS, MEASURES

    names = (
        [m.key for m in MEASURES] + [m.key for m in MEANS] + [keys.REWARD, keys.STEP_TIME, keys.THROUGHPUT]
    )
    root = tmp_path / "spool"
    run = _spool_run(root, "big", [])
    target = 48 * 2**20
    with (run / keys.POINTS_FILE).open("wb") as fh:
        step = size = 0
        while size < target:
            batch = [
                (
                    s,
                    1.7e9 + s * 0.25,
                    {k: (s * 7919 + i * 104729) % 100003 / 97.0 for i, k in enumerate(names)},
                )
                for s in range(step, step + 2000)
            ]
            step += 2000
            data = b"".join(journal.encode_points(batch))
            fh.write(data)
            size += len(data)
    script = textwrap.dedent(
        f"""
        import json
        import numpy, pandas
        import cliptrack.store.frame, cliptrack.backends.jsonl.reader
        def status(field):  # VmHWM: this process's own peak (ru_maxrss carries the parent's over a fork)
            with open("/proc/self/status") as fh:
                return next(int(l.split()[1]) * 1024 for l in fh if l.startswith(field))
        base = status("VmRSS")
        runset = cliptrack.backends.jsonl.reader.read([], jsonl_dir={str(root)!r})
        peak = status("VmHWM")
        print(json.dumps({{"base": base, "peak": peak, "rows": len(runset.frame)}}))
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=600
    )
    assert child.returncode == 0, child.stderr
    measured = json.loads(child.stdout.splitlines()[-1])
    assert measured["rows"] == step * len(names)
    used = measured["peak"] - measured["base"]
    assert used <= 3 * size + MEMORY_BASELINE, (
        f"{used / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB journal ({used / size:.2f}x)"
    )


# ---- replay ---------------------------------------------------------------------------------------


def test_replay_skips_and_names_lines_its_sink_cannot_take_and_delivers_the_rest(tmp_path):
    """A line nested 100,000 levels deep and a point at step 2**63 (past MLflow's int64) in the
    journal: replay names both (file, line, what is wrong) and delivers every other point within
    its timeout, instead of a dead sink thread or retries until the timeout."""
    from cliptrack.log.replay import replay_run
    from mlflow.tracking import MlflowClient

    db = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spool = tmp_path / "spool"
    tracker = Tracker(
        "hostile",
        sinks=(f"http://127.0.0.1:{closed_port()}",),  # nothing delivered: all left for replay
        spool_dir=spool,
        experiment="hostile",
        limits=Limits(flush_interval_s=0.05),
        open_timeout_s=0,
        handle_signals=False,
    )
    for step in range(10):
        tracker.log(step, {"a:mean": float(step)})
    tracker.close(timeout_s=0)
    for lane in tracker._lanes:
        lane.join(60)
    points = spool / tracker.run_id / keys.POINTS_FILE
    with points.open("ab") as fh:
        fh.write(
            b'{"step": 10, "wall_time": 1.0, "metrics": {"a:mean": '
            + b"[" * 100_000
            + b"]" * 100_000
            + b"}}\n"
        )
        fh.write(b"".join(journal.encode_points([(2**63, 2.0, {"a:mean": 1.0})])))
        fh.write(b"".join(journal.encode_points([(s, 3.0 + s, {"a:mean": float(s)}) for s in range(12, 22)])))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = replay_run(RunDir(spool, tracker.run_id), tracking_uri=db, timeout_s=30)
    [result] = results
    assert result.outcome == "replayed" and result.left == 0, result.line()
    notes = [str(w.message) for w in caught]
    assert any(f"{points}:11 " in n and "nested too deeply" in n for n in notes), notes
    assert any(f"{points}:12 " in n and f"step {2**63} is outside" in n for n in notes), notes
    client = MlflowClient(db)
    [run] = client.search_runs([client.get_experiment_by_name("hostile").experiment_id])
    steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "a:mean"))
    assert steps == [*range(10), *range(12, 22)]


# ---- the int64 step range ---------------------------------------------------------------------------
def test_steps_0_and_2_to_the_62_in_one_run_keep_every_value(tmp_path):
    points = [
        Point(0, 1.0, {keys.LOSS_TOKENS: 10.0, keys.CLIPPED_TOKENS: 1.0}),
        Point(2**62, 2.0, {keys.LOSS_TOKENS: 20.0, keys.CLIPPED_TOKENS: 2.0}),
    ]
    runset = RunSet.from_points([(LoadedRun(RunInfo("r", "r", "megatron"), "memory"), points)])
    rows = sorted(zip(runset.frame["step"].tolist(), runset.frame["value"].tolist(), strict=True))
    assert rows == [(0, 1.0), (0, 10.0), (2**62, 2.0), (2**62, 20.0)]
    wide = runset.wide("r")
    assert wide.index.tolist() == [0, 2**62]
    assert wide[keys.LOSS_TOKENS].tolist() == [10.0, 20.0]

    root = tmp_path / "spool"  # and from a journal, the extremes of int64 in one run
    _spool_run(
        root,
        "j",
        [(p.step, p.wall_time, dict(p.metrics)) for p in points] + [(-(2**63), 0.5, {"x:sum": 1.0})],
    )
    with (root / "j" / keys.POINTS_FILE).open("ab") as fh:
        fh.write(b"".join(journal.encode_points([(2**63 - 1, 3.0, {"x:sum": 2.0})])))
    frame = load_runs([], jsonl_dir=root).frame
    assert sorted(set(frame["step"].tolist())) == [-(2**63), 0, 2**62, 2**63 - 1]
    assert len(frame) == 6
