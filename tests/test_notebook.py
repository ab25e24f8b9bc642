"""``notebooks/compare_backends.ipynb`` runs end to end, headless, against runs this test writes."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from tests._compare_fixtures import megatron_vs_miles, write_jsonl, write_mlflow

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "compare_backends.ipynb"


def test_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].metadata.get("tags") == ["parameters"]
    assert all(c.outputs == [] and c.execution_count is None for c in code)


def _with_parameters(**params) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    cell.source += "\n# injected by tests/test_notebook.py\n" + "\n".join(
        f"{k} = {v!r}" for k, v in params.items()
    )
    return nb


def _outputs(nb: nbformat.NotebookNode) -> str:
    return json.dumps([o for c in nb.cells if c.cell_type == "code" for o in c.outputs])


@pytest.mark.slow
def test_notebook_executes_against_mlflow_runs(tmp_path):
    from nbclient import NotebookClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    megatron, miles = megatron_vs_miles(miles_clip_p=0.16, miles_missing=(5,))
    ids = [write_mlflow(uri, megatron), write_mlflow(uri, miles)]
    nb = _with_parameters(TRACKING_URI=uri, RUN_IDS=ids)
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    text = _outputs(nb)
    assert "on-policy verdict: different" in text
    assert "Not equally on-policy" in text
    assert "effective sample size" in text and "lag-1" in text and "left out of the paired comparison" in text
    assert sum(1 for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})) == 1
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []


@pytest.mark.slow
def test_notebook_executes_against_jsonl_runs(tmp_path):
    from nbclient import NotebookClient

    for run in megatron_vs_miles():
        write_jsonl(tmp_path / "spool", run)
    nb = _with_parameters(
        JSONL_DIR=str(tmp_path / "spool"), RUN_IDS=["megatron-run", "miles-run"], ALIGN="tokens"
    )
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    assert "on-policy verdict: equivalent" in _outputs(nb)


@pytest.mark.slow
def test_notebook_says_insufficient_data_for_short_runs(tmp_path):
    from nbclient import NotebookClient

    for run in megatron_vs_miles(n_megatron=40, n_miles=40, miles_clip_p=0.3):
        write_jsonl(tmp_path / "spool", run)
    nb = _with_parameters(JSONL_DIR=str(tmp_path / "spool"), RUN_IDS=["megatron-run", "miles-run"])
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    text = _outputs(nb)
    assert "on-policy verdict: insufficient data" in text
    assert "only 40 paired units (minimum 100)" in text
