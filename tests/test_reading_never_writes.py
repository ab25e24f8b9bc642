"""Reading never writes: ``cliptrack runs`` and ``compare`` (and ``load_runs`` / ``list_runs``) on a
sqlite path that is not an MLflow store refuse with one line on stderr and exit code 2, and leave
every file of the folder byte-identical (no MLflow table created inside another program's
database, no new file). A real MLflow store, and a plain path to one, keep working; writing to a
new store (the tracker) is not affected."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from cliptrack.backends.preflight import PlainPathNote, StoreError
from cliptrack.cli.main import main

from tests._compare_fixtures import megatron_vs_miles, write_mlflow
from tests._refusal import refused

COMMANDS = {"runs": ["runs"], "compare": ["compare", "run-a", "run-b"]}


def _snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` -> the sha256 of its bytes ("dir" for a folder)."""
    return {
        str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
    }


def _foreign_db(path: Path, *, wal: bool = False) -> None:
    """A sqlite database of another program: one table ``foo`` with a row."""
    connection = sqlite3.connect(path)
    if wal:
        connection.execute("PRAGMA journal_mode=wal")
    connection.execute("CREATE TABLE foo (a INTEGER)")
    connection.execute("INSERT INTO foo VALUES (1)")
    connection.commit()
    connection.close()


def _target(tmp_path: Path, case: str) -> Path:
    """The path ``case`` names under ``tmp_path``, made as that case says."""
    path = tmp_path / "x.db"
    if case == "foreign":
        _foreign_db(path)
    elif case == "foreign-wal":
        _foreign_db(path, wal=True)
        for extra in ("x.db-wal", "x.db-shm"):  # closed cleanly: sqlite removed them
            assert not (tmp_path / extra).exists()
    elif case == "empty":
        path.touch()
    elif case == "directory":
        path.mkdir()
    elif case == "no-tables":
        sqlite3.connect(path).execute("VACUUM").connection.close()
    else:
        assert case == "missing"
    return path


def _refuses(argv: list[str], tmp_path: Path, capsys, monkeypatch) -> str:
    """``cliptrack ARGV`` refused in one line in ``tmp_path``, every file of the folder
    byte-identical and none added; the line."""
    return refused(argv, tmp_path, lambda: _snapshot(tmp_path), capsys, monkeypatch)


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("foreign", ("is not an MLflow store", "tables found: foo")),
        ("foreign-wal", ("is not an MLflow store", "tables found: foo")),
        ("no-tables", ("is not an MLflow store", "holds no tables")),
        ("empty", ("an empty file",)),
        ("missing", ("does not exist",)),
        ("directory", ("names a folder",)),
    ],
)
def test_a_path_that_is_no_mlflow_store_is_refused_untouched(
    command, case, words, tmp_path, capsys, monkeypatch
):
    path = _target(tmp_path, case)
    uri = f"sqlite:///{path}"
    line = _refuses([*COMMANDS[command], "--tracking-uri", uri], tmp_path, capsys, monkeypatch)
    assert line.startswith(f"cliptrack {command}: ") and uri in line, line
    for word in words:
        assert word in line, line
    if case.startswith("foreign"):  # the other program's data is still there, and nothing else
        with sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True) as connection:
            tables = connection.execute("SELECT name FROM sqlite_master").fetchall()
        assert tables == [("foo",)]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_default_store_and_the_environment_are_checked_too(command, tmp_path, capsys, monkeypatch):
    _foreign_db(tmp_path / "mlflow.db")
    line = _refuses(COMMANDS[command], tmp_path, capsys, monkeypatch)
    assert "sqlite:///mlflow.db (the default store) is not an MLflow store" in line
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    before = _snapshot(tmp_path)
    assert main(COMMANDS[command]) == 2
    assert "(MLFLOW_TRACKING_URI) is not an MLflow store" in capsys.readouterr().err
    assert _snapshot(tmp_path) == before


def test_the_python_readers_refuse_before_mlflow_opens_the_file(tmp_path):
    from cliptrack.backends import list_runs, load_runs

    _foreign_db(tmp_path / "x.db")
    uri = f"sqlite:///{tmp_path / 'x.db'}"
    before = _snapshot(tmp_path)
    for read in (
        lambda: load_runs(["a", "b"], tracking_uri=uri),
        lambda: load_runs(["a", "b"], tracking_uri=uri),
        lambda: list_runs(tracking_uri=uri),
    ):
        with pytest.raises(StoreError, match="is not an MLflow store: tables found: foo"):
            read()
    assert _snapshot(tmp_path) == before


def test_a_plain_path_to_a_foreign_database_is_refused_naming_what_it_was_read_as(
    tmp_path, capsys, monkeypatch
):
    _foreign_db(tmp_path / "x.db")
    line = _refuses(["runs", "--tracking-uri", "x.db"], tmp_path, capsys, monkeypatch)
    assert f"sqlite:///{(tmp_path / 'x.db').resolve()} (given as x.db) is not an MLflow store" in line


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory) -> tuple[Path, list[str]]:
    """A real MLflow sqlite store, made by MLflow's own client: two runs; their MLflow ids."""
    root = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    return root, [write_mlflow(uri, run) for run in megatron_vs_miles()]


