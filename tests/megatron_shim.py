"""Test-only access to the CPU redirect for Megatron-Core's schedules.

The redirect itself (and why it is needed) lives in one place, :mod:`cliptrack.adapters.demo.megatron_cpu`;
the tests use the same one. Pipeline-parallel configs also need ``batch_p2p_sync=False`` (no CUDA
synchronise). The library never touches devices.
"""

from __future__ import annotations

from cliptrack.adapters.demo.megatron_cpu import CudaToCpu, cpu_redirect

cpu_megatron = cpu_redirect
"""Within the block, Megatron-Core's CUDA allocations land on the CPU."""

__all__ = ["CudaToCpu", "cpu_megatron"]
