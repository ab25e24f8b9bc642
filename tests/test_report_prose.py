"""Every sentence of the report is written in ``cliptrack.compare.notes``: the modules that render a
comparison (tables, numbers, JSON, markdown, HTML, the result model) hold no prose of their own, and
notes that say the same of several quantities are written once from their reason, not rewritten."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from cliptrack.compare import RunSet, compare
from cliptrack.store.frame import LoadedRun
from cliptrack.store.records import RunInfo

from tests._compare_fixtures import megatron_vs_miles

COMPARE = Path(__file__).resolve().parent.parent / "tracking" / "compare"
RENDERING = ("report.py", "report_json.py", "tables.py", "formatting.py", "findings.py", "result.py")
"""The modules that render a comparison or hold what it found: none of them writes a sentence."""

PROSE = re.compile(r"[A-Za-z][A-Za-z'-]*(?: +[A-Za-z][A-Za-z'-]*){2,}")
"""Three or more words in a row: a phrase or a sentence (a column name or a unit is two at most)."""


def _text(node: ast.AST) -> str | None:
    """A string literal's text; an f-string's literal parts, its fields as gaps (`` {} ``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else " {} " for v in node.values)
    return None


def prose_in(source: str) -> list[tuple[int, str]]:
    """Each string literal or f-string of ``source`` holding prose (:data:`PROSE`), with its line;
    docstrings and the messages of raised errors are not the report's."""
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            for statement in node.body:  # docstrings, and the strings documenting an attribute
                if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                    skip.add(id(statement.value))
        if isinstance(node, ast.Raise) and node.exc is not None:
            skip.update(id(sub) for sub in ast.walk(node.exc))
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)  # read as one, with the f-string
    found = []
    for node in ast.walk(tree):
        text = None if id(node) in skip else _text(node)
        if text is not None and PROSE.search(text):
            found.append((getattr(node, "lineno", 0), text))
    return found


def test_the_check_finds_a_sentence_and_leaves_numbers_docstrings_and_errors_alone():
    source = '''
def f(x, d):
    """A docstring is a sentence, and not the report's."""
    if x is None:
        raise ValueError(f"no value for {d}: give one")
    label = "n/a"
    cell = f"{x:.3g} pp"
    return f"The {d} is inconclusive: neither within nor beyond {x} is shown."
'''
    found = prose_in(source)
    assert [line for line, _ in found] == [8]
    assert prose_in('x = "the interval lies within the margin"') == [
        (1, "the interval lies within the margin")
    ]


def test_no_rendering_module_writes_prose():
    found = [
        f"{name}:{line}: {text!r}"
        for name in RENDERING
        for line, text in prose_in((COMPARE / name).read_text(encoding="utf-8"))
    ]
    assert not found, "prose outside cliptrack.compare.notes:\n" + "\n".join(found)


def test_notes_about_several_quantities_are_one_sentence_naming_them_all():
    """Two runs alike over 200 steps: the long-memory note of each of five quantities is one line,
    written from its reason with the quantities listed (no note text is edited)."""
    runs = megatron_vs_miles()
    result = compare(
        RunSet.from_points(
            (LoadedRun(RunInfo(r.run_id, r.run_name, r.backend), "test"), r.points) for r in runs
        )
    )
    lines = result.grouped_notes()
    memory = [line for line in lines if "long-memory test" in line]
    assert memory == [
        "Note: miles-run vs megatron-run: each of clip_fraction, clip_low_fraction, clip_high_fraction, "
        "reward and throughput is equivalent over 200 paired units, short of the about 470 the "
        "long-memory test needs (more with a trend or strong persistence): the interval assumes short "
        "memory (docs/STATISTICS.md, long memory)"
    ]
    assert sum("long-memory test" in n.text for n in result.notes) == 5
    assert lines[0].startswith("Aligned by step, all steps; 90% intervals: ")


AXES = {"step", "tokens", "time", "tokens_seen", "elapsed_s"}
"""The alignments and the frame columns that are their axes."""


def axis_word_maps(source: str) -> list[int]:
    """Lines of the dict literals of ``source`` that put words to two or more axes (string values;
    ``align.ALIGNMENTS``' columns, ``step``/``tokens_seen``/``elapsed_s``, are names, not words)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Dict):
            continue
        keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
        values = {v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)}
        if len(keys & AXES) >= 2 and values and not values <= {"step", "tokens_seen", "elapsed_s"}:
            found.append(node.lineno)
    return found


def test_the_axes_are_worded_in_one_place():
    """``notes.words.AXIS_WORDS`` is the one map of axis -> words in the comparison (and the check
    finds a second one)."""
    assert axis_word_maps('W = {"step": "steps", "time": "seconds"}') == [1]
    assert axis_word_maps('ALIGNMENTS = {"step": "step", "tokens": "tokens_seen", "time": "elapsed_s"}') == []
    found = [
        f"{path.relative_to(COMPARE)}:{line}"
        for path in sorted(COMPARE.rglob("*.py"))
        if "_vendor" not in path.parts and path != COMPARE / "notes" / "words.py"
        for line in axis_word_maps(path.read_text(encoding="utf-8"))
    ]
    assert not found, f"axis words outside notes/words.py: {found}"
