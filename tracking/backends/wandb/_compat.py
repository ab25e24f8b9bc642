"""Everything cliptrack takes from W&B beyond ``wandb.init`` / ``run.log``, in one place.

- where a run's files are: ``<dir>/wandb/{offline-run,run}-<YYYYmmdd_HHMMSS>-<id>/run-<id>.wandb``,
  ``<dir>`` being ``dir=``, else ``WANDB_DIR``, else the working directory (wandb's own rule);
- the ``.wandb`` transaction log, read back: a 7-byte header (``:W&B``, magic 0xBEE1, version 0)
  then leveldb-log framing (32 KiB blocks of ``<crc32 u32><length u16><type u8>`` chunks; FULL /
  FIRST / MIDDLE / LAST chunks reassemble one serialised ``wandb_internal_pb2.Record``).
  This is what W&B really holds of a run, whatever ``run.log`` accepted before a crash;
- which wandb-core a run goes to: ``wandb.init`` attaches to the service named by ``WANDB_SERVICE``
  (``<version>-<pid of the process that started it>-unix-<socket>`` or ``...-tcp-localhost-<port>``),
  which a process inherits from a parent that used W&B, or from ``wandb beta core start``. Such a
  service outlives a killed training process and keeps its run open ("run ID ... is in use" when
  replay resumes it; its ``.wandb`` file not final). ``own_service`` makes a run start a service of
  its own, a child that writes what it holds and exits when its process dies.
"""

from __future__ import annotations

import json
import math
import os
import struct
import time
import warnings
import zlib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from cliptrack.core.versions import check_version

MINIMUM = (0, 19)
"""Oldest W&B release the seam was verified on (verified: 0.31.0)."""
SUPPORTED_BELOW = (1, 0)
"""First W&B release not verified (exclusive bound); others are refused by ``check_supported``."""
USES = (
    "the .wandb transaction log format (leveldb-log framing of wandb.proto.wandb_internal_pb2.Record) and "
    "the run directory layout wandb/{offline-run,run}-<time>-<id>/run-<id>.wandb, and the "
    "WANDB_SERVICE token <version>-<pid>-..."
)
SERVICE_ENV = "WANDB_SERVICE"
"""The environment variable naming the wandb-core service ``wandb.init`` attaches to."""

FILE_HEADER = struct.Struct("<4sHB")
CHUNK_HEADER = struct.Struct("<IHB")
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def installed_version() -> str:
    """The installed W&B's version string."""
    return metadata.version("wandb")


def check_supported() -> None:
    """Raise ``UnsupportedVersionError`` unless the installed W&B is in the verified range."""
    check_version(
        "wandb",
        installed_version(),
        MINIMUM,
        SUPPORTED_BELOW,
        USES,
        seam="tracking/backends/wandb/_compat.py",
    )


def own_service() -> None:
    """Make this process's next ``wandb.init`` start a wandb-core of its own: drop an inherited
    ``WANDB_SERVICE`` (one started by another process). A service this process started itself is
    kept (wandb puts its own token there), so that runs of one process share it."""
    token = os.environ.get(SERVICE_ENV)
    if token and token.split("-", 2)[1:2] != [str(os.getpid())]:
        del os.environ[SERVICE_ENV]


def resolve_dir(dir: str | os.PathLike[str] | None) -> str:
    """The absolute directory W&B puts ``wandb/`` under: ``dir``, else ``WANDB_DIR``, else the
    working directory (recorded so that replay, run from elsewhere, finds the same files)."""
    chosen = os.fspath(dir) if dir is not None else os.environ.get("WANDB_DIR") or os.getcwd()
    return os.path.abspath(os.path.expanduser(chosen))


def run_files(dir: str | os.PathLike[str], run_id: str) -> list[Path]:
    """Every ``.wandb`` transaction log of run ``run_id`` under ``dir`` (one per process that
    logged it: the first one and each resume), oldest first."""
    base = Path(dir) / "wandb"
    if not base.is_dir():
        return []
    found = [
        p / f"run-{run_id}.wandb"
        for p in base.iterdir()
        if p.name.endswith(f"-{run_id}") and p.name.startswith(("run-", "offline-run-"))
    ]
    return sorted(
        (p for p in found if p.is_file()),
        key=lambda p: p.parent.name[: -(len(run_id) + 1)].rsplit("-", 1)[-1],
    )


