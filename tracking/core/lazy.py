"""Lazy re-exports (PEP 562): a package names where each public attribute lives and imports that
module on first use, so that ``import cliptrack`` and ``cliptrack --help`` stay light."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["lazy_attribute"]


def lazy_attribute(package: str, homes: Mapping[str, str], name: str) -> Any:
    """Attribute ``name`` of ``package``, taken from the module ``homes[name]`` (imported now);
    AttributeError, as for any module, when ``homes`` does not name it."""
    home = homes.get(name)
    if home is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
