"""The spool: each run's directory on disk, its journal of points and how far each sink has got.

Layout (``root`` is the tracker's ``spool_dir``, or the directory named by a ``jsonl`` backend)::

    <root>/<run_id>/run.json           run metadata (``RunInfo.to_meta``) + sinks.<name> replay state,
                                       redacted (``cliptrack.core.secrets``: no password or token)
    <root>/<run_id>/points.jsonl       the journal: every point, append-only, in logging order
    <root>/<run_id>/acked-<sink>.json  {"points": n, "offset": bytes, "fingerprint": hash}: the
                                       journal up to byte ``offset`` (its first n lines) is
                                       acknowledged by <sink>
    <root>/<run_id>/params-<sink>.json the params and tags <sink> has taken or refused
                                       (``cliptrack.store.params``: name -> digest of the value)
    <root>/<run_id>/<sink>.lock        flock held while a process writes <sink> for this run

The journal (``cliptrack.store.journal``, its only reader and writer) is the only copy of a point that is
not yet in a backend: what a sink has not acknowledged is the tail of points.jsonl past its
``acked`` offset. Acknowledgements are byte offsets into the journal, so they stay true across
processes (a resumed run appends to the same file).

Integrity is checked, not assumed: an acknowledgement records the fingerprint of the journal
bytes before its offset, and run.json records where the journal ended when the run was closed
(``journal``). An acknowledgement past the journal's end, one whose bytes changed (a shortened,
replaced or rewritten journal) or whose line count disagrees is reported (a ``JournalMismatch``
warning and a log line) and not trusted: the sink starts over from what it really holds (its
read-back) or from the journal's start.

Locks belong to the process that took them: ``flock`` is shared by a forked child (one open file
description), so a child never unlocks (``LOCK_UN`` would release the parent's lock); its copy of
the descriptor is only closed.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from cliptrack.core import keys
from cliptrack.core.secrets import redact_value
from cliptrack.core.text import printable
from cliptrack.store import journal
from cliptrack.store.files import lock_held, open_regular
from cliptrack.store.journal import DamagedLine as DamagedLine
from cliptrack.store.journal import Journal as Journal  # the append side, for the tracker
from cliptrack.store.journal import Position
from cliptrack.store.journal import encode_points as encode_points
from cliptrack.store.journal import parse_line as parse_line
from cliptrack.store.records import Point, RunInfo, check_run_id

try:  # POSIX advisory locks; where absent, replay cannot tell a live run and trusts the caller
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

LOG = logging.getLogger("cliptrack")
LOCK_RETRY_S = 0.05
"""Seconds ``lock_sink`` waits before its one more try: a reader that probes the lock
(``RunDir.writer_alive``) holds it shared for microseconds."""

Ack = Position
"""How far a sink has got: ``points`` lines, ending ``offset`` bytes into points.jsonl (a journal
``Position``; its ``fingerprint`` is filled in when it is saved)."""


class JournalMismatch(DamagedLine):
    """A recorded position (an acknowledgement, run.json's journal end) that the journal on disk
    does not match: it was shortened, replaced or rewritten. Reported; the position is not trusted."""


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` via a temporary file and an atomic rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(obj, fh, indent=1, sort_keys=True, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


class RunDir:
    """One run's directory under ``root``; safe to share between the threads of one process."""

    def __init__(self, root: str | os.PathLike[str], run_id: str) -> None:
        self.root = Path(root)
        self.run_id = check_run_id(run_id)
        self.path = self.root / run_id
        self.meta_path = self.path / keys.RUN_META_FILE
        self.points_path = self.path / keys.POINTS_FILE
        self._lock = threading.RLock()  # reentrant: a signal handler may update run.json mid-update
        self._locks: dict[str, tuple[BinaryIO, int]] = {}  # sink -> (lock file, owner pid)
        self._reported: set[int] = set()

    # ---- run.json ------------------------------------------------------------------------------
    def read_meta(self) -> dict[str, Any]:
        """The run's metadata; ``{}`` if run.json does not exist yet. ``DamagedRunFile`` naming the
        file when it is not a JSON object (empty, torn, ``null``, ``[1,2]``, nested too deeply)."""
        try:
            with open_regular(self.meta_path) as fh:
                meta = json.load(fh)
        except FileNotFoundError:
            return {}
        except (ValueError, RecursionError) as exc:  # not JSON (a UnicodeDecodeError is a ValueError)
            raise DamagedRunFile(f"{printable(self.meta_path)} is damaged: {printable(exc)}") from None
        if not isinstance(meta, dict):
            kind = _JSON_KINDS.get(type(meta), type(meta).__name__)
            raise DamagedRunFile(
                f"{printable(self.meta_path)} is damaged: it holds {kind}, not a JSON object"
            )
        return meta

    def read_run(self) -> RunInfo:
        """The run run.json describes (the directory name fills in a missing id); ``DamagedRunFile``
        naming the file when it is not a run's metadata (a field of the wrong type too)."""
        meta = self.read_meta()
        try:
            return RunInfo.from_meta(meta, self.run_id)
        except (TypeError, ValueError) as exc:
            raise DamagedRunFile(f"{printable(self.meta_path)} is damaged: {printable(exc)}") from None

    def update_meta(self, **fields: Any) -> dict[str, Any]:
        """Merge ``fields`` into run.json (``sinks`` is merged per sink) and return the result."""
        with self._lock:
            meta = self.read_meta()
            sinks = fields.pop("sinks", None)
            meta.update(fields)
            if sinks:
                merged = dict(meta.get("sinks") or {})
                for name, state in sinks.items():
                    merged[name] = {**(merged.get(name) or {}), **state}
                meta["sinks"] = merged
            self.path.mkdir(parents=True, exist_ok=True)
            meta = redact_value(meta)  # never a credential on disk (cliptrack.core.secrets)
            write_json_atomic(self.meta_path, meta)
            return meta

    def sink_states(self) -> dict[str, dict[str, Any]]:
        """run.json's per-sink replay states (``{}`` when none)."""
        return sink_states(self.read_meta())

    # ---- acknowledgements ----------------------------------------------------------------------
    def ack_path(self, sink: str) -> Path:
        return self.path / f"acked-{sink}.json"

    def read_ack(self, sink: str) -> Ack:
        """How far ``sink`` got, checked against the journal on disk: an acknowledgement the
        journal does not match (see the module docstring) is reported and replaced by ``Ack()``
        (the sink starts over from what it really holds)."""
        try:
            with open_regular(self.ack_path(sink)) as fh:
                obj = json.load(fh)
            ack = Ack(int(obj["points"]), int(obj["offset"]), str(obj.get("fingerprint") or ""))
        except FileNotFoundError:
            return Ack()
        except (ValueError, KeyError, TypeError):
            warnings.warn(
                f"{self.ack_path(sink)} is damaged; {sink} starts over from the journal's start",
                DamagedLine,
                stacklevel=2,
            )
            return Ack()
        problem = journal.mismatch(self.points_path, ack)
        if problem is None:
            return ack
        self.report_mismatch(f"{sink}'s acknowledgement ({self.ack_path(sink).name})", problem)
        return Ack()

    def write_ack(self, sink: str, ack: Ack) -> None:
        fingerprint = ack.fingerprint or journal.fingerprint(self.points_path, ack.offset)
        write_json_atomic(
            self.ack_path(sink), {"points": ack.points, "offset": ack.offset, "fingerprint": fingerprint}
        )

    # ---- params and tags taken (cliptrack.store.params) -------------------------------------------
    def params_path(self, sink: str) -> Path:
        return self.path / f"params-{sink}.json"

    def read_params_ack(self, sink: str) -> dict[str, Any]:
        """What ``params-<sink>.json`` records (``{}`` when absent; a damaged file is warned about
        and read as ``{}``: every param and tag is then checked against the backend again)."""
        try:
            with open(self.params_path(sink), encoding="utf-8") as fh:
                obj = json.load(fh)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            return obj
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            warnings.warn(
                f"{self.params_path(sink)} is damaged ({exc}); {sink}'s params and tags are sent again",
                DamagedLine,
                stacklevel=2,
            )
            return {}

    def write_params_ack(self, sink: str, record: dict[str, Any]) -> None:
        write_json_atomic(self.params_path(sink), record)

    def report_mismatch(self, what: str, problem: str) -> None:
        """Report (log line and ``JournalMismatch`` warning) a recorded position the journal does
        not match."""
        text = f"run {self.run_id}: {what} does not match {self.points_path}: {problem}; not trusted"
        LOG.warning("%s", text)
        warnings.warn(text, JournalMismatch, stacklevel=3)

    def check_journal(self) -> str | None:
        """Why the journal end run.json recorded at the last close (``journal``) or its run id do not
        match the run directory on disk (reported); None when they do."""
        meta = self.read_meta()
        problem = None
        if meta.get("run_id") not in (None, self.run_id):
            problem = f"run.json names run {meta.get('run_id')!r}, its directory is {self.run_id!r}"
        recorded = meta.get("journal")
        if problem is None and isinstance(recorded, dict):
            try:
                position = Ack(
                    int(recorded["points"]), int(recorded["offset"]), str(recorded.get("fingerprint", ""))
                )
            except (KeyError, TypeError, ValueError):
                problem = f"run.json's journal record {recorded!r} is damaged"
            else:
                problem = journal.mismatch(self.points_path, position)
        if problem is not None:
            self.report_mismatch("run.json", problem)
        return problem

    def journal_size(self) -> int:
        """Bytes in points.jsonl (0 when absent)."""
        try:
            return self.points_path.stat().st_size
        except FileNotFoundError:
            return 0

    def journal_end(self) -> Ack:
        """Complete lines of points.jsonl and the byte offset just past the last one (a torn
        tail left by a crash is not part of the journal)."""
        return journal.end(self.points_path)

    # ---- reading points back (cliptrack.store.journal) ------------------------------------------------
    def read_points(self, offset: int = 0, end: int | None = None) -> Iterator[tuple[Point, int]]:
        """Yield ``(point, end_offset)`` for each complete line from byte ``offset`` up to ``end``.

        Stops at a line without its newline (being written, or torn by a crash); a damaged
        complete line is skipped with one ``DamagedLine`` warning naming its byte offset.
        """
        return journal.read_points(self.points_path, offset, end, self.report_damaged)

    def read_lines(self, offset: int, end: int, limit: int) -> bytes:
        """The journal's bytes from ``offset`` up to ``end``: at most ``limit`` whole lines."""
        return journal.read_lines(self.points_path, offset, end, limit)

    def report_damaged(self, start: int, exc: BaseException) -> None:
        """Warn once (``DamagedLine``) about the damaged line at byte ``start``, naming its line
        number (counted then: damaged lines are rare) and what is wrong."""
        if start in self._reported:
            return
        self._reported.add(start)
        line = self.count_points(0, start) + 1
        warnings.warn(
            f"{printable(self.points_path)}:{line} (byte {start}): damaged line skipped ({printable(exc)})",
            DamagedLine,
            stacklevel=3,
        )

    def count_points(self, offset: int = 0, end: int | None = None) -> int:
        """Complete lines of points.jsonl between byte ``offset`` and ``end`` (fast: no parsing)."""
        return journal.count_points(self.points_path, offset, end)

    def load_points(self, *, strict: bool = False) -> list[Point]:
        """Every point of points.jsonl, each line checked (``cliptrack.store.journal.load_points``)."""
        return journal.load_points(self.points_path, strict=strict)

    # ---- live-writer locks ---------------------------------------------------------------------
    def lock_sink(self, sink: str) -> bool:
        """Take the per-sink write lock for this process; False if another process holds it."""
        if fcntl is None:
            return True
        self.path.mkdir(parents=True, exist_ok=True)
        fh = open(self.path / f"{sink}.lock", "wb")
        for attempt in range(2):  # a reader's probe (``writer_alive``) holds it for microseconds
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if attempt:
                    fh.close()
                    return False
                time.sleep(LOCK_RETRY_S)
        self._locks[sink] = (fh, os.getpid())
        return True

    def writer_alive(self, sink: str = "jsonl") -> bool | None:
        """Whether a live process holds ``sink``'s write lock (``jsonl``: the tracker logging the
        run); read-only (the lock file is neither made nor changed, the lock tried shared and let go
        at once). False without a lock file; None where advisory locks are not there."""
        if fcntl is None:
            return None
        if sink in self._locks:
            return True
        return lock_held(self.path / f"{sink}.lock")

    def unlock_sink(self, sink: str) -> None:
        """Release the lock this process took; in a forked child only close the child's copy of
        the descriptor (the lock is the parent's: ``LOCK_UN`` would release it for the parent)."""
        held = self._locks.pop(sink, None)
        if held is None:
            return
        fh, pid = held
        if fcntl is not None and pid == os.getpid():
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        fh.close()


class DuplicateRunId(ValueError):
    """Two run directories claim one run id (a copied folder): neither is read as that run."""


_JSON_KINDS = {
    type(None): "null",
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
}


class DamagedRunFile(ValueError):
    """A run.json that is not a run's metadata (empty, torn, not a JSON object, a field of the wrong
    type); the message names the file."""


class DamagedRun(UserWarning):
    """A run directory skipped by a reader of the spool: its run.json is damaged (``DamagedRunFile``)."""

    label = "note"
    """How the command line prefixes it (``cliptrack: note: ...``)."""


def check_unique_ids(runs: Iterable[RunDir]) -> list[RunDir]:
    """``runs`` when each run id (the one its run.json names, else its directory's) is claimed by
    one directory; ``DuplicateRunId`` naming the id and both directories otherwise (a copied run
    directory would be read, or replayed, as the run it copies)."""
    unique: dict[Path, RunDir] = {}
    for run in runs:  # a directory named twice (a root given twice) is one directory
        unique.setdefault(run.path.resolve(), run)
    claimed: dict[str, RunDir] = {}
    for run in unique.values():
        run_id = str(run.read_meta().get("run_id") or run.run_id)
        first = claimed.setdefault(run_id, run)
        if first is not run:
            raise DuplicateRunId(
                f"run id {printable(run_id)!r} is claimed by two run directories, {printable(first.path)} "
                f"and {printable(run.path)} (run.json names it in each): refused; remove or rename the "
                "copy (and fix the run_id in its run.json)"
            )
    return list(unique.values())


def spool_runs(root: str | os.PathLike[str]) -> list[RunDir]:
    """The run directories directly under the spool directory ``root`` (those holding a run.json),
    sorted by name (the run id); ``[]`` when ``root`` is not a directory. A run whose run.json is
    damaged is left out with a ``DamagedRun`` note naming the file: one damaged run never hides the
    others. ``DuplicateRunId`` when two of them claim one run id (``check_unique_ids``)."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = []
    for p in base.iterdir():
        meta = p / keys.RUN_META_FILE
        if not meta.is_file() and meta.exists():
            open_regular(meta).close()  # a FIFO or a device as run.json: SpecialFileError naming it
        if meta.is_file():
            try:
                found.append(RunDir(base, p.name))
            except ValueError:
                continue  # not a name the tracker writes
    return check_unique_ids(sorted(_readable(found), key=lambda r: r.run_id))


def _readable(runs: Iterable[RunDir]) -> list[RunDir]:
    """``runs`` whose run.json describes a run; each other one named in a ``DamagedRun`` note."""
    out = []
    for run in runs:
        try:
            run.read_run()
        except DamagedRunFile as exc:
            warnings.warn(f"{exc}; the run is skipped", DamagedRun, stacklevel=3)
            continue
        out.append(run)
    return out


def run_dirs(root: str | os.PathLike[str]) -> list[RunDir]:
    """Every run directory under ``root`` (those holding a run.json; ``root`` itself if it is one),
    oldest first."""
    base = Path(root)
    if (base / keys.RUN_META_FILE).is_file():  # root is itself a run directory
        return [RunDir(base.parent, base.name)]

    def started(run: RunDir) -> float:
        try:
            return float(run.read_meta().get("started") or 0)
        except (ValueError, TypeError):
            return 0.0

    return sorted(spool_runs(base), key=lambda r: (started(r), r.run_id))


def pending(run: RunDir, sink: str) -> tuple[int, int]:
    """``(points, bytes)`` of points.jsonl that ``sink`` has not acknowledged."""
    ack = run.read_ack(sink)
    return run.count_points(ack.offset), max(0, run.journal_size() - ack.offset)


def sink_states(meta: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``run.json``'s per-sink replay states (``{}`` when none)."""
    return {name: dict(state) for name, state in (meta.get("sinks") or {}).items()}
