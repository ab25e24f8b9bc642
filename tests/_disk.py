"""Filling a (small, test-only) file system to its last byte, for the full-disk faults."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def fill(where: Path) -> Path:
    """Fill the file system of ``where`` to the last byte; delete the returned file to free it."""
    filler = where / f"filler-{uuid.uuid4().hex}"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (65536, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler
