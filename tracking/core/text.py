"""Text from a run, escaped for the medium it lands in: a terminal, markdown, HTML.

Everything a run provides (its name and label, backend label, params, metric keys, notes, error
text a backend echoes back) is data, never markup or a terminal command. It is stored as given and
escaped where it is shown, by one of these:

- :func:`printable` — a terminal or log line: control characters (ANSI and OSC escapes, NUL,
  C1 controls such as ``\\x9b``, newlines, tabs) and invisible format characters (the bidi
  overrides ``U+202A``–``U+202E`` and isolates ``U+2066``–``U+2069``, ``U+200E``/``U+200F``,
  zero-width characters) are written visibly as Python escapes (``\\x1b``, ``\\n``,
  ``\\u202e``); so a name can neither colour the terminal, retitle it, reorder a line nor start
  a second line. Every other escaper starts from it, so text from a run is one line everywhere.
- :func:`markdown_text` — inline markdown, for a renderer that allows HTML (MLflow's run
  descriptions: GitHub-flavoured showdown with ``<img>``, ``<a>`` and ``<iframe>`` allowed,
  bare URLs, ``www.`` and ``@name`` turned into links): the text renders as itself, with no
  image, link, mention, tag, emphasis, code, table cell or list.
- :func:`html_text` — HTML element content or a quoted attribute value (the dashboard).

:func:`markdown_lines` and :func:`html_lines` escape text cliptrack composes itself over several
lines (the comparison's summary, whose run-provided parts are already :func:`printable`): each
line as above, the line breaks kept, a leading ``- `` kept as a list item in markdown.
"""

from __future__ import annotations

import html
import re

__all__ = ["html_lines", "html_text", "markdown_lines", "markdown_text", "printable"]


def printable(text: object) -> str:
    """``text`` (``str(text)``) safe to print on a terminal, on one line: every character
    ``str.isprintable`` refuses (controls, line and paragraph separators, format characters
    such as the bidi overrides) is written as its Python escape (``\\x1b``, ``\\n``,
    ``\\u202e``); everything else is kept. Idempotent on its own output."""
    value = str(text)
    if value.isprintable():
        return value
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in value)


# Characters that open an inline markdown construct (escapes, code, emphasis, links and images,
# tables, strikethrough, task lists): always escaped with a backslash. Parentheses are not: they
# form a link or an image only after a ``]``, which is escaped.
_MARKDOWN_PUNCTUATION = re.compile(r"([\\`*_{}\[\]!|~])")
# Characters HTML and markdown read as markup or links: written as entities (``@`` would be a
# GitHub mention or an e-mail link).
_MARKDOWN_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "@": "&#64;"}
# An automatic link: ``scheme://`` (its colon as an entity: showdown 1.x, which MLflow's UI uses,
# keeps a backslash before a colon) and ``www.``.
_AUTOLINK = re.compile(r"(?<=www)\.", re.IGNORECASE)
_SCHEME = re.compile(r":(?=/)")
# A block marker at the start of a line: heading, list item, setext rule, numbered item.
_LINE_START = re.compile(r"^(\s*)([#+\-=]|\d+(?=\.(?:\s|$)))")


def markdown_text(text: object) -> str:
    """``text`` as inline markdown that renders as the text itself (one line, as
    :func:`printable`), in a renderer that also accepts HTML: markdown punctuation escaped with a
    backslash, ``& < > " @`` as HTML entities, and ``://`` and ``www.`` broken so no URL becomes
    a link. Inline: a text that starts a line goes through :func:`markdown_lines`."""
    value = printable(text)
    value = _MARKDOWN_PUNCTUATION.sub(r"\\\1", value)
    value = "".join(_MARKDOWN_ENTITIES.get(ch, ch) for ch in value)
    value = _SCHEME.sub("&#58;", value)
    return _AUTOLINK.sub("\\\\.", value)


def _escape_line_start(match: re.Match[str]) -> str:
    spaces, marker = match.group(1), match.group(2)
    return spaces + (marker + "\\" if marker[0].isdigit() else "\\" + marker)


def markdown_lines(text: str) -> str:
    """Multi-line text composed by cliptrack as markdown: each line through :func:`markdown_text`
    with a heading or list marker at its start escaped, the line breaks kept and a leading ``- ``
    kept as a list item."""
    out = []
    for line in text.split("\n"):
        bullet = "- " if line.startswith("- ") else ""
        out.append(bullet + _LINE_START.sub(_escape_line_start, markdown_text(line[len(bullet) :]), count=1))
    return "\n".join(out)


def html_text(text: object) -> str:
    """``text`` as HTML element content or a quoted attribute value: :func:`printable` (one
    line), then ``& < > " '`` as entities."""
    return html.escape(printable(text), quote=True)


def html_lines(text: str) -> str:
    """Multi-line text composed by cliptrack as HTML: each line through :func:`html_text`, the
    line breaks kept (for a ``white-space: pre-wrap`` element)."""
    return "\n".join(html_text(line) for line in text.split("\n"))
