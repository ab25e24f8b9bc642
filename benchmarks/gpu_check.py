"""One short check on a CUDA device: cost, exactness and host syncs of the losses with counting.

For decoupled PPO with a dual clip (``clip_reference="old"``, ``dual_clip=3``) and CISPO, eager
(``CLIPTRACK_FUSED=0``) and fused (``=1``), with float32 and bfloat16 log-probs at [256 x 8192]
tokens:

- **cost**: forward + backward over the logprobs of the loss with its counts and gauge, against the
  same objective with no counting under ``torch.compile`` (the anchor), medians of interleaved
  repeats timed with CUDA events; reported as ratios (loss / anchor);
- **exactness**: every count against a float64 CPU reference token by token (a token whose ratio
  lies within 4 ulps of the dtype of a bound may fall on either side; the difference must not exceed
  their number), the loss within a stated rounding bound of the float64 objective;
- **host syncs**: ``torch.cuda.set_sync_debug_mode("error")`` around the loss calls, their
  backward, the packing of a step's reports (``sum_reports``) and the Megatron reduction's one
  collective (``merged_sums`` over an NCCL group of world size 1): any synchronising call raises.

Prints one JSON line. ``--dry-run`` runs the same code on the CPU at [8 x 256] (gloo; no sync
check, which is CUDA's), as the test suite does. Run on a GPU machine:
``python -m benchmarks.gpu_check``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cliptrack.adapters.losses import builtin as losses
from cliptrack.adapters.megatron import make_loss_func, merged_sums, sum_reports
from cliptrack.core import keys

from tests._harness import loss_path

GPU_SHAPE = (256, 8192)
DRY_SHAPE = (8, 256)
DUAL_CLIP = 3.0
BANDS = {"ppo": (0.8, 1.2), "cispo": (0.0, 4.0)}
OPTIONS: dict[str, dict[str, object]] = {
    "ppo": {"clip_reference": "old", "dual_clip": DUAL_CLIP},
    "cispo": {},
}


@dataclass(frozen=True)
class Inputs:
    lp: Tensor
    slp: Tensor
    old: Tensor
    adv: Tensor
    mask: Tensor


@dataclass(frozen=True)
class Row:
    loss: str
    dtype: str
    path: str
    ratio_to_anchor: float
    counts_exact: bool
    loss_error: float
    loss_bound: float


def make_inputs(shape: tuple[int, int], dtype: torch.dtype, device: torch.device, seed: int = 0) -> Inputs:
    """Sampler, old and current log-probs (the current 0.3 nats from the old, the old 0.05 from the
    sampler), advantages N(0, 1) and a mask keeping 90 % of the tokens."""
    gen = torch.Generator().manual_seed(seed)
    slp = -torch.rand(shape, generator=gen) * 4
    old = slp + 0.05 * torch.randn(shape, generator=gen)
    lp = old + 0.3 * torch.randn(shape, generator=gen)
    adv = torch.randn(shape, generator=gen)
    mask = torch.rand(shape, generator=gen) > 0.1
    return Inputs(*(t.to(device) for t in (lp.to(dtype), slp.to(dtype), old.to(dtype), adv, mask)))


def per_token(name: str, lp: Tensor, x: Inputs) -> Tensor:
    """Each token's loss without counting (verl's decoupled dual-clip PPO; CISPO against the sampler)."""
    low, high = BANDS[name]
    if name == "ppo":
        ratio = torch.exp(lp - x.old)
        clip1 = torch.maximum(-x.adv * ratio, -x.adv * torch.clamp(ratio, low, high))
        return torch.where(x.adv < 0, torch.minimum(-x.adv * DUAL_CLIP, clip1), clip1)
    coefficient = torch.clamp(torch.exp(lp - x.slp).detach(), low, high)
    return -(coefficient * x.adv * lp)


def anchor(lp: Tensor, x: Inputs, name: str) -> Tensor:
    """The objective without counting: the masked sum of :func:`per_token`."""
    return (per_token(name, lp, x) * x.mask).sum()


def counted(name: str, lp: Tensor, x: Inputs) -> losses.LossOutput:
    return losses.LOSSES[name](lp, x.slp, x.adv, x.mask, old_logprobs=x.old, **OPTIONS[name])


def reference_counts(name: str, x: Inputs) -> tuple[dict[str, int], int]:
    """Each count over eligible tokens from float64 ratios on the CPU, and the number of tokens
    whose ratio lies within 4 ulps (of the log-probs' dtype) of a bound."""
    low, high = BANDS[name]
    lp, slp, old = (t.detach().cpu().double() for t in (x.lp, x.slp, x.old))
    adv, on = x.adv.cpu().double(), x.mask.cpu()
    ratio = torch.exp(lp - (old if name == "ppo" else slp))
    if name == "ppo":
        low_side, high_side = (adv < 0) & (ratio < low), (adv > 0) & (ratio > high)
    else:
        low_side, high_side = ratio < low, ratio > high
    counts = {
        keys.LOSS_TOKENS: int(on.sum()),
        keys.CLIPPED_LOW_TOKENS: int((low_side & on).sum()),
        keys.CLIPPED_HIGH_TOKENS: int((high_side & on).sum()),
    }
    counts[keys.CLIPPED_TOKENS] = counts[keys.CLIPPED_LOW_TOKENS] + counts[keys.CLIPPED_HIGH_TOKENS]
    bounds = [low, high]
    if name == "ppo":
        counts[keys.DUAL_CLIPPED_TOKENS] = int(((adv < 0) & (ratio > DUAL_CLIP) & on).sum())
        bounds.append(DUAL_CLIP)
    eps = 4 * float(torch.finfo(x.lp.dtype).eps)
    near = sum(int((((ratio - b).abs() <= eps * b) & on).sum()) for b in bounds if b > 0)
    return counts, near


def loss_bound(name: str, x: Inputs) -> tuple[float, float]:
    """The float64 objective on the CPU and how far a build in the log-probs' dtype may lie from it:
    each term within 8 roundings of the dtype (``exp`` and at most four products and differences),
    their sum accumulated in float32 in any order (torch accumulates a low-precision sum in float32:
    ``n`` roundings of float32 of the sum of magnitudes), and the total rounded once to the dtype."""
    cpu = Inputs(*(t.detach().cpu().double() if t.is_floating_point() else t.cpu() for t in vars(x).values()))
    terms = per_token(name, cpu.lp, cpu)[cpu.mask]
    unit = float(torch.finfo(x.lp.dtype).eps) / 2
    unit32 = float(torch.finfo(torch.float32).eps) / 2
    total, magnitude = float(terms.sum()), float(terms.abs().sum())
    return total, 8 * unit * magnitude + terms.numel() * unit32 * magnitude + unit * abs(total)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call, ended by a synchronisation (CUDA events on a GPU)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1000
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def forward_backward(loss_of: Callable[[Tensor], Tensor], x: Inputs) -> Callable[[], object]:
    def run() -> object:
        lp = x.lp.detach().requires_grad_(True)
        loss = loss_of(lp)
        loss.backward()
        return lp.grad

    return run


def check_case(
    name: str, dtype: torch.dtype, shape: tuple[int, int], device: torch.device, repeats: int
) -> list[Row]:
    x = make_inputs(shape, dtype, device)
    compiled_anchor = torch.compile(anchor)
    plain = forward_backward(lambda lp: compiled_anchor(lp, x, name), x)
    expected, near = reference_counts(name, x)
    truth, bound = loss_bound(name, x)
    rows = []
    for value in ("0", "1"):
        with loss_path(value):
            ours = forward_backward(lambda lp: counted(name, lp, x).loss, x)
            for _ in range(3):  # compile both (a second shape guard may recompile) before timing
                ours(), plain()
            times: dict[str, list[float]] = {"ours": [], "plain": []}
            for _ in range(repeats):  # interleaved: drift hits both alike
                times["ours"].append(timed(ours, device))
                times["plain"].append(timed(plain, device))
            out = counted(name, x.lp, x)
        got = {key: int(out.get(key)) for key in expected}
        off = sum(abs(got[k] - expected[k]) for k in expected if k != keys.LOSS_TOKENS)
        rows.append(
            Row(
                loss=name,
                dtype=str(dtype).removeprefix("torch."),
                path="fused" if value == "1" else "eager",
                ratio_to_anchor=statistics.median(times["ours"]) / statistics.median(times["plain"]),
                counts_exact=got[keys.LOSS_TOKENS] == expected[keys.LOSS_TOKENS] and off <= near,
                loss_error=abs(float(out.loss.detach().double()) - truth),
                loss_bound=bound,
            )
        )
    return rows


@contextlib.contextmanager
def sync_forbidden(device: torch.device) -> Iterator[None]:
    """On CUDA: any host synchronisation raises. On the CPU there is nothing to guard."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def check_syncs(device: torch.device, shape: tuple[int, int]) -> dict[str, bool]:
    """Whether the loss calls and their backward, the packing of a step's reports and the one
    collective of the Megatron reduction (NCCL on a GPU, gloo on the CPU; world size 1) ran without
    a host synchronisation; each part after a first call outside the guard (compiling)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29561")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    group = dist.new_group([0])
    result = {}
    for name in OPTIONS:
        for value in ("0", "1"):
            x = make_inputs(shape, torch.float32, device, seed=1)
            inputs = {"sampling_logprobs": x.slp, "advantages": x.adv, "mask": x.mask, "old_logprobs": x.old}
            loss_func = make_loss_func(name, inputs, OPTIONS[name])
            with loss_path(value):
                warm = [loss_func(x.lp.detach().requires_grad_(True))[2]]
                merged_sums(warm, group=group, device=device)
                try:
                    with sync_forbidden(device):
                        lp = x.lp.detach().requires_grad_(True)
                        loss, _, report = loss_func(lp)
                        loss.backward()
                        sum_reports([report, report], device=device)
                        merged_sums([report, report], group=group, device=device)
                    result[f"{name}/{'fused' if value == '1' else 'eager'}"] = True
                except RuntimeError as exc:  # what sync debug mode raises
                    print(f"host sync in {name} ({value}): {exc}", file=sys.stderr)
                    result[f"{name}/{'fused' if value == '1' else 'eager'}"] = False
    return result


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dry-run", action="store_true", help="the CPU at a small shape (what the suite runs)"
    )
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per side (interleaved)")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --dry-run on the CPU")
    device = torch.device("cpu" if args.dry_run else "cuda")
    shape = DRY_SHAPE if args.dry_run else GPU_SHAPE
    rows = [
        row
        for name in OPTIONS
        for dtype in (torch.float32, torch.bfloat16)
        for row in check_case(name, dtype, shape, device, args.repeats)
    ]
    syncs = check_syncs(device, shape)
    report: dict[str, object] = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (dry run)",
        "shape": list(shape),
        "rows": [asdict(r) for r in rows],
        "exact": all(r.counts_exact and r.loss_error <= r.loss_bound for r in rows),
        "sync_free": syncs if device.type == "cuda" else "not checked on the CPU",
    }
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()
