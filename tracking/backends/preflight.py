"""Checks before anything reads: the MLflow store named exists and answers (the window holding data is
checked by the comparison, ``cliptrack.compare.align.check_window``).

Reading never writes: MLflow's client makes a missing sqlite file (and its folder) and creates its
tables (66 in MLflow 3.17) in any sqlite file it opens, so a mistyped path, or a path to another
program's database, would "work", find no run, and leave MLflow's schema behind. So a sqlite file is
opened here first, read-only with Python's ``sqlite3``, and it must already hold MLflow's own
tables (``MLFLOW_TABLES``) before MLflow's client ever sees it. Every check here raises
``StoreError`` (a ``LookupError``) with one line saying what was tried and what to do; each check
reads, none writes (``sqlite_catalog``).

A database server (``postgresql://``, ``mysql://``, ``mssql://``, with or without ``+DRIVER``) is
treated alike: MLflow's ``SqlAlchemyStore`` creates its tables (and runs its migrations) in any
database it opens that lacks them, so the database's table names are read first with SQLAlchemy's
``inspect`` on a connection of our own (``database_catalog``), and it must hold ``MLFLOW_TABLES``
before MLflow's client opens it. A refusal names the database without its password.

A store of another MLflow schema (its ``alembic_version`` row is not the revision the installed
MLflow reads) is refused as well, by the check the MLflow reader passes (``SchemaCheck``): MLflow's
store constructor would run its migrations on it (a store written by an older MLflow would be
upgraded by a read, and one missing a newer table half-migrated).

A plain path to an existing file (``--tracking-uri mlflow.db``) is read as
``sqlite:///<absolute path>``, with a note (``PlainPathNote``) saying so.

Time bound: a server is probed with one TCP connection (``PROBE_TIMEOUT_S``) before any request;
the reads themselves run under ``_compat_mlflow.bounded_requests(reads=True)`` (2 retries, a
connection within ``READ_CONNECT_TIMEOUT_S``, a reply within ``read_timeout_s()``, on the reading
threads only), so a server that cannot be reached costs seconds, not MLflow's default of minutes of
retries, while a busy one is waited for.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import warnings
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

from cliptrack.core.secrets import RedactedError

DEFAULT_URI = "sqlite:///mlflow.db"
"""MLflow's own default store (relative to the working directory)."""
PROBE_TIMEOUT_S = 3.0
"""Seconds one TCP connection to a tracking server may take."""
STORE_HINT = (
    "name the store with --tracking-uri sqlite:///PATH/mlflow.db (the demo's: "
    "sqlite:///cliptrack-demo/mlflow.db) or http://HOST:PORT, or read the spool with --jsonl DIR"
)
SQLITE_MAGIC = b"SQLite format 3\x00"
MLFLOW_TABLES = ("alembic_version", "experiments", "runs", "metrics")
"""Tables every MLflow SQL store holds (MLflow 2 and 3): a sqlite file without them is not one."""
WAL_HEADER_OFFSET = 18
"""Byte of a sqlite header holding the write format version: 2 means WAL journal mode."""
TABLES_SHOWN = 10
"""Table names a refusal lists at most."""
REVISION_QUERY = "SELECT version_num FROM alembic_version"
"""The schema revision of an MLflow SQL store (alembic's table, one row)."""
DATABASE_SCHEMES = {"postgresql": 5432, "mysql": 3306, "mssql": 1433}
"""Database servers MLflow keeps a store in (besides sqlite), with their default ports."""
SchemaCheck = Callable[[str | None, str, str, list[str]], None]
"""Checks a SQL store's schema revision (None: no ``alembic_version`` row) for the reader that
passes it, given the store's URI as a refusal names it (without a password), where the URI came
from (``origin``: " (the default store)", or "") and the store's table names (an interrupted
migration leaves some behind); raises ``StoreError`` for one it cannot read without migrating
(``cliptrack.backends.mlflow.listing.check_schema``)."""


class StoreError(RedactedError, LookupError):
    """The named store does not exist, cannot be read, or holds nothing to compare (its message
    redacted: no password or token of the store's URI)."""


class PlainPathNote(UserWarning):
    """A plain path given as a tracking URI is read as the ``sqlite:///`` URI of that file."""

    label = "note"
    """How the command line prefixes it (``cliptrack: note: ...``)."""


def resolve_tracking_uri(tracking_uri: str | None, schema: SchemaCheck | None = None) -> str:
    """The MLflow URI to read, checked: it names an existing MLflow SQL store (sqlite or a database
    server), whose schema revision ``schema`` accepts when given, or an answering server; a plain
    path to an existing file comes back as its ``sqlite:///`` URI.

    None means ``MLFLOW_TRACKING_URI``, else MLflow's default ``sqlite:///mlflow.db``.
    """
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    origin = (
        "" if tracking_uri else " (the default store)" if uri == DEFAULT_URI else " (MLFLOW_TRACKING_URI)"
    )
    scheme = urlparse(uri).scheme
    if scheme == "sqlite":
        _check_sqlite(uri, origin, schema)
    elif scheme in ("http", "https"):
        _check_server(uri)
    elif scheme.split("+", 1)[0].lower() in DATABASE_SCHEMES:
        _check_database(uri, origin, schema)
    elif scheme in ("", "file") or len(scheme) == 1:  # a plain path (a Windows drive letter too)
        return _plain_path_store(uri, origin, schema)
    return uri


