"""Shared test machinery: a host-sync guard, loopback ports, a one-rank Megatron-Core setup."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import torch
import torch.distributed as dist

HOST_CONVERSIONS = ("item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy")
"""Every ``Tensor`` method that copies a value to the host."""


@contextlib.contextmanager
def host_sync_forbidden() -> Iterator[None]:
    """Every tensor-to-host conversion raises inside the block."""
    saved = {name: getattr(torch.Tensor, name) for name in HOST_CONVERSIONS}

    def forbid(name: str):  # type: ignore[no-untyped-def]
        def raiser(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise AssertionError(f"host synchronisation: Tensor.{name} called")

        return raiser

    for name in HOST_CONVERSIONS:
        setattr(torch.Tensor, name, forbid(name))
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def megatron_one_rank() -> Iterator[None]:
    """Megatron's parallel_state on a one-rank gloo group over 127.0.0.1, CUDA literals on CPU."""
    from megatron.core import parallel_state

    from tests.megatron_shim import cpu_megatron

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with cpu_megatron():
            parallel_state.initialize_model_parallel(1, 1)
            try:
                yield
            finally:
                parallel_state.destroy_model_parallel()
    finally:
        if created:
            dist.destroy_process_group()
