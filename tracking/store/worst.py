"""A step's worst sequences on disk and in the stores: ``worst.jsonl`` in the run directory, the
W&B table and the MLflow artifact, all holding the same rows (``cliptrack.core.worst``).

- ``worst.jsonl`` (``WORST_FILE``): one line per ``Tracker.log_worst`` call, in logging order:
  ``{"step": s, "k": k, "records": [...]}``, ``records`` being ``Worst.records()`` (one per
  criterion and rank). A step logged twice is read back as its last line (a resumed run re-logs).
- W&B: a ``wandb.Table`` under ``WANDB_KEY`` at the trainer step, with ``TABLE_COLUMNS``.
- MLflow: one JSON artifact per step, ``artifact_path(step)``, in MLflow's table layout (``{"columns":
  [...], "data": [[...], ...]}``, what ``MlflowClient.log_table`` writes), ``TABLE_COLUMNS``.

A table row is a record with ``k`` added (``table_rows``), so that a table read back alone gives
the whole ``Worst`` (``from_rows``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cliptrack.core.text import printable
from cliptrack.core.worst import COLUMNS, CRITERIA, SequenceGauge, Worst, rank_key
from cliptrack.store import journal

LOG = logging.getLogger("cliptrack")

__all__ = [
    "ARTIFACT_DIR",
    "TAG",
    "TABLE_COLUMNS",
    "WANDB_KEY",
    "WORST_FILE",
    "artifact_path",
    "artifact_step",
    "checked",
    "encode",
    "from_rows",
    "latest_per_step",
    "read_worst_file",
    "table_rows",
]

WORST_FILE = "worst.jsonl"
"""The run directory's record of the worst sequences, one JSON line per logged step."""
WANDB_KEY = "worst_sequences"
"""The W&B history key of a step's table (a ``wandb.Table``)."""
ARTIFACT_DIR = "worst_sequences"
"""The MLflow artifact directory holding one JSON table per step."""
TAG = "cliptrack.worst_sequences"
"""The MLflow run tag (``"1"``) set once a table reached the run's artifacts: a reader lists the
artifacts only then (artifact requests of a proxied store go through MLflow's artifact proxy, which
drops a tracking URI's query, so a run without tables costs no such request)."""
MAX_LINE_BYTES = journal.MAX_LINE_BYTES
"""Longest ``worst.jsonl`` line (bytes, newline included) a reader takes, the journal's limit (16 MiB:
about 60,000 sequences a table); ``log_worst`` refuses a longer table (``checked``), a reader skips a
longer line with a note, never holding it whole."""
TABLE_COLUMNS = ("step", "criterion", "rank", "k", *COLUMNS)
"""The columns of a step's table (W&B, MLflow): a record of ``Worst.records()`` and ``k``."""

_INTEGER_FIELDS = frozenset({"datum", "tokens", "worst_token"})
_ARTIFACT_NAME = re.compile(r"step_(\d+)\.json$")


def artifact_path(step: int) -> str:
    """The MLflow artifact of ``step``'s table: ``worst_sequences/step_000012.json`` (six digits at
    least; ``artifact_step`` reads any width back)."""
    return f"{ARTIFACT_DIR}/step_{step:06d}.json"


def artifact_step(path: str) -> int | None:
    """The step of an ``artifact_path`` (None for any other file)."""
    found = _ARTIFACT_NAME.search(path)
    return int(found.group(1)) if found and path.startswith(ARTIFACT_DIR + "/") else None


def checked(step: int, worst: object) -> Worst:
    """``worst`` with plain ``int`` / ``float`` fields (numpy scalars, 0-d tensors converted), as
    ``Tracker.log_worst`` accepts it: a ``Worst`` of ``step`` (``step`` already a valid step), at most
    ``k`` sequences per criterion. TypeError for anything but a ``Worst``, ValueError naming the step
    otherwise."""
    if not isinstance(worst, Worst):
        raise TypeError(
            f"step {step}: log_worst takes a cliptrack.core.worst.Worst, got {type(worst).__name__}"
        )
    if isinstance(worst.step, bool) or not isinstance(worst.step, int) or worst.step != step:
        raise ValueError(f"step {step}: the Worst given is of step {worst.step!r}")
    k = worst.k
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"step {step}: the Worst's k must be an integer >= 1, got {k!r}")
    by: dict[str, tuple[SequenceGauge, ...]] = {}
    for criterion in CRITERIA:
        listed = worst.by.get(criterion, ())
        if len(listed) > k:
            raise ValueError(f"step {step}: {len(listed)} sequences by {criterion}, more than k={k}")
        try:
            by[criterion] = tuple(SequenceGauge.from_row([getattr(s, c) for c in COLUMNS]) for s in listed)
        except (TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"step {step}: a worst sequence by {criterion}: {exc}") from None
        _check_ranked(step, criterion, by[criterion])
    table = Worst(step, k, by)
    size = len(encode(table))
    if size > MAX_LINE_BYTES:
        raise ValueError(
            f"step {step}: the table takes {size} bytes in worst.jsonl, more than the readers' "
            f"{MAX_LINE_BYTES}-byte limit of a line; log fewer sequences (a smaller k)"
        )
    return table


