"""Secrets in text: the one place that knows what a credential looks like and how it is hidden.

Everything cliptrack writes or prints that may hold a store address or a server's error text
(console lines, ``run.json``, dashboards, markdown, JSON, MLflow descriptions and artifacts, W&B
reports, error lines) goes through :func:`redact`. What is hidden:

- the password of a URI's user info: ``postgresql://user:PASSWORD@host/db`` becomes
  ``postgresql://user:***@host/db`` (a user name alone is kept: it is not a secret);
- the value of a query parameter whose name says it is a credential (``token``, ``access_token``,
  ``api_key``, ``key``, ``password``, ``secret``, ``sig``, ``signature``, ``auth`` and their
  spellings with ``-``/``_``, any case): ``?token=abc`` becomes ``?token=***``;
- a libpq-style ``password=...`` pair (``host=h password=PW``);
- a ``Bearer``/``Basic`` authorization value, as servers sometimes echo it back;
- the values of credential environment variables set in this process (``WANDB_API_KEY``,
  ``MLFLOW_TRACKING_TOKEN``, ``MLFLOW_TRACKING_PASSWORD``, ``DATABRICKS_TOKEN``, ...; see
  :data:`SECRET_ENV`), wherever they appear.

The real value is still used to connect: redaction applies to what is shown and stored, never to
what is handed to a client.
"""

from __future__ import annotations

import os
import re

__all__ = ["MASK", "SECRET_ENV", "redact", "redact_value"]

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

# scheme://user:password@host  ->  the password part (up to the last '@' before the host's path)
_USERINFO = re.compile(
    r"""(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@?#'"<>]*:)(?P<secret>[^\s/?#'"<>]+)"""
    r"""(?=@[^\s@/?#'"<>]*(?:[/?#\s'"<>]|$))"""
)
_QUERY = re.compile(
    r"(?P<head>[?&;](?:[A-Za-z0-9_\-]*?)(?:token|api[_\-]?key|key|password|passwd|pwd|secret|sig|signature|auth|"
    r"credential|credentials)=)(?P<secret>[^&;#\s'\"<>]+)",
    re.IGNORECASE,
)
_KEY_VALUE = re.compile(r"(?P<head>(?<![?&;\w])(?:password|passwd|pwd)\s*[=:]\s*)(?P<secret>[^\s&;,'\"<>]+)", re.IGNORECASE)
_AUTH_HEADER = re.compile(r"(?P<head>\b(?:Bearer|Basic|Token)\s+)(?P<secret>[A-Za-z0-9._~+/\-]{8,}=*)")
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
    out = _KEY_VALUE.sub(_masked, out)
    out = _AUTH_HEADER.sub(_masked, out)
    for name in SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= _MIN_ENV_SECRET and value in out:
            out = out.replace(value, MASK)
    return out


def redact_value(value: object) -> object:
    """``value`` with :func:`redact` applied to every string in it (dicts, lists and tuples walked;
    other values returned as they are): for JSON documents and parameter mappings."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(k) if isinstance(k, str) else k: redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v) for v in value)
    return value