def plain_path_uri(uri: str) -> str | None:
    """``sqlite:///<absolute path>`` when ``uri`` is a plain path (or ``file:`` URI) naming an
    existing file, else None (any other URI, a folder, a missing path)."""
    scheme = urlparse(uri).scheme
    if scheme not in ("", "file") and len(scheme) != 1:
        return None
    path = _plain_path(uri)
    return f"sqlite:///{path.resolve()}" if path.is_file() else None


def _plain_path(uri: str) -> Path:
    return Path(unquote(urlparse(uri).path if uri.startswith("file:") else uri)).expanduser()


def _plain_path_store(uri: str, origin: str, schema: SchemaCheck | None) -> str:
    """The ``sqlite:///`` URI a plain path to a file is read as, checked (``_check_sqlite``), with a
    ``PlainPathNote``; StoreError for a folder or a missing path."""
    sqlite_uri = plain_path_uri(uri)
    if sqlite_uri is None:
        raise StoreError(_plain_path_message(uri, origin))
    _check_sqlite(sqlite_uri, f" (given as {uri}{origin})", schema)
    warnings.warn(f"{uri}{origin} is a plain path: reading it as {sqlite_uri}", PlainPathNote, stacklevel=3)
    return sqlite_uri


def _sqlite_path(uri: str) -> Path | None:
    """The file of ``sqlite:///rel`` / ``sqlite:////abs``; None for an in-memory database."""
    rest = uri[len("sqlite://") :]
    if rest in ("", "/", "/:memory:"):
        return None
    return Path(unquote(rest[1:] if rest.startswith("/") else rest).split("?", 1)[0])


def _check_sqlite(uri: str, origin: str, schema: SchemaCheck | None) -> None:
    """The sqlite file of ``uri`` exists, is a sqlite database and holds MLflow's tables; nothing
    is created or written (StoreError otherwise)."""
    path = _sqlite_path(uri)
    if path is None:
        return
    if not path.exists():
        where = "its folder" if not path.parent.exists() else "the file"
        raise StoreError(
            f"no MLflow store at {uri}{origin}: {where} {str(path.parent if not path.parent.exists() else path)!r} "
            f"does not exist (reading creates nothing); {STORE_HINT}"
        )
    if path.is_dir():
        raise StoreError(f"MLflow store {uri}{origin} names a folder, not a database file; {STORE_HINT}")
    with path.open("rb") as handle:
        head = handle.read(len(SQLITE_MAGIC))
    if head != SQLITE_MAGIC:
        state = "an empty file" if not head else "not a sqlite database"
        raise StoreError(f"MLflow store {uri}{origin}: {str(path)!r} is {state}; {STORE_HINT}")
    _check_mlflow_tables(path, uri, origin, schema)


def _check_mlflow_tables(path: Path, uri: str, origin: str, schema: SchemaCheck | None) -> None:
    """StoreError unless the sqlite file at ``path`` holds every table of ``MLFLOW_TABLES``."""
    try:
        tables, revision = sqlite_catalog(path)
    except sqlite3.Error as exc:
        raise StoreError(f"{uri}{origin} cannot be read as a sqlite database ({exc}); {STORE_HINT}") from None
    _require_mlflow_store(tables, uri, origin)
    if schema is not None:
        schema(revision, uri, origin, tables)


def _require_mlflow_store(tables: list[str], uri: str, origin: str) -> None:
    """StoreError unless ``tables`` (a store's table names, sorted) hold every one of
    ``MLFLOW_TABLES``; ``uri`` is the store as shown (without a password)."""
    missing = [name for name in MLFLOW_TABLES if name not in tables]
    if not missing:
        return
    if not tables:
        found = "it holds no tables"
    else:
        shown = ", ".join(tables[:TABLES_SHOWN])
        more = f" and {len(tables) - TABLES_SHOWN} more" if len(tables) > TABLES_SHOWN else ""
        found = f"tables found: {shown}{more} (no {', '.join(missing)})"
    raise StoreError(
        f"{uri}{origin} is not an MLflow store: {found}; it was left untouched (reading writes nothing); "
        f"{STORE_HINT}"
    )


