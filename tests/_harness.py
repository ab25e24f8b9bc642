"""Shared test machinery: a host-sync guard, the loss path switch, loopback ports, gloo worker ranks as processes, a one-rank
Megatron-Core setup, and the skip marks of tests that need an external program."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

HOST_CONVERSIONS = ("item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy")
"""Every ``Tensor`` method that copies a value to the host."""


@contextlib.contextmanager
def loss_path(value: str) -> Iterator[None]:
    """Run the block with ``CLIPTRACK_FUSED=value`` (``1`` fused losses, ``0`` eager), restored after."""
    from cliptrack.adapters.losses import fused

    saved = os.environ.get(fused.ENV_VAR)
    os.environ[fused.ENV_VAR] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(fused.ENV_VAR, None)
        else:
            os.environ[fused.ENV_VAR] = saved


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


def closed_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (a free port, released at once): a dead
    backend's address."""
    return free_port()


def run_ranks(script: Path, args: list[str], world: int, tmp_path: Path, timeout_s: float) -> list[Any]:
    """Run ``script tmp_path *args`` as ``world`` gloo ranks on loopback (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR/PORT set; one OpenMP thread each); each writes ``tmp_path/rank{r}.json``. Returns
    those results by rank, or fails naming each rank that exited non-zero with the tail of its log."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            GLOO_SOCKET_IFNAME="lo",
            OMP_NUM_THREADS="1",
        )
        log = (tmp_path / f"rank{rank}.log").open("w")
        cmd = [sys.executable, str(script), str(tmp_path), *args]
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    failed = []
    for rank, (proc, log) in enumerate(procs):
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for other, _ in procs:
                other.kill()
            code = -9
        log.close()
        if code != 0:
            failed.append(
                f"rank {rank} exited {code}:\n" + (tmp_path / f"rank{rank}.log").read_text()[-3000:]
            )
    assert not failed, "\n".join(failed)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


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
