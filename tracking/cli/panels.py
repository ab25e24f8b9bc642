"""``cliptrack panels BACKEND ...``: draw a comparison in a backend's own UI.

One sub-command per registered backend that declares a ``panels`` part
(``cliptrack.backends.registry``): its ``HELP`` is the sub-command's help, its ``add_arguments``
its flags and its ``run`` the command. The built-in ones are ``cliptrack panels mlflow``
(``cliptrack.cli.mlflow_panels``) and ``cliptrack panels wandb`` (``cliptrack.cli.wandb_panels``).
"""

from __future__ import annotations

import argparse
import sys

from cliptrack.backends.registry import BACKENDS, backend, resolve
from cliptrack.cli.errors import error_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="target", required=True, metavar="BACKEND")
    for declared in BACKENDS.values():
        if declared.panels is None:
            continue
        part = resolve(declared, "panels")
        part.add_arguments(sub.add_parser(declared.name, help=part.HELP))


def run(args: argparse.Namespace) -> int:
    try:
        status: int = resolve(backend(args.target), "panels").run(args)
        return status
    except (LookupError, ValueError, FileNotFoundError) as exc:
        print(error_text("panels", exc), file=sys.stderr)
        return 2
