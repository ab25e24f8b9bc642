"""``cliptrack probe A.json B.json``: the same batch through two stacks, compared per datum.

Each file holds one ``ForwardBackwardOutput`` as JSON (what a REST frontend returns, or
``cliptrack.adapters.miles.output_to_json``) with per-datum outputs of the same datums, computed by
one stack each (:func:`cliptrack.compare.probe.compare_outputs`). Prints the verdict and one line
per quantity; ``--json`` every number.

Exit codes, as ``cliptrack compare --fail-on not-equivalent``: 0 equivalent; 1 different or
inconclusive; 2 a usage or data error, or too few datums for a verdict (insufficient data).

Every value is checked (:mod:`cliptrack.compare.probe_input`: counts whole, >= 0 and within the
datum's tokens, the gauge's sums in their ranges, one clip side per token) and a bad one refused
naming the file, the datum and the field (exit 2). The summary's labels (the file names by
default) are redacted and escaped for the terminal. Memory: about 3.5 times the larger file plus
9 bytes per token of both (``probe_input``'s docstring): two 152 MB files peak at 651 MB.

Imports stay light (no numpy) until a probe runs, so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cliptrack.compare.quantities import Margin, margin_from_text
from cliptrack.compare.stats.estimate import EQUIVALENT, INSUFFICIENT

EXIT_EQUIVALENT = 0
EXIT_NOT_EQUIVALENT = 1
EXIT_ERROR = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "exit codes: 0 equivalent; 1 different or inconclusive; 2 usage or data error, or insufficient data"
    )
    parser.add_argument("a", metavar="A.json", help="the reference stack's output of the batch (JSON)")
    parser.add_argument("b", metavar="B.json", help="the other stack's output of the same batch (JSON)")
    parser.add_argument(
        "--labels", metavar="A,B", default=None, help="the stacks' names (default: the file names)"
    )
    parser.add_argument("--confidence", type=float, default=0.90, help="interval confidence (default 0.90)")
    parser.add_argument(
        "--margin",
        action="append",
        default=[],
        metavar="QUANTITY=VALUE",
        help="a quantity's margin, repeatable, as cliptrack compare writes it: 10%% relative (of the "
        "quantity's size, never below its default floor), 10%%,0.001 relative with its floor, 0.001 "
        "absolute (quantities: logprob_gap, clip_fraction, kl_k3, abs_log_ratio, loss)",
    )
    parser.add_argument("--json", action="store_true", help="every number as JSON on stdout")


def _margins(specs: list[str]) -> dict[str, Margin]:
    """``--margin Q=V`` as written for ``cliptrack compare`` (``quantities.margin_from_text``)."""
    margins: dict[str, Margin] = {}
    for spec in specs:
        name, eq, value = spec.partition("=")
        if not eq or not name.strip():
            raise ValueError(f"--margin {spec!r}: expected QUANTITY=VALUE, e.g. clip_fraction=10%,0.001")
        margins[name.strip()] = margin_from_text(name.strip(), value)
    return margins


def run(args: argparse.Namespace) -> int:
    from cliptrack.compare.probe import compare_outputs

    labels = tuple(args.labels.split(",")) if args.labels else (Path(args.a).stem, Path(args.b).stem)
    if len(labels) != 2 or not all(labels):
        raise ValueError(f"--labels {args.labels!r}: expected two names, A,B")
    result = compare_outputs(  # the files are read one at a time (a bad value named by file, datum, field)
        args.a,
        args.b,
        confidence=args.confidence,
        margins=_margins(args.margin),
        labels=(labels[0], labels[1]),
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(result.summary())
    if result.verdict == INSUFFICIENT:
        print(f"cliptrack probe: {result.verdict}: no verdict", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_EQUIVALENT if result.verdict == EQUIVALENT else EXIT_NOT_EQUIVALENT
