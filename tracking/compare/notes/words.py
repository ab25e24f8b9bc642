"""The report's vocabulary: an alignment axis in words, and a list of names in words.

:data:`AXIS_WORDS` is the one map of axis -> words; every sentence and label that names an axis
reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class AxisWords:
    """An alignment axis in words: ``name`` ("Aligned by tokens seen"), ``units`` (a stretch of it,
    "steps 100-199", "seconds 30-60"; a shift of it), ``title`` (a plot's axis title, with its unit)."""

    name: str
    units: str
    title: str


AXIS_WORDS = {
    "step": AxisWords("step", "steps", "trainer step"),
    "tokens": AxisWords("tokens seen", "tokens seen", "tokens seen (loss tokens)"),
    "time": AxisWords("wall time", "seconds", "wall time since start (s)"),
}
"""Alignment (``cliptrack.compare.align.ALIGNMENTS``) -> its words."""


def listed(names: Sequence[str]) -> str:
    """Names as one subject: ``a``; ``each of a, b and c``."""
    if len(names) == 1:
        return names[0]
    return f"each of {', '.join(names[:-1])} and {names[-1]}"
