"""The tinker seam: tinker's public types, its private pydantic ``TensorData`` model and its
protobuf module, checked against the tinker versions they were verified on.

Public (any tinker): ``tinker.types.ForwardBackwardOutput`` and ``tinker.types.TensorData``,
re-exported here (identical stand-in dataclasses without tinker). Version-sensitive (checked on
first use, :data:`SUPPORTED`): ``tinker.types._pydantic_types.tensor_data.TensorData`` (the
pydantic model that validates TensorData JSON and decodes sparse CSR values) and
``tinker.proto.tinker_public_pb2`` (the ``ForwardBackwardOutput`` protobuf, which tinker >= 0.38
clients require).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from cliptrack.adapters._compat import UnsupportedVersionError, check_version

__all__ = [
    "HAVE_TINKER",
    "MINIMUM",
    "SUPPORTED_BELOW",
    "UnsupportedVersionError",
    "ForwardBackwardOutput",
    "TensorData",
    "check_supported",
    "installed_version",
    "proto_module",
    "tensor_data_model",
]

MINIMUM = (0, 38)
"""Oldest tinker the private uses were verified on."""
SUPPORTED_BELOW = (0, 39)
"""First tinker release not verified (exclusive bound)."""
USES = "tinker.types._pydantic_types.tensor_data.TensorData and tinker.proto.tinker_public_pb2"

TensorData: Any
try:  # tinker's own types, so outputs pass through tinker's helpers unchanged
    from tinker.types import ForwardBackwardOutput
    from tinker.types import TensorData as TensorData

    HAVE_TINKER = True
except ImportError:  # pragma: no cover - exercised only where tinker is absent
    HAVE_TINKER = False
    TensorData = None

    @dataclass(frozen=True)
    class ForwardBackwardOutput:  # type: ignore[no-redef]
        """Same fields as ``tinker.types.ForwardBackwardOutput``."""

        loss_fn_output_type: str
        loss_fn_outputs: list[dict[str, Any]]
        metrics: dict[str, float] = field(default_factory=dict)


@functools.cache
def installed_version() -> str:
    """The installed tinker's version string; ImportError without tinker."""
    try:
        return metadata.version("tinker")
    except metadata.PackageNotFoundError:
        raise ImportError("this needs tinker (pip install 'cliptrack[tinker]')") from None


def check_supported() -> None:
    """Raise :class:`cliptrack.adapters._compat.UnsupportedVersionError` unless the installed tinker is in
    the verified range (ImportError without tinker)."""
    check_version("tinker", installed_version(), MINIMUM, SUPPORTED_BELOW, USES)


def tensor_data_model() -> Any:
    """tinker's private pydantic ``TensorData`` model (validates JSON, decodes sparse CSR)."""
    check_supported()
    from tinker.types._pydantic_types.tensor_data import TensorData as TensorDataModel

    return TensorDataModel


def proto_module() -> Any:
    """tinker's ``tinker_public_pb2`` protobuf module."""
    check_supported()
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2