def leave_the_second_of(dir: str | os.PathLike[str], run_id: str) -> None:
    """Before resuming run ``run_id``: W&B names a run's directory by the second it starts in, so a
    resume started in the same second as an earlier process of the run (a replay right after a
    crash) would share its directory and overwrite its ``.wandb`` file. Wait for the next second
    then (at most 1 s; nothing when no earlier directory is from this second)."""
    now = time.time()
    stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(now))
    if any(
        path.parent.name.startswith((f"run-{stamp}-", f"offline-run-{stamp}-"))
        for path in run_files(dir, run_id)
    ):
        time.sleep(math.ceil(now) - now + 0.01)


def records(path: str | os.PathLike[str], *, strict: bool = False) -> Iterator[Any]:
    """Each ``wandb_internal_pb2.Record`` of a ``.wandb`` file, in order.

    The one reader of the transaction log (the sink's replay, the comparison's loader and the
    tests all read through it). A file shorter than its header, or a record cut short at the end
    (a process killed mid-write), ends the file quietly. A damaged chunk before the end (checksum
    mismatch, unknown chunk type) raises ValueError naming the file and byte offset when
    ``strict``; else it is warned about and reading stops there (what follows cannot be trusted).
    A file that is not a W&B log at all raises ValueError.
    """
    check_supported()
    from wandb.proto import wandb_internal_pb2

    pending = b""
    for kind, payload in _chunks(Path(path), strict):
        if kind in (FIRST, MIDDLE):
            pending = payload if kind == FIRST else pending + payload
            continue
        record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
        record.ParseFromString(payload if kind == FULL else pending + payload)
        pending = b""
        yield record


def _chunks(path: Path, strict: bool) -> Iterator[tuple[int, bytes]]:
    """``(chunk type, payload)`` of each intact chunk of a ``.wandb`` file, in order (see ``records``)."""
    data = path.read_bytes()
    if len(data) < FILE_HEADER.size:
        return
    ident, _magic, _version = FILE_HEADER.unpack_from(data, 0)
    if ident != b":W&B":
        raise ValueError(f"{path}: not a W&B transaction log (header {data[:7]!r})")
    pos = FILE_HEADER.size
    while pos + CHUNK_HEADER.size <= len(data):
        room = BLOCK - pos % BLOCK
        if room < CHUNK_HEADER.size:  # a block's tail too short for a chunk header is padding
            pos += room
            continue
        crc, length, kind = CHUNK_HEADER.unpack_from(data, pos)
        start = pos + CHUNK_HEADER.size
        payload = data[start : start + length]
        if kind == 0 and length == 0:  # zero padding
            pos = start
            continue
        if len(payload) < length:
            return  # cut short by a crash
        problem = _damage(crc, kind, payload)
        if problem:
            if strict:
                raise ValueError(f"{path}: {problem} in record at byte {pos}; the file is damaged")
            warnings.warn(f"{path}: {problem} in record at byte {pos}; reading stops there", stacklevel=3)
            return
        pos = start + length
        yield kind, payload


def _damage(crc: int, kind: int, payload: bytes) -> str:
    """What is wrong with a chunk ("" when nothing): its checksum or its type."""
    if zlib.crc32(payload, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
        return "checksum mismatch"
    if kind not in (FULL, FIRST, MIDDLE, LAST):
        return f"unknown chunk type {kind}"
    return ""


NESTED_KEY_SEPARATOR = "."
"""How a nested key (``item.nested_key``) is spelled flat: W&B's own spelling ("." means nesting
in a metric name; its readers nest ``nested_key`` parts as dicts, which flattened is ``a.b``)."""


def item_key(item: Any) -> str:
    """The flat key of one history or config item of a record (the one decoder of W&B item keys)."""
    return item.key if item.key else NESTED_KEY_SEPARATOR.join(item.nested_key)


def items(entries: Any) -> dict[str, Any]:
    """The ``{flat key: value}`` of a record's items (history row items, config updates), values
    decoded from JSON (``NaN`` and ``Infinity`` included)."""
    return {item_key(item): json.loads(item.value_json) for item in entries}


def history_rows(path: str | os.PathLike[str], *, strict: bool = False) -> Iterator[dict[str, Any]]:
    """Each history row of a ``.wandb`` file (see ``items``)."""
    for record in records(path, strict=strict):
        if record.WhichOneof("record_type") == "history":
            yield items(record.history.item)
