"""The Miles path and the Megatron path, fed the same global batch, emit identical clip metrics.

Megatron path: ``cliptrack.adapters.megatron.make_loss_func`` per micro-batch and ``reduce_losses`` — once
through Megatron-Core's real ``get_forward_backward_func`` schedule (one gloo rank on 127.0.0.1,
the tests' CPU shim), once with a hand-rolled loop over micro-batches (no megatron-core needed).
Miles path: every sequence of the batch is a datum in Tinker's JSON form, run through
``forward_backward_loss`` in chunks, sent as JSON, added to a ``ClientAggregator`` in shuffled
order and emitted. Both are also checked against docs/CONTRACT.md's rule token by token, and both
carry the same on-policy gauge.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import pytest
import torch
from cliptrack.adapters.megatron import make_loss_func, reduce_losses
from cliptrack.adapters.miles import ClientAggregator, forward_backward_loss, output_to_json
from cliptrack.core import keys

from tests import _harness as harness
from tests import _megatron_setup as setup

CLIP_METRICS = (keys.LOSS_TOKENS, *keys.CLIP_COUNT_KEYS, keys.CLIP_FRACTION)


def as_datum(loss_fn: str, batch: setup.GlobalBatch, row: int) -> dict:
    """Sequence ``row`` of the batch as a Tinker datum's loss_fn_inputs (JSON TensorData)."""

    def td(t: torch.Tensor, dtype: str = "float32") -> dict:
        return {"data": t.tolist(), "dtype": dtype, "shape": list(t.shape)}

    datum = {"target_tokens": td(batch.labels[row], "int64"), "mask": td(batch.mask[row])}
    if loss_fn == "cross_entropy":
        datum["weights"] = td(batch.mask[row])
    else:
        datum["logprobs"] = td(batch.sampling_logprobs[row])
        datum["advantages"] = td(batch.advantages[row])
    return datum


def miles_path(
    scenario: str, batch: setup.GlobalBatch, chunk_sizes: list[int], seed: int
) -> dict[str, float]:
    spec = setup.SCENARIOS[scenario]
    policy = setup.reference_logprobs(batch.tokens, batch.labels)
    rows = list(range(batch.tokens.shape[0]))
    chunks, start = [], 0
    for size in chunk_sizes:
        part = rows[start : start + size]
        start += size
        result = forward_backward_loss(
            [as_datum(spec["loss_fn"], batch, r) for r in part],
            [policy[r] for r in part],
            spec["loss_fn"],
            spec["config"],
        )
        chunks.append(json.loads(json.dumps(output_to_json(result.output))))  # over HTTP
    assert start == len(rows)
    random.Random(seed).shuffle(chunks)
    agg = ClientAggregator()
    agg.register("miles-run")
    for chunk in chunks:
        agg.add("miles-run", 0, chunk)
    return agg.emit("miles-run", 0).metrics


def clip_metrics(metrics: dict[str, float]) -> dict[str, float]:
    return {k: metrics[k] for k in CLIP_METRICS if k in metrics}


def assert_same_gauge(miles: dict[str, float], megatron: dict[str, float], *, same_logprobs: bool) -> None:
    """Both paths carry the same gauge: the same keys and the outside count exactly. Given the same
    float32 log-probs, the extremes exactly too and the float64 sums and means to their summation
    order (and the wire's float32 pairs, 2**-48 of each datum's value); given log-probs from two
    computations of one model (Megatron's schedule and a plain forward), to float32 rounding."""
    assert {k for k in keys.GAUGE_KEYS if k in miles} == {k for k in keys.GAUGE_KEYS if k in megatron}
    tokens = megatron[keys.LOSS_TOKENS]
    for key in keys.GAUGE_KEYS:
        if key not in megatron:
            continue
        if key == keys.RATIO_OUTSIDE_TOKENS or (same_logprobs and key in keys.EXTREME_KEYS):
            assert miles[key] == megatron[key], key
        elif same_logprobs:
            assert miles[key] == pytest.approx(megatron[key], rel=1e-12, abs=1e-12), key
        else:
            assert miles[key] == pytest.approx(megatron[key], rel=1e-5, abs=1e-6 * tokens), key


