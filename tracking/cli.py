"""The ``cliptrack`` command line: one subcommand per module, imported only when used.

Each command module exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "demo": ("tracking.demo", "train a small policy through both stacks, log and compare the runs"),
    "replay": ("tracking.replay", "push spooled points to their backends without duplicating any"),
    "compare": ("tracking.compare.cli", "compare runs: table, verdict, optional HTML dashboard"),
    "panels": ("tracking.compare.panels_cli", "build W&B workspace/report or MLflow comparison panels"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cliptrack", description="Exact PPO/CISPO clip fractions, tracked and compared across RL stacks."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            command.set_defaults(_unavailable=f"cliptrack {name} is unavailable: {exc}")
            continue
        module.add_arguments(command)
        command.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "_unavailable", None):
        print(args._unavailable, file=sys.stderr)
        return 2
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
