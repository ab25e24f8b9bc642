"""cliptrack installs one top-level package, ``cliptrack``, and lives beside AdapterHub's ``adapters``.

The wheel is built from this checkout; AdapterHub's library comes from the package index (it is
installed, with its own transformers release, into a virtual environment made for the test; torch
comes from the environment running the tests). Both are imported in one process, then cliptrack is
uninstalled and AdapterHub's files are still whole.
"""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def _run(*command: str | Path, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{command}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        out,
        ROOT,
        cwd=out,
    )
    (found,) = out.glob("cliptrack-*.whl")
    return found


def test_the_wheel_installs_one_top_level_package(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"cliptrack"}
    # the folders arrive mapped into the namespace, the vendored dashboard script with them
    assert "cliptrack/log/tracker.py" in names
    assert "cliptrack/adapters/losses/builtin.py" in names
    assert any(name.startswith("cliptrack/compare/views/_vendor/") for name in names)


def test_adapterhub_and_cliptrack_import_side_by_side(wheel: Path, tmp_path: Path):
    env = tmp_path / "venv"
    # no pip of its own: this environment's pip installs into it (pip --python), as it uninstalls;
    # no bytecode compiled at install (the probe imports a few of transformers' thousands of modules)
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env)
    python = env / "bin" / "python"
    pip = (
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "-q",
        "--no-compile",
        "--disable-pip-version-check",
    )
    _run(*pip, "adapters", cwd=tmp_path)
    _run(*pip, "--no-deps", "--force-reinstall", wheel, cwd=tmp_path)
    probe = (
        "import adapters, cliptrack, cliptrack.adapters.losses as losses\n"
        "from cliptrack import Tracker\n"
        "assert hasattr(adapters, 'AutoAdapterModel'), adapters.__file__\n"
        "assert callable(losses.ppo) and Tracker.__name__ == 'Tracker'\n"
        "print(adapters.__file__)\n"
    )
    # run away from the checkout: its adapters/ folder is not what either import should find
    found = _run(python, "-c", probe, cwd=tmp_path).stdout.strip().splitlines()[-1]
    assert Path(found).is_relative_to(env), found
    before = sorted(p.name for p in Path(found).parent.iterdir())
    _run(sys.executable, "-m", "pip", "--python", python, "uninstall", "-y", "-q", "cliptrack", cwd=tmp_path)
    assert sorted(p.name for p in Path(found).parent.iterdir()) == before
    _run(python, "-c", "import adapters; assert hasattr(adapters, 'AutoAdapterModel')", cwd=tmp_path)


def test_a_script_beside_a_clone_named_cliptrack_imports_the_installed_package(wheel: Path, tmp_path: Path):
    """A user's script saved next to the clone (a folder named ``cliptrack``, as ``git clone`` names it)
    imports the installed package, as ``make demo`` installs it (a regular install, not editable: an
    editable install's import hook comes after the folder on ``sys.path``, which then shadows it as
    an empty namespace package)."""
    env = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env)
    python = env / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", wheel, cwd=tmp_path)
    parent = tmp_path / "work"
    clone = parent / "cliptrack"
    (clone / "tracking").mkdir(parents=True)
    (clone / "README.md").write_text("a clone\n")
    script = parent / "my_loop.py"
    script.write_text("from cliptrack import Tracker\nimport cliptrack\nprint(cliptrack.__file__)\n")
    proc = _run(python, script, cwd=parent)
    installed = Path(proc.stdout.strip())
    assert installed.name == "__init__.py" and "site-packages" in installed.parts, proc.stdout
    assert clone not in installed.parents
