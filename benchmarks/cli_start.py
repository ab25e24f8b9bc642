"""``cliptrack --help`` and ``cliptrack compare --help`` start-up, side by side with the previous
command line that imported every subcommand's module to declare its arguments.

Each row is the median wall time of a fresh ``python`` process (interleaved with its anchor, so
load on the machine hits both alike). The anchor of every row is a bare ``python -c pass``, the
floor no command line can go below. Target: ``--help`` and ``compare --help`` <= 0.3 s.
Run: ``python benchmarks/cli_start.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._timing import Row, interleaved_medians, markdown  # noqa: E402 - importable once ROOT is on sys.path

REPEATS = 9
PREVIOUS = (
    "import argparse, importlib, sys\n"
    "import cliptrack.compare\n"
    "from cliptrack.cli.main import COMMANDS\n"
    "[getattr(cliptrack.compare, name) for name in cliptrack.compare._HOMES]\n"
    "p = argparse.ArgumentParser(prog='cliptrack')\n"
    "sub = p.add_subparsers(dest='command', required=True)\n"
    "for name, c in COMMANDS.items():\n"
    "    s = sub.add_parser(name)\n"
    "    importlib.import_module(c.run_module)\n"
    "    importlib.import_module(c.arguments_from).add_arguments(s)\n"
    "p.parse_args(sys.argv[1:])\n"
)
"""The previous start-up: every command's module imported before parsing, and with it every module
of ``cliptrack.compare`` (its ``__init__`` imported them all before names were loaded on first use)."""


def _process(*argv: str) -> object:
    return lambda: subprocess.run(
        [sys.executable, *argv], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
    )


def run(repeats: int = REPEATS) -> list[Row]:
    fns = {
        "python -c pass": _process("-c", "pass"),
        "cliptrack --help": _process("-m", "cliptrack.cli.main", "--help"),
        "cliptrack compare --help": _process("-m", "cliptrack.cli.main", "compare", "--help"),
        "previous cliptrack --help (every subcommand imported)": _process("-c", PREVIOUS, "--help"),
        "previous cliptrack compare --help": _process("-c", PREVIOUS, "compare", "--help"),
    }
    medians = interleaved_medians(fns, repeats, warmup=1)  # type: ignore[arg-type]
    floor = medians["python -c pass"]
    rows = []
    for name in ("cliptrack --help", "cliptrack compare --help"):
        previous = medians[
            f"previous {name}"
            if name != "cliptrack --help"
            else "previous cliptrack --help (every subcommand imported)"
        ]
        rows.append(Row(name, medians[name], "python -c pass", medians[name] / floor, "≤ 0.3 s"))
        rows.append(
            Row(
                f"{name}",
                medians[name],
                "previous start-up (every subcommand imported)",
                medians[name] / previous,
            )
        )
    for name in fns:
        if name.startswith("previous"):
            rows.append(Row(name, medians[name], "python -c pass", medians[name] / floor))
    return rows


def main() -> int:
    print(markdown(run()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
