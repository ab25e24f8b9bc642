"""The one place the comparison's sentences are written: every sentence a user reads about a
comparison (its notes, verdict reasons, headline, summary, audits) is made here, true of the
numbers it is made from, and nothing edits a sentence after it is made (a different wording is a
different reason, or a different note-making function).

- ``sentences``: a reason (``cliptrack.compare.reasons``) in words, and the ``Note`` a result carries;
- ``headline``: the answer, the figure it rests on, what would change it, why;
- ``summary``: the plain-language summary and the grouped notes;
- ``phrases``: the pieces the sentences and the tables' cells share (values, margins, stretches);
- ``words``: the vocabulary (an axis in words, a list of names).

Numbers are shown by ``cliptrack.compare.formatting``.
"""

from __future__ import annotations

from cliptrack.compare.notes.headline import CAUSES, headline, headline_lines, why
from cliptrack.compare.notes.sentences import (
    RECIPE_WORDS,
    audit_text,
    densities_text,
    note,
    sentence,
    span_text,
    steps_text,
)
from cliptrack.compare.notes.summary import SEGMENTS_HEADING, audit_lines, context, grouped_notes, summary
from cliptrack.compare.notes.words import AXIS_WORDS, AxisWords, listed

__all__ = [
    "AXIS_WORDS",
    "CAUSES",
    "RECIPE_WORDS",
    "SEGMENTS_HEADING",
    "AxisWords",
    "audit_lines",
    "audit_text",
    "context",
    "densities_text",
    "grouped_notes",
    "headline",
    "headline_lines",
    "listed",
    "note",
    "sentence",
    "span_text",
    "steps_text",
    "summary",
    "why",
]
