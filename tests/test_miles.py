"""The Miles-runtime path: per-datum counts from the runtime, exact through JSON, tinker's types,
tinker's chunk merger and protobuf, summed per client; Miles' own log dict; bad input.

Expected values come from the plain per-token references in ``tests/reference.py`` (one token at a
time in Python), never from the code under test.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
import textwrap
from fractions import Fraction

import numpy as np
import pytest
import torch
from cliptrack.adapters.losses import builtin as losses
from cliptrack.adapters.miles import (
    MAX_CHUNK_DATUMS,
    ClientAggregator,
    UnknownClientError,
    aggregate_datums,
    forward_backward_loss,
    log_entries,
    output_from_json,
    output_to_json,
    output_to_proto,
    read_train_log,
    sum_train_logs,
)
from cliptrack.adapters.miles import keys as miles_keys
from cliptrack.core import keys
from tinker import types as tinker_types
from tinker.lib.chunked_fwdbwd_helpers import combine_fwd_bwd_output_results
from tinker.proto.response_conv import deserialize_forward_backward_output

from tests import reference

# ---- a batch of datums and its plain reference --------------------------------------------------


def make_batch(n_datums: int, seed: int, *, min_len: int = 1, max_len: int = 12, spread: float = 0.4):
    """Datums in Tinker's JSON ``loss_fn_inputs`` form and the policy's log-prob tensors."""
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    datums, policy = [], []
    for _ in range(n_datums):
        n = rng.randint(min_len, max_len)
        sampling = torch.randn(n, generator=gen) * 0.3 - 1.5
        lp = sampling + torch.randn(n, generator=gen) * spread
        adv = torch.randn(n, generator=gen)
        mask = (torch.rand(n, generator=gen) > 0.25).float()
        datums.append(
            {
                "target_tokens": {"data": list(range(n)), "dtype": "int64", "shape": [n]},
                "logprobs": {"data": sampling.tolist(), "dtype": "float32", "shape": [n]},
                "advantages": {"data": adv.tolist(), "dtype": "float32", "shape": [n]},
                "mask": {"data": mask.tolist(), "dtype": "float32", "shape": [n]},
            }
        )
        policy.append(lp.float())
    return datums, policy


def field(datum, name):
    return torch.tensor(datum[name]["data"], dtype=torch.float32)


def reference_counts(datums, policy, loss_fn="ppo", low=0.8, high=1.2):
    """Per-datum reference counts (plain per-token Python), in datum order."""
    per_token = reference.per_token_ppo if loss_fn == "ppo" else reference.per_token_cispo
    return [
        per_token(lp, field(d, "logprobs"), field(d, "advantages"), field(d, "mask"), low, high)
        for d, lp in zip(datums, policy, strict=True)
    ]


def total_of(counts):
    return (
        sum(c.loss_tokens for c in counts),
        sum(c.clipped for c in counts),
        sum(c.low for c in counts),
        sum(c.high for c in counts),
    )


def assert_exact(metrics, counts):
    loss_tokens, clipped, low, high = total_of(counts)
    assert metrics[keys.LOSS_TOKENS] == loss_tokens
    assert metrics[keys.CLIPPED_TOKENS] == clipped
    assert metrics[keys.CLIPPED_LOW_TOKENS] == low
    assert metrics[keys.CLIPPED_HIGH_TOKENS] == high
    # the fraction is formed once, from the sums: bit-identical to the exact ratio rounded once
    assert metrics[keys.CLIP_FRACTION] == float(Fraction(clipped, loss_tokens))


def chunks_of(items, sizes):
    out, start = [], 0
    for size in sizes:
        out.append(items[start : start + size])
        start += size
    assert start == len(items)
    return out


# ---- runtime side ---------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_fn", ["ppo", "cispo"])
def test_runtime_per_datum_counts_loss_and_gradient_match_the_reference(loss_fn):
    datums, policy = make_batch(24, seed=1)
    low, high = (0.8, 1.2) if loss_fn == "ppo" else (0.0, 4.0)
    policy = [lp.clone().requires_grad_() for lp in policy]
    result = forward_backward_loss(datums, policy, loss_fn)
    expected = reference_counts(datums, [lp.detach() for lp in policy], loss_fn, low, high)
    assert len(result.output.loss_fn_outputs) == len(datums)
    for out, ref, lp in zip(result.output.loss_fn_outputs, expected, policy, strict=True):
        assert out[keys.DATUM_LOSS_TOKENS].tolist() == [ref.loss_tokens]
        assert out[keys.DATUM_CLIPPED_TOKENS].tolist() == [ref.clipped]
        assert out[keys.DATUM_CLIPPED_LOW_TOKENS].tolist() == [ref.low]
        assert out[keys.DATUM_CLIPPED_HIGH_TOKENS].tolist() == [ref.high]
        assert out[keys.DATUM_CLIPPED_TOKENS].dtype == "int64" and out[keys.DATUM_CLIPPED_TOKENS].shape == [1]
        assert out[keys.DATUM_LOGPROBS].dtype == "float32"
        assert np.array_equal(out[keys.DATUM_LOGPROBS].to_numpy(), lp.detach().numpy())
    assert_exact(result.output.metrics, expected)
    assert result.output.metrics[keys.LOSS_SUM] == pytest.approx(sum(r.loss for r in expected), rel=1e-5)
    # the gradient is that of Tinker's plain objective summed over datums
    result.loss.backward()
    objective = reference.objective_ppo if loss_fn == "ppo" else reference.objective_cispo
    plain = [lp.detach().clone().requires_grad_() for lp in policy]
    sum(
        objective(lp, field(d, "logprobs"), field(d, "advantages"), field(d, "mask"), low, high)
        for d, lp in zip(datums, plain, strict=True)
    ).backward()
    for lp, ref in zip(policy, plain, strict=True):
        assert torch.equal(lp.grad, ref.grad)


def test_per_datum_thresholds_override_the_request_config():
    datums, policy = make_batch(6, seed=2, spread=0.6)
    thresholds = [(0.5, 1.5), (0.9, 1.1), None, (0.7, 1.3), None, (0.95, 1.05)]
    for i, (d, t) in enumerate(zip(datums, thresholds, strict=True)):
        if t is None:
            continue
        n = len(d["mask"]["data"])
        if i % 2:  # one value per datum
            d["clip_low_threshold"] = {"data": [t[0]], "dtype": "float32", "shape": [1]}
            d["clip_high_threshold"] = {"data": [t[1]], "dtype": "float32", "shape": [1]}
        else:  # one value per token, as tinker's datum.py types them
            d["clip_low_threshold"] = {"data": [t[0]] * n, "dtype": "float32", "shape": [n]}
            d["clip_high_threshold"] = {"data": [t[1]] * n, "dtype": "float32", "shape": [n]}
    config = {"clip_low_threshold": 0.85, "clip_high_threshold": 1.15}
    result = forward_backward_loss(datums, policy, "ppo", config)
    for d, lp, t, out in zip(datums, policy, thresholds, result.output.loss_fn_outputs, strict=True):
        low, high = t if t is not None else (0.85, 1.15)
        # thresholds travel as float32 on the wire: the reference uses the same rounded bounds
        low, high = float(np.float32(low)), float(np.float32(high))
        ref = reference.per_token_ppo(
            lp, field(d, "logprobs"), field(d, "advantages"), field(d, "mask"), low, high
        )
        assert out[keys.DATUM_CLIPPED_LOW_TOKENS].tolist() == [ref.low]
        assert out[keys.DATUM_CLIPPED_HIGH_TOKENS].tolist() == [ref.high]


def test_one_host_transfer_per_request():
    datums, policy = make_batch(16, seed=3)
    tensor_datums = [{k: torch.tensor(v["data"]) for k, v in d.items()} for d in datums]
    calls = []
    names = ("item", "tolist", "numpy", "__float__", "__int__", "__bool__", "cpu")
    saved = {name: getattr(torch.Tensor, name) for name in names}

    def counting(name):
        def method(self, *args, **kwargs):
            calls.append(name)
            return saved[name](self, *args, **kwargs)

        return method

    with contextlib.ExitStack() as stack:
        for name in names:
            setattr(torch.Tensor, name, counting(name))
            stack.callback(setattr, torch.Tensor, name, saved[name])
        forward_backward_loss(tensor_datums, policy, "ppo")
    assert calls == ["cpu", "numpy"]  # one stacked copy of every count, loss and log-prob


def test_a_loss_that_never_clips_yields_no_clip_keys():
    datums, policy = make_batch(5, seed=4)
    for loss_fn, config in [("importance_sampling", None), ("dro", {"beta": 0.1})]:
        result = forward_backward_loss(datums, policy, loss_fn, config)
        expected_tokens = sum(int(sum(d["mask"]["data"])) for d in datums)
        assert result.output.metrics[keys.LOSS_TOKENS] == expected_tokens
        assert not set(keys.CLIP_SERIES_KEYS) - {keys.LOSS_TOKENS} & set(result.output.metrics)
        for out in result.output.loss_fn_outputs:  # no clip fields; the gauge (sampling log-probs)
            assert set(out) == {keys.DATUM_LOGPROBS, keys.DATUM_LOSS_TOKENS, *keys.DATUM_GAUGE_FIELDS}
        metrics = aggregate_datums(json.loads(json.dumps(output_to_json(result.output))))
        assert metrics[keys.LOSS_TOKENS] == expected_tokens
        assert keys.CLIP_FRACTION not in metrics and keys.CLIPPED_TOKENS not in metrics
    ce = [{"target_tokens": d["target_tokens"], "weights": d["mask"]} for d in datums]
    result = forward_backward_loss(ce, policy, "cross_entropy")
    assert result.output.metrics[keys.LOSS_TOKENS] == expected_tokens
    assert keys.CLIPPED_TOKENS not in result.output.metrics
    assert not set(keys.GAUGE_KEYS) & set(result.output.metrics)  # no sampling log-probs: no gauge
    for out in result.output.loss_fn_outputs:
        assert set(out) == {keys.DATUM_LOGPROBS, keys.DATUM_LOSS_TOKENS}


def test_runtime_accepts_tinker_datums():
    datums, policy = make_batch(4, seed=5)
    tinker_datums = [
        tinker_types.Datum(
            model_input=tinker_types.ModelInput.from_ints(d["target_tokens"]["data"]),
            loss_fn_inputs={
                k: np.asarray(v["data"], dtype=np.float32 if v["dtype"] == "float32" else np.int64)
                for k, v in d.items()
            },
        )
        for d in datums
    ]
    typed = forward_backward_loss(tinker_datums, policy, "ppo").output.metrics
    plain = forward_backward_loss(datums, policy, "ppo").output.metrics
    assert typed == plain
    assert_exact(typed, reference_counts(datums, policy))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d, c: d[0].pop("advantages"), r"datum 0: .*lacks \['advantages'\]"),
        (
            lambda d, c: d[1].update(target_tokens={"data": [1], "dtype": "int64", "shape": [1]}),
            r"datum 1: target_tokens has 1",
        ),
        (
            lambda d, c: d[2]["advantages"]["data"].__setitem__(0, float("nan")),
            r"datum 2: invalid loss input",
        ),
        (lambda d, c: d[0]["mask"]["data"].__setitem__(0, 0.5), r"datum 0: invalid loss input"),
        (lambda d, c: c.update(clip_low_threshold=1.5), r"clip_low_threshold=1.5 is above"),
        (lambda d, c: c.update(beta=0.1), r"loss_fn_config keys \['beta'\] are not used by 'ppo'"),
        (
            lambda d, c: d[1]["advantages"]["data"].__setitem__(1, "high"),
            r"datum 1: loss_fn_inputs\['advantages'\].*'high'",
        ),
    ],
)
def test_runtime_bad_input_names_datum_and_input(mutate, message):
    datums, policy = make_batch(3, seed=6, min_len=3)
    config = {}
    mutate(datums, config)
    with pytest.raises(ValueError, match=message):
        forward_backward_loss(datums, policy, "ppo", config)


def test_runtime_refuses_unknown_loss_and_mismatched_lengths():
    datums, policy = make_batch(3, seed=7)
    with pytest.raises(ValueError, match="unknown loss_fn 'grpo'"):
        forward_backward_loss(datums, policy, "grpo")
    with pytest.raises(ValueError, match="3 datums but 2 logprobs"):
        forward_backward_loss(datums, policy[:2], "ppo")
    with pytest.raises(ValueError, match="needs loss_fn_config\\['beta'\\]"):
        forward_backward_loss(datums, policy, "dro")


# ---- wire round trips: JSON, tinker's types, tinker's chunk merger, protobuf ------------------------


def run_chunks(datums, policy, sizes, loss_fn="ppo"):
    return [
        forward_backward_loss(d, p, loss_fn).output
        for d, p in zip(chunks_of(datums, sizes), chunks_of(policy, sizes), strict=True)
    ]


def test_json_round_trip_over_http_gives_the_single_process_fraction():
    datums, policy = make_batch(40, seed=8)
    expected = reference_counts(datums, policy)
    chunks = run_chunks(datums, policy, [7, 20, 13])
    wire = [json.loads(json.dumps(output_to_json(c))) for c in chunks]  # what a REST frontend returns
    random.Random(0).shuffle(wire)
    assert_exact(aggregate_datums(wire), expected)
    typed = [output_from_json(w) for w in wire]  # parsed into tinker's own TensorData
    assert isinstance(typed[0].loss_fn_outputs[0][keys.DATUM_CLIPPED_TOKENS], tinker_types.TensorData)
    assert_exact(aggregate_datums(typed), expected)


def test_tinker_chunk_merger_gives_the_single_process_fraction_and_its_own_mean_does_not():
    # chunks of <= 1024 datums with very different token densities, as tinker's client splits them
    short, short_policy = make_batch(1024, seed=9, min_len=1, max_len=2, spread=1.0)
    long, long_policy = make_batch(300, seed=10, min_len=30, max_len=40, spread=0.1)
    datums, policy = short + long, short_policy + long_policy
    expected = reference_counts(datums, policy)
    single = forward_backward_loss(datums, policy, "ppo").output
    assert_exact(single.metrics, expected)
    sizes = [MAX_CHUNK_DATUMS, len(datums) - MAX_CHUNK_DATUMS]
    chunks = [
        output_from_json(json.loads(json.dumps(output_to_json(c)))) for c in run_chunks(datums, policy, sizes)
    ]
    merged = combine_fwd_bwd_output_results(list(reversed(chunks)))  # tinker's own merger, any order
    assert isinstance(merged, tinker_types.ForwardBackwardOutput)
    assert_exact(aggregate_datums(merged), expected)
    assert aggregate_datums(merged) == aggregate_datums(single)
    # tinker weights ``clip_fraction:mean`` by datum count, which is not the token fraction
    loss_tokens, clipped, _, _ = total_of(expected)
    assert merged.metrics[keys.CLIP_FRACTION] != pytest.approx(clipped / loss_tokens, rel=1e-3)


def test_protobuf_round_trip_through_tinkers_own_decoder():
    datums, policy = make_batch(12, seed=11)
    output = forward_backward_loss(datums, policy, "cispo").output
    decoded = deserialize_forward_backward_output(output_to_proto(output))
    assert len(decoded.loss_fn_outputs) == 12
    for a, b in zip(output.loss_fn_outputs, decoded.loss_fn_outputs, strict=True):
        assert b[keys.DATUM_CLIPPED_TOKENS].shape == [1]
        assert np.array_equal(a[keys.DATUM_LOGPROBS].to_numpy(), b[keys.DATUM_LOGPROBS].to_numpy())
    assert_exact(aggregate_datums(decoded), reference_counts(datums, policy, "cispo", 0.0, 4.0))
    assert decoded.metrics == output.metrics


# ---- per-client aggregation -----------------------------------------------------------------------


def test_two_clients_interleaved_on_one_runtime_never_mix():
    batches = {
        "run-a": make_batch(30, seed=12, spread=0.2),
        "run-b": make_batch(25, seed=13, spread=0.8),
    }
    agg = ClientAggregator()
    arrivals = []
    expected = {}
    for client, (datums, policy) in batches.items():
        agg.register(client)
        for step in (1, 2):
            half = len(datums) // 2
            step_datums, step_policy = (
                (datums[:half], policy[:half]) if step == 1 else (datums[half:], policy[half:])
            )
            expected[client, step] = reference_counts(step_datums, step_policy)
            sizes = [3, 5, len(step_datums) - 8]
            for chunk in run_chunks(step_datums, step_policy, sizes):
                arrivals.append((client, step, json.loads(json.dumps(output_to_json(chunk)))))
    random.Random(1).shuffle(arrivals)  # chunks of both clients and both steps interleaved
    for client, step, chunk in arrivals:
        agg.add(client, step, chunk)
    assert agg.pending_steps("run-a") == [1, 2] and agg.pending_steps("run-b") == [1, 2]
    for (client, step), counts in expected.items():
        fbo = agg.emit(client, step)
        assert isinstance(fbo, tinker_types.ForwardBackwardOutput)
        assert_exact(fbo.metrics, counts)
    assert total_of(expected["run-a", 1]) != total_of(expected["run-b", 1])


def test_several_forward_backward_calls_of_one_step_sum_ppo_with_cispo():
    datums, policy = make_batch(20, seed=14)
    agg = ClientAggregator(keep_outputs=True)
    agg.register("run")
    agg.add("run", 0, forward_backward_loss(datums[:12], policy[:12], "ppo").output)
    agg.add("run", 0, forward_backward_loss(datums[12:], policy[12:], "cispo").output)
    fbo = agg.emit("run", 0)
    expected = reference_counts(datums[:12], policy[:12]) + reference_counts(
        datums[12:], policy[12:], "cispo", 0.0, 4.0
    )
    assert_exact(fbo.metrics, expected)
    assert len(fbo.loss_fn_outputs) == 20
    assert keys.LOSS_SUM in fbo.metrics


def good_chunk(seed, n=6):
    datums, policy = make_batch(n, seed=seed)
    return json.loads(json.dumps(output_to_json(forward_backward_loss(datums, policy, "ppo").output))), (
        reference_counts(datums, policy)
    )


def set_count(chunk, i, name, value, dtype="int64"):
    chunk["loss_fn_outputs"][i][name] = {"data": [value], "dtype": dtype, "shape": [1]}
    chunk["metrics"] = {}


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (
            lambda c: set_count(c, 1, keys.DATUM_CLIPPED_TOKENS, 10**6),
            r"clipped_tokens=1000000 exceeds loss_tokens",
        ),
        (lambda c: set_count(c, 0, keys.DATUM_LOSS_TOKENS, -3), r"loss_tokens'\] must be >= 0"),
        (lambda c: set_count(c, 2, keys.DATUM_CLIPPED_LOW_TOKENS, 1.5), r"whole number of tokens"),
        (lambda c: set_count(c, 2, keys.DATUM_LOSS_TOKENS, 4.0, "float32"), r"must be an int64 token count"),
        (lambda c: c["loss_fn_outputs"][3].pop(keys.DATUM_LOSS_TOKENS), r"\[3\] has no 'loss_tokens' field"),
        (
            lambda c: c["loss_fn_outputs"][1].pop(keys.DATUM_CLIPPED_HIGH_TOKENS),
            r"but not \['clipped_high_tokens'\]",
        ),
        (
            lambda c: c["loss_fn_outputs"][4].update(
                {keys.DATUM_LOSS_TOKENS: {"data": [1, 2], "dtype": "int64"}}
            ),
            r"exactly one token count",
        ),
        (
            lambda c: c["loss_fn_outputs"][2].update(
                {keys.DATUM_LOSS_TOKENS: {"data": [3], "dtype": "int64", "shape": "1"}}
            ),
            r"\[2\]\['loss_tokens'\] has shape '1'.*list of dimensions",
        ),
        (
            lambda c: c["loss_fn_outputs"][0].update(
                {keys.DATUM_CLIPPED_TOKENS: {"data": [0], "dtype": "int64", "shape": [None]}}
            ),
            r"\[0\]\['clipped_tokens'\] has shape \[None\]",
        ),
        (
            lambda c: c["metrics"].update({keys.LOSS_TOKENS: 10**5}),
            r"loss_tokens:sum.\] = 100000 but its datums sum to",
        ),
    ],
)
def test_bad_chunks_raise_and_leave_the_sums_untouched(corrupt, message):
    agg = ClientAggregator()
    agg.register("run")
    first, first_counts = good_chunk(15)
    last, last_counts = good_chunk(16)
    agg.add("run", 3, first)
    bad, _ = good_chunk(17)
    corrupt(bad)
    with pytest.raises(ValueError, match=message):
        agg.add("run", 3, bad)
    agg.add("run", 3, last)
    assert_exact(agg.emit("run", 3).metrics, first_counts + last_counts)


def test_mixed_loss_kinds_unknown_clients_and_closed_steps_are_refused():
    datums, policy = make_batch(8, seed=18)
    agg = ClientAggregator()
    agg.register("run")
    agg.add("run", 0, forward_backward_loss(datums, policy, "ppo").output)
    with pytest.raises(
        ValueError, match="never clips but earlier outputs of the step come from one that clips"
    ):
        agg.add("run", 0, forward_backward_loss(datums, policy, "importance_sampling").output)
    with pytest.raises(UnknownClientError, match="unknown client 'other'.*registered: 'run'"):
        agg.add("other", 0, forward_backward_loss(datums, policy, "ppo").output)
    with pytest.raises(ValueError, match="already registered"):
        agg.register("run")
    assert_exact(agg.emit("run", 0).metrics, reference_counts(datums, policy))
    with pytest.raises(ValueError, match="already emitted"):
        agg.add("run", 0, forward_backward_loss(datums, policy, "ppo").output)
    with pytest.raises(ValueError, match="no outputs for step 0 \\(it was already emitted\\)"):
        agg.emit("run", 0)
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        agg.add("run", -1, forward_backward_loss(datums, policy, "ppo").output)
    # within one request: a datum without clip fields among clipping datums
    mixed = output_to_json(forward_backward_loss(datums, policy, "ppo").output)
    for name in (keys.DATUM_CLIPPED_TOKENS, keys.DATUM_CLIPPED_LOW_TOKENS, keys.DATUM_CLIPPED_HIGH_TOKENS):
        mixed["loss_fn_outputs"][5].pop(name)
    mixed["metrics"] = {}
    with pytest.raises(ValueError, match=r"\[5\]: this output comes from a loss that never clips"):
        aggregate_datums(mixed)
    # across the outputs of one call: the offending output is named
    with pytest.raises(ValueError, match=r"^outputs\[2\]: this output comes from a loss that never clips"):
        aggregate_datums(
            [
                forward_backward_loss(datums, policy, loss).output
                for loss in ("ppo", "cispo", "importance_sampling")
            ]
        )


def test_steps_accept_numpy_integers_and_stop_at_the_trackers_64_bit_bound():
    datums, policy = make_batch(4, seed=22)
    agg = ClientAggregator()
    agg.register("run")
    agg.add("run", np.int64(2), forward_backward_loss(datums[:2], policy[:2], "ppo").output)
    agg.add("run", 2, forward_backward_loss(datums[2:], policy[2:], "ppo").output)
    assert agg.pending_steps("run") == [2] and type(agg.pending_steps("run")[0]) is int
    assert_exact(agg.emit("run", np.uint32(2)).metrics, reference_counts(datums, policy))
    agg.add("run", 2**63 - 1, forward_backward_loss(datums, policy, "ppo").output)
    with pytest.raises(ValueError, match=r"step 9223372036854775808 does not fit a signed 64-bit integer"):
        agg.add("run", 2**63, forward_backward_loss(datums, policy, "ppo").output)
    for bad in (True, 2.0, np.float64(2.0), "2", np.int64(-1)):
        with pytest.raises(ValueError, match="step must be an int >= 0"):
            agg.add("run", bad, forward_backward_loss(datums, policy, "ppo").output)
    assert agg.pending_steps("run") == [2**63 - 1]


def test_a_step_of_a_loss_that_never_clips_emits_no_clip_keys():
    datums, policy = make_batch(8, seed=19)
    agg = ClientAggregator()
    agg.register("sft")
    agg.add("sft", 5, forward_backward_loss(datums[:4], policy[:4], "importance_sampling").output)
    agg.add("sft", 5, forward_backward_loss(datums[4:], policy[4:], "dro", {"beta": 0.5}).output)
    metrics = agg.emit("sft", 5).metrics
    assert metrics[keys.LOSS_TOKENS] == sum(int(sum(d["mask"]["data"])) for d in datums)
    assert not {keys.CLIP_FRACTION, *keys.CLIP_COUNT_KEYS} & set(metrics)


# ---- Miles' own train-step log dict ----------------------------------------------------------------


def miles_micro_batch_log(datums, policy, *, per_token, extra=False):
    """The log dict Miles' loss_function returns for one micro-batch (its formulas, written plainly)."""
    count = 0.0
    clipfrac = 0.0
    for d, lp in zip(datums, policy, strict=True):
        ref = reference.per_token_ppo(
            lp, field(d, "logprobs"), field(d, "advantages"), field(d, "mask"), 0.8, 1.2
        )
        eligible = int(sum(d["mask"]["data"]))
        if per_token:
            count += max(eligible, 1)
            clipfrac += ref.clipped
        else:
            count += 1
            clipfrac += ref.clipped / max(eligible, 1)
    names = ["loss", "pg_loss", miles_keys.PG_CLIPFRAC, "ppo_kl"]
    values = [count, 0.5, 0.25, clipfrac, 0.01]
    if extra:
        mask = torch.cat([field(d, "mask") for d in datums])
        out = losses.ppo(
            torch.cat(policy),
            torch.cat([field(d, "logprobs") for d in datums]),
            torch.cat([field(d, "advantages") for d in datums]),
            mask,
        )
        entries = log_entries(out)
        names += list(entries)
        values += [float(v) for v in entries.values()]
    return {"keys": names, "values": torch.tensor(values, dtype=torch.float64 if extra else torch.float32)}


