"""Miles' real training-utils source, loaded from the released ``miles-rl`` wheel (not installed).

The wheel also ships its own ``megatron/core`` and ``sglang`` trees, which would replace the
installed megatron-core, so it is never pip-installed: :func:`miles_source` downloads it once
(``pip download miles-rl==VERSION --no-deps``) into a cache folder and unpacks only its ``miles/``
package there. :func:`import_miles` puts that folder on ``sys.path`` and imports Miles' loss and
log modules. Two of their imports are never run by the loss path and are stood in for when absent:
``ray`` (``miles.utils.misc`` decorates a helper actor with ``ray.remote`` at import time) and
``psutil`` (``log_utils.log_cpu_memory`` only).

Cache folder: ``$CLIPTRACK_MILES_CACHE``, else ``~/.cache/cliptrack/miles-rl-VERSION``. A wheel
already in that folder is used as it is (offline CI can place it there).
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path
from typing import Any

VERSION = "0.0.2"
"""The Miles release the tests check against (``miles/backends/training_utils/loss.py``)."""
_PROBE = Path("miles") / "backends" / "training_utils" / "loss.py"


class MilesUnavailable(RuntimeError):
    """The wheel could not be obtained (no network, no cached copy)."""


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "cliptrack" / f"miles-rl-{VERSION}"
    return Path(os.environ.get("CLIPTRACK_MILES_CACHE", default))


def miles_source() -> Path:
    """The folder holding Miles' ``miles/`` package; downloads and unpacks the wheel on first use."""
    cache = cache_dir()
    src = cache / "src"
    if (src / _PROBE).is_file():
        return src
    cache.mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache.glob(f"miles_rl-{VERSION}-*.whl"))
    if not wheels:
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    f"miles-rl=={VERSION}",
                    "--no-deps",
                    "--quiet",
                    "-d",
                    str(cache),
                ],
                capture_output=True,
                text=True,
                timeout=600,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MilesUnavailable(f"pip download miles-rl=={VERSION} failed: {exc}") from exc
        wheels = sorted(cache.glob(f"miles_rl-{VERSION}-*.whl"))
        if proc.returncode != 0 or not wheels:
            raise MilesUnavailable(f"pip download miles-rl=={VERSION} failed: {proc.stderr.strip()[-500:]}")
    staging = Path(tempfile.mkdtemp(prefix="src-", dir=cache))
    with zipfile.ZipFile(wheels[0]) as wheel:
        wheel.extractall(staging, members=[n for n in wheel.namelist() if n.startswith("miles/")])
    try:
        staging.rename(src)  # atomic; another process may have won the race
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    if not (src / _PROBE).is_file():
        raise MilesUnavailable(f"{wheels[0]} holds no {_PROBE}")
    return src


def _stand_in_for_unused_imports() -> None:
    try:
        import ray  # noqa: F401 - only whether it imports matters
    except ImportError:
        ray_stub: Any = types.ModuleType("ray")
        ray_stub.__path__ = []
        ray_stub.remote = lambda *args, **kwargs: lambda obj: obj
        util: Any = types.ModuleType("ray.util")
        util.__path__ = []
        strategies: Any = types.ModuleType("ray.util.scheduling_strategies")
        strategies.NodeAffinitySchedulingStrategy = object
        state: Any = types.ModuleType("ray.util.state")
        state.list_nodes = None
        sys.modules.update(
            {
                "ray": ray_stub,
                "ray.util": util,
                "ray.util.scheduling_strategies": strategies,
                "ray.util.state": state,
            }
        )
    try:
        import psutil  # noqa: F401 - only whether it imports matters
    except ImportError:
        sys.modules["psutil"] = types.ModuleType("psutil")


def import_miles() -> types.SimpleNamespace:
    """Miles' modules: ``loss``, ``log_utils``, ``cp_utils``, ``parallel`` (raises MilesUnavailable)."""
    src = str(miles_source())
    if src not in sys.path:
        sys.path.insert(0, src)
    _stand_in_for_unused_imports()
    base = "miles.backends.training_utils"
    modules = {
        name: importlib.import_module(f"{base}.{name}")
        for name in ("loss", "log_utils", "cp_utils", "parallel")
    }
    assert Path(modules["loss"].__file__ or "").is_relative_to(src), modules["loss"].__file__
    return types.SimpleNamespace(**modules)
