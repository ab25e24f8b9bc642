"""``cliptrack compare RUN_A RUN_B [...]`` or ``cliptrack compare --group A=RUN,RUN --group B=RUN,RUN``:
load runs, print the verdict table and summary; ``--fail-on`` makes it a CI gate.

Runs are named by id or name in one store, by any registered backend's store flag:
``--tracking-uri`` (MLflow, the default store), ``--jsonl DIR`` (the spool), ``--wandb-dir DIR``
(W&B run files) or ``--csv DIR`` (the CSV backend); ``entity/project/run_id`` references with no
store named go through the W&B public API.

Exit codes: 0 compared (and the gate, if any, passed); 1 the ``--fail-on`` gate tripped; 2 a usage
or data error (bad arguments, a run not found, data that cannot be compared), with ``--debug`` too
(which prints the traceback as well).

Imports stay light (no pandas, no numpy) until a comparison runs, so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from typing import Any

from cliptrack.backends.options import add_source_arguments, source_arguments
from cliptrack.cli.errors import error_text
from cliptrack.compare.align import ALIGNMENTS, check_window
from cliptrack.compare.quantities import (
    QUANTITIES,
    RELATIVE_MARGIN,
    REWARD_ABS_MARGIN,
    Margin,
    Quantity,
    absolute,
    parse_margin,
    quantity,
    relative,
)
from cliptrack.compare.result import FAIL_ON
from cliptrack.compare.window import parse_window
from cliptrack.compare.worst import worst_sequences
from cliptrack.core.text import printable

EXIT_PASSED = 0
"""Compared; the ``--fail-on`` gate, if any, passed."""
EXIT_GATE = 1
"""The ``--fail-on`` gate tripped."""
EXIT_ERROR = 2
"""A usage or data error."""


def add_comparison_arguments(parser: argparse.ArgumentParser) -> None:
    """Alignment, window, margins and confidence."""
    parser.add_argument(
        "--align",
        choices=sorted(ALIGNMENTS),
        default="step",
        help="pair runs by trainer step, by tokens seen, or by wall time (default: step)",
    )
    parser.add_argument(
        "--window", metavar="A:B", help="keep A <= x < B on the alignment axis (steps, tokens or s)"
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="an absolute clip-fraction margin (fraction of tokens, e.g. 0.002 = ±0.2 pp) at every level, "
        "instead of the default relative one (same as --margin clip_fraction=0.002)",
    )
    parser.add_argument(
        "--reward-tolerance",
        type=float,
        default=None,
        help=f"reward margin, relative (log-ratio scale) when both rewards are clearly away from "
        f"zero (default {RELATIVE_MARGIN})",
    )
    parser.add_argument(
        "--reward-abs-tolerance",
        type=float,
        default=REWARD_ABS_MARGIN,
        help=f"reward margin in reward units, used when the rewards are near zero "
        f"(default {REWARD_ABS_MARGIN})",
    )
    parser.add_argument(
        "--throughput-tolerance",
        type=float,
        default=None,
        help=f"throughput margin on the log-ratio scale: 0.05 means |log(B/A)| < log(1.05) "
        f"(default {RELATIVE_MARGIN})",
    )
    defaults = "; ".join(f"{q.name} {q.margin_text()}" for q in QUANTITIES if q.verdict)
    parser.add_argument(
        "--margin",
        action="append",
        default=[],
        metavar="QUANTITY=VALUE",
        help="margin of any compared quantity, repeatable: VALUE%% is relative (25%%: |log(B/A)| < "
        "log(1.25), the quantity's absolute floor near zero), RELATIVE,FLOOR relative with that floor "
        "(25%%,0.0001), a plain number absolute in the quantity's units at every level "
        f"(defaults: {defaults.replace('%', '%%')})",
    )
    parser.add_argument(
        "--margin-floor",
        action="append",
        default=[],
        metavar="QUANTITY=VALUE",
        help="the absolute floor of a relative margin (the margin near zero, in the quantity's units), "
        "repeatable",
    )
    parser.add_argument("--confidence", type=float, default=0.90, help="interval confidence (default 0.90)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "exit codes: 0 compared (and the --fail-on gate, if given, passed); 1 the --fail-on gate tripped; "
        "2 usage or data error"
    )
    parser.add_argument(
        "runs", nargs="*", metavar="RUN", help="run ids or names; the first is the reference (or use --group)"
    )
    parser.add_argument(
        "--group",
        action="append",
        default=[],
        metavar="NAME=RUN,RUN,...",
        help="a stack as a group of 2+ seeds, repeatable (the first group is the reference): "
        "intervals then include the between-seed variation",
    )
    parser.add_argument(
        "--group-by",
        metavar="TAG",
        help="group the runs named (or, with none named, every run of the store or experiment) into "
        "stacks by a tag: 'stack' (the run's backend label) or a run parameter such as 'recipe'; "
        "each group needs 2+ seeds",
    )
    parser.add_argument(
        "--fail-on",
        choices=FAIL_ON,
        help="CI gate on the on-policy answer: exit 1 when it is 'different', or (not-equivalent) "
        "anything but 'equivalent'",
    )
    add_source_arguments(parser)
    add_comparison_arguments(parser)
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="every column of the table (intervals per run, step-weighted difference, lag-1, ESS, "
        "segments) and the full summary, however wide",
    )
    parser.add_argument("--html", metavar="OUT", help="also write the self-contained HTML dashboard here")
    parser.add_argument("--markdown", metavar="OUT", help="also write summary and table as markdown here")
    parser.add_argument(
        "--json",
        action="store_true",
        help="every estimate, interval, effective sample size, verdict and note as JSON, printed "
        "alone on stdout (--json takes no value: run ids may follow it)",
    )
    parser.add_argument(
        "--json-file",
        metavar="FILE",
        help="write that JSON to FILE, the table on stdout (also spelled --json=FILE)",
    )


JSON_FILE_SUFFIX = ".json"
"""A word right after ``--json`` ending so is read as its file, as before ``--json-file`` (a run id
never ends so)."""


def rewrite_argv(argv: list[str]) -> list[str]:
    """The words after ``compare`` with ``--json`` spelled as the parser takes it: ``--json=FILE``
    and the older ``--json FILE.json`` become ``--json-file FILE``, ``--json=-`` and ``--json -``
    become ``--json`` (stdout); a bare ``--json`` followed by run ids stays a flag. Words after
    ``--`` are left as they are."""
    out: list[str] = []
    words = iter(argv)
    for word in words:
        if word == "--":
            out += [word, *words]
            break
        if word.startswith("--json="):
            target = word.partition("=")[2]
            out += ["--json"] if target == "-" else ["--json-file", target]
            continue
        out.append(word)
    return _older_json_file(out)


def _older_json_file(argv: list[str]) -> list[str]:
    """``--json -`` as ``--json``, ``--json FILE.json`` as ``--json-file FILE.json`` (the older
    spellings of ``--json [FILE]``), before any ``--``."""
    end = argv.index("--") if "--" in argv else len(argv)
    for i in range(end - 1):
        if argv[i] != "--json":
            continue
        following = argv[i + 1]
        if following == "-":
            return [*argv[: i + 1], *argv[i + 2 :]]
        if following.lower().endswith(JSON_FILE_SUFFIX) and not following.startswith("-"):
            return [*argv[:i], "--json-file", *argv[i + 1 :]]
    return argv


def parse_groups(texts: list[str]) -> dict[str, list[str]]:
    """``["megatron=a,b", "miles=c,d"]`` -> ``{"megatron": ["a", "b"], "miles": ["c", "d"]}``;
    ValueError naming the bad argument."""
    groups: dict[str, list[str]] = {}
    for text in texts:
        name, sep, members = text.partition("=")
        runs = [r.strip() for r in members.split(",") if r.strip()]
        if not sep or not name.strip() or not runs:
            raise ValueError(f"--group {text!r} must be NAME=RUN,RUN,... (e.g. megatron=run-a,run-b)")
        if name.strip() in groups:
            raise ValueError(f"--group {name.strip()!r} is given twice")
        groups[name.strip()] = runs
    return groups


def _pairs(texts: list[str], flag: str, example: str) -> list[tuple[str, str]]:
    """``["a=1", "b=2%"]`` -> ``[("a", "1"), ("b", "2%")]``; ValueError naming the bad argument."""
    out = []
    for text in texts:
        name, sep, value = text.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ValueError(f"{flag} {text!r} must be QUANTITY=VALUE (e.g. {example})")
        out.append((name.strip(), value.strip()))
    return out


def _quantity(name: str, flag: str) -> Quantity:
    try:
        return quantity(name)
    except KeyError:
        raise ValueError(
            f"{flag} names unknown quantity {name!r}; known: {[q.name for q in QUANTITIES]}"
        ) from None


def parse_margins(args: argparse.Namespace) -> dict[str, Margin]:
    """Margins by quantity name (``quantities.Margin``) from ``--margin Q=V`` (``V%`` relative, a
    plain number absolute, for every quantity),
    ``--margin-floor Q=V`` and the named margin options."""
    margins: dict[str, Margin] = {}
    for name, value in _pairs(getattr(args, "margin", []), "--margin", "clip_fraction=25%"):
        try:
            margins[name] = parse_margin(_quantity(name, "--margin"), value)
        except ValueError as exc:
            raise ValueError(
                f"--margin {name}={value}: {exc}; write QUANTITY=NUMBER (absolute) or QUANTITY=PERCENT% "
                "(relative), e.g. clip_fraction=25%"
            ) from None
    for name, value in (
        ("clip_fraction", args.tolerance),
        ("reward", args.reward_tolerance),
        ("throughput", args.throughput_tolerance),
    ):
        if value is not None:
            margins[name] = absolute(value) if name == "clip_fraction" else relative(value)
    for name, value in _pairs(getattr(args, "margin_floor", []), "--margin-floor", "clip_fraction=0.0001"):
        q = _quantity(name, "--margin-floor")
        try:
            floor = float(value)
        except ValueError:
            raise ValueError(f"--margin-floor {name}={value!r}: the floor must be a number") from None
        given = margins.get(name, q.default_margin)
        if not given.is_relative:
            raise ValueError(f"--margin-floor {name}: the margin of {name} is absolute, so it has no floor")
        margins[name] = relative(given.value, floor)
    return margins


def load_and_compare(args: argparse.Namespace) -> tuple[Any, Any]:
    """Load the named runs (or groups) and compare them as the arguments say; return (runset, result)."""
    from cliptrack.backends.load import load_runs
    from cliptrack.compare.engine import compare

    groups = parse_groups(getattr(args, "group", []))
    if groups and args.runs:
        raise ValueError("name runs either as RUN arguments or with --group, not both")
    group_by = getattr(args, "group_by", None)
    if groups and group_by:
        raise ValueError("name groups either with --group or with --group-by, not both")
    refs = [r for members in groups.values() for r in members] if groups else args.runs
    margins, window = parse_margins(args), parse_window(args.window)  # usage errors before any loading
    runset = load_runs(refs, **source_arguments(args))
    check_window(runset, args.align, window)
    if groups:  # each ref as the label it was loaded under (a run set keeps the order of its refs)
        label = dict(zip(refs, runset.labels, strict=True))
        groups = {name: [label[ref] for ref in members] for name, members in groups.items()}
    result = compare(
        runset,
        groups=groups or None,
        group_by=group_by,
        align=args.align,
        window=window,
        margins=margins,
        reward_abs_tolerance=args.reward_abs_tolerance,
        confidence=args.confidence,
    )
    result.worst = worst_of_runs(runset, window if args.align == "step" else None)
    return runset, result


def worst_of_runs(runset: Any, window: Any = None) -> Any:
    """The runs' worst sequences and those that recur (``cliptrack.compare.worst``), over the step
    ``window`` when the comparison aligns by step; None when no run logged a table. Reading them
    never fails the comparison: a store that cannot give them back is named on stderr."""
    from cliptrack.backends.load import load_worst

    try:
        tables = load_worst(runset)
    except Exception as exc:  # noqa: BLE001 - a diagnostic: the verdicts stand without it
        print(f"cliptrack compare: the worst sequences could not be read: {printable(exc)}", file=sys.stderr)
        return None
    bounds = (None, None) if window is None else (window.start, window.end)
    return worst_sequences(tables, steps=bounds)


TERMINAL_WIDTH = 120
"""Columns of the printed table when stdout is not a terminal (``shutil.get_terminal_size``'s fallback)."""
OPTIONAL_COLUMNS = ("paired", "seeds", "margin")
"""Columns of the short table left out, in this order, while it is wider than the terminal."""


def terminal_width() -> int:
    """The terminal's width in columns (``TERMINAL_WIDTH`` when stdout is not a terminal)."""
    import shutil

    return shutil.get_terminal_size((TERMINAL_WIDTH, 24)).columns


def fit_table(frame: Any, width: int) -> str:
    """``frame`` as text no wider than ``width``: optional columns left out first
    (``OPTIONAL_COLUMNS``), then long cells cut short (``...``)."""
    import pandas as pd

    def render(f: Any, colwidth: int | None) -> str:
        with pd.option_context(
            "display.width", 10_000, "display.max_columns", 100, "display.max_colwidth", colwidth
        ):
            return str(f.to_string(index=False))

    def widest(text: str) -> int:
        return max((len(line) for line in text.splitlines()), default=0)

    text = render(frame, None)
    for column in OPTIONAL_COLUMNS:
        if widest(text) <= width:
            return text
        if column in frame.columns:
            frame = frame.drop(columns=[column])
            text = render(frame, None)
    colwidth = max((len(str(v)) for v in frame.astype(str).to_numpy().ravel()), default=8)
    while widest(text) > width and colwidth > 8:
        colwidth -= 2
        frame = frame.rename(columns=lambda c, w=colwidth: c if len(c) <= w else c[: w - 3] + "...")
        text = render(frame, colwidth)
    return text


def format_result(result: Any, *, width: int | None = None, verbose: bool = False) -> str:
    """What ``cliptrack compare`` prints: the verdict table fitted to ``width`` (default: the
    terminal's, ``TERMINAL_WIDTH`` off a terminal), then the headline (at most three lines: the
    verdict, the figure, what would change it), then the notes, grouped, each once. ``verbose``:
    every column of the table and the full plain-language summary instead. Every cell and column
    name is ``printable`` (the summary holds run-provided text so already)."""
    frame = result.formatted_table() if verbose else result.compact_table()
    frame = frame.rename(columns=printable).map(lambda v: printable(v) if isinstance(v, str) else v)
    worst = getattr(result, "worst", None)  # the worst sequences' lines (a diagnostic), last
    tail = "\n\n" + "\n".join(printable(line) for line in worst.note_lines()) if worst is not None else ""
    if verbose:
        table = fit_table(frame, 10_000)
        return f"{table}\n\n{result.summary()}{tail}"
    table = fit_table(frame, width or terminal_width())
    notes = result.grouped_notes()
    parts = [table, "\n".join(result.headline_lines())] + (["\n".join(notes)] if notes else [])
    return "\n\n".join(parts) + tail


def _gate(args: argparse.Namespace, result: Any) -> int:
    if not getattr(args, "fail_on", None):
        return EXIT_PASSED
    if result.gate_tripped(args.fail_on):
        print(
            f"cliptrack compare: gate --fail-on {args.fail_on} tripped: the on-policy answer is "
            f"{result.on_policy_verdict!r}",
            file=sys.stderr,
        )
        return EXIT_GATE
    return EXIT_PASSED


def run(args: argparse.Namespace) -> int:
    if len(args.runs) < 2 and not args.group and not args.experiment and not getattr(args, "group_by", None):
        print(
            "cliptrack compare: name at least two runs (RUN_A RUN_B ...), two groups (--group "
            "NAME=RUN,RUN), or group every run of the store by a parameter (--group-by PARAM)",
            file=sys.stderr,
        )
        return EXIT_ERROR
    try:
        runset, result = load_and_compare(args)
    except (LookupError, ValueError, FileNotFoundError) as exc:
        if getattr(args, "debug", False):  # the traceback, and still the exit code of a data error
            traceback.print_exc()
        else:
            print(error_text("compare", exc), file=sys.stderr)
        return EXIT_ERROR
    files = _write_files(args, runset, result)
    if args.json:  # stdout is the JSON alone; where the files went, on stderr
        print(result.to_json())
        for line in files:
            print(line, file=sys.stderr)
        return _gate(args, result)
    print(format_result(result, verbose=args.verbose))
    for line in files:
        print(line)
    return _gate(args, result)


def _write_files(args: argparse.Namespace, runset: Any, result: Any) -> list[str]:
    """Write what ``--json-file``, ``--html`` and ``--markdown`` ask for; one line per file written
    saying where."""
    from pathlib import Path

    lines = []
    if args.json_file:
        Path(args.json_file).write_text(result.to_json() + "\n", encoding="utf-8")
        lines.append(f"json: {args.json_file}")
    if args.html:
        from cliptrack.compare.views.dashboard import write_dashboard

        lines.append(f"\ndashboard: {write_dashboard(args.html, runset, result)}")
    if args.markdown:
        Path(args.markdown).write_text(result.to_markdown(), encoding="utf-8")
        lines.append(f"markdown: {args.markdown}")
    return lines
