"""The comparison as JSON (``cliptrack compare --json``, ``ComparisonResult.to_dict``/``to_json``),
derived from the result's dataclasses, and the one schema it follows (:func:`schema`, version
:data:`SCHEMA_VERSION`; docs/JSON.md describes it).

Each object is one dataclass (:data:`OBJECTS`): every field, under its own name unless
:data:`RENAMED`, except the few :data:`OMITTED` (reasons as data, whose words are a field beside
them), plus the :data:`ADDED` values read from its properties. A float that is not finite is
``null``; a tuple is a list; a nested dataclass is its object. The schema is derived from the same
tables and the fields' annotations, so the output and the schema cannot drift apart.

Run-provided text is held as given (``json.dumps`` escapes control characters); :func:`as_json`
holds no credential (``cliptrack.core.secrets.redact_value``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from typing import Any

from cliptrack.compare.findings import (
    Audit,
    Difference,
    DifferenceSegment,
    Findings,
    GroupDifference,
    GroupSegment,
    Lead,
    Note,
    RunEstimate,
)
from cliptrack.compare.notes import headline, why
from cliptrack.compare.quantities import Estimand, Quantity
from cliptrack.compare.stats import MIN_ESS, MIN_UNITS, Estimate
from cliptrack.compare.stats.estimate import GroupEstimate
from cliptrack.core.secrets import redact_value

SCHEMA_VERSION = 3
"""The version of the JSON's layout (``schema_version``): raised when a key is renamed or removed,
or its type changes (a key added keeps it). 2: the layout derived from the dataclasses, with
``schema_version``; 3: a quantity's ``plain_relative`` dropped."""

OBJECTS: dict[str, type] = {
    "estimate": Estimate,
    "group_estimate": GroupEstimate,
    "run_estimate": RunEstimate,
    "segment": DifferenceSegment,
    "group_segment": GroupSegment,
    "lead": Lead,
    "difference": Difference,
    "group_difference": GroupDifference,
    "estimand": Estimand,
    "quantity": Quantity,
    "note": Note,
    "audit": Audit,
}
"""The JSON's objects by name (its schema's ``$defs``), each the dataclass it is derived from."""

RENAMED: dict[type, dict[str, str]] = {
    Estimate: {"low": "ci_low", "high": "ci_high", "n_units": "units", "memory": "memory_d"},
    GroupEstimate: {
        "low": "ci_low",
        "high": "ci_high",
        "seeds_a": "seeds_reference",
        "seeds_b": "seeds_group",
        "between_sd_a": "between_sd_reference",
        "between_sd_b": "between_sd_group",
    },
    RunEstimate: {"units": "units_valid", "total_numerator": "numerator", "total_denominator": "denominator"},
    DifferenceSegment: {"estimate": "difference"},
    GroupSegment: {"estimate": "difference"},
    Difference: {"estimate": "difference"},
    GroupDifference: {"estimate": "difference"},
    Quantity: {"name": "metric"},
}
"""Field -> key where the JSON's name differs from the field's (the interval's ``ci_low``)."""

OMITTED: dict[type, frozenset[str]] = {
    Difference: frozenset({"why", "differing"}),
    GroupDifference: frozenset({"why", "differing"}),
    Note: frozenset({"reason"}),
}
"""Fields left out: a reason as data (its words are ``reason`` or ``text``); the segments not
shown within the margin (each segment's ``differs`` says it)."""

FLATTENED: dict[type, str] = {RunEstimate: "estimate"}
"""A field whose object's keys stand in its parent's own (a run's estimate: ``value``, ``ci_low``...)."""

ADDED: dict[type, dict[str, tuple[str, Callable[[Any], Any]]]] = {
    Estimate: {"enough_data": ("bool", lambda e: e.enough_data)},
    Quantity: {
        "numerator": ("str", lambda q: q.numerator),
        "denominator": ("str | None", lambda q: q.denominator),
    },
    DifferenceSegment: {"differs": ("bool", lambda s: False)},
    GroupSegment: {"differs": ("bool", lambda s: False)},
    Audit: {"gap": ("float", lambda a: a.gap)},
}
"""Key -> (type, value) read from a property; a segment's ``differs`` is set by its difference."""


# ------------------------------------------------------------------------------------- values


