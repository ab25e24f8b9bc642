"""Read a W&B ``.wandb`` transaction log back with wandb's own protobuf classes.

The file is a leveldb-style log: a 7-byte header (``:W&B``, magic 0xBEE1, version), then 32 KiB
blocks of chunks, each ``<crc32c u32><length u16><type u8>`` + payload; FULL/FIRST/MIDDLE/LAST
chunks reassemble one serialised ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2 as pb

BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[pb.Record]:
    data = Path(path).read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0 and length == 0:  # zero padding at the end of a block
            pos += left - 7
            continue
        buf += data[pos : pos + length]
        pos += length
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(buf)
            buf = b""
            yield record


def history(path: Path) -> list[dict[str, Any]]:
    """Every history row, values decoded from JSON (``NaN``/``Infinity`` included)."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def of_type(path: Path, kind: str) -> list[Any]:
    return [getattr(r, kind) for r in records(path) if r.WhichOneof("record_type") == kind]
