"""The demo's CPU redirect for Megatron-Core: run its real schedule on a machine without a GPU.

Why this exists: Megatron-Core 0.16.1's schedules allocate a few tensors with ``device="cuda"``
literals (the token counter of ``forward_backward_no_pipelining``, pipeline p2p buffers through
``torch.cuda.current_device()``), so on a CPU-only machine its ``get_forward_backward_func()``
fails before the first micro-batch. The demo trains on CPU, so within :func:`cpu_redirect`:

* a :class:`torch.overrides.TorchFunctionMode` rewrites a ``device=`` keyword naming CUDA to
  ``"cpu"`` (and makes ``Tensor.cuda()`` a no-op);
* ``torch.cuda.current_device`` returns ``"cpu"``.

Nothing else changes: the schedule, its loss-function protocol and the reductions are Megatron's
own. This is the only module that touches devices; the library (``cliptrack.adapters.megatron``) never
does, and on a GPU the redirect is not entered (:func:`needed`). :func:`megatron_session` sets up
what the schedule needs around a run: a one-rank gloo process group on 127.0.0.1 (unless one is
already initialised) and ``parallel_state`` with TP = PP = CP = 1.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["CudaToCpu", "available", "cpu_redirect", "megatron_session", "needed"]


def available() -> bool:
    """Whether megatron-core can be imported."""
    try:
        import megatron.core.pipeline_parallel  # noqa: F401
    except ImportError:
        return False
    return True


def needed() -> bool:
    """Whether the redirect is needed (no CUDA device)."""
    return not torch.cuda.is_available()


def _is_cuda(device: object) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return False


class CudaToCpu(TorchFunctionMode):
    """Rewrite ``device="cuda"`` keywords of torch functions to ``"cpu"``; ``Tensor.cuda()`` is a no-op."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.cuda:
            return args[0]
        return func(*args, **kwargs)


@contextlib.contextmanager
def cpu_redirect() -> Iterator[None]:
    """Within the block, Megatron-Core's CUDA allocations land on the CPU (a no-op with CUDA)."""
    if not needed():
        yield
        return
    original = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    try:
        with CudaToCpu():
            yield
    finally:
        torch.cuda.current_device = original  # type: ignore[assignment]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def megatron_session() -> Iterator[None]:
    """One-rank ``torch.distributed`` (gloo) and Megatron ``parallel_state``, unless already set up."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    created_group = not dist.is_initialized()
    if created_group:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    created_state = not parallel_state.model_parallel_is_initialized()
    try:
        if created_state:
            with cpu_redirect():
                parallel_state.initialize_model_parallel(1, 1)
        yield
    finally:
        if created_state:
            parallel_state.destroy_model_parallel()
        if created_group:
            dist.destroy_process_group()
