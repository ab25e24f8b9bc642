"""The unit table's column names: the contract between ``align.unit_table``, which writes them, and
the engine, which reads them. Declared here once; neither side spells a column name itself.

A unit table (one per run) is indexed by unit (a step, or a bin of steps) and holds ``X`` (the
step, or the bin centre on the alignment axis: tokens seen or seconds), ``N_STEPS`` (steps in the
unit) and, per quantity, the columns of ``Columns.of(quantity_name)``.
"""

from __future__ import annotations

from dataclasses import dataclass

X = "x"
"""The unit's position on the alignment axis: the step, or the bin centre (tokens seen, seconds)."""
N_STEPS = "n_steps"
"""Trainer steps in the unit (1 when aligned by step)."""
UNIT = "unit"
"""Name of the table's index."""


@dataclass(frozen=True)
class Columns:
    """One quantity's columns in a unit table.

    ``num`` / ``den``: sums over the unit's valid steps (NaN where none is valid; ``den`` is 1 per
    step for a quantity without a denominator); ``bad``: steps where a key of the quantity was
    logged non-finite (NaN or infinite); ``invalid``: steps whose exact counts were refused
    (negative, fractional or above their total); ``logged``: steps where all its keys were logged,
    finite or not. Counts are steps (floats, as sums of per-step flags).
    """

    num: str
    den: str
    bad: str
    invalid: str
    logged: str

    @classmethod
    def of(cls, name: str) -> Columns:
        """The columns of the quantity named ``name`` (``quantities.Quantity.name``)."""
        return cls(f"{name}.num", f"{name}.den", f"{name}.bad", f"{name}.invalid", f"{name}.logged")

    @property
    def values(self) -> tuple[str, str, str, str]:
        """The columns a substitute estimand replaces (an approximate run's logged mean): all but ``invalid``."""
        return self.num, self.den, self.bad, self.logged
