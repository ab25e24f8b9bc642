"""A failure as the command line prints it: ``cliptrack COMMAND: what went wrong``, the message's
own lines kept apart (a not-found run is three short lines), every line made printable."""

from __future__ import annotations

from cliptrack.core.secrets import RedactedError
from cliptrack.core.text import printable


def error_text(command: str, exc: BaseException, suffix: str = "") -> str:
    """``exc``'s message under ``cliptrack COMMAND:``, ``suffix`` after it; the exception's type
    when it has no message. The lines of cliptrack's own store errors (``RedactedError``: a
    not-found run's listing) are kept apart, each printable, whitespace within collapsed; any
    other message is one printable line (a newline in text from a run cannot start a line)."""
    text = str(exc)
    parts = text.splitlines() if isinstance(exc, RedactedError) else [text]
    lines = [printable(" ".join(line.split())) for line in parts if line.strip()]
    lines = lines or [type(exc).__name__]
    lines[0] = f"cliptrack {command}: {lines[0]}"
    lines[-1] += suffix
    return "\n".join(lines)
