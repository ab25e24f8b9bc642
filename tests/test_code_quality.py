"""The tracking layer imports without torch; no function of the package is above cyclomatic complexity 15.
(ruff and mypy run beside the suite: ``make check``, called by .ci/run.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_COMPLEXITY = 15
"""Most cyclomatic complexity (as radon measures it) of any function in tracking/ or adapters/."""


def test_tracking_imports_without_torch():
    code = (
        "import sys, importlib.abc\n"
        "class NoTorch(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "import cliptrack, cliptrack.log.tracker, cliptrack.compare, cliptrack.cli.main\n"
        "from cliptrack import Tracker\n"
        "assert 'torch' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_no_function_is_above_complexity_15():
    """Every function and method of tracking/ and adapters/ (radon's blocks less the classes, whose
    score is an average of their methods') is at most :data:`MAX_COMPLEXITY`."""
    pytest.importorskip("radon")
    from radon.complexity import cc_visit
    from radon.visitors import Function

    too_complex = []
    for folder in ("tracking", "adapters"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for block in cc_visit(path.read_text(encoding="utf-8")):
                if isinstance(block, Function) and block.complexity > MAX_COMPLEXITY:
                    too_complex.append(
                        f"{path.relative_to(ROOT)}:{block.lineno} {block.fullname} {block.complexity}"
                    )
    assert not too_complex, f"functions above complexity {MAX_COMPLEXITY}:\n" + "\n".join(too_complex)