def test_a_real_mlflow_store_keeps_working(mlflow_store, capsys):
    root, ids = mlflow_store
    uri = f"sqlite:///{root / 'mlflow.db'}"
    assert main(["runs", "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert all(run_id in out for run_id in ids) and "megatron-run" in out
    assert main(["compare", *ids, "--tracking-uri", uri]) == 0
    assert "Equally on-policy" in capsys.readouterr().out


def test_a_plain_path_to_a_store_is_read_as_its_sqlite_uri_with_a_note(mlflow_store, capsys, monkeypatch):
    root, ids = mlflow_store
    monkeypatch.chdir(root)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.warns(PlainPathNote, match=rf"mlflow.db is a plain path: reading it as sqlite:///{root}"):
        assert main(["compare", *ids, "--tracking-uri", "mlflow.db"]) == 0
    assert "Equally on-policy" in capsys.readouterr().out
    with pytest.warns(PlainPathNote):
        assert main(["runs", "--tracking-uri", "./mlflow.db", "--json"]) == 0
    listed = capsys.readouterr().out
    assert all(run_id in listed for run_id in ids)


@pytest.mark.slow  # a cliptrack process importing MLflow
def test_the_note_is_one_line_on_stderr_as_a_process(mlflow_store):
    root, ids = mlflow_store
    proc = subprocess.run(
        [sys.executable, "-m", "cliptrack.cli.main", "runs", "--tracking-uri", "mlflow.db"],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.startswith("cliptrack: note: ")]
    assert notes == [
        f"cliptrack: note: mlflow.db is a plain path: reading it as sqlite:///{root.resolve() / 'mlflow.db'}"
    ], proc.stderr
    assert all(run_id in proc.stdout for run_id in ids)


def test_writing_to_a_new_store_is_not_affected(tmp_path):
    """The tracker still creates its store (file and MLflow's tables) where none exists."""
    from cliptrack import Tracker
    from cliptrack.core import keys

    uri = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    (tmp_path / "new").mkdir()
    with Tracker(
        "fresh",
        sinks=["mlflow"],
        sink_options={"mlflow": {"tracking_uri": uri}},
        spool_dir=tmp_path / "spool",
    ) as tracker:
        tracker.log(0, {keys.LOSS_TOKENS: 10.0})
    from cliptrack.backends import list_runs

    assert [entry.name for entry in list_runs(tracking_uri=uri)] == ["fresh"]


def test_panels_mlflow_logs_to_the_store_a_plain_path_was_read_as(tmp_path, monkeypatch, capsys):
    """``panels mlflow --tracking-uri mlflow.db`` reads the runs there and logs the comparison run
    into the same sqlite store (not into an MLflow file store named ``mlflow.db``)."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ids = [write_mlflow(uri, run) for run in megatron_vs_miles()]
    monkeypatch.chdir(tmp_path)
    argv = ["panels", "mlflow", *ids, "--tracking-uri", "mlflow.db", "--artifact-dir", "artifacts"]
    with pytest.warns(PlainPathNote):
        assert main(argv) == 0
    run_id = capsys.readouterr().out.strip().rsplit(" ", 1)[-1]
    assert MlflowClient(tracking_uri=uri).get_run(run_id).data.tags["cliptrack.kind"] == "comparison"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifacts", "mlflow.db"]


def _older_store(root: Path, tmp_path: Path, *, drop_newer_table: bool) -> tuple[Path, str]:
    """A copy of the real store in ``tmp_path`` as an older MLflow left it: its schema revision one
    migration back (and, with ``drop_newer_table``, a table that a later migration made missing);
    return its path and the revision written."""
    import shutil

    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    migrations = ScriptDirectory.from_config(_get_alembic_config(db_url=""))
    older = migrations.get_revision(migrations.get_current_head()).down_revision
    path = tmp_path / "old.db"
    shutil.copyfile(root / "mlflow.db", path)
    connection = sqlite3.connect(path)
    connection.execute("UPDATE alembic_version SET version_num = ?", (older,))
    if drop_newer_table:
        connection.execute("DROP TABLE webhook_events")
    connection.commit()
    connection.close()
    return path, str(older)


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("drop_newer_table", [False, True])
def test_a_store_of_another_mlflow_schema_is_refused_unmigrated(
    mlflow_store, command, drop_newer_table, tmp_path, capsys, monkeypatch
):
    """MLflow's client would run its migrations on such a store (upgrading another MLflow's store by
    a read, or half-migrating it when a table is missing): it is refused, byte-identical."""
    from cliptrack.backends.mlflow._compat import schema_revision

    path, older = _older_store(mlflow_store[0], tmp_path, drop_newer_table=drop_newer_table)
    uri = f"sqlite:///{path}"
    line = _refuses([*COMMANDS[command], "--tracking-uri", uri], tmp_path, capsys, monkeypatch)
    assert f"{uri} is an MLflow store of another schema (revision {older}; MLflow " in line, line
    assert f"reads {schema_revision()})" in line and f"mlflow db upgrade {uri}" in line, line
