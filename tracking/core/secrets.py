"""Secrets in text: the one place that knows what a credential looks like and how it is hidden.

Everything cliptrack writes or prints that may hold a store address or a server's error text
(console lines, ``run.json``, dashboards, markdown, JSON, MLflow descriptions and artifacts, W&B
reports, error lines) goes through :func:`redact`. What is hidden:

- the password of a URI's user info: ``postgresql://user:PASSWORD@host/db`` becomes
  ``postgresql://user:***@host/db`` (a user name alone is kept: it is not a secret);
- the value of a query parameter whose name says it is a credential (``token``, ``access_token``,
  ``api_key``, ``key``, ``password``, ``secret``, ``sig``, ``signature``, ``auth`` and their
  spellings with ``-``/``_``, any case): ``?token=abc`` becomes ``?token=***`` (but for
  :data:`NOT_SECRET_PARAMS`, such as the MLflow UI's ``viewStateShareKey``);
- a ``password=...`` or ``password: ...`` pair, its value bare or quoted: libpq's
  ``host=h password=PW`` and ``password='P W'``, a dict's repr ``{'password': 'PW'}``, JSON's
  ``{"password": "PW"}`` (a quoted value is hidden up to its closing quote);
- an ``Authorization: Basic/Bearer/Token`` value, or a ``Bearer`` token, as servers sometimes
  echo them back, the header also as a dict's repr holds it (``{'Authorization': 'Basic X'}``);
- the values of credential environment variables set in this process (``WANDB_API_KEY``,
  ``MLFLOW_TRACKING_TOKEN``, ``MLFLOW_TRACKING_PASSWORD``, ``DATABRICKS_TOKEN``, ...; see
  :data:`SECRET_ENV`), wherever they appear.

The real value is still used to connect: redaction applies to what is shown and stored, never to
what is handed to a client. Where a stored value is needed again (``run.json``'s tracking URI, to
resume or replay a run), :func:`restore` finds the real one among the values the user gives
(``MLFLOW_TRACKING_URI``, ``--tracking-uri``, the tracker's own URI).

Text is redacted where it is made (a message, a description, an alert): cliptrack's own exceptions
derive from :class:`RedactedError`, whose message is redacted when it is raised. Boundaries that apply
it wholesale besides: :class:`RedactingFilter` on the ``cliptrack`` logger (every log line, whatever
handler prints it), :func:`redacted_output` around a command line (everything it prints on stdout
and stderr, warnings included) and :func:`redacted_errors` around a library entry point (the
message of every exception it lets out, its causes' included, whoever raised it: a client library
echoes the URL it was given).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TextIO, TypeVar, cast

_T = TypeVar("_T")

__all__ = [
    "MASK",
    "SECRET_ENV",
    "RedactedError",
    "RedactingFilter",
    "hides",
    "install_filter",
    "redact",
    "redact_exception",
    "redact_value",
    "redacted_errors",
    "redacted_output",
    "restore",
]

MASK = "***"

#: Environment variables whose values are credentials: hidden wherever they appear in text.
SECRET_ENV = (
    "WANDB_API_KEY",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_PASSWORD",
    "DATABRICKS_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AZURE_STORAGE_ACCESS_KEY",
    "AZURE_STORAGE_CONNECTION_STRING",
    "PGPASSWORD",
    "HF_TOKEN",
)

NOT_SECRET_PARAMS = ("viewStateShareKey",)
"""Query parameters whose names look like a credential's but are not one: MLflow UI's
``viewStateShareKey`` names an experiment tag holding a chart view (the address the demo prints)."""

# scheme://user:password@host  ->  the password part (up to the last '@' before the host's path;
# RFC 3986 allows ' and the other sub-delimiters in a password)
_USERINFO = re.compile(
    r"""(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@?#'"<>]*:)(?P<secret>[^\s/?#"<>]+)"""
    r"""(?=@[^\s@/?#'"<>]*(?:[/?#\s'"<>]|$))"""
)
_QUERY = re.compile(
    rf"(?P<head>[?&;](?!(?:{'|'.join(NOT_SECRET_PARAMS)})=)(?:[A-Za-z0-9_\-]*?)(?:token|api[_\-]?key|key|password|passwd|pwd|secret|sig|signature|auth|"
    r"credential|credentials)=)(?!\*\*\*(?![A-Za-z0-9]))(?P<secret>[^&;#\s'\"<>]+)",
    re.IGNORECASE,
)
# password=PW, password: PW; the key may be quoted as in a dict's repr or JSON ('password': PW)
_KEY_VALUE = re.compile(
    r"(?P<head>(?<![?&;\w])(?:password|passwd|pwd)['\"]?\s*[=:]\s*)(?!\*\*\*(?![A-Za-z0-9]))"
    r"(?P<secret>[^\s&;,'\"<>]+)",
    re.IGNORECASE,
)
# the same with a quoted value, up to its closing quote (backslash escapes kept inside): libpq's
# password='my PW', a dict's repr {'password': 'PW'}, JSON {"password": "PW"}
_QUOTED_KEY_VALUE = re.compile(
    r"""(?P<head>(?<![?&;\w])(?:password|passwd|pwd)['"]?\s*[=:]\s*(?P<quote>['"]))"""
    r"(?P<secret>(?:\\.|(?!(?P=quote))[^\\\n])+)",
    re.IGNORECASE,
)
# "Authorization: Basic/Bearer/Token X" (any case; the header name and value may be quoted, as in a
# dict's repr {'Authorization': 'Basic X'}), or "Bearer X" alone; never "Basic settings"
_AUTH_HEADER = re.compile(
    r"(?P<head>\b(?:(?:proxy-)?authorization['\"]?\s*[:=]\s*['\"]?(?:(?:bearer|basic|token|digest)\s+)?"
    r"|(?-i:Bearer)\s+))"
    r"(?P<secret>[A-Za-z0-9._~+/\-]{8,}=*)",
    re.IGNORECASE,
)
# A value the mask begins, followed by punctuation (``?token=***)``: redacted text put in
# parentheses, or before a colon), is taken as masked already, so redacting twice changes nothing
# (the unquoted value patterns above).
_MIN_ENV_SECRET = 6  # shorter values would mask ordinary words


