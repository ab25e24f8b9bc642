"""``cliptrack notebook``: run the comparison notebook headless and write the executed copy.

The notebook ships inside the package (``cliptrack/cli/compare_backends.ipynb``, package data; the
repository's ``notebooks/compare_backends.ipynb`` is the same file, for working in Jupyter), so the
command runs from any folder. It reads the demo's output (``--demo-out DIR``, else
``CLIPTRACK_DEMO_OUT``, else ``./cliptrack-demo``: the notebook's own default) and compares the
demo's stacks over seeds and its control, as the demo's terminal does; or, from the store named by
``--tracking-uri`` or ``--jsonl``, the latest finished run of each backend. It executes every cell
with nbclient on a ``python3`` kernel started in the working directory, writes
``<out>/compare_backends.executed.ipynb`` with the outputs (``--out DIR``; default: the demo's
output folder, or the working directory when a store is named), then prints its path and what the
notebook's verdict cell printed.

The values given are put in a cell of their own after the notebook's ``parameters`` cell (tagged
``injected-parameters``, as papermill does), so the executed copy shows both. Nothing is written
unless every cell ran: no demo output, a store that cannot be read or a cell that fails is one line
on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from cliptrack.backends.preflight import StoreError, resolve_tracking_uri
from cliptrack.cli.demo import DEFAULT_OUT, find_output
from cliptrack.core.secrets import redact, redact_value
from cliptrack.core.text import printable

NOTEBOOK = "compare_backends.ipynb"
"""The shipped notebook, package data of ``cliptrack.cli``."""
EXECUTED = "compare_backends.executed.ipynb"
"""The executed copy's file name in ``--out``."""
DEMO_OUT_ENV = "CLIPTRACK_DEMO_OUT"
"""The environment variable the notebook reads the demo's output folder from."""
CELL_TIMEOUT_S = 600
"""Seconds one cell may run."""
KERNEL = "python3"
"""The kernel the notebook runs on (jupyter_client starts it with this interpreter)."""
KERNEL_ARGUMENTS = ["--IPKernelApp.log_level=ERROR"]
"""The kernel process's own log: errors only (not ipykernel's start-up warning about its local TCP
transport); what the cells print is in the notebook."""
EXIT_FAILED = 2
VERDICT_TAG = "verdict"
"""The tag of the notebook's cell whose printed lines (the headline and the verdicts) the command
repeats on stdout."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        metavar="DIR",
        help=f"folder to write {EXECUTED} to (default: the demo's output folder, or the working "
        "directory when --tracking-uri or --jsonl is given)",
    )
    parser.add_argument(
        "--demo-out",
        metavar="DIR",
        help=f"the folder `cliptrack demo` wrote (default: {DEMO_OUT_ENV}, else ./{DEFAULT_OUT})",
    )
    store = parser.add_mutually_exclusive_group()
    store.add_argument(
        "--tracking-uri",
        metavar="URI",
        help="read the latest finished run of each backend from this MLflow store instead of the demo's "
        "(sqlite:///PATH/mlflow.db, a plain PATH to a database file, or http://HOST:PORT)",
    )
    store.add_argument(
        "--jsonl", metavar="DIR", help="read the latest run of each backend from this JSONL spool directory"
    )


def shipped_notebook() -> str:
    """The notebook's text, as installed with the package."""
    return resources.files("cliptrack.cli").joinpath(NOTEBOOK).read_text(encoding="utf-8")


class NotebookError(Exception):
    """Why the notebook cannot run or did not run through: one line for stderr."""


