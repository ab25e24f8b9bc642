"""Renderings of what a comparison found (``findings.Findings``, and so a ``ComparisonResult``):
markdown and the HTML table here; the rest from the modules that hold them, re-exported:

- ``cliptrack.compare.tables``: the tables (data frames);
- ``cliptrack.compare.notes``: every sentence (headline, summary, grouped notes, why);
- ``cliptrack.compare.report_json``: the JSON and its schema;
- ``cliptrack.compare.formatting``: the numbers.

Each reads the result and nothing else, so the terminal, the dashboard, the MLflow comparison run,
the notebook and scripts (``--json``) all say the same thing.

Run-provided text (labels, reasons and notes that quote them) is escaped for the medium, through
``cliptrack.core.text``: the summary and headline hold it ``printable`` (one line each: a newline in a
run name cannot start a forged line), ``markdown`` and ``html_table`` escape every cell for their
medium, and the tables (data frames) hold it as given, escaped where they are printed. JSON holds
it as given (``json.dumps`` escapes control characters). The summary, markdown and JSON hold no
credential (``cliptrack.core.secrets.redact``, before any escaping).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cliptrack.compare.formatting import relative_change
from cliptrack.compare.notes import (
    CAUSES,
    SEGMENTS_HEADING,
    audit_lines,
    grouped_notes,
    headline,
    headline_lines,
    summary,
    why,
)
from cliptrack.compare.notes.phrases import difference as format_difference
from cliptrack.compare.notes.phrases import full_margin as format_margin
from cliptrack.compare.report_json import SCHEMA_VERSION, as_dict, as_json, schema
from cliptrack.compare.tables import compact_table, estimates_table, formatted_table, segments_table, table
from cliptrack.core.secrets import redact
from cliptrack.core.text import html_text, markdown_lines, markdown_text

if TYPE_CHECKING:
    import pandas as pd
    from cliptrack.compare.findings import Findings

__all__ = [
    "CAUSES",
    "SCHEMA_VERSION",
    "as_dict",
    "as_json",
    "audit_lines",
    "compact_table",
    "estimates_table",
    "format_difference",
    "format_margin",
    "formatted_table",
    "grouped_notes",
    "headline",
    "headline_lines",
    "html_table",
    "markdown",
    "relative_change",
    "schema",
    "segments_table",
    "summary",
    "table",
    "why",
]


def _markdown_rows(frame: pd.DataFrame) -> list[str]:
    header = "| " + " | ".join(markdown_text(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = [
        "| " + " | ".join(markdown_text(redact(str(v))) for v in row) + " |"
        for row in frame.itertuples(index=False)
    ]
    return [header, rule, *body]


def markdown(result: Findings) -> str:
    """Summary, table and the per-segment differences as markdown; every run-provided text renders
    as itself (``cliptrack.core.text.markdown_text``: no link, image or HTML from a run name)."""
    parts = [markdown_lines(summary(result)), "", *_markdown_rows(formatted_table(result))]
    segments = segments_table(result)
    if len(segments):
        parts += ["", SEGMENTS_HEADING, "", *_markdown_rows(segments)]
    return "\n".join(parts) + "\n"


def html_table(result: Findings) -> str:
    """The formatted table as an HTML ``<table>``; every cell is escaped (``cliptrack.core.text.html_text``)."""
    frame = formatted_table(result)
    head = "".join(f"<th>{html_text(c)}</th>" for c in frame.columns)
    body = []
    for row in frame.itertuples(index=False):
        cells = []
        for column, value in zip(frame.columns, row, strict=True):
            cls = ""
            if column == "verdict":
                cls = f' class="verdict {html_text(str(value).strip("()").replace(" ", "-"))}"'
            cells.append(f"<td{cls}>{html_text(value)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f'<table class="verdict-table"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    )
