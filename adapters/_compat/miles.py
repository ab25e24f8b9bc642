"""The Miles seam: the parts of Miles' training code :mod:`cliptrack.adapters.miles.custom_loss` relies on.

cliptrack relies on (verified on the ``miles-rl`` release :data:`MINIMUM` .. :data:`SUPPORTED_BELOW`,
``miles/backends/training_utils/loss.py``):

- ``policy_loss_function(args, batch, logits, sum_of_sample_mean) -> (loss, log)``;
- that function calling ``compute_policy_loss(ppo_kl, advantages, eps_clip, eps_clip_high, ...) ->
  (pg_losses, clipfrac)``, looked up in its own module's globals, with ``ppo_kl`` the per-token
  ``old_log_probs - log_probs`` and ``clipfrac`` the per-token clip decision of this rank's CP slice;
- ``get_parallel_state().cp.rank`` and ``get_local_response_loss_masks(total_lengths,
  response_lengths, loss_masks, qkv_format, max_seq_lens)`` in that module's namespace.

Miles is often run from a source checkout, which has no distribution metadata: then the version
cannot be checked and the structure is (a missing name raises :class:`UnsupportedVersionError`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any

from cliptrack.adapters._compat import UnsupportedVersionError, check_version

__all__ = [
    "MINIMUM",
    "SUPPORTED_BELOW",
    "UnsupportedVersionError",
    "installed_version",
    "policy_loss",
    "recording_clip_decisions",
]

MINIMUM = (0, 0, 2)
"""Oldest ``miles-rl`` release the seam was verified on."""
SUPPORTED_BELOW = (0, 1)
"""First ``miles-rl`` release not verified (exclusive bound)."""
USES = (
    "miles.backends.training_utils.loss: policy_loss_function calling compute_policy_loss from its "
    "module globals, get_parallel_state().cp.rank and get_local_response_loss_masks"
)
_NAMES = ("compute_policy_loss", "get_parallel_state", "get_local_response_loss_masks")
_LOCK = threading.RLock()


@functools.cache
def installed_version() -> str | None:
    """The installed ``miles-rl`` version, ``None`` without distribution metadata (a source checkout)."""
    try:
        return metadata.version("miles-rl")
    except metadata.PackageNotFoundError:
        return None


def policy_loss() -> tuple[Callable[..., Any], dict[str, Any]]:
    """Miles' ``policy_loss_function`` and its module's namespace (version and names checked)."""
    found = installed_version()
    if found is not None:
        check_version("miles-rl", found, MINIMUM, SUPPORTED_BELOW, USES)
    try:
        from miles.backends.training_utils.loss import policy_loss_function
    except ImportError as exc:
        raise ImportError(
            "cliptrack.adapters.miles.custom_loss runs inside Miles' training loop and needs Miles "
            f"(miles.backends.training_utils.loss) importable: {exc}"
        ) from exc
    namespace: dict[str, Any] = policy_loss_function.__globals__
    missing = [name for name in _NAMES if name not in namespace]
    if missing:
        raise UnsupportedVersionError(
            f"this Miles ({found or 'source checkout'}) has no {missing} beside policy_loss_function; "
            f"cliptrack relies on {USES}"
        )
    return policy_loss_function, namespace


@contextlib.contextmanager
def recording_clip_decisions(namespace: dict[str, Any]) -> Iterator[list[tuple[Any, Any, Any]]]:
    """Within the block, ``compute_policy_loss`` in ``namespace`` records ``(ppo_kl, advantages,
    clipfrac)`` (detached; ``ppo_kl = old_log_probs - log_probs`` per token, Miles' masking applied).

    The wrapper calls Miles' function and returns its result unchanged (same tensors, same graph);
    the original is restored on exit. Calls from several threads are serialised.
    """
    original = namespace["compute_policy_loss"]
    calls: list[tuple[Any, Any, Any]] = []

    def recording(ppo_kl: Any, advantages: Any, *args: Any, **kwargs: Any) -> Any:
        pg_losses, clipfrac = original(ppo_kl, advantages, *args, **kwargs)
        calls.append((ppo_kl.detach(), advantages.detach(), clipfrac.detach()))
        return pg_losses, clipfrac

    with _LOCK:
        namespace["compute_policy_loss"] = recording
        try:
            yield calls
        finally:
            namespace["compute_policy_loss"] = original