def _masked(match: re.Match[str]) -> str:
    return match.group("head") + MASK


def redact(text: str) -> str:
    """``text`` with every credential it holds replaced by ``***`` (see the module's docstring);
    text without one is returned unchanged."""
    if not text:
        return text
    out = _USERINFO.sub(_masked, text)
    out = _QUERY.sub(_masked, out)
    out = _QUOTED_KEY_VALUE.sub(_masked, out)
    out = _KEY_VALUE.sub(_masked, out)
    out = _AUTH_HEADER.sub(_masked, out)
    for name in SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= _MIN_ENV_SECRET and value in out:
            out = out.replace(value, MASK)
    return out


def redact_value(value: _T) -> _T:
    """``value`` with :func:`redact` applied to every string in it (dicts, lists and tuples walked;
    other values returned as they are): for JSON documents and parameter mappings."""
    out: Any = value
    if isinstance(value, str):
        out = redact(value)
    elif isinstance(value, dict):
        out = {redact(k) if isinstance(k, str) else k: redact_value(v) for k, v in value.items()}
    elif isinstance(value, (list, tuple)):
        out = type(value)(redact_value(v) for v in value)
    return cast(_T, out)


class RedactedError(Exception):
    """An exception whose message (every string argument) is redacted when it is made: the base of
    the errors cliptrack raises with a store's address in them (``StoreError``,
    ``RunNotFoundError``), so the text never holds a credential, whoever prints it."""

    def __init__(self, *args: object) -> None:
        super().__init__(*redact_value(args))


_MESSAGE_ATTRIBUTES = ("message", "msg", "reason", "strerror", "filename", "filename2")
"""Attributes in which exceptions keep text besides their arguments (MLflow's ``message``,
``OSError``'s file names, ``requests``' ``reason``): redacted too when they hold a string."""


def redact_exception(exc: BaseException) -> BaseException:
    """``exc`` itself, with :func:`redact` applied in place to its arguments and its text
    attributes (:data:`_MESSAGE_ATTRIBUTES`), and to those of its causes and contexts (a printed
    traceback shows them). Its type and traceback are kept, so a caller still catches it as
    before."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        with contextlib.suppress(Exception):  # an exception whose args cannot be set keeps them
            clean = redact_value(current.args)
            if clean != current.args:
                current.args = clean
        for name in _MESSAGE_ATTRIBUTES:
            value = getattr(current, name, None)
            if isinstance(value, str) and redact(value) != value:
                with contextlib.suppress(Exception):
                    setattr(current, name, redact(value))
        pending += [e for e in (current.__cause__, current.__context__) if e is not None]
    return exc


@contextlib.contextmanager
def redacted_errors() -> Iterator[None]:
    """Around a library entry point (a ``with`` block, or a decorator: ``@redacted_errors()``):
    an exception leaving it has its message redacted (:func:`redact_exception`) and is raised on,
    the same object with its traceback."""
    try:
        yield
    except Exception as exc:
        redact_exception(exc)
        raise


def hides(stored: str) -> bool:
    """Whether ``stored`` (a value as :func:`redact` left it) has a part hidden behind ``***``."""
    return MASK in stored


def restore(stored: str, candidates: Iterable[str | None]) -> str | None:
    """The real value behind ``stored``: ``stored`` itself when it hides nothing, else the first of
    ``candidates`` that redacts to it (the same value with its secrets: the same scheme, user,
    host, path and query apart from what is hidden); None when no candidate does."""
    if not hides(stored):
        return stored
    for candidate in candidates:
        if candidate and not hides(candidate) and redact(candidate) == stored:
            return candidate
    return None


class RedactingFilter(logging.Filter):
    """A logging filter that redacts each record's message (its arguments merged in) and its
    formatted exception: installed on the ``cliptrack`` logger, it covers every handler that
    prints cliptrack's records (its own stderr handler, the application's root handlers)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logging's to report
            return True
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def install_filter(logger: logging.Logger) -> None:
    """Add one :class:`RedactingFilter` to ``logger`` (idempotent)."""
    if not any(isinstance(f, RedactingFilter) for f in logger.filters):
        logger.addFilter(RedactingFilter())


class _RedactingStream:
    """A text stream that redacts each ``write`` before passing it on (every other attribute is the
    wrapped stream's). ``print`` writes each argument whole, so a value is never split."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def redacted_output() -> Iterator[None]:
    """Within the block, everything written to ``sys.stdout`` and ``sys.stderr`` (prints, warnings,
    log handlers created inside it) is redacted; the streams are restored after."""
    saved = sys.stdout, sys.stderr
    sys.stdout = _RedactingStream(saved[0])  # type: ignore[assignment]
    sys.stderr = _RedactingStream(saved[1])  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def redacted_repr(obj: Any) -> str:
    """A dataclass's repr (its fields as the generated one shows them) with :func:`redact` applied:
    for a dataclass holding a store's address, what a log line or a traceback shows of it."""
    shown = ", ".join(f"{f.name}={getattr(obj, f.name)!r}" for f in dataclasses.fields(obj) if f.repr)
    return redact(f"{type(obj).__name__}({shown})")
