"""The worst sequences of a step: the sequences carrying the most sampler–trainer mismatch (torch-free).

A step's gauge (:mod:`cliptrack.core.measures`) says how far off-policy its tokens are on the
whole; the worst sequences say where: per step, for each of three criteria (:data:`CRITERIA`), the
``k`` sequences ranking highest, each with its datum id, its eligible tokens, its own gauge sums
and the position of its worst token (:class:`SequenceGauge`).

The order is total and exact: by the criterion's value, largest first, ties by datum id, smallest
first; a sequence without an eligible token never ranks. So the worst ``k`` of a union of parts is
the worst ``k`` of the parts' worst ``k`` (:func:`merge_worst`), whatever the chunking, order or
rank layout: the merge of micro-batches, ranks, tinker chunks and Miles clients is exact, and
equals an offline sort of every sequence of the step. A datum seen more than once in a step (one
per optimisation pass over the batch: PPO epochs) ranks once, by its largest value under each
criterion (its :func:`_best` pass), which keeps every merge exact.

Units: ``log_ratio``, ``abs_log_ratio``, ``kl_k3`` are sums over the sequence's eligible tokens in
nats (``l = logprobs - sampling_logprobs``, as the gauge); ``max_abs_log_ratio`` is the largest
``|l|`` of one token, in nats; ``tokens`` counts eligible tokens; ``worst_token`` is the position
(0-based, in the sequence) of the token with that largest ``|l|``, the first such on a tie.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "COLUMNS",
    "CRITERIA",
    "DEFAULT_K",
    "SequenceGauge",
    "Worst",
    "merge_worst",
    "rank_key",
    "worst_of",
]

CRITERIA = ("abs_log_ratio", "kl_k3", "max_abs_log_ratio")
"""What the worst sequences are ranked by: the sequence's summed ``|l|``, its summed k3 term, and
its largest single-token ``|l|`` (each a :class:`SequenceGauge` field)."""

COLUMNS = ("datum", "tokens", "log_ratio", "abs_log_ratio", "kl_k3", "max_abs_log_ratio", "worst_token")
"""The fields of one sequence, in the order of a row (the device tensors' columns, the tables')."""

DEFAULT_K = 8
"""Sequences kept per criterion and step unless asked otherwise."""


SUM_SLACK = 1e-6
"""Relative slack of ``max |l| <= sum |l|`` and ``|sum l| <= sum |l|``: sums formed in another order
on the device round apart by a few ulps, and a value given in float32 by its 6e-8."""


def _whole(sequence: Any, name: str) -> int:
    """Field ``name`` of ``sequence`` as an ``int``: an integer, or a float with no fraction (device
    rows carry ids and counts as float64); ValueError naming the field otherwise."""
    value = _plain(getattr(sequence, name))
    if not isinstance(value, bool):
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    raise ValueError(
        f"sequence {getattr(sequence, 'datum', '?')!r}: {name} must be an integer, got {value!r}"
    )


@dataclass(frozen=True)
class SequenceGauge:
    """One sequence's gauge (module docstring: units). ``datum``: its id (an integer the caller
    gives, unique within the step: the sample's index in the global batch, a Miles datum's id)."""

    datum: int
    tokens: int
    log_ratio: float
    abs_log_ratio: float
    kl_k3: float
    max_abs_log_ratio: float
    worst_token: int

    def __post_init__(self) -> None:
        for name in ("datum", "tokens", "worst_token"):
            object.__setattr__(self, name, _whole(self, name))
        if self.tokens < 0:
            raise ValueError(f"sequence {self.datum}: tokens must be >= 0, got {self.tokens}")
        if self.worst_token < (0 if self.tokens else -1):
            raise ValueError(
                f"sequence {self.datum}: worst_token must be a position >= 0 (-1 without an eligible "
                f"token), got {self.worst_token}"
            )
        for name in ("log_ratio", "abs_log_ratio", "kl_k3", "max_abs_log_ratio"):
            value = _plain(getattr(self, name))
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"sequence {self.datum}: {name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value))
        for name in ("abs_log_ratio", "kl_k3", "max_abs_log_ratio"):
            if getattr(self, name) < 0:
                raise ValueError(f"sequence {self.datum}: {name} must be >= 0, got {getattr(self, name)!r}")
        for name, part in (
            ("max_abs_log_ratio", self.max_abs_log_ratio),
            ("|log_ratio|", abs(self.log_ratio)),
        ):
            if part > self.abs_log_ratio * (1 + SUM_SLACK) + SUM_SLACK:
                raise ValueError(
                    f"sequence {self.datum}: {name}={part!r} exceeds abs_log_ratio={self.abs_log_ratio!r}, "
                    "the sum of |l| over its tokens"
                )

    @classmethod
    def from_row(cls, row: Sequence[float]) -> SequenceGauge:
        """A sequence from a row of :data:`COLUMNS` values (counts and positions as whole floats)."""
        if len(row) != len(COLUMNS):
            raise ValueError(f"a sequence row has {len(COLUMNS)} values {COLUMNS}, got {len(row)}")
        values = dict(zip(COLUMNS, row, strict=True))
        return cls(**{c: _plain(v) for c, v in values.items()})

    def value(self, criterion: str) -> float:
        """The value this sequence is ranked by under ``criterion`` (one of :data:`CRITERIA`)."""
        if criterion not in CRITERIA:
            raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
        return float(getattr(self, criterion))


def _plain(value: Any) -> Any:
    """A numpy scalar or 0-d tensor as its Python number (``item()``); anything else as it is, for
    :func:`_whole` to judge (so 1.5 is refused, not truncated)."""
    item = getattr(value, "item", None)
    return item() if callable(item) else value


def rank_key(criterion: str) -> Any:
    """The sort key of :data:`CRITERIA` order: value descending, then datum ascending."""
    return lambda s: (-s.value(criterion), s.datum)


def _best(criterion: str) -> Any:
    """Which of a datum's several passes ranks it under ``criterion``: the largest value, ties by the
    rest of the row (largest), so the choice never depends on the order of arrival."""
    return lambda s: (s.value(criterion), *(getattr(s, c) for c in COLUMNS[1:]))


def worst_of(sequences: Iterable[SequenceGauge], k: int = DEFAULT_K) -> dict[str, tuple[SequenceGauge, ...]]:
    """The worst ``k`` sequences by each criterion (module docstring: the order), sequences without
    an eligible token left out, a datum seen more than once ranked by its best pass. ValueError for
    ``k < 1``."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    passes: dict[int, list[SequenceGauge]] = {}
    for s in sequences:
        if s.tokens > 0:
            passes.setdefault(s.datum, []).append(s)
    out = {}
    for c in CRITERIA:
        best = [max(seen, key=_best(c)) for seen in passes.values()]
        out[c] = tuple(sorted(best, key=rank_key(c))[:k])
    return out


