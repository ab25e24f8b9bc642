"""The command line imports a subcommand only when it runs: ``--help`` and ``compare --help``
load no numpy, pandas, MLflow, torch or plotting (their start-up time is measured in
benchmarks/cli_start.py, never asserted here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("numpy", "pandas", "mlflow", "torch", "wandb", "matplotlib", "plotly")
PROBE = """
import sys
from cliptrack.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as exit:
    assert exit.code == 0, exit.code
print("imported=" + ",".join(sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[0].split(",")))))
"""


@pytest.mark.parametrize("argv", [["--help"], ["compare", "--help"], ["runs", "--help"]])
def test_help_imports_nothing_heavy(argv):
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.replace("sys.argv[0]", repr(",".join(HEAVY))), *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage: cliptrack" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "imported="


def test_every_command_still_declares_its_arguments(capsys):
    from cliptrack.cli.main import COMMANDS, main

    for name in COMMANDS:
        with pytest.raises(SystemExit) as exit:
            main([name, "--help"])
        assert exit.value.code == 0
        usage = capsys.readouterr().out
        assert f"usage: cliptrack {name}" in usage and "unavailable" not in usage
        assert len(usage.splitlines()) > 4, usage  # its own options, not only -h
