"""The worst sequences of the compared runs, as a diagnostic beside the verdicts (never part of one).

Each run's tables (``Tracker.log_worst``: per step, the ``k`` sequences with the largest summed
``|l|``, summed k3 and largest single-token ``|l|``; ``cliptrack.core.worst``) are read back by
``cliptrack.backends.load.load_worst``. ``worst_sequences`` finds the sequences that **recur** as
worst: per run and criterion, each datum id listed among a step's worst in ``min_steps`` steps or
more, with the number of those steps and their share of the run's tables. A datum that keeps
coming back is a prompt or sample the sampler and the trainer disagree on again and again (a
tokenizer edge, a long generation, a template), not the noise of one step.

Datum ids are the caller's (``SequenceGauge.datum``): they compare across steps only when they
name the same prompt or sample at every step (a dataset index, a prompt hash), not a position in
the step's batch. The note says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cliptrack.core.worst import CRITERIA, SequenceGauge, Worst
from cliptrack.store import worst as worst_store

__all__ = ["CRITERION_WORDS", "MIN_STEPS", "Recurring", "WorstSequences", "worst_sequences"]

MIN_STEPS = 2
"""Steps a datum must be among the worst in to be listed as recurring."""
SHOWN = 3
"""Recurring sequences named per run in the text note."""
CRITERION_WORDS = {
    "abs_log_ratio": "summed |log ratio|",
    "kl_k3": "summed k3",
    "max_abs_log_ratio": "largest token |log ratio|",
}
"""Each criterion in words."""
IDS_CAVEAT = (
    "datum ids compare across steps only when they name the same prompt or sample at every step, "
    "not a position in the step's batch"
)


@dataclass(frozen=True)
class Recurring:
    """A datum among ``run``'s worst ``k`` by ``criterion`` in ``steps`` of its ``tables`` steps
    (``share`` = steps / tables), first at ``first_step``, last at ``last_step``; ``largest``: its
    largest value under the criterion over those steps (nats), ``rank``: its best rank (1 = worst)."""

    run: str
    criterion: str
    datum: int
    steps: int
    tables: int
    first_step: int
    last_step: int
    largest: float
    rank: int

    @property
    def share(self) -> float:
        return self.steps / self.tables if self.tables else 0.0


@dataclass(frozen=True)
class WorstSequences:
    """The runs' worst-sequence tables (run label -> one ``Worst`` per step, by step; runs without
    tables left out) and the sequences that recur (most steps first, then datum id)."""

    tables: dict[str, tuple[Worst, ...]]
    recurring: tuple[Recurring, ...] = ()
    min_steps: int = MIN_STEPS
    k: dict[str, int] = field(default_factory=dict)
    """Per run, the largest ``k`` of its tables."""

    def recurring_in(self, run: str, criterion: str | None = None) -> list[Recurring]:
        return [r for r in self.recurring if r.run == run and (criterion is None or r.criterion == criterion)]

    def last(self, run: str) -> Worst | None:
        """The run's table of its last step (None when it has none)."""
        tables = self.tables.get(run, ())
        return tables[-1] if tables else None

    def note_lines(self) -> list[str]:
        """What the text report says: per run, the datums that recur most by summed ``|l|``."""
        lines = []
        for run, tables in self.tables.items():
            top = self.recurring_in(run, CRITERIA[0])[:SHOWN]
            k = self.k.get(run, 0)
            if not top:
                lines.append(
                    f"worst sequences of {run}: no datum is among the {k} worst by "
                    f"{CRITERION_WORDS[CRITERIA[0]]} in {self.min_steps}+ of its {len(tables)} steps"
                )
                continue
            named = ", ".join(f"datum {r.datum} in {r.steps} ({r.share:.0%})" for r in top)
            lines.append(
                f"worst sequences of {run}: recurring among the {k} worst by "
                f"{CRITERION_WORDS[CRITERIA[0]]} of its {len(tables)} steps: {named}"
            )
        if lines:
            lines.append(f"(a diagnostic, no verdict; {IDS_CAVEAT})")
        return lines

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: per run its steps with tables, ``k``, the last step's table (records) and the
        recurring sequences."""
        return {
            "min_steps": self.min_steps,
            "criteria": list(CRITERIA),
            "note": IDS_CAVEAT,
            "runs": [
                {
                    "run": run,
                    "k": self.k.get(run, 0),
                    "steps": [w.step for w in tables],
                    "last": tables[-1].records() if tables else [],
                    "recurring": [
                        {
                            "criterion": r.criterion,
                            "datum": r.datum,
                            "steps": r.steps,
                            "share": r.share,
                            "first_step": r.first_step,
                            "last_step": r.last_step,
                            "largest": r.largest,
                            "best_rank": r.rank,
                        }
                        for r in self.recurring_in(run)
                    ],
                }
                for run, tables in self.tables.items()
            ],
        }


def _recurring(run: str, tables: Sequence[Worst], criterion: str, min_steps: int) -> list[Recurring]:
    seen: dict[int, list[tuple[int, int, SequenceGauge]]] = {}
    for worst in tables:
        for rank, s in enumerate(worst.by.get(criterion, ()), start=1):
            seen.setdefault(s.datum, []).append((worst.step, rank, s))
    out = [
        Recurring(
            run=run,
            criterion=criterion,
            datum=datum,
            steps=len({step for step, _, _ in found}),
            tables=len(tables),
            first_step=min(step for step, _, _ in found),
            last_step=max(step for step, _, _ in found),
            largest=max(s.value(criterion) for _, _, s in found),
            rank=min(rank for _, rank, _ in found),
        )
        for datum, found in seen.items()
    ]
    return sorted((r for r in out if r.steps >= min_steps), key=lambda r: (-r.steps, r.datum))


def _within(step: int, steps: tuple[float | None, float | None]) -> bool:
    start, end = steps
    return (start is None or step >= start) and (end is None or step < end)


def worst_sequences(
    tables: Mapping[str, Sequence[Worst]],
    *,
    min_steps: int = MIN_STEPS,
    steps: tuple[float | None, float | None] = (None, None),
) -> WorstSequences | None:
    """The diagnostic of ``tables`` (run label -> its tables, ``load_worst``'s answer), over the
    steps ``start <= step < end`` of ``steps`` (None: unbounded); None when no run has a table
    there. A step given twice counts once (its last table)."""
    if isinstance(min_steps, bool) or not isinstance(min_steps, int) or min_steps < 1:
        raise ValueError(f"min_steps must be an integer >= 1, got {min_steps!r}")
    kept: dict[str, tuple[Worst, ...]] = {}
    for run, given in tables.items():
        chosen = tuple(w for w in worst_store.latest_per_step(given) if _within(w.step, steps))
        if chosen:
            kept[run] = chosen
    if not kept:
        return None
    recurring = [r for run, t in kept.items() for c in CRITERIA for r in _recurring(run, t, c, min_steps)]
    return WorstSequences(
        tables=kept,
        recurring=tuple(recurring),
        min_steps=min_steps,
        k={run: max(w.k for w in t) for run, t in kept.items()},
    )