def _plain(x: Any) -> Any:
    """A field's value as JSON-ready data: non-finite floats -> None, tuples -> lists, a dataclass
    -> its object."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, (tuple, list)):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if is_dataclass(x) and not isinstance(x, type):
        return data(x)
    return x


def data(obj: Any) -> dict[str, Any]:
    """One dataclass of :data:`OBJECTS` as its JSON object."""
    cls = type(obj)
    renamed, omitted = RENAMED.get(cls, {}), OMITTED.get(cls, frozenset())
    out: dict[str, Any] = {}
    for f in fields(obj):
        if f.name in omitted:
            continue
        value = _plain(getattr(obj, f.name))
        if FLATTENED.get(cls) == f.name:
            out.update(value)
        else:
            out[renamed.get(f.name, f.name)] = value
    for key, (_, read) in ADDED.get(cls, {}).items():
        out[key] = _plain(read(obj))
    if isinstance(obj, (Difference, GroupDifference)):
        for segment, entry in zip(obj.segments, out["segments"], strict=True):
            entry["differs"] = segment in obj.differing
    return out


def as_dict(result: Findings) -> dict[str, Any]:
    """Every estimate, interval, effective sample size, segment, verdict and note as JSON-ready
    data (NaN -> null), in the layout :func:`schema` describes."""
    return {
        "schema_version": SCHEMA_VERSION,
        "verdict": result.on_policy_verdict,
        "headline": headline(result),
        "why": why(result),
        "on_policy": list(result.on_policy),
        "seeds_covered": result.seeds_covered,
        "groups": {g: list(m) for g, m in result.groups.items()},
        "runs": [
            {"label": r, "backend": result.backends[r], "reference": r == result.reference}
            for r in result.runs
        ],
        "align": result.align,
        "window": str(result.window),
        "confidence": result.confidence,
        "method": result.method,
        "minimum": {"units": MIN_UNITS, "ess": MIN_ESS},
        "quantities": [data(q) for q in result.quantities],
        "estimates": [data(e) for e in result.estimates],
        "differences": [data(d) for d in result.differences],
        "group_differences": [data(d) for d in result.group_differences],
        "notes": [data(n) for n in result.notes],
        "audits": [data(a) for a in result.audits],
    }


def as_json(result: Findings) -> str:
    """:func:`as_dict` as JSON text (indented; no credential)."""
    return json.dumps(redact_value(as_dict(result)), indent=2, allow_nan=False)


# ------------------------------------------------------------------------------------- schema


_SCALARS = {"str": {"type": "string"}, "int": {"type": "integer"}, "bool": {"type": "boolean"}}
_NAMES = {cls.__name__: name for name, cls in OBJECTS.items()}


def _type(annotation: str) -> dict[str, Any]:
    """An annotation (as written in the dataclass) as a JSON Schema: floats may be null (not finite)."""
    annotation = annotation.strip()
    if annotation.endswith("| None"):
        return {"anyOf": [_type(annotation[: -len("| None")]), {"type": "null"}]}
    if annotation == "float":
        return {"type": ["number", "null"]}
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    if annotation in _NAMES:
        return {"$ref": f"#/$defs/{_NAMES[annotation]}"}
    items = re.fullmatch(r"tuple\[(.+), \.\.\.\]", annotation)
    if items:
        return {"type": "array", "items": _type(items.group(1))}
    fixed = re.fullmatch(r"tuple\[(.+)\]", annotation)
    if fixed:
        parts = [_type(a) for a in fixed.group(1).split(",")]
        return {"type": "array", "prefixItems": parts, "minItems": len(parts), "maxItems": len(parts)}
    raise TypeError(f"no JSON type for the annotation {annotation!r}")


def _object(cls: type) -> dict[str, Any]:
    """The schema of one dataclass's JSON object (:func:`data`)."""
    renamed, omitted = RENAMED.get(cls, {}), OMITTED.get(cls, frozenset())
    properties: dict[str, Any] = {}
    for f in fields(cls):
        if f.name in omitted:
            continue
        if FLATTENED.get(cls) == f.name:
            properties.update(_object(OBJECTS[_NAMES[str(f.type)]])["properties"])
        else:
            properties[renamed.get(f.name, f.name)] = _type(str(f.type))
    for key, (annotation, _) in ADDED.get(cls, {}).items():
        properties[key] = _type(annotation)
    return {
        "type": "object",
        "description": (cls.__doc__ or "").strip().split("\n\n")[0],
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of :func:`as_dict`'s output, version :data:`SCHEMA_VERSION`."""
    array = {name: {"type": "array", "items": {"$ref": f"#/$defs/{name}"}} for name in OBJECTS}
    strings = {"type": "array", "items": {"type": "string"}}
    top = {
        "schema_version": {"const": SCHEMA_VERSION},
        "verdict": {"type": "string"},
        "headline": {"type": "string"},
        "why": {"type": "string"},
        "on_policy": strings,
        "seeds_covered": {"type": "boolean"},
        "groups": {"type": "object", "additionalProperties": strings},
        "runs": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "label": {"type": "string"},
                    "backend": {"type": "string"},
                    "reference": {"type": "boolean"},
                },
                "required": ["label", "backend", "reference"],
                "additionalProperties": False,
            },
        },
        "align": {"type": "string"},
        "window": {"type": "string"},
        "confidence": {"type": "number"},
        "method": {"type": "string"},
        "minimum": {
            "type": "object",
            "properties": {"units": {"type": "integer"}, "ess": {"type": "number"}},
            "required": ["units", "ess"],
            "additionalProperties": False,
        },
        "quantities": array["quantity"],
        "estimates": array["run_estimate"],
        "differences": array["difference"],
        "group_differences": array["group_difference"],
        "notes": array["note"],
        "audits": array["audit"],
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"cliptrack comparison, schema version {SCHEMA_VERSION}",
        "type": "object",
        "properties": {**top, "worst_sequences": {"type": "object"}},
        "required": list(top),
        "additionalProperties": False,
        "$defs": {name: _object(cls) for name, cls in OBJECTS.items()},
    }


__all__ = ["OBJECTS", "SCHEMA_VERSION", "as_dict", "as_json", "data", "schema"]