def test_miles_log_dict_in_per_token_mode_gives_exact_counts():
    datums, policy = make_batch(30, seed=20, min_len=2)
    for d in datums:  # Miles counts a sample with no eligible token as 1; keep every sample eligible
        d["mask"]["data"][0] = 1.0
    expected = reference_counts(datums, policy)
    loss_tokens, clipped, low, high = total_of(expected)
    # micro-batches on 2 DP ranks, summed as Miles' train_one_step does
    logs = [
        miles_micro_batch_log(datums[a:b], policy[a:b], per_token=True)
        for a, b in [(0, 7), (7, 15), (15, 30)]
    ]
    counts = read_train_log(sum_train_logs(logs), calculate_per_token_loss=True)
    assert (counts.loss_tokens, counts.get(keys.CLIPPED_TOKENS)) == (loss_tokens, clipped)
    assert counts.fraction == clipped / loss_tokens
    # Miles' own log has no low/high split: the clip metrics come without the split series
    assert counts.to_metrics() == {
        keys.LOSS_TOKENS: loss_tokens,
        keys.CLIPPED_TOKENS: clipped,
        keys.CLIP_FRACTION: clipped / loss_tokens,
    }
    # with cliptrack's entries the split is known too
    logs = [
        miles_micro_batch_log(datums[a:b], policy[a:b], per_token=True, extra=True)
        for a, b in [(0, 12), (12, 30)]
    ]
    counts = read_train_log(sum_train_logs(logs), calculate_per_token_loss=True)
    assert (counts.get(keys.CLIPPED_LOW_TOKENS), counts.get(keys.CLIPPED_HIGH_TOKENS)) == (low, high)
    assert counts.to_metrics()[keys.CLIP_FRACTION] == clipped / loss_tokens
    # context parallelism: each CP rank counts the full masks but sums only its own slice
    cp_log = sum_train_logs(logs)
    cp_log["values"][0] *= 2
    assert read_train_log(cp_log, calculate_per_token_loss=True, context_parallel_size=2) == counts


