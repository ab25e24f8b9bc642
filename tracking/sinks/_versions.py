"""The version check of the sinks' vendor seams (``_compat_mlflow``, ``_compat_wandb``): each seam
declares the release range it was verified on, and refuses a release outside it with a message
naming the package, the version found, the range and what to re-check."""

from __future__ import annotations

import re
from importlib import metadata


class UnsupportedVersionError(ImportError):
    """An installed package is outside the version range a sink's seam was verified on."""


def release(version: str) -> tuple[int, ...]:
    """``"3.17.2"`` -> ``(3, 17, 2)``, ``"0.31.0rc1"`` -> ``(0, 31, 0)``; ``()`` when there is none."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(part) for part in match.group(1).split(".")) if match else ()


def check_version(
    package: str, minimum: tuple[int, ...], below: tuple[int, ...], uses: str, found: str | None = None
) -> str:
    """The installed (or given) version of ``package``; UnsupportedVersionError unless
    ``minimum <= version < below``. ``uses``: what the seam relies on."""
    version = found if found is not None else metadata.version(package)
    if not minimum <= release(version) < below:
        supported = f">={'.'.join(map(str, minimum))},<{'.'.join(map(str, below))}"
        raise UnsupportedVersionError(
            f"{package} {version} is not supported by cliptrack's {package} sink (supported: {package}{supported}); "
            f"it relies on {uses}. Install a supported version (pip install '{package}{supported}') or verify "
            f"these against {package} {version} and widen the range in tracking/sinks/_compat_{package}.py"
        )
    return version
