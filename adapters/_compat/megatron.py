"""The megatron-core seam: the ``parallel_state`` calls cliptrack makes, checked against the
megatron-core versions they were verified on.

cliptrack relies on (megatron-core :data:`MINIMUM` .. :data:`SUPPORTED_BELOW`):

- ``parallel_state.model_parallel_is_initialized()``, ``is_pipeline_last_stage(ignore_virtual=True)``,
  ``get_data_parallel_group(with_context_parallel=True)``, ``get_pipeline_model_parallel_group()``,
  ``get_pipeline_model_parallel_last_rank()``;
- the loss-function convention of ``forward_backward_func``: a loss function returning the 3-tuple
  ``(loss, num_tokens, report)`` (``forward_step_calc_loss``), one report per micro-batch on the last
  pipeline stage.

megatron-core is optional: nothing here imports it at module level, and :func:`parallel_state`
returns ``None`` when it is absent or not initialised.
"""

from __future__ import annotations

import functools
from importlib import metadata
from typing import Any

from cliptrack.adapters._compat import UnsupportedVersionError, check_version

__all__ = [
    "MINIMUM",
    "SUPPORTED_BELOW",
    "UnsupportedVersionError",
    "check_supported",
    "data_parallel_group",
    "installed_version",
    "is_last_pipeline_stage",
    "parallel_state",
    "pipeline_group",
]

MINIMUM = (0, 16, 1)
"""Oldest megatron-core the seam was verified on."""
SUPPORTED_BELOW = (0, 17)
"""First megatron-core release not verified (exclusive bound; 0.17 needs Python >= 3.12)."""
USES = (
    "parallel_state (model_parallel_is_initialized, is_pipeline_last_stage, get_data_parallel_group"
    "(with_context_parallel=True), get_pipeline_model_parallel_group/_last_rank) and the 3-tuple "
    "(loss, num_tokens, report) loss-function convention of forward_backward_func"
)


@functools.cache
def installed_version() -> str | None:
    """The installed megatron-core's version string, ``None`` when it is not installed."""
    try:
        return metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return None


def check_supported() -> None:
    """Raise :class:`cliptrack.adapters._compat.UnsupportedVersionError` unless the installed megatron-core
    is in the verified range (nothing to check when it is absent)."""
    found = installed_version()
    if found is not None:
        check_version("megatron-core", found, MINIMUM, SUPPORTED_BELOW, USES)


def parallel_state() -> Any:
    """Megatron's ``parallel_state`` when installed and initialised, else ``None`` (lazy import)."""
    try:
        from megatron.core import parallel_state as state
    except ImportError:
        return None
    check_supported()
    return state if state.model_parallel_is_initialized() else None


def is_last_pipeline_stage(state: Any) -> bool:
    """Whether this rank is on the last pipeline stage (virtual stages ignored)."""
    return bool(state.is_pipeline_last_stage(ignore_virtual=True))


def data_parallel_group(state: Any) -> Any:
    """This rank's data-parallel x context-parallel group (tensor-parallel ranks excluded)."""
    return state.get_data_parallel_group(with_context_parallel=True)


def context_parallel(state: Any) -> tuple[Any, int, int]:
    """This rank's context-parallel group, its size and this rank's index in it."""
    return (
        state.get_context_parallel_group(),
        int(state.get_context_parallel_world_size()),
        int(state.get_context_parallel_rank()),
    )


def pipeline_group(state: Any) -> tuple[Any, int]:
    """This rank's pipeline-parallel group and the global rank of its last stage."""
    return state.get_pipeline_model_parallel_group(), int(state.get_pipeline_model_parallel_last_rank())
