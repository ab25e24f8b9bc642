"""The comparison's text renderings for the views and the panels: tables, summary, markdown, HTML,
JSON. They live in ``cliptrack.compare.report`` (below ``result``, whose ``ComparisonResult``
offers them as methods); this module names them where the views look for them."""

from __future__ import annotations

from cliptrack.compare.report import (
    as_dict,
    as_json,
    estimates_table,
    format_difference,
    format_margin,
    formatted_table,
    headline,
    html_table,
    markdown,
    relative_change,
    segments_table,
    summary,
    table,
)

__all__ = [
    "as_dict",
    "as_json",
    "estimates_table",
    "format_difference",
    "format_margin",
    "formatted_table",
    "headline",
    "html_table",
    "markdown",
    "relative_change",
    "segments_table",
    "summary",
    "table",
]
