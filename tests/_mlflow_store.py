"""New MLflow sqlite stores of the test process, made from one migrated copy.

MLflow creates the tables of an empty SQL store and runs every one of its alembic migrations
(``mlflow.store.db.utils._initialize_tables``) the first time a client opens it: about 1.5 s of CPU
and, with an fsync per migration, several seconds on a busy disk, for each of the suite's many
stores. ``install`` replaces that step in the test process, for an sqlite database that holds no
table yet, with a page copy (sqlite's backup) of one store that MLflow's own step initialised once
per process: the same schema, revision and rows. Anything else (a database with tables of its own,
another dialect, a store opened by an ``mlflow`` command or any subprocess) goes through MLflow's
own step as before."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

_lock = threading.Lock()


def install(directory: Path) -> None:
    """From now on, a new sqlite store of this process is a copy of ``directory/template.db``,
    initialised by MLflow on first need. Nothing happens where MLflow's step is not where expected."""
    try:
        import mlflow.store.db.utils as utils
    except ImportError:
        return
    original = getattr(utils, "_initialize_tables", None)
    if original is None or getattr(original, "_from_template", False):
        return
    template = directory / "template.db"

    def initialize_tables(engine: Any) -> None:
        if engine.dialect.name != "sqlite" or not _empty(engine):
            original(engine)
            return
        with _lock:
            if not template.exists():
                directory.mkdir(parents=True, exist_ok=True)
                building = directory / "building.db"
                building.unlink(missing_ok=True)
                made = utils.create_sqlalchemy_engine_with_retry(f"sqlite:///{building}")
                original(made)
                made.dispose()
                building.rename(template)
        raw = engine.raw_connection()
        try:
            source = sqlite3.connect(template)
            try:
                source.backup(raw.driver_connection)
            finally:
                source.close()
        finally:
            raw.close()

    initialize_tables._from_template = True  # type: ignore[attr-defined]
    utils._initialize_tables = initialize_tables


def _empty(engine: Any) -> bool:
    """Whether the sqlite database of ``engine`` holds no table, index or view (a new file)."""
    raw = engine.raw_connection()
    try:
        return raw.driver_connection.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
    finally:
        raw.close()
