"""One damaged run never hides the others.

- a run directory whose ``run.json`` is damaged (empty, torn, ``null``, an array, a field of the
  wrong type) is skipped by ``cliptrack runs``, ``compare`` and ``watch`` (its reference looked up
  by name in the spool) with a note naming the file; the healthy runs are listed and compared;
- a damaged ``worst.jsonl`` line (200,000 nested brackets: too deep for ``json``) is skipped with a
  warning naming the file and line, and the worst-sequence section keeps every run's other tables;
- an oversized ``worst.jsonl`` line is skipped without being read whole: reading stays within
  ``MAX_LINE_BYTES`` and a fraction of it, whatever the line's size;
- ``log_worst`` refuses a table whose line would be over that limit, so a reader takes back every
  table the tracker writes.
"""

from __future__ import annotations

import json
import logging
import random
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from cliptrack.cli.main import main
from cliptrack.core import keys
from cliptrack.core.worst import CRITERIA, SequenceGauge, Worst, worst_of
from cliptrack.log.tracker import Tracker
from cliptrack.store import journal
from cliptrack.store import worst as worst_store

from tests._compare_fixtures import megatron_vs_miles, write_jsonl

REPO = Path(__file__).resolve().parents[1]
DAMAGED = {
    "empty": b"",
    "torn": b"{",
    "null": b"null",
    "array": b"[1,2]",
    "wrong-field": b'{"run_id": "wrong-field", "started": "yesterday"}',
}
"""run.json contents a crash, a full disk or a hand edit can leave, by run directory name."""
NESTED = b"[" * 200_000 + b"]" * 200_000 + b"\n"
"""A ``worst.jsonl`` line nested too deeply for Python's ``json`` (a RecursionError)."""


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    """Two healthy runs (megatron-run, miles-run) and one run directory per ``DAMAGED`` run.json."""
    root = tmp_path / "spool"
    megatron, miles = megatron_vs_miles(n_megatron=40, n_miles=40)
    for run in (megatron, miles):
        write_jsonl(root, run)
    for name, content in DAMAGED.items():
        (root / name).mkdir()
        (root / name / keys.RUN_META_FILE).write_bytes(content)
    return root