def _check_ranked(step: int, criterion: str, listed: tuple[SequenceGauge, ...]) -> None:
    """``listed`` as a ranking stores it: sequences with an eligible token, each datum once, in the
    order of ``cliptrack.core.worst`` (value descending, datum ascending); ValueError naming the rank."""
    seen: set[int] = set()
    for rank, s in enumerate(listed, start=1):
        where = f"step {step}: the worst sequences by {criterion}, rank {rank} (datum {s.datum})"
        if s.tokens == 0:
            raise ValueError(f"{where} has no eligible token: such a sequence never ranks")
        if s.datum in seen:
            raise ValueError(f"{where}: the datum is listed twice (a datum ranks once, by its best pass)")
        seen.add(s.datum)
        if rank > 1 and rank_key(criterion)(s) < rank_key(criterion)(listed[rank - 2]):
            raise ValueError(
                f"{where} ranks above rank {rank - 1} (datum {listed[rank - 2].datum}): "
                f"{criterion} {s.value(criterion)!r} vs {listed[rank - 2].value(criterion)!r}; "
                "the order is the value, largest first, then the datum id, smallest first"
            )


def encode(worst: Worst) -> bytes:
    """The ``worst.jsonl`` line of ``worst`` (a ``checked`` one), newline included."""
    line = {"step": worst.step, "k": worst.k, "records": worst.records()}
    return (json.dumps(line, allow_nan=False, separators=(",", ":")) + "\n").encode("utf-8")


def table_rows(worst: Worst) -> list[list[Any]]:
    """The rows of ``worst``'s table, in ``TABLE_COLUMNS`` order."""
    return [[{**r, "k": worst.k}[c] for c in TABLE_COLUMNS] for r in worst.records()]


def from_rows(columns: Sequence[str], rows: Iterable[Sequence[Any]], step: int | None = None) -> Worst:
    """The ``Worst`` of one step's table read back (``columns`` naming at least ``TABLE_COLUMNS``;
    ``step`` when the rows are of a step with no sequence). ValueError naming what is missing."""
    missing = [c for c in TABLE_COLUMNS if c not in columns]
    if missing:
        raise ValueError(f"a worst-sequences table without the columns {missing}")
    records = [dict(zip(columns, row, strict=True)) for row in rows]
    if not records:
        if step is None:
            raise ValueError("an empty worst-sequences table names no step")
        return Worst(step, 1, {})
    first = records[0]
    return Worst.from_records(int(first["step"]), int(first["k"]), records)


def _parse(line: bytes) -> Worst:
    try:
        obj = json.loads(line)
    except RecursionError:
        raise ValueError("nested too deeply to parse") from None
    if not isinstance(obj, Mapping):
        raise ValueError("not a JSON object")
    return Worst.from_records(int(obj["step"]), int(obj["k"]), obj["records"])


def read_worst_file(path: str | Path) -> list[Worst]:
    """Every table of a ``worst.jsonl`` (a run directory or the file), in logging order; ``[]`` when
    there is none. A damaged line (torn by a crash, not JSON, nested too deeply, not a table, longer
    than ``MAX_LINE_BYTES``) is skipped with a warning naming the file and line. Lines are read one
    at a time, an oversized one in bounded chunks (``journal.lines``): memory stays within
    ``MAX_LINE_BYTES`` and the tables, whatever the file holds."""
    path = Path(path)
    if path.is_dir():
        path = path / WORST_FILE
    if not path.exists():
        return []
    out = []
    start = 0
    for number, line, end in journal.lines(path):
        size, start = end - start, end
        if journal.oversized(line, end - size, end):
            why: str | None = f"a line of {size} bytes, longer than the {MAX_LINE_BYTES}-byte limit"
        elif not line.strip():
            continue
        else:
            why = None
            try:
                out.append(_parse(line))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                why = str(exc)
        if why is not None:
            LOG.warning(
                "%s line %d is not a worst-sequences table (skipped): %s",
                printable(path),
                number,
                printable(why),
            )
    return out


def latest_per_step(tables: Iterable[Worst]) -> list[Worst]:
    """One table per step, the last given for it, by step."""
    by_step: dict[int, Worst] = {}
    for worst in tables:
        by_step[worst.step] = worst
    return [by_step[s] for s in sorted(by_step)]
