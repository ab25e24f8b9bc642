"""Checks before anything reads: the MLflow store named exists and answers, the window holds data.

Reading never creates a store: MLflow's client makes a missing sqlite file (and its folder) and
fills it with empty tables, so a mistyped path would "work" and then find no run. Every check here
raises ``StoreError`` (a ``LookupError``) with one line saying what was tried and what to do.

Time bound: a server is probed with one TCP connection (``PROBE_TIMEOUT_S``) before any request;
the reads themselves run under ``_compat_mlflow.bounded_requests(reads=True)`` (2 retries, a
connection within ``READ_CONNECT_TIMEOUT_S``, a reply within ``read_timeout_s()``, on the reading
threads only), so a server that cannot be reached costs seconds, not MLflow's default of minutes of
retries, while a busy one is waited for.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from cliptrack.compare.align import ALIGNMENTS

if TYPE_CHECKING:
    from cliptrack.compare.frame import RunSet
    from cliptrack.compare.window import Window

DEFAULT_URI = "sqlite:///mlflow.db"
"""MLflow's own default store (relative to the working directory)."""
PROBE_TIMEOUT_S = 3.0
"""Seconds one TCP connection to a tracking server may take."""
STORE_HINT = (
    "name the store with --tracking-uri sqlite:///PATH/mlflow.db (the demo's: "
    "sqlite:///cliptrack-demo/mlflow.db) or http://HOST:PORT, or read the spool with --jsonl DIR"
)
SQLITE_MAGIC = b"SQLite format 3\x00"
_AXIS_WORDS = {"step": "steps", "tokens_seen": "tokens seen", "elapsed_s": "elapsed seconds"}


class StoreError(LookupError):
    """The named store does not exist, cannot be read, or holds nothing to compare."""


def resolve_tracking_uri(tracking_uri: str | None) -> str:
    """The MLflow URI to read, checked: it names an existing sqlite file or an answering server.

    None means ``MLFLOW_TRACKING_URI``, else MLflow's default ``sqlite:///mlflow.db``.
    """
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    origin = (
        "" if tracking_uri else " (the default store)" if uri == DEFAULT_URI else " (MLFLOW_TRACKING_URI)"
    )
    scheme = urlparse(uri).scheme
    if scheme == "sqlite":
        _check_sqlite(uri, origin)
    elif scheme in ("http", "https"):
        _check_server(uri)
    elif scheme in ("", "file") or len(scheme) == 1:  # a plain path (a Windows drive letter too)
        raise StoreError(_plain_path_message(uri))
    return uri


def _sqlite_path(uri: str) -> Path | None:
    """The file of ``sqlite:///rel`` / ``sqlite:////abs``; None for an in-memory database."""
    rest = uri[len("sqlite://") :]
    if rest in ("", "/", "/:memory:"):
        return None
    return Path(unquote(rest[1:] if rest.startswith("/") else rest).split("?", 1)[0])


def _check_sqlite(uri: str, origin: str) -> None:
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


def _check_server(uri: str) -> None:
    parsed = urlparse(uri)
    host = parsed.hostname or "localhost"
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise StoreError(
            f"no MLflow server answers at {uri} ({reason}); start one "
            f"(mlflow server --backend-store-uri sqlite:///PATH/mlflow.db --port {port}) or check the URI"
        ) from None


def _plain_path_message(uri: str) -> str:
    path = Path(unquote(urlparse(uri).path if uri.startswith("file:") else uri))
    if path.is_dir() and (path / "mlflow.db").is_file():
        return f"--tracking-uri {uri} is a folder: its database is sqlite:///{(path / 'mlflow.db').resolve()}"
    if path.is_file():
        return f"--tracking-uri {uri} is a plain path: a database file is read as sqlite:///{path.resolve()}"
    return (
        f"--tracking-uri {uri} is a plain path: MLflow's file store (mlruns/) is not read (MLflow 3 "
        f"keeps it in maintenance mode); {STORE_HINT}"
    )


def check_window(runset: RunSet, align: str, window: Window) -> None:
    """Every run has data inside ``window`` on the ``align`` axis; StoreError naming the run and its
    range otherwise (an empty window would compare nothing and report NaN)."""
    if window.start is None and window.end is None:
        return
    axis = ALIGNMENTS[align]
    frame = runset.frame
    for info in runset.runs:
        values = frame.loc[frame["run_id"] == info.run.run_id, axis]
        if values.empty or window.mask(values).any():
            continue
        raise StoreError(
            f"--window {window} holds no data of run {info.display}: its {_AXIS_WORDS[axis]} run from "
            f"{values.min():g} to {values.max():g}; choose a window inside that range"
        )
