"""Vendor seams: every private or version-sensitive use of a third-party package, one module per
vendor, each checking the installed version against the range it was verified on.

- :mod:`cliptrack.adapters._compat.tinker`: tinker's types, its private pydantic ``TensorData`` model and
  its protobuf module;
- :mod:`cliptrack.adapters._compat.megatron`: megatron-core's ``parallel_state`` calls;
- :mod:`cliptrack.adapters._compat.miles`: Miles' policy loss and the names beside it that the custom loss uses.

An upgrade outside a range fails in the seam with :class:`UnsupportedVersionError` (the one check,
in :mod:`cliptrack.core.versions`), which names the package, the version found, the supported range and
what to re-check.
"""

from __future__ import annotations

from cliptrack.core.versions import UnsupportedVersionError, check_version, parse_version

__all__ = ["UnsupportedVersionError", "check_version", "parse_version"]
