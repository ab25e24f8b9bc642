"""``cliptrack notebook``, the command the demo prints for its notebook: run from a folder that is not
the repository, it executes the notebook shipped in the package against the demo's output and
writes the executed copy, with its outputs, where it says; without a demo output (or when a cell
fails) it is one line on stderr, exit code 2 and no file."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from cliptrack.cli.demo import next_steps
from cliptrack.cli.notebook import EXECUTED, shipped_notebook

from tests._compare_fixtures import megatron_vs_miles, synthetic_run, write_jsonl, write_mlflow

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "compare_backends.ipynb"
SHIPPED = ROOT / "tracking" / "cli" / "compare_backends.ipynb"


def _cliptrack(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """``cliptrack ARGV`` run in ``cwd`` as a user runs it (the console script's ``main``)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("CLIPTRACK_DEMO_OUT", "MLFLOW_TRACKING_URI")}
    return subprocess.run(
        [sys.executable, "-m", "cliptrack.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**environ, **env},
    )


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _printed_notebook_command(out: Path) -> list[str]:
    """The notebook line of the demo's "next steps", as words (the ``cliptrack`` word dropped)."""
    text = next_steps(out, f"sqlite:///{out / 'mlflow.db'}", "1", {}, {})
    [line] = [x.strip()[2:] for x in text.splitlines() if x.strip().startswith("$ ") and "notebook" in x]
    words = shlex.split(line)
    assert words[0] == "cliptrack", line
    return words[1:]


def test_the_package_ships_the_repositorys_notebook():
    assert SHIPPED.read_bytes() == NOTEBOOK.read_bytes()  # one notebook: edit both, or neither
    assert shipped_notebook() == NOTEBOOK.read_text(encoding="utf-8")  # read from the package
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '"cliptrack.cli" = ["compare_backends.ipynb"]' in text  # installed with it, not only here


def test_the_notebook_names_the_clis_interval_method():
    from cliptrack.compare.stats.estimate import METHOD

    intro = " ".join(nbformat.read(NOTEBOOK, as_version=4).cells[0].source.split())
    assert "fixed-b" not in intro and "HAC" not in intro
    assert METHOD.split(" around")[0] in intro  # "equal-weighted cosine (EWC) long-run variance of ..."


def _demo_like_store(folder: Path) -> None:
    """An MLflow store in ``folder`` shaped as the demo's: three seeds each of the ``megatron`` and
    ``miles`` groups (the run parameter ``group``, as the demo logs it), Miles clipping 3 times as
    often, and no control."""
    for backend, clip_p, seeds in (("megatron", 0.05, (1, 2, 3)), ("miles", 0.15, (4, 5, 6))):
        for seed in seeds:
            run = synthetic_run(
                f"{backend}-seed{seed}",
                f"{backend}-seed{seed}",
                backend,
                seed=seed,
                n_steps=30,
                clip_p=clip_p,
            )
            run.config["group"] = backend
            write_mlflow(f"sqlite:///{folder / 'mlflow.db'}", run)


@pytest.mark.slow
def test_the_printed_command_runs_from_any_folder(tmp_path):
    demo = (tmp_path / "demo-out").resolve()
    demo.mkdir()
    _demo_like_store(demo)
    elsewhere = tmp_path / "elsewhere"  # neither the repository nor the demo's folder
    elsewhere.mkdir()

    proc = _cliptrack(_printed_notebook_command(demo), elsewhere)

    assert proc.returncode == 0, proc.stderr[-3000:]
    path = demo / EXECUTED
    assert f"executed notebook, with its outputs: {path}" in proc.stdout.splitlines()
    said = proc.stdout.split("the notebook says:\n")[1]  # its verdict cell's lines, repeated
    assert "  verdict on the stacks: different" in said.splitlines()
    assert "these stacks (miles and megatron, 3 and 3 seeds)" in said and "control verdict" not in said
    assert f"pip install jupyterlab && jupyter lab {path}" in proc.stdout
    assert proc.stderr == ""
    assert _files(elsewhere) == set() and _files(demo) == {"mlflow.db", EXECUTED}
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)
    [injected] = [c for c in code if "injected-parameters" in c.metadata.get("tags", [])]
    assert f"DEMO_OUT = {str(demo)!r}" in injected.source
    outputs = [o for c in code for o in c.outputs]
    assert [o for o in outputs if o.get("output_type") == "error"] == []
    assert sum(1 for c in code if c.outputs) >= 6  # the runs, the frame, totals, verdict, plot, table, notes
    text = json.dumps(outputs)
    assert "verdict on the stacks: different" in text and "difference [CI]" in text  # the CLI's table
    assert sum(1 for o in outputs if "image/png" in o.get("data", {})) == 1


@pytest.mark.slow
def test_another_store_compares_the_latest_run_of_each_backend(tmp_path):
    """``--tracking-uri``: runs that carry no demo group, the latest finished run of each backend."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for run in megatron_vs_miles(miles_clip_p=0.16, n_megatron=120, n_miles=120):
        write_mlflow(uri, run)
    proc = _cliptrack(["notebook", "--tracking-uri", uri, "--out", "results"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "  on-policy verdict: different" in proc.stdout.splitlines()
    assert "verdict on the stacks" not in proc.stdout


def test_without_a_demo_output_one_line_exit_2_and_no_file(tmp_path):
    proc = _cliptrack(["notebook"], tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith("cliptrack notebook: no demo output (mlflow.db) in "), line
    assert f"{tmp_path / 'cliptrack-demo'}" in line and "run `cliptrack demo`" in line  # the notebook's
    assert "--demo-out DIR" in line
    assert _files(tmp_path) == set()

    named = _cliptrack(["notebook", "--out", "results"], tmp_path, CLIPTRACK_DEMO_OUT=str(tmp_path / "gone"))
    assert named.returncode == 2 and str(tmp_path / "gone") in named.stderr
    assert len(named.stderr.splitlines()) == 1 and _files(tmp_path) == set()


@pytest.mark.slow
def test_a_failing_cell_is_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "spool").mkdir()  # a spool without runs: the notebook's loading cell raises
    proc = _cliptrack(["notebook", "--jsonl", "spool", "--out", "results"], tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith("cliptrack notebook: the notebook stopped: RunNotFoundError: no runs"), line
    assert line.endswith("nothing was written")
    assert _files(tmp_path) == {"spool"}


def test_the_figures_panel_titles_do_not_overlap(tmp_path):
    """The plotting cell, as shipped, on runs with every kind of panel: no title overlaps another
    or leaves the figure."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from cliptrack.backends import load_runs
    from cliptrack.compare import compare
    from cliptrack.compare.views.plots import panel_figures
    from cliptrack.compare.views.plots_matplotlib import draw

    for run in megatron_vs_miles(n_megatron=120, n_miles=120):
        write_jsonl(tmp_path, run)
    runs = load_runs(["megatron-run", "miles-run"], jsonl_dir=str(tmp_path))
    cell = next(
        c.source
        for c in nbformat.read(NOTEBOOK, as_version=4).cells
        if "panel_figures(runs, result)" in c.source
    )
    space = {"runs": runs, "result": compare(runs, runs.labels), "plt": plt, "textwrap": textwrap}
    space |= {"panel_figures": panel_figures, "draw": draw}
    exec(cell, space)  # the notebook's own cell
    fig = space["fig"]
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        edge = fig.bbox
        boxes = [
            title.get_window_extent(renderer)
            for ax in fig.axes
            if ax.get_visible()
            for title in (ax.title, ax._left_title, ax._right_title)
            if title.get_text()
        ]
        assert len(boxes) == len(space["figures"])
        for i, box in enumerate(boxes):
            assert edge.x0 <= box.x0 and box.x1 <= edge.x1, (i, box, edge)
            for other in boxes[i + 1 :]:
                assert not box.overlaps(other), (box, other)
    finally:
        plt.close(fig)