def test_miles_log_dict_in_per_sample_mean_mode_is_refused():
    datums, policy = make_batch(6, seed=21)
    log = miles_micro_batch_log(datums, policy, per_token=False)
    with pytest.raises(
        ValueError, match="per-sample-mean mode.*cannot be recovered.*--calculate-per-token-loss"
    ):
        read_train_log(log, calculate_per_token_loss=False)


def test_miles_log_dict_bad_shapes_and_inexact_values_are_refused():
    with pytest.raises(ValueError, match="2 keys but 2 values"):
        read_train_log({"keys": ["loss", "pg_clipfrac"], "values": [3.0, 1.0]}, calculate_per_token_loss=True)
    with pytest.raises(ValueError, match="'count' = 33554432 is beyond 16777216 in float32"):
        read_train_log(
            {"keys": ["pg_clipfrac"], "values": torch.tensor([2.0**25, 3.0], dtype=torch.float32)},
            calculate_per_token_loss=True,
        )
    # half precision: 1001 tokens in bfloat16 reads back as 1000; 2049 in float16 as 2048
    with pytest.raises(ValueError, match="'count' = 1000 is beyond 256 in bfloat16"):
        read_train_log(
            {"keys": ["pg_clipfrac"], "values": torch.tensor([1001.0, 3.0], dtype=torch.bfloat16)},
            calculate_per_token_loss=True,
        )
    with pytest.raises(ValueError, match="logs\\[1\\] value 'count' = 4096 is beyond 2048 in float16"):
        sum_train_logs(
            [
                {"keys": ["pg_clipfrac"], "values": torch.tensor([10.0, 3.0], dtype=torch.float16)},
                {"keys": ["pg_clipfrac"], "values": torch.tensor([4096.0, 2049.0], dtype=torch.float16)},
            ]
        )
    # counts exact in their own dtype stay exact when summed past its limit; other values are not counts
    halves = [
        {"keys": ["pg_clipfrac", "loss"], "values": torch.tensor([200.0, 7.0, 1e6], dtype=torch.bfloat16)}
    ] * 3
    assert read_train_log(sum_train_logs(halves), calculate_per_token_loss=True).loss_tokens == 600
    with pytest.raises(ValueError, match="whole number of tokens"):
        read_train_log({"keys": ["pg_clipfrac"], "values": [10.0, 2.5]}, calculate_per_token_loss=True)
    with pytest.raises(ValueError, match="neither 'pg_clipfrac' nor 'clipped_tokens'"):
        read_train_log({"keys": ["loss"], "values": [10.0, 2.5]}, calculate_per_token_loss=True)
    with pytest.raises(ValueError, match="not a multiple of context_parallel_size=2"):
        read_train_log(
            {"keys": ["pg_clipfrac"], "values": [11.0, 2.0]},
            calculate_per_token_loss=True,
            context_parallel_size=2,
        )
    with pytest.raises(ValueError, match="keys .* but logs\\[0\\] has"):
        sum_train_logs([{"keys": ["a"], "values": [1.0, 2.0]}, {"keys": ["b"], "values": [1.0, 2.0]}])


