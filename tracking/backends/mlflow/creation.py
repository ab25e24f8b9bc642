"""A new MLflow store is created by one process at a time, and a store left mid-migration is named
with its repair.

MLflow's tracking store creates the tables of a database that lacks them and runs every one of its
alembic migrations the first time a client opens it (``SqlAlchemyStore.__init__`` ->
``mlflow.store.db.utils._initialize_tables``), with no lock between processes (MLflow's own
``_safe_initialize_tables`` guards only its job and workspace stores). Eight trackers starting
together on a new ``sqlite:///.../mlflow.db`` on a busy machine ran those migrations over each other
(``table _alembic_tmp_metrics already exists``, ``duplicate column name: step``) and left the
database mid-migration: no run written, and every later open failing the same way.

``creating(uri)`` holds an exclusive ``flock`` on ``<database file>.cliptrack-lock`` beside a local
sqlite database while the sink's client is constructed: the other processes wait for it. Under the
lock a store that does not exist yet (no file, or an empty one) is built whole in a temporary file
beside it (``<database file>.creating-<pid>``: MLflow's own tables and migrations,
``_compat.initialize_schema``) and linked into place only once complete: a creator that ends midway
(its tracker closed and the process exited while the sink's thread was still migrating: the thread
dies with the process) leaves a temporary file the next creator removes, never a store
mid-migration. MLflow's client then finds every table at the head revision and migrates nothing.
The lock file stays beside the database (empty; it is only ever locked). A database server, or a
system without ``fcntl``, is opened as before (MLflow's own behaviour).

``mid_migration`` tells a store an interrupted migration left behind (alembic's batch-mode
``_alembic_tmp_<table>`` copies, or MLflow's tables without a recorded revision), ``repair`` how to
repair it: ``mlflow db upgrade`` alone fails on such a store (``table _alembic_tmp_metrics already
exists``), so the leftover tables are dropped first (both wedged stores of the eight-writer race
were brought to the head revision that way, and read). ``in_progress`` tells a store being created
right now (a reader then says so instead).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from cliptrack.backends.mlflow._compat import SQLITE_PREFIX, initialize_schema
from cliptrack.store.files import lock_held

LOCK_SUFFIX = ".cliptrack-lock"
"""The lock file's name: the database file's name with this suffix, in the same folder."""
CREATING_INFIX = ".creating-"
"""A store being built: the database file's name, this, the building process's id."""
LOCK_WAIT_S = 300.0
"""Seconds ``creating`` waits for another process creating the store (MLflow's migrations take
about 1.5 s of CPU: 16 s at a load of 14 on two cores, minutes at 19) before giving up with
``CreationTimeout`` (the sink then retries, with backoff)."""
LOCK_POLL_S = 0.05
"""Seconds between two tries of the lock while another process holds it."""
LEFTOVER_PREFIX = "_alembic_tmp_"
"""Tables alembic's batch mode (sqlite) copies a table into while altering it: one left behind
means a migration was interrupted."""


class CreationTimeout(RuntimeError):
    """Another process held the store's creation lock for longer than ``LOCK_WAIT_S``."""


def database_file(tracking_uri: str) -> Path | None:
    """The database file of a local ``sqlite:///`` URI (its query string left out), else None (a
    server, a database server, an in-memory database)."""
    if not tracking_uri.startswith(SQLITE_PREFIX) or ":memory:" in tracking_uri:
        return None
    path = tracking_uri.removeprefix(SQLITE_PREFIX).split("?", 1)[0]
    return Path(path).expanduser() if path else None


@contextlib.contextmanager
def creating(tracking_uri: str, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Inside the block this process alone, among those that take the same lock, opens the store
    ``tracking_uri`` names (a local sqlite database; any other store is not locked). The database's
    folder is made when missing (as MLflow makes it). ``CreationTimeout`` after ``wait_s`` seconds."""
    path = database_file(tracking_uri)
    try:
        import fcntl
    except ImportError:  # no flock (Windows): MLflow's own behaviour
        path = None
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(path.name + LOCK_SUFFIX)
    with lock.open("a") as handle:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CreationTimeout(
                        f"another process has been creating the MLflow store {path} for over {wait_s:g} s "
                        f"(it holds the lock {lock}); retrying"
                    ) from None
                time.sleep(LOCK_POLL_S)
        try:
            _create_if_new(path)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _create_if_new(path: Path) -> None:
    """Under the creation lock: when the database file ``path`` is missing or empty, MLflow's schema
    built in a temporary file beside it, synced to disk and put in its place at once (a missing
    file is linked, never overwritten; an empty one replaced). Earlier creators' temporary files,
    left by a process that ended midway, are removed first."""
    for stale in path.parent.glob(f"{path.name}{CREATING_INFIX}*"):
        stale.unlink(missing_ok=True)
    try:
        if path.stat().st_size > 0:
            return
        empty = True
    except FileNotFoundError:
        empty = False
    building = path.with_name(f"{path.name}{CREATING_INFIX}{os.getpid()}")
    try:
        initialize_schema(SQLITE_PREFIX + str(building.resolve()))
        _sync(building)
        if empty:
            os.replace(building, path)
        else:
            os.link(building, path)  # FileExistsError if another program made it meanwhile: left alone
        _sync(path.parent)
    except FileExistsError:
        pass
    finally:
        building.unlink(missing_ok=True)


def _sync(path: Path) -> None:
    """``fsync`` of a file or a folder (its entries)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def leftovers(tables: Sequence[str]) -> list[str]:
    """The tables of ``tables`` an interrupted alembic batch migration left behind, sorted."""
    return sorted(name for name in tables if name.startswith(LEFTOVER_PREFIX))


def in_progress(database: Path) -> bool:
    """Whether a process holds the creation lock of the sqlite file ``database`` now (it is creating
    or migrating the store); read-only: the lock file is neither made nor changed, the lock tried
    shared and let go at once."""
    return lock_held(database.with_name(database.name + LOCK_SUFFIX)) is True


def mid_migration(tables: Sequence[str], revision: str | None) -> str | None:
    """What shows that a store holding ``tables`` at schema ``revision`` (None: no recorded
    revision) was left mid-migration, as a phrase; None when nothing does."""
    left = leftovers(tables)
    if left:
        return f"the leftover tables {', '.join(left)} of an interrupted migration, at revision {revision}"
    if revision is None:
        return "MLflow's tables without a recorded schema revision"
    return None


def repair(shown: str, database: Path | None, tables: Sequence[str]) -> str:
    """What repairs a store left mid-migration: its leftover tables (of ``tables``) dropped, then
    ``mlflow db upgrade`` (which fails while they are there); ``shown`` is the store's URI as
    messages show it (no password), ``database`` its sqlite file (None for a database server),
    whose drop is a ``python -c`` command line."""
    upgrade = f"mlflow db upgrade {shown}"
    left = leftovers(tables)
    if not left:
        return f"back it up, then run: {upgrade}"
    drops = " ".join(f"DROP TABLE {name};" for name in left)
    if database is None:
        return f"back it up, drop the leftover tables ({drops}), then run: {upgrade}"
    code = f"import sqlite3; sqlite3.connect({json.dumps(str(database))}).executescript({json.dumps(drops)})"
    return f"back it up, then run: python -c {shlex.quote(code)} && {upgrade}"
