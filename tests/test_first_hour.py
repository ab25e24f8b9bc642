"""A newcomer's first hour, end to end: the demo with its output redirected, then every command it
printed, exactly as printed, then the notebook as shipped against the demo's output."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from cliptrack.core import keys

from tests._demo import DEMO_STEPS, DemoRun

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "compare_backends.ipynb"
STEPS = DEMO_STEPS

# every test that reads the session demo runs on one worker (tests/conftest.py), so the demo runs once
pytestmark = pytest.mark.slow


def _cliptrack(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``cliptrack ARGV`` as a user runs it (the console script is ``cliptrack.cli.main:main``)."""
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "cliptrack.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env=env,
    )


@pytest.fixture
def demo(demo_run: DemoRun) -> tuple[Path, subprocess.CompletedProcess]:
    """The session's one demo run (``tests/conftest.py``): run from a fresh folder with its output
    redirected (pipes, not a terminal), as the README says; its output folder and its process."""
    return demo_run.out, demo_run.proc


def _printed_commands(stdout: str) -> list[str]:
    return [line.strip()[2:] for line in stdout.splitlines() if line.strip().startswith("$ ")]


def test_output_is_quiet_and_third_party_messages_are_in_the_log(demo):
    out, proc = demo
    assert "\r" not in proc.stdout and "\x1b[" not in proc.stdout  # no bar frames in a file
    assert f"megatron: run 3/3, step {STEPS}/{STEPS} (100%)" in proc.stdout  # 3 seeds of STEPS steps
    for noise in (
        "Creating initial MLflow database tables",
        "UserWarning",
        "Apex is not installed",
        "INFO",
        "Downloading artifacts",  # MLflow's progress bar, as the comparison reads the worst tables
    ):
        assert noise not in proc.stderr, proc.stderr
        assert noise not in proc.stdout
    log = (out / "demo.log").read_text()
    assert "Creating initial MLflow database tables" in log and "Apex is not installed" in log


def test_the_printed_commands_run_as_printed(demo):
    out, proc = demo
    commands = _printed_commands(proc.stdout)
    groups = {
        line.split()[1]: line.split()[2:] for line in proc.stdout.splitlines() if line.startswith("  runs ")
    }
    assert sorted(groups) == ["megatron", "megatron-stale2", "miles"]
    assert all(len(ids) == 3 for ids in groups.values())
    run_ids = [run_id for ids in groups.values() for run_id in ids]
    compare, as_json, control, probe, runs, ui, notebook = commands
    stacks = f"--group megatron={','.join(groups['megatron'])} --group miles={','.join(groups['miles'])}"
    assert compare.startswith(f"cliptrack compare {stacks} --tracking-uri ")  # the ids the demo printed
    assert as_json == compare + " --json"
    assert control.startswith(
        f"cliptrack compare --group megatron-stale2={','.join(groups['megatron-stale2'])}"
    )
    assert ui.startswith("mlflow ui --backend-store-uri sqlite:///")
    assert notebook == f"cliptrack notebook --demo-out {out}"
    assert probe.startswith("cliptrack probe ")  # run as printed: the test below
    table = _cliptrack(shlex.split(compare)[1:], out.parent)
    assert table.returncode == 0, table.stderr
    assert "Downloading artifacts" not in table.stderr, table.stderr  # no progress bar per run read
    assert "clip_fraction" in table.stdout and "Not equally on-policy" in table.stdout
    assert max(len(line) for line in table.stdout.split("\n\n")[0].splitlines()) <= 120  # the table fits
    numbers = _cliptrack(shlex.split(as_json)[1:], out.parent)
    assert numbers.returncode == 0, numbers.stderr
    result = json.loads(numbers.stdout)
    assert result["verdict"] == "different"  # the stale Miles stack, over 3 seeds each
    checked = _cliptrack(shlex.split(control)[1:], out.parent)
    assert checked.returncode == 0 and "Not equally on-policy" not in checked.stdout, checked.stdout
    listing = _cliptrack(shlex.split(runs)[1:], out.parent)
    assert listing.returncode == 0, listing.stderr
    for run_id in run_ids:
        assert run_id in listing.stdout
    rows = json.loads(_cliptrack([*shlex.split(runs)[1:], "--json"], out.parent).stdout)
    assert sorted(r["cliptrack_id"] for r in rows) == sorted(run_ids)
    assert {r["status"] for r in rows} == {"FINISHED"} and {r["steps"] for r in rows} == {STEPS}
    store_ids = [row["store_id"] for row in rows]  # the MLflow UI's ids are accepted too
    assert not set(store_ids) & set(run_ids)
    other = _cliptrack(
        ["compare", *store_ids, "--tracking-uri", f"sqlite:///{out / 'mlflow.db'}"], out.parent
    )
    assert other.returncode == 0, other.stderr


