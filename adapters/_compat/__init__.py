"""Vendor seams: every private or version-sensitive use of a third-party package, one module per
vendor, each checking the installed version against the range it was verified on.

- :mod:`adapters._compat.tinker`: tinker's types, its private pydantic ``TensorData`` model and
  its protobuf module;
- :mod:`adapters._compat.megatron`: megatron-core's ``parallel_state`` calls.

An upgrade outside a range fails in the seam with :class:`UnsupportedVersionError`, which names
the package, the version found, the supported range and what to re-check.
"""

from __future__ import annotations

import re

__all__ = ["UnsupportedVersionError", "check_version", "parse_version"]


class UnsupportedVersionError(ImportError):
    """An installed package is outside the version range a seam was verified on."""


def parse_version(version: str) -> tuple[int, ...]:
    """The numeric release of a version string (``"0.38.0"`` -> ``(0, 38, 0)``, ``"0.16.1rc1"`` ->
    ``(0, 16, 1)``); ValueError when it has none."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    if match is None:
        raise ValueError(f"cannot read a version number from {version!r}")
    return tuple(int(part) for part in match.group(1).split("."))


def check_version(
    package: str, found: str, minimum: tuple[int, ...], below: tuple[int, ...], uses: str
) -> None:
    """Raise :class:`UnsupportedVersionError` unless ``minimum <= found < below``.

    ``uses``: what the seam relies on, named in the message so an upgrade knows what to re-check.
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
            f"or verify these against {package} {found} and widen the range in the seam"
        )