@pytest.fixture(scope="module")
def megatron_one_rank() -> Iterator[None]:
    """Megatron's parallel_state on a one-rank gloo group over 127.0.0.1, CUDA literals on CPU."""
    pytest.importorskip("megatron.core")
    with harness.megatron_one_rank():
        yield


@pytest.mark.parametrize("scenario", ["ppo", "cispo", "ppo_nothing_clips", "cross_entropy"])
def test_megatron_schedule_and_miles_runtime_emit_identical_clip_metrics(megatron_one_rank, scenario):
    n_seq = setup.N_MICRO * setup.MICRO_BATCH
    batch = setup.global_batch(scenario, n_seq)
    data = list(setup.micro_batches(scenario, batch, dp_rank=0, cp_rank=0, cp=1))
    reports = setup.run_step(setup.build_model(), scenario, data, seq_len=setup.SEQ_LEN)
    megatron = reduce_losses(reports)
    assert megatron is not None
    miles = miles_path(scenario, batch, chunk_sizes=[1, 2, n_seq - 3], seed=0)
    assert clip_metrics(miles) == clip_metrics(megatron.metrics)
    assert_same_gauge(miles, megatron.metrics, same_logprobs=False)
    assert miles[keys.LOSS_SUM] == pytest.approx(megatron.metrics[keys.LOSS_SUM], rel=1e-5, abs=1e-4)
    if setup.SCENARIOS[scenario]["loss_fn"] == "cross_entropy":
        assert not {keys.CLIP_FRACTION, *keys.CLIP_COUNT_KEYS, *keys.GAUGE_KEYS} & (
            set(miles) | set(megatron.metrics)
        )
    else:
        assert keys.KL_K3_MEAN in miles and miles[keys.LOG_RATIO_MAX] >= miles[keys.LOG_RATIO_MIN]
    if setup.SCENARIOS[scenario]["loss_fn"] == "ppo":  # and both follow docs/CONTRACT.md's rule
        n, clipped, low, high = setup.plain_ppo_counts(batch)
        assert [miles[k] for k in (keys.LOSS_TOKENS, *keys.CLIP_COUNT_KEYS)] == [n, clipped, low, high]


@pytest.mark.parametrize(
    "scenario, micro_rows, chunk_sizes",
    [
        ("ppo", [1, 5, 2, 8], [16]),
        ("ppo", [16], [3, 3, 3, 3, 4]),
        ("cispo", [4, 4, 4, 4], [1] * 16),
        ("ppo_empty_last_rank", [2, 6, 8], [7, 9]),
        ("ppo_nothing_clips", [3, 13], [10, 6]),
    ],
)
def test_hand_rolled_megatron_loop_and_miles_runtime_agree_for_any_split(scenario, micro_rows, chunk_sizes):
    """Without megatron-core: micro-batches of any size vs chunks of any size, same global batch."""
    spec = setup.SCENARIOS[scenario]
    batch = setup.global_batch(scenario, 16, dp=2, seed=3)
    policy = setup.reference_logprobs(batch.tokens, batch.labels)
    reports, start = [], 0
    for n in micro_rows:
        rows, start = slice(start, start + n), start + n
        loss_func = make_loss_func(
            spec["loss_fn"], setup.loss_inputs(spec["loss_fn"], batch, rows, slice(None)), spec["config"]
        )
        reports.append(loss_func(policy[rows])[2])
    megatron = reduce_losses(reports, group=None)
    assert megatron is not None
    miles = miles_path(scenario, batch, chunk_sizes, seed=len(micro_rows))
    assert clip_metrics(miles) == clip_metrics(megatron.metrics)
    assert keys.CLIPPED_TOKENS in miles
    assert_same_gauge(miles, megatron.metrics, same_logprobs=True)
    assert keys.KL_K3_SUM in miles