# ---- without tinker ----------------------------------------------------------------------------------


def test_the_path_works_without_tinker_installed(tmp_path):
    script = textwrap.dedent(
        """
        import json, sys
        sys.modules["tinker"] = None  # importing tinker now fails, as where it is not installed
        import torch
        from cliptrack.adapters.miles import ClientAggregator, aggregate_datums, forward_backward_loss, output_to_json
        from cliptrack.adapters.miles.wire import WireTensor

        lp = torch.tensor([-1.0, -2.0, -0.5, -1.5])
        datum = {"logprobs": [-1.5, -1.0, -0.5, -1.0], "advantages": [1.0, -1.0, 1.0, -1.0], "mask": [1, 1, 1, 0]}
        out = forward_backward_loss([datum, datum], [lp, lp], "ppo").output
        assert type(out).__module__ == "cliptrack.adapters._compat.tinker", type(out)
        assert isinstance(out.loss_fn_outputs[0]["clipped_tokens"], WireTensor)
        agg = ClientAggregator()
        agg.register("run")
        agg.add("run", 0, json.loads(json.dumps(output_to_json(out))))
        agg.add("run", 0, out)
        print(json.dumps([aggregate_datums(out), agg.emit("run", 0).metrics]))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    single, emitted = json.loads(done.stdout.strip().splitlines()[-1])
    # per token, by hand: r = e^0.5 (A>0, r>1.2: clipped high), e^-1 (A<0, r<0.8: clipped low),
    # 1 (not clipped); the fourth token is masked out. Two identical datums per request.
    assert single[keys.LOSS_TOKENS] == 6 and single[keys.CLIPPED_TOKENS] == 4
    assert single[keys.CLIPPED_LOW_TOKENS] == 2 and single[keys.CLIPPED_HIGH_TOKENS] == 2
    assert emitted[keys.LOSS_TOKENS] == 12 and emitted[keys.CLIP_FRACTION] == 8 / 12


def test_a_sum_metric_missing_from_some_outputs_is_dropped_not_summed_partially():
    """An output without metrics (a bare JSON dict) among outputs with ``loss:sum``: as in tinker's
    merge, a key missing from any output of the step is dropped, never summed over part of it."""
    datums, policy = make_batch(10, seed=22)
    first = forward_backward_loss(datums[:6], policy[:6], "ppo").output
    second = json.loads(
        json.dumps(output_to_json(forward_backward_loss(datums[6:], policy[6:], "ppo").output))
    )
    second["metrics"] = {}
    expected = reference_counts(datums, policy)
    agg = ClientAggregator()
    agg.register("run")
    agg.add("run", 0, first)
    agg.add("run", 0, second)
    for metrics in (
        agg.emit("run", 0).metrics,
        aggregate_datums([first, second]),
        aggregate_datums([second, first]),
    ):
        assert keys.LOSS_SUM not in metrics  # the first output's loss alone would be a wrong sum
        assert_exact(metrics, expected)
    # an output with no datums and no metrics changes nothing
    empty = {"loss_fn_outputs": [], "metrics": {}}
    both = aggregate_datums([first, empty])
    assert both[keys.LOSS_SUM] == first.metrics[keys.LOSS_SUM]
    assert_exact(both, expected[:6])
