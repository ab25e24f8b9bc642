"""Test-only shim: run Megatron-Core's schedules on CPU.

Megatron-Core 0.16.1 allocates a few tensors with ``device="cuda"`` literals (the schedules'
token counters, pipeline p2p buffers via ``torch.cuda.current_device()``). On a CPU-only machine
:func:`cpu_megatron` redirects those to the CPU:

* a :class:`torch.overrides.TorchFunctionMode` rewrites a ``device=`` keyword naming CUDA to ``cpu``
  (and makes ``Tensor.cuda()`` a no-op);
* ``torch.cuda.current_device`` returns ``"cpu"`` (pipeline p2p buffers).

Pipeline-parallel configs also need ``batch_p2p_sync=False`` (no CUDA synchronise). This belongs in
tests only; the library never touches devices.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


def _is_cuda(device: object) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return False


class CudaToCpu(TorchFunctionMode):
    """Rewrite ``device="cuda"`` keywords of torch functions to ``"cpu"``."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.cuda:
            return args[0]
        return func(*args, **kwargs)


@contextlib.contextmanager
def cpu_megatron() -> Iterator[None]:
    """Within the block, Megatron-Core's CUDA allocations land on the CPU."""
    original = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    try:
        with CudaToCpu():
            yield
    finally:
        torch.cuda.current_device = original  # type: ignore[assignment]
