"""The tests' view of a W&B ``.wandb`` transaction log, read through the vendor seam's one reader
(``cliptrack.backends.wandb._compat.records``): every history row, or every record of one type."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cliptrack.backends.wandb._compat import history_rows, records


def history(path: Path) -> list[dict[str, Any]]:
    """Every history row, values decoded from JSON (``NaN``/``Infinity`` included)."""
    return list(history_rows(path))


def of_type(path: Path, kind: str) -> list[Any]:
    """The ``kind`` payload (e.g. ``"run"``, ``"config"``) of every record of that type, in order."""
    return [getattr(r, kind) for r in records(path, strict=True) if r.WhichOneof("record_type") == kind]
