"""Every way of naming a store that ``cliptrack compare`` cannot read: exit code 2, one line on stderr
saying what was tried and what to do, no file or folder created, no traceback (unless ``--debug``),
and a bounded time even for a server that does not answer."""

from __future__ import annotations

import importlib
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cliptrack.backends.preflight import PlainPathNote
from cliptrack.cli.main import main

from tests._compare_fixtures import megatron_vs_miles, write_mlflow

BOUND_S = 10.0
"""The issue's bound on one failing command, timed after its imports (which a loaded machine can
make slow on their own); what it bounds is the command's own work: MLflow's retries against a dead
server used to take minutes."""


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _fails_cleanly(argv: list[str], tmp_path: Path, capsys, monkeypatch, *words: str) -> str:
    """Run ``cliptrack ARGV`` in ``tmp_path``; assert the failure contract; return the stderr line."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for module in ("mlflow.tracking", "cliptrack.backends.load", "cliptrack.cli.runs"):
        importlib.import_module(module)  # before the clock starts (see BOUND_S)

    capsys.readouterr()  # what setting the store up printed
    before = _files(tmp_path)
    started = time.perf_counter()
    code = main(argv)
    elapsed = time.perf_counter() - started
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured
    assert 1 <= len(lines) <= 3 and "Traceback" not in captured.err, captured.err
    assert captured.out == ""
    assert _files(tmp_path) == before, "reading created files"
    assert elapsed < BOUND_S, elapsed
    text = "\n".join(lines)
    for word in words:
        assert word in text, text
    return text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_store_named_and_none_in_the_working_directory(tmp_path, capsys, monkeypatch):
    line = _fails_cleanly(["compare", "a", "b"], tmp_path, capsys, monkeypatch, "sqlite:///mlflow.db")
    assert "--tracking-uri" in line and "does not exist" in line


def test_mistyped_sqlite_path_creates_neither_folder_nor_database(tmp_path, capsys, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'nope' / 'mlflow.db'}"
    _fails_cleanly(
        ["compare", "a", "b", "--tracking-uri", uri], tmp_path, capsys, monkeypatch, "nope", "does not exist"
    )
    assert not (tmp_path / "nope").exists()


def test_plain_path_names_the_uri_to_pass(tmp_path, capsys, monkeypatch):
    (tmp_path / "mlruns").mkdir()
    line = _fails_cleanly(
        ["compare", "a", "b", "--tracking-uri", "./mlruns"], tmp_path, capsys, monkeypatch, "plain path"
    )
    assert "sqlite:///" in line


def test_plain_path_to_a_database_file_is_read_as_its_sqlite_uri(tmp_path, capsys, monkeypatch):
    """The plain path works (tests/test_reading_never_writes.py); a run not found there names the
    sqlite URI it was read as."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    write_mlflow(uri, megatron_vs_miles()[0])
    with pytest.warns(PlainPathNote):
        line = _fails_cleanly(
            ["compare", "a", "b", "--tracking-uri", "mlflow.db"], tmp_path, capsys, monkeypatch, "'a'"
        )
    assert f"sqlite:///{(tmp_path / 'mlflow.db').resolve()}" in line


def test_plain_path_to_a_missing_file_says_it_does_not_exist(tmp_path, capsys, monkeypatch):
    _fails_cleanly(
        ["runs", "--tracking-uri", "nope.db"], tmp_path, capsys, monkeypatch, "nope.db", "does not exist"
    )


def test_dead_server_fails_within_the_bound(tmp_path, capsys, monkeypatch):
    uri = f"http://127.0.0.1:{_free_port()}"
    line = _fails_cleanly(
        ["compare", "a", "b", "--tracking-uri", uri], tmp_path, capsys, monkeypatch, uri, "mlflow server"
    )
    assert "--workers 1)" in line  # the command it suggests comes up on a small busy machine


def test_empty_store_says_it_holds_no_runs(tmp_path, capsys, monkeypatch):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'empty.db'}"
    MlflowClient(tracking_uri=uri).search_experiments()  # creates MLflow's tables, no run
    _fails_cleanly(
        ["compare", "a", "b", "--tracking-uri", uri], tmp_path, capsys, monkeypatch, "holds no runs"
    )


