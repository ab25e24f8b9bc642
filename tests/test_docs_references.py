"""Every module, name and path the docs mention exists: a dotted ``cliptrack.…`` reference imports
(its longest importable prefix, then attributes) or is a tag cliptrack writes (``keys.TAG_*``, or
one of their prefixes followed by a placeholder), and a path under one of the repository's folders
names a file or folder (a ``*`` in it matches one)."""

from __future__ import annotations

import importlib
import re
import subprocess
from pathlib import Path

import pytest
from cliptrack.core import keys

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
DOTTED = re.compile(r"(?<![\w./-])cliptrack(?:\.[A-Za-z_]\w*)+")
FOLDERS = ("tracking", "adapters", "tests", "benchmarks", "research", "notebooks", "docs")
PATH = re.compile(r"(?<![\w./-])(?:" + "|".join(FOLDERS) + r")/[\w*./-]*")
SUBFOLDERS = sorted(
    {p.name for top in ("tracking", "adapters") for p in (ROOT / top).iterdir() if p.is_dir()}
)
INNER_PATH = re.compile(r"(?<![\w./-])(?:" + "|".join(SUBFOLDERS) + r")/[\w*./-]*\.py")
"""A module path written from inside a package folder (``backends/mlflow/sink.py``)."""


def _references(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    return sorted(
        {
            (doc.relative_to(ROOT).as_posix(), m.group(0))
            for doc in DOCS
            for m in pattern.finditer(doc.read_text())
        }
    )


TAGS = {value for name, value in vars(keys).items() if name.startswith("TAG_") and isinstance(value, str)}


def _resolves(dotted: str) -> bool:
    if dotted in TAGS or any(dotted.startswith(tag + ".") for tag in TAGS):
        return True
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def _exists(path: str) -> bool:
    """The path names something in the checkout, or a place git ignores (a cache a script fills)."""
    path = path.rstrip(".,:;)")
    if any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists():
        return True
    return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, check=False).returncode == 0


def test_the_docs_name_references_of_both_kinds():
    assert len(_references(DOTTED)) > 20 and len(_references(PATH)) > 20


@pytest.mark.parametrize(("doc", "reference"), _references(DOTTED))
def test_every_dotted_reference_imports(doc, reference):
    assert _resolves(reference.rstrip(".")), f"{doc} names {reference}, which does not import"


@pytest.mark.parametrize(("doc", "reference"), _references(PATH))
def test_every_path_exists(doc, reference):
    assert _exists(reference), f"{doc} names {reference}, which does not exist"


@pytest.mark.parametrize(("doc", "reference"), _references(INNER_PATH))
def test_every_module_path_inside_a_package_exists(doc, reference):
    assert _exists(f"tracking/{reference}") or _exists(f"adapters/{reference}"), (
        f"{doc} names {reference}, which is in neither tracking/ nor adapters/"
    )