def sqlite_catalog(path: Path) -> tuple[list[str], str | None]:
    """The table names of the sqlite database at ``path``, sorted, and its MLflow schema revision
    (None without an ``alembic_version`` table), read without writing anything.

    The file is opened read-only (``mode=ro``). A database in WAL mode whose ``-wal`` or ``-shm``
    file is missing is opened ``immutable`` instead: a read-only connection would create both
    files (and leave them). sqlite3.Error when the file cannot be read as a database.
    """
    wal = path.with_name(path.name + "-wal")
    shm = path.with_name(path.name + "-shm")
    with path.open("rb") as handle:
        header = handle.read(WAL_HEADER_OFFSET + 2)
    in_wal_mode = len(header) == WAL_HEADER_OFFSET + 2 and header[WAL_HEADER_OFFSET] == 2
    mode = "ro&immutable=1" if in_wal_mode and not (wal.exists() and shm.exists()) else "ro"
    target = f"{path.resolve().as_uri()}?mode={mode}"
    connection = sqlite3.connect(target, uri=True)
    try:
        rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        tables = sorted(str(name) for (name,) in rows)
        found = connection.execute(REVISION_QUERY).fetchone() if "alembic_version" in tables else None
    finally:
        connection.close()
    return tables, None if found is None else str(found[0])


def _check_database(uri: str, origin: str, schema: SchemaCheck | None) -> None:
    """The database server of ``uri`` answers and the database holds MLflow's tables, read with a
    connection of our own before MLflow's client opens it (which would create them); StoreError
    otherwise, naming the database without its password."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(uri)
    except ArgumentError as exc:
        raise StoreError(f"tracking URI {uri!r}{origin} is not a database URI ({exc})") from None
    shown = url.render_as_string(hide_password=True)
    port = url.port or DATABASE_SCHEMES[url.get_backend_name()]
    if url.host:
        _probe_database(url.host, port, shown, origin)
    try:
        tables, revision = database_catalog(uri)
    except ImportError as exc:
        raise StoreError(
            f"{shown}{origin} cannot be read: its driver is not installed ({exc}); "
            "pip install 'cliptrack[mlflow]' installs PostgreSQL's (psycopg2)"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any driver's error: one line, without the password
        raise StoreError(f"{shown}{origin} cannot be read: {_first_line(exc, url.password)}") from None
    _require_mlflow_store(tables, shown, origin)
    if schema is not None:
        schema(revision, shown, origin, tables)


def _unanswered(host: str, port: int) -> str | None:
    """Why nothing answers a TCP connection at ``host:port`` within ``PROBE_TIMEOUT_S`` seconds;
    None when something does."""
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def _probe_database(host: str, port: int, shown: str, origin: str) -> None:
    reason = _unanswered(host, port)
    if reason is not None:
        raise StoreError(
            f"no database server answers at {shown}{origin} ({reason}); start it or check the URI"
        )


def _first_line(exc: BaseException, password: str | None) -> str:
    """The first line of a driver's error (SQLAlchemy's wrapper left off), the password masked."""
    inner = getattr(exc, "orig", None) or exc
    line = (str(inner).strip().splitlines() or [type(inner).__name__])[0]
    return line.replace(password, "***") if password else line


def database_catalog(uri: str) -> tuple[list[str], str | None]:
    """The table names of the database at ``uri`` (its default schema, as MLflow reads it), sorted,
    and its MLflow schema revision (None without an ``alembic_version`` table), read on a connection
    of our own that writes nothing and is closed afterwards (the transaction SQLAlchemy opens is
    rolled back). Raises what the driver raises when it cannot connect."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    engine = sqlalchemy.create_engine(uri, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            tables = sorted(sqlalchemy.inspect(connection).get_table_names())
            found = None
            if "alembic_version" in tables:
                found = connection.execute(sqlalchemy.text(REVISION_QUERY)).scalar()
            connection.rollback()
    finally:
        engine.dispose()
    return tables, None if found is None else str(found)


def _check_server(uri: str) -> None:
    parsed = urlparse(uri)
    host = parsed.hostname or "localhost"
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    reason = _unanswered(host, port)
    if reason is not None:
        raise StoreError(
            f"no MLflow server answers at {uri} ({reason}); start one "
            f"(mlflow server --backend-store-uri sqlite:///PATH/mlflow.db --port {port} --workers 1) "
            "or check the URI"
        )


def _plain_path_message(uri: str, origin: str = "") -> str:
    """Why a plain path that names no file is not read, and what to type instead."""
    path = _plain_path(uri)
    given = f"{uri}{origin}"
    if path.is_dir() and (path / "mlflow.db").is_file():
        return (
            f"tracking URI {given} is a plain path to a folder: read its database with "
            f"--tracking-uri sqlite:///{(path / 'mlflow.db').resolve()}"
        )
    if path.is_dir():
        return (
            f"tracking URI {given} is a plain path to a folder: MLflow's file store (mlruns/) is not "
            f"read (MLflow 3 keeps it in maintenance mode); {STORE_HINT}"
        )
    return (
        f"no MLflow store at {given}: the file {str(path)!r} does not exist (reading creates nothing); "
        f"{STORE_HINT}"
    )
