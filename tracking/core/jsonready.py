"""Values made ready for strict JSON: a number that is not finite becomes ``null``.

A NaN or an infinity (a quantity with no estimate, a watched value that blew up) is written as
``null`` in the JSON cliptrack hands to other programs (``cliptrack watch --json``, the probe's
``to_dict``; the comparison's report does the same field by field), so that it is strict JSON
(RFC 8259), which ``json.loads`` of any language reads; the accompanying text says which value it
was.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["json_ready", "strict_json"]


def json_ready(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None``: dicts, lists and tuples walked
    (a tuple becomes a list, as JSON has one array); other values returned as they are."""
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def strict_json(value: Any) -> str:
    """``json.dumps`` of :func:`json_ready` ``(value)``, refusing any NaN left (there is none)."""
    return json.dumps(json_ready(value), allow_nan=False)