def _parameters(args: argparse.Namespace) -> tuple[dict[str, Any], Path]:
    """The notebook parameters to set and the default output folder; NotebookError when the runs
    to read are not there (checked before any kernel starts)."""
    if args.tracking_uri:
        try:
            return {"TRACKING_URI": resolve_tracking_uri(args.tracking_uri)}, Path.cwd()
        except StoreError as exc:
            raise NotebookError(str(exc)) from None
    if args.jsonl:
        spool = Path(args.jsonl).expanduser().resolve()
        if not spool.is_dir():
            raise NotebookError(
                f"no JSONL spool directory {spool} (--jsonl): pass the folder the tracker wrote"
            )
        return {"JSONL_DIR": str(spool)}, Path.cwd()
    given = args.demo_out or os.environ.get(DEMO_OUT_ENV) or DEFAULT_OUT
    try:
        demo = find_output(Path(given).expanduser())  # the notebook's own check and message
    except FileNotFoundError as exc:
        raise NotebookError(
            f"{exc}; then: cliptrack notebook --demo-out DIR (or --tracking-uri / --jsonl for other runs)"
        ) from None
    return {"DEMO_OUT": str(demo)}, demo


def with_parameters(text: str, parameters: dict[str, Any]) -> Any:
    """The notebook ``text`` with a cell setting ``parameters`` after its ``parameters`` cell."""
    import nbformat

    nb = nbformat.reads(text, as_version=4)
    at = next((i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])), -1)
    lines = ["# Parameters set by `cliptrack notebook`", *(f"{k} = {v!r}" for k, v in parameters.items())]
    cell = nbformat.v4.new_code_cell("\n".join(lines), metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(at + 1, cell)
    return nb


def verdict_text(nb: Any) -> str:
    """What the executed ``nb``'s verdict cell (tagged :data:`VERDICT_TAG`) printed on stdout."""
    return "".join(
        output.get("text", "")
        for cell in nb.cells
        if VERDICT_TAG in cell.get("metadata", {}).get("tags", [])
        for output in cell.get("outputs", [])
        if output.get("output_type") == "stream" and output.get("name") == "stdout"
    )


def _first_error(nb: Any) -> str:
    """``Name: value`` of the first error output of ``nb``'s cells."""
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                return f"{output.get('ename')}: {output.get('evalue')}"
    return "a cell failed"


def execute(nb: Any, cwd: Path) -> None:
    """Run every cell of ``nb`` in place, the kernel started in ``cwd``; NotebookError on a failure."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name=KERNEL,
        resources={"metadata": {"path": str(cwd)}},
        extra_arguments=KERNEL_ARGUMENTS,
    )
    try:
        client.execute()
    except CellExecutionError:
        raise NotebookError(f"the notebook stopped: {_first_error(nb)}; nothing was written") from None


def write(nb: Any, out: Path) -> Path:
    """Write ``nb`` as ``out/EXECUTED`` (the folder made if needed), through a temporary file, with
    every credential in it redacted: the kernel ran with the tracking URI as given (a database
    password in it), the file keeps ``***`` in its place, in the parameters cell and in any output."""
    import nbformat

    out.mkdir(parents=True, exist_ok=True)
    path = out / EXECUTED
    partial = out / f".{EXECUTED}.partial"
    nbformat.write(nbformat.from_dict(redact_value(nb)), str(partial))
    partial.replace(path)
    return path


def run(args: argparse.Namespace) -> int:
    try:
        import nbclient  # noqa: F401 - the notebook extra, checked before anything else
        import nbformat  # noqa: F401
    except ImportError as exc:
        print(
            f"cliptrack notebook needs nbclient, nbformat and ipykernel ({exc}): "
            "pip install 'cliptrack[notebooks]'",
            file=sys.stderr,
        )
        return EXIT_FAILED
    try:
        parameters, default_out = _parameters(args)
        nb = with_parameters(shipped_notebook(), parameters)
        execute(nb, Path.cwd())
    except NotebookError as exc:
        print(f"cliptrack notebook: {printable(' '.join(str(exc).split()))}", file=sys.stderr)
        return EXIT_FAILED
    out = Path(args.out).expanduser().resolve() if args.out else default_out
    path = write(nb, out)
    said = redact(verdict_text(nb)).strip()
    if said:
        print("the notebook says:")
        print("\n".join(f"  {printable(line)}" if line else "" for line in said.splitlines()))
    print(f"executed notebook, with its outputs: {path}")
    print(f"  to work in it in Jupyter (not in any extra): pip install jupyterlab && jupyter lab {path}")
    return 0