def _verdict_lines(text: str) -> list[str]:
    """The lines that carry the demo's answer, in order: each comparison's figure (the stacks',
    then the control's), the verdict on the stacks, the control's verdict."""
    starts = ("The figure: ", "verdict on the stacks: ", "control verdict (")
    return [line for line in text.splitlines() if line.startswith(starts)]


def test_the_notebook_as_shipped_reads_the_demo_output(demo, monkeypatch):
    """Run as shipped against the demo's output, the notebook compares the demo's stacks over seeds
    (and the control) from the store and prints what the demo's terminal printed: the same figures
    and the same verdicts, each side computed on its own (the demo in its process, the notebook
    from the runs it reads back)."""
    import nbformat
    from nbclient import NotebookClient

    out, proc = demo
    [notebook] = [c for c in _printed_commands(proc.stdout) if c.startswith("cliptrack notebook")]
    assert (
        notebook == f"cliptrack notebook --demo-out {out}"
    )  # run as printed: tests/test_notebook_command.py
    monkeypatch.setenv("CLIPTRACK_DEMO_OUT", str(out))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    before = sorted(p.name for p in NOTEBOOK.parent.iterdir())
    nb = nbformat.read(NOTEBOOK, as_version=4)  # as shipped: no parameter injected
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = json.dumps(outputs)
    assert not [o for o in outputs if o.get("output_type") == "error"]
    printed = "".join(
        o["text"] for o in outputs if o.get("output_type") == "stream" and o["name"] == "stdout"
    )
    terminal = _verdict_lines(proc.stdout)
    assert len(terminal) == 4, proc.stdout  # two figures (stacks, control) and two verdicts
    assert "verdict on the stacks: different" in terminal  # the stale Miles stack, over 3 seeds each
    assert _verdict_lines(printed) == terminal
    assert "9 runs from sqlite:///" in printed and "megatron (3 seeds), miles (3 seeds)" in printed
    assert "insufficient data" not in printed
    stderr = [o["text"] for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stderr"]
    assert stderr == []  # no third-party warning (tqdm's IProgress, MLflow's logs) in the notebook
    assert " pp" in text  # the CLI's units: percentage points, not raw log-ratios
    assert sorted(p.name for p in NOTEBOOK.parent.iterdir()) == before  # no mlflow.db left behind


def test_the_printed_probe_command_gives_the_probes_verdict(demo, tmp_path):
    """The demo writes the paired probe's two inputs and prints the command that compares them; run
    as printed from another folder it answers from that one batch: both paths compute the same
    numbers at the same weights (cliptrack.adapters.demo.probe), so the probe says equivalent (exit
    0), in the very words the demo printed when it compared the outputs in its own process."""
    out, proc = demo
    [probe] = [c for c in _printed_commands(proc.stdout) if c.startswith("cliptrack probe ")]
    words = shlex.split(probe)
    a, b = Path(words[2]), Path(words[3])
    assert (a, b) == (out / "probe" / "megatron.json", out / "probe" / "miles.json")
    for path in (a, b):
        assert len(json.loads(path.read_text())["loss_fn_outputs"]) == 256  # the probe's 256 datums
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    checked = _cliptrack(words[1:], elsewhere)
    assert checked.returncode == 0, checked.stdout + checked.stderr  # 0: equivalent
    first = checked.stdout.splitlines()[0]
    assert first.startswith("paired probe, miles vs megatron on 256 datums") and ": equivalent" in first
    assert checked.stdout.strip() in proc.stdout  # the demo's own summary of the same outputs
    assert "paired probe (numerics, same batch and weights): equivalent" in proc.stdout
    assert list(elsewhere.iterdir()) == []


def test_the_notebook_without_a_demo_output_says_what_to_run(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    monkeypatch.setenv("CLIPTRACK_DEMO_OUT", str(tmp_path / "never-ran"))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    with pytest.raises(CellExecutionError, match="run `cliptrack demo`"):
        NotebookClient(
            nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
        ).execute()
    assert list(tmp_path.iterdir()) == []


def test_the_demo_keys_are_the_keys_a_user_is_told_to_pass(demo):
    from mlflow.tracking import MlflowClient

    out, _ = demo
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    [run, *_] = client.search_runs([client.get_experiment_by_name("cliptrack-demo").experiment_id])
    assert {keys.REWARD, keys.THROUGHPUT, keys.CLIP_FRACTION} <= set(run.data.metrics)


def _readme_loop() -> str:
    """The README's complete custom-loop example: the python block after its announcing line."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    after = text[text.index("Your own loop, complete and runnable") :]
    start = after.index("```python\n") + len("```python\n")
    return after[start : after.index("```", start)]


def test_the_readme_loop_runs_and_its_printed_command_finds_the_stale_stack(tmp_path):
    """The README's own loop as it stands, run from a folder of its own: six runs (two stacks, three
    seeds each) logged with their counts as the README says, and the command it prints, run as
    printed, calls the stale stack different on the clip fraction and the mismatch KL."""
    code = _readme_loop()
    assert (
        "tracker.log_output(" in code and "with tracker.step(step):" in code and "/ out.loss_tokens" in code
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = proc.stdout.strip().splitlines()[-1]
    assert printed == "cliptrack compare --group-by stack --jsonl my-runs"
    listing = _cliptrack(["runs", "--jsonl", "my-runs", "--json"], tmp_path)
    rows = json.loads(listing.stdout)
    assert sorted(r["name"] for r in rows) == sorted(
        f"{s}-seed{i}"
        for s, i in [("fresh", 0), ("fresh", 1), ("fresh", 2), ("stale", 10), ("stale", 11), ("stale", 12)]
    )
    assert all(r["status"] == "FINISHED" and r["steps"] == 40 for r in rows)
    points = [
        json.loads(line)
        for line in (tmp_path / "my-runs" / rows[0]["cliptrack_id"] / keys.POINTS_FILE)
        .read_text()
        .splitlines()
    ]
    metrics = points[0]["metrics"]
    assert metrics[keys.LOSS_TOKENS] == 2 * 64  # two epochs of 64 tokens, summed
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert "`loss_tokens:sum` is tokens × passes (here 64 × 2 = 128 a step)" in readme  # says so
    assert metrics[keys.CLIP_FRACTION] == metrics[keys.CLIPPED_TOKENS] / metrics[keys.LOSS_TOKENS]
    assert metrics[keys.STEP_TIME] > 0 and keys.REWARD in metrics
    result = _cliptrack([*shlex.split(printed)[1:], "--json"], tmp_path)
    answer = json.loads(result.stdout)
    verdicts = {d["metric"]: d["verdict"] for d in answer["group_differences"]}
    assert verdicts["clip_fraction"] == "different" and verdicts["kl_k3"] == "different", result.stdout[
        -2000:
    ]
    assert "different" in readme  # and the README says what it gives