def merge_worst(
    parts: Iterable[Mapping[str, Sequence[SequenceGauge]]], k: int = DEFAULT_K
) -> dict[str, tuple[SequenceGauge, ...]]:
    """The worst ``k`` of the union of ``parts`` (each a :func:`worst_of` result with at least
    ``k`` per criterion, or all its sequences): exact, whatever their number and order. Each
    criterion merges its own lists (a datum in several parts: its best pass)."""
    lists: dict[str, list[SequenceGauge]] = {c: [] for c in CRITERIA}
    for part in parts:
        for c in CRITERIA:
            lists[c].extend(part.get(c, ()))
    return {c: worst_of(lists[c], k)[c] for c in CRITERIA}


@dataclass(frozen=True)
class Worst:
    """One step's worst sequences: ``step``, ``k`` and, per criterion (every one of
    :data:`CRITERIA`, in that order; none listed: an empty tuple), the sequences in order."""

    step: int
    k: int
    by: dict[str, tuple[SequenceGauge, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.by) - set(CRITERIA))
        if unknown:
            raise ValueError(f"worst sequences by unknown criteria {unknown}; known: {CRITERIA}")
        object.__setattr__(self, "by", {c: tuple(self.by.get(c, ())) for c in CRITERIA})

    def records(self) -> list[dict[str, Any]]:
        """One flat record per (criterion, rank): ``step``, ``criterion``, ``rank`` (1 = worst) and
        the sequence's fields: the rows of the W&B table, the MLflow artifact and ``worst.jsonl``."""
        return [
            {"step": self.step, "criterion": c, "rank": i + 1, **asdict(s)}
            for c in CRITERIA
            for i, s in enumerate(self.by.get(c, ()))
        ]

    @classmethod
    def from_records(cls, step: int, k: int, records: Iterable[Mapping[str, Any]]) -> Worst:
        """The inverse of :meth:`records` (records of other steps are refused)."""
        by: dict[str, list[tuple[int, SequenceGauge]]] = {}
        for r in records:
            if int(r["step"]) != step:
                raise ValueError(f"a record of step {r['step']} among step {step}'s worst sequences")
            s = SequenceGauge.from_row([r[c] for c in COLUMNS])
            by.setdefault(str(r["criterion"]), []).append((int(r["rank"]), s))
        return cls(step, k, {c: tuple(s for _, s in sorted(v, key=lambda x: x[0])) for c, v in by.items()})
