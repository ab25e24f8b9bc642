"""The one version check of every vendor seam (``cliptrack.adapters._compat.*``, ``cliptrack.backends.<vendor>._compat``
and the backends' other private readers): each seam declares the release range it was verified on and refuses a
release outside it with a message naming the package, the version found, the range and what to re-check.
"""

from __future__ import annotations

import functools
import re

__all__ = ["UnsupportedVersionError", "check_version", "parse_version"]


class UnsupportedVersionError(ImportError):
    """An installed package is outside the version range a seam was verified on."""


def parse_version(version: str) -> tuple[int, ...]:
    """The numeric release of a version string (``"0.38.0"`` -> ``(0, 38, 0)``, ``"0.16.1rc1"`` ->
    ``(0, 16, 1)``, ``"v1.2"`` -> ``(1, 2)``); ValueError when it has none."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if match is None:
        raise ValueError(f"cannot read a version number from {version!r}")
    return tuple(int(part) for part in match.group(1).split("."))


@functools.lru_cache(maxsize=64)  # seams check on every use (e.g. each tensor conversion)
def check_version(
    package: str,
    found: str,
    minimum: tuple[int, ...],
    below: tuple[int, ...],
    uses: str,
    seam: str = "the seam",
) -> str:
    """Return ``found``; raise :class:`UnsupportedVersionError` unless ``minimum <= found < below``.

    ``uses``: what the seam relies on, named in the message so an upgrade knows what to re-check;
    ``seam``: the module holding the range, named so the range can be widened after re-checking.
    """
    supported = f">={'.'.join(map(str, minimum))},<{'.'.join(map(str, below))}"
    try:
        release = parse_version(found)
    except ValueError:
        release = ()
    if not release or not minimum <= release < below:
        raise UnsupportedVersionError(
            f"{package} {found} is not supported by cliptrack (supported: {package}{supported}); "
            f"cliptrack relies on {uses}. Install a supported version (pip install '{package}{supported}') "
            f"or verify these against {package} {found} and widen the range in {seam}"
        )
    return found