def test_empty_file_is_not_a_database(tmp_path, capsys, monkeypatch):
    (tmp_path / "mlflow.db").touch()
    _fails_cleanly(["compare", "a", "b"], tmp_path, capsys, monkeypatch, "empty file")
    assert (tmp_path / "mlflow.db").stat().st_size == 0


def test_unknown_run_lists_what_is_there(tmp_path, capsys, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    megatron, miles = megatron_vs_miles()
    write_mlflow(uri, megatron)
    write_mlflow(uri, miles)
    line = _fails_cleanly(
        ["compare", "megatron-run", "typo-run", "--tracking-uri", uri],
        tmp_path,
        capsys,
        monkeypatch,
        "typo-run",
    )
    lines = line.splitlines()
    assert len(lines) == 3 and all(len(x) < 200 for x in lines), lines  # three short lines
    assert lines[1] == "training runs there, latest first: miles-run, megatron-run"
    assert lines[2].startswith(f"cliptrack runs --tracking-uri {uri} lists them all")


def test_window_past_the_data_names_the_range(tmp_path, capsys, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    megatron, miles = megatron_vs_miles()
    ids = [write_mlflow(uri, megatron), write_mlflow(uri, miles)]
    line = _fails_cleanly(
        ["compare", *ids, "--tracking-uri", uri, "--window", "500:600"],
        tmp_path,
        capsys,
        monkeypatch,
        "500:600",
    )
    assert "from 0 to 199" in line


def test_debug_shows_the_traceback_and_keeps_exit_code_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for argv in (["--debug", "compare", "a", "b"], ["compare", "a", "b", "--debug"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err
        assert "StoreError" in err and "does not exist" in err
    assert not (tmp_path / "mlflow.db").exists()


def test_debug_keeps_exit_code_2_as_a_process(tmp_path):
    uri = f"sqlite:///{tmp_path / 'nope' / 'mlflow.db'}"
    proc = subprocess.run(
        [sys.executable, "-m", "cliptrack.cli.main", "--debug", "compare", "a", "b", "--tracking-uri", uri],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback (most recent call last)" in proc.stderr


def test_runs_command_fails_the_same_way(tmp_path, capsys, monkeypatch):
    _fails_cleanly(["runs"], tmp_path, capsys, monkeypatch, "does not exist")


def test_as_a_process_the_error_is_one_line_and_exit_code_2(tmp_path):
    uri = f"sqlite:///{tmp_path / 'nope' / 'mlflow.db'}"
    proc = subprocess.run(
        [sys.executable, "-m", "cliptrack.cli.main", "compare", "a", "b", "--tracking-uri", uri],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["compare", "--traking-uri", "sqlite:///x.db", "a", "b"], "(did you mean --tracking-uri?)"),
        (["runs", "--jsnol", "spool"], "(did you mean --jsonl?)"),
        (["comapre", "a", "b"], "(did you mean compare?)"),
    ],
)
def test_a_mistyped_flag_or_command_suggests_the_nearest(argv, hint, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("cliptrack: error: ") and err.endswith(hint), err


def test_a_flag_far_from_every_known_one_gets_no_guess(capsys):
    with pytest.raises(SystemExit):
        main(["runs", "--zzzzzz"])
    assert "did you mean" not in capsys.readouterr().err


def test_a_database_file_given_as_a_spool_says_what_it_is_and_which_flag_reads_it(
    tmp_path, capsys, monkeypatch
):
    import sqlite3

    monkeypatch.chdir(tmp_path)
    sqlite3.connect(tmp_path / "mlflow.db").execute("create table t (a)").connection.close()
    assert main(["runs", "--jsonl", "mlflow.db"]) == 2
    err = capsys.readouterr().err
    assert f"'{tmp_path / 'mlflow.db'}' is an SQLite database" in err
    assert f"--tracking-uri sqlite:///{tmp_path / 'mlflow.db'}" in err  # absolute: it works from anywhere
    assert main(["runs", "--jsonl", "missing"]) == 2
    assert f"JSONL spool directory '{tmp_path / 'missing'}' does not exist" in capsys.readouterr().err
