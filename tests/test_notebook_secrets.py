"""``cliptrack notebook --tracking-uri`` with a database password in the URI: the kernel reads the
runs with it, and the executed notebook it writes holds ``***`` in its place — in the parameters
cell and in every output — as do its stdout and stderr. The store is MLflow's on PostgreSQL
(Debian's package, started by the test; skipped with the reason where it cannot run)."""

from __future__ import annotations

import nbformat
import pytest
from cliptrack.cli.notebook import EXECUTED, write

from tests import _postgres
from tests._compare_fixtures import megatron_vs_miles, write_mlflow
from tests._harness import free_port
from tests._tools import needs_postgres
from tests.test_notebook_command import _cliptrack

PASSWORD = "nb-S3cret-pw-7f1d"
"""The cluster's password: in the URI the notebook is given, never in what it writes or prints."""


def test_the_writer_redacts_the_parameters_cell_and_every_output(tmp_path) -> None:
    """Without a server: a notebook whose parameters cell and outputs (a stream, a result, an
    error's traceback) carry a URI with a password is written with ``***`` in each place."""
    uri = f"postgresql://user:{PASSWORD}@db.example:5432/mlflow"
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(f"TRACKING_URI = {uri!r}")
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text=f"reading {uri}\n"),
        nbformat.v4.new_output("execute_result", data={"text/plain": repr(uri)}, execution_count=1),
        nbformat.v4.new_output("error", ename="OperationalError", evalue=uri, traceback=[f"at {uri}"]),
    ]
    nb.cells.append(cell)
    text = write(nb, tmp_path).read_text()
    assert PASSWORD not in text
    assert text.count("postgresql://user:***@db.example:5432/mlflow") == 5
    nbformat.validate(nbformat.reads(text, as_version=4))


@pytest.fixture(scope="module")
def store():
    """A PostgreSQL cluster whose database ``store`` is an MLflow store with two runs."""
    if _postgres.unavailable():
        pytest.skip(_postgres.unavailable() or "")
    try:
        with _postgres.running(free_port(), PASSWORD) as server:
            server.createdb("store")
            uri = server.uri("store")
            for run in megatron_vs_miles(n_megatron=120, n_miles=120):
                write_mlflow(uri, run)
            yield uri
    except _postgres.PostgresError as exc:  # pragma: no cover - a host where the package cannot start
        pytest.skip(f"PostgreSQL cannot run here: {str(exc)[:500]}")


@pytest.mark.slow
@needs_postgres
def test_the_executed_notebook_never_holds_the_password(store, tmp_path) -> None:
    assert PASSWORD in store
    proc = _cliptrack(["notebook", "--tracking-uri", store, "--out", "results"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "results" / EXECUTED).read_text()
    assert PASSWORD not in text and PASSWORD not in proc.stdout and PASSWORD not in proc.stderr
    assert store.replace(PASSWORD, "***") in text  # the parameters cell, redacted
    nb = nbformat.reads(text, as_version=4)
    assert any(c.get("outputs") for c in nb.cells if c.cell_type == "code")  # it ran on the runs
