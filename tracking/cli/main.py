"""The ``cliptrack`` command line: one subcommand per module, imported only when that command runs.

Each command names the module that declares its arguments (``add_arguments(parser)``) and the
module that runs it (``run(args) -> int``); both are imported only for the command given, so
``cliptrack --help`` imports no subcommand and ``cliptrack compare --help`` only the light
``cliptrack.cli.compare`` (no numpy or pandas).

A failure is one line on stderr and exit code 2; ``--debug`` shows the traceback instead, with the
same exit code.
Everything a command prints on stdout and stderr is redacted (``cliptrack.core.secrets``: no password,
token or API key of a store address or the environment is shown).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
import traceback
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

from cliptrack.cli.errors import error_text
from cliptrack.core.secrets import redacted_output
from cliptrack.core.text import printable


@dataclass(frozen=True)
class Command:
    """A subcommand: its help line, the module declaring its arguments and the module running it."""

    help: str
    run_module: str
    args_module: str | None = None
    """Module with ``add_arguments``; None: ``run_module`` declares them too."""

    @property
    def arguments_from(self) -> str:
        return self.args_module or self.run_module


COMMANDS = {
    "demo": Command(
        "train a small policy through both stacks, log and compare the runs", "cliptrack.cli.demo"
    ),
    "compare": Command(
        "compare runs: table, verdict, optional HTML dashboard",
        "cliptrack.cli.compare",
    ),
    "probe": Command(
        "compare two stacks' outputs of the same batch per datum (a paired probe)", "cliptrack.cli.probe"
    ),
    "runs": Command("list a store's runs: ids, names, status, start time, steps", "cliptrack.cli.runs"),
    "panels": Command(
        "draw a comparison in a backend's own UI (cliptrack panels BACKEND)", "cliptrack.cli.panels"
    ),
    "notebook": Command(
        "run the comparison notebook on the demo's runs (or a store) and write the executed copy",
        "cliptrack.cli.notebook",
    ),
    "watch": Command(
        "follow a run's series against a band and print each breach (a live watch)", "cliptrack.cli.watch"
    ),
    "replay": Command(
        "push spooled points to their backends without duplicating any", "cliptrack.log.replay"
    ),
}
EXIT_USAGE = 2
"""Exit code of every failure the command line reports (argparse's own usage errors included)."""


def selected_command(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (its first word that is a command), or None."""
    for word in argv:
        if word in COMMANDS:
            return word
        if not word.startswith("-"):
            return None
    return None


class Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors suggest the nearest flag or command to a mistyped one."""

    def error(self, message: str) -> NoReturn:
        super().error(message + suggestion(self, message))


def _options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of ``parser`` and of its sub-commands' parsers, and the commands' names."""
    found: set[str] = set()
    for action in parser._actions:
        found.update(s for s in action.option_strings if s.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
            for sub in action.choices.values():
                found |= _options(sub)
    return found


def suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    """`` (did you mean --tracking-uri?)`` for an unrecognised flag or an invalid command close to a
    known one; empty otherwise."""
    words = []
    if message.startswith("unrecognized arguments: "):
        words = [w.split("=", 1)[0] for w in message.split(": ", 1)[1].split() if w.startswith("--")]
    elif "invalid choice: " in message:
        words = [message.split("invalid choice: ", 1)[1].split(" ", 1)[0].strip("'")]
    known = sorted(_options(parser))
    near = [m for w in words for m in difflib.get_close_matches(w, known, n=1, cutoff=0.7)]
    return f" (did you mean {' or '.join(dict.fromkeys(near))}?)" if near else ""


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``selected``'s arguments are declared (its module imported), or every
    command's when ``selected`` is ``"*"``."""
    parser = Parser(
        prog="cliptrack", description="Exact PPO/CISPO clip fractions, tracked and compared across RL stacks."
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of a failure")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        subparser = sub.add_parser(name, help=command.help, description=command.help)
        subparser.set_defaults(_command=name)
        subparser.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
        if selected not in (name, "*"):
            continue
        try:
            module = importlib.import_module(command.arguments_from)
        except ImportError as exc:
            subparser.set_defaults(_unavailable=f"cliptrack {name} is unavailable: {exc}")
            continue
        module.add_arguments(subparser)
    return parser


def _run(args: argparse.Namespace) -> int:
    if getattr(args, "_unavailable", None):
        print(args._unavailable, file=sys.stderr)
        return EXIT_USAGE
    module = importlib.import_module(COMMANDS[args._command].run_module)
    return int(module.run(args) or 0)


def _one_line_warning(message: Warning | str, category: type[Warning], *_: object, **__: object) -> str:
    """A warning as ``cliptrack: warning: ...`` on one line (no source file and line); a category
    with a ``label`` (``"note"``) is shown under that word instead."""
    label = getattr(category, "label", "warning")
    return f"cliptrack: {label}: {printable(' '.join(str(message).split()))}\n"


def rewritten(selected: str | None, argv: list[str]) -> list[str]:
    """``argv`` with the words after ``selected`` passed through its arguments module's
    ``rewrite_argv`` when it has one (``compare``: ``--json=FILE`` as ``--json-file FILE``)."""
    if selected is None:
        return argv
    try:
        module = importlib.import_module(COMMANDS[selected].arguments_from)
    except ImportError:
        return argv
    rewrite = getattr(module, "rewrite_argv", None)
    if rewrite is None:
        return argv
    at = argv.index(selected) + 1
    return [*argv[:at], *rewrite(argv[at:])]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    selected = selected_command(argv)
    args = build_parser(selected).parse_args(rewritten(selected, argv))
    with redacted_output():  # no credential in anything a command prints (cliptrack.core.secrets)
        return _guarded(args)


def _guarded(args: argparse.Namespace) -> int:
    shown = warnings.formatwarning
    warnings.formatwarning = _one_line_warning  # type: ignore[assignment]
    try:
        return _run(args)
    except KeyboardInterrupt:
        print(f"cliptrack {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - the command line's one boundary: one line, or the traceback
        if args.debug:  # the traceback, and the same exit code as without --debug
            traceback.print_exc()
            return EXIT_USAGE
        print(error_text(args.command, exc, " (--debug shows the traceback)"), file=sys.stderr)
        return EXIT_USAGE
    finally:
        warnings.formatwarning = shown


if __name__ == "__main__":
    sys.exit(main())
