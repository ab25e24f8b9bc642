"""Reading never writes, on PostgreSQL: ``cliptrack runs``, ``compare`` and ``notebook`` (and
``load_runs`` / ``list_runs``) on a ``postgresql://`` database that is empty, another program's,
missing, or refused (wrong password) exit 2 with one line on stderr, and leave the cluster as it
was: the same databases, and each database's ``pg_dump`` (schema and rows) byte-identical. MLflow's
own store constructor would create its tables and run its migrations in such a database.

PostgreSQL is Debian's package, started by the test (``tests/_postgres.py``); skipped, with the
reason, where it is not installed or cannot run."""

from __future__ import annotations

import hashlib

import pytest
from cliptrack.backends.preflight import StoreError

from tests import _postgres
from tests._harness import free_port
from tests._refusal import refused
from tests._tools import needs_postgres

PASSWORD = "pg-Re4d0nly-9c2a"
"""The cluster's password: in every URI the tests pass, never in what is printed."""

COMMANDS = {
    "runs": ["runs"],
    "compare": ["compare", "run-a", "run-b"],
    "notebook": ["notebook"],
}

pytestmark = [pytest.mark.slow, needs_postgres]


@pytest.fixture(scope="module")
def postgres():
    """A cluster with an empty database ``empty`` and another program's database ``foreign``
    (one table ``foo`` with a row)."""
    try:
        with _postgres.running(free_port(), PASSWORD) as server:
            server.createdb("empty")
            server.createdb("foreign")
            server.psql("foreign", "CREATE TABLE foo (a integer); INSERT INTO foo VALUES (1);")
            yield server
    except _postgres.PostgresError as exc:  # pragma: no cover - a host where the package cannot start
        pytest.skip(f"PostgreSQL cannot run here: {str(exc)[:500]}")


def _state(server: _postgres.Postgres) -> dict[str, str]:
    """Every database of the cluster -> the sha256 of its ``pg_dump`` (schema and rows)."""
    names = server.psql("postgres", "SELECT datname FROM pg_database WHERE NOT datistemplate ORDER BY 1")
    return {name: hashlib.sha256(server.dump(name).encode()).hexdigest() for name in names.split()}


def _refuses(server: _postgres.Postgres, argv: list[str], capsys, monkeypatch, tmp_path) -> str:
    """``cliptrack ARGV`` refused in one line without the password, the cluster unchanged and no
    file written; the line."""
    line = refused(argv, tmp_path, lambda: _state(server), capsys, monkeypatch)
    assert PASSWORD not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "reading wrote files"
    return line


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    ("database", "words"),
    [
        ("empty", ("is not an MLflow store", "it holds no tables", "left untouched")),
        ("foreign", ("is not an MLflow store", "tables found: foo (no alembic_version")),
        ("missing", ("cannot be read", 'database "missing" does not exist')),
    ],
)
def test_a_database_that_is_no_mlflow_store_is_refused_untouched(
    postgres, command, database, words, capsys, monkeypatch, tmp_path
):
    for driver in (None, "psycopg2"):  # postgresql:// (SQLAlchemy's default driver) and +psycopg2
        uri = postgres.uri(database, driver=driver)
        line = _refuses(postgres, [*COMMANDS[command], "--tracking-uri", uri], capsys, monkeypatch, tmp_path)
        assert line.startswith(f"cliptrack {command}: "), line
        assert uri.replace(PASSWORD, "***") in line, line  # the database named, its password masked
        for word in words:
            assert word in line, line
    assert postgres.psql("foreign", "SELECT a FROM foo") == "1"


def test_a_wrong_password_or_a_closed_port_is_one_line(postgres, capsys, monkeypatch, tmp_path):
    wrong = postgres.uri("empty").replace(PASSWORD, "not-the-password")
    line = _refuses(postgres, ["runs", "--tracking-uri", wrong], capsys, monkeypatch, tmp_path)
    assert "cannot be read" in line and "password authentication failed" in line, line
    assert "not-the-password" not in line
    closed = f"postgresql://{_postgres.USER}:{PASSWORD}@127.0.0.1:{free_port()}/empty"
    line = _refuses(postgres, ["runs", "--tracking-uri", closed], capsys, monkeypatch, tmp_path)
    assert "no database server answers at postgresql://" in line, line


def test_the_python_readers_refuse_before_mlflow_opens_the_database(postgres):
    from cliptrack.backends import list_runs, load_runs

    uri = postgres.uri("foreign")
    before = _state(postgres)
    for read in (
        lambda: load_runs(["a", "b"], tracking_uri=uri),
        lambda: load_runs(["a", "b"], tracking_uri=uri),
        lambda: list_runs(tracking_uri=uri),
    ):
        with pytest.raises(StoreError, match="is not an MLflow store: tables found: foo") as raised:
            read()
        assert PASSWORD not in str(raised.value)
    assert _state(postgres) == before