def _cliptrack(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cliptrack.cli.main", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


def _names_each_damaged_file(stderr: str, root: Path) -> None:
    for name in DAMAGED:
        assert f"{root / name / keys.RUN_META_FILE} is damaged" in stderr, stderr
    assert stderr.count("the run is skipped") == len(DAMAGED), stderr


@pytest.mark.slow  # cliptrack in a subprocess
def test_runs_lists_the_healthy_runs_and_names_each_damaged_run_json(spool: Path) -> None:
    done = _cliptrack("runs", "--jsonl", str(spool), "--json")
    assert done.returncode == 0, done.stderr
    assert sorted(entry["name"] for entry in json.loads(done.stdout)) == ["megatron-run", "miles-run"]
    _names_each_damaged_file(done.stderr, spool)


@pytest.mark.slow  # cliptrack in a subprocess
def test_compare_of_two_healthy_runs_goes_on_beside_damaged_ones(spool: Path) -> None:
    done = _cliptrack("compare", "megatron-run", "miles-run", "--jsonl", str(spool), "--json")
    assert done.returncode == 0, done.stderr
    assert [run["label"] for run in json.loads(done.stdout)["runs"]] == ["megatron-run", "miles-run"]
    _names_each_damaged_file(done.stderr, spool)


@pytest.mark.slow  # cliptrack in a subprocess
def test_watch_finds_its_reference_by_name_beside_damaged_runs(spool: Path) -> None:
    reference = f"jsonl:{spool}#megatron-run"
    done = _cliptrack(
        "watch",
        str(spool / "miles0000002"),
        "--key",
        "clip_fraction:mean",
        "--reference",
        reference,
        "--once",
    )
    assert done.returncode in (0, 1), done.stderr  # 1: a breach; 2 would be the refusal
    _names_each_damaged_file(done.stderr, spool)


def _sequences(rng: random.Random, n: int) -> list[SequenceGauge]:
    out = []
    for datum in range(n):
        tokens = rng.randint(1, 30)
        abs_l = rng.random() * tokens
        out.append(SequenceGauge(datum, tokens, abs_l / 2, abs_l, abs_l * 0.01, min(rng.random(), abs_l), 0))
    return out


def _tables(seed: int, steps: range, k: int = 4) -> list[Worst]:
    rng = random.Random(seed)
    return [Worst(step, k, worst_of(_sequences(rng, 30), k)) for step in steps]


def test_a_line_nested_too_deeply_hides_no_worst_table(tmp_path: Path, capsys, caplog) -> None:
    root = tmp_path / "spool"
    megatron, miles = megatron_vs_miles(n_megatron=40, n_miles=40)
    tables = {"megatron-run": _tables(1, range(0, 40, 4)), "miles-run": _tables(2, range(0, 40, 2))}
    hostile = None
    for run in (megatron, miles):
        run_dir = write_jsonl(root, run)
        lines = [worst_store.encode(w) for w in tables[run.run_name]]
        if run.run_name == "miles-run":
            lines.insert(3, NESTED)  # line 4
            hostile = run_dir / worst_store.WORST_FILE
        (run_dir / worst_store.WORST_FILE).write_bytes(b"".join(lines))
    with caplog.at_level(logging.WARNING, logger="cliptrack"):
        assert main(["compare", "megatron-run", "miles-run", "--jsonl", str(root), "--json"]) == 0
    worst = json.loads(capsys.readouterr().out)["worst_sequences"]
    assert {entry["run"]: entry["steps"] for entry in worst["runs"]} == {
        name: [w.step for w in listed] for name, listed in tables.items()
    }
    assert f"{hostile} line 4 is not a worst-sequences table (skipped): nested too deeply" in caplog.text


def test_an_oversized_worst_line_is_skipped_without_being_read_whole(tmp_path: Path, caplog) -> None:
    limit = journal.MAX_LINE_BYTES  # worst.jsonl's limit is the journal's (worst_store.MAX_LINE_BYTES)
    tables = _tables(3, range(2))
    size = 4 * limit  # 64 MiB
    path = tmp_path / worst_store.WORST_FILE
    with open(path, "wb") as fh:
        fh.write(worst_store.encode(tables[0]))
        fh.write(b'{"step": 1, "pad": "' + b"x" * (size - 23) + b'"}\n')
        fh.write(worst_store.encode(tables[1]))
    tracemalloc.start()
    try:
        read = worst_store.read_worst_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # a line is read up to the limit (in a buffer, then as bytes: twice), the rest in 1 MiB chunks;
    # the line alone is 4x the limit, the file read whole (and split) 8x
    assert peak < 2.5 * limit, peak
    assert read == tables
    assert f"{path} line 2 is not a worst-sequences table (skipped): a line of {size} bytes" in caplog.text


@pytest.mark.slow  # a 20 MB table checked and encoded
def test_log_worst_refuses_a_table_longer_than_a_reader_takes(tmp_path: Path) -> None:
    k = 40_000  # 3 criteria x 40,000 sequences: about 20 MB as one line
    alike = tuple(SequenceGauge(datum, 10, 0.5, 1.0, 0.01, 0.25, 3) for datum in range(k))  # ranked by datum
    big = Worst(0, k, dict.fromkeys(CRITERIA, alike))
    assert len(worst_store.encode(big)) > journal.MAX_LINE_BYTES
    with Tracker("w", sinks=["jsonl"], spool_dir=tmp_path) as tracker:
        with pytest.raises(ValueError, match=r"step 0: the table takes \d+ bytes in worst\.jsonl"):
            tracker.log_worst(0, big)
        tracker.log_worst(1, _tables(5, range(1, 2))[0])
    assert [w.step for w in worst_store.read_worst_file(tracker.run_dir.path)] == [1]
