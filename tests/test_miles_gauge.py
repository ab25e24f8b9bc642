"""The on-policy gauge through the Miles-runtime path: per datum (a sequence) on the wire, summed per
client in any chunking and order, extremes combined, means formed once from the merged sums.

The reference is plain Python over the tokens, in float64 (:func:`gauge_reference`), never the code
under test; exactness across chunkings is checked bit for bit against one unchunked request.
"""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch
from cliptrack.adapters.miles import (
    ClientAggregator,
    aggregate_datums,
    forward_backward_loss,
    output_from_json,
    output_to_json,
    output_to_proto,
)
from cliptrack.adapters.miles.wire import float_data, read_float
from cliptrack.core import keys
from hypothesis import given, settings
from hypothesis import strategies as st
from tinker.lib.chunked_fwdbwd_helpers import combine_fwd_bwd_output_results
from tinker.proto.response_conv import deserialize_forward_backward_output

from tests.reference import plain_worst

LN2 = math.log(2.0)
GAUGE_LOSSES = {
    "ppo": None,
    "cispo": None,
    "importance_sampling": None,
    "dro": {"beta": 0.1},
}


def gauge_reference(pairs: list[tuple[float, float]], low: float = 0.5, high: float = 2.0) -> dict:
    """The gauge of eligible tokens given as ``(logprob, sampling_logprob)``, one token at a time in
    float64: sums in exact order-free rounding (``math.fsum``), extremes, the outside count."""
    ls = [lp - slp for lp, slp in pairs]
    out = {
        keys.LOG_RATIO_SUM: math.fsum(ls),
        keys.ABS_LOG_RATIO_SUM: math.fsum(abs(x) for x in ls),
        keys.KL_K3_SUM: math.fsum(math.expm1(x) - x for x in ls),
        keys.RATIO_OUTSIDE_TOKENS: sum(1 for x in ls if not low <= math.exp(x) <= high),
        keys.IS_WEIGHT_SUM: math.fsum(math.exp(x) for x in ls),
        keys.IS_WEIGHT_SQ_SUM: math.fsum(math.exp(2 * x) for x in ls),
    }
    if ls:
        out[keys.LOG_RATIO_MAX] = max(ls)
        out[keys.LOG_RATIO_MIN] = min(ls)
    return out


def assert_gauge_matches(metrics: dict, reference: dict, tokens: int) -> None:
    """The gauge in ``metrics`` against the float64 reference (the loss forms per-token terms in
    float32, so float values agree to float32 rounding; counts exactly)."""
    assert metrics[keys.LOSS_TOKENS] == tokens
    assert metrics[keys.RATIO_OUTSIDE_TOKENS] == reference[keys.RATIO_OUTSIDE_TOKENS]
    for key, value in reference.items():
        assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-5 * max(1, tokens)), key
    for key in (keys.LOG_RATIO_MAX, keys.LOG_RATIO_MIN):
        assert (key in metrics) == (tokens > 0), key
    if tokens:  # the means are the merged sums over the tokens, formed once
        assert metrics[keys.KL_K3_MEAN] == metrics[keys.KL_K3_SUM] / tokens
        assert metrics[keys.ABS_LOG_RATIO_MEAN] == metrics[keys.ABS_LOG_RATIO_SUM] / tokens
    else:
        assert keys.KL_K3_MEAN not in metrics and keys.ABS_LOG_RATIO_MEAN not in metrics


def cut(items: list, cuts: list[int]) -> list[list]:
    points = sorted({c for c in cuts if 0 < c < len(items)})
    bounds = [0, *points, len(items)]
    return [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


log_ratio = st.floats(-7.5, 7.5, width=32).filter(lambda x: abs(abs(x / 3) - LN2) > 1e-3)  # l = x / 3
token = st.tuples(
    log_ratio,
    st.floats(-3.0, -0.125, width=32),  # the sampler's log-prob
    st.floats(-2.0, 2.0, width=32),  # advantage
    st.sampled_from([0.0, 1.0, 1.0, 1.0]),  # mask
)


def batch(tokens, datum_cuts, dtype=torch.float32):
    """Datums (``loss_fn_inputs`` with tensors), the policy's log-probs per datum, and the eligible
    ``(logprob, sampling_logprob)`` pairs as the tensors hold them. In float64 every per-token term
    and sum rounds, so a sum's grouping shows in its last bits."""
    sampling = torch.tensor([t[1] for t in tokens], dtype=dtype)
    policy = sampling + torch.tensor([t[0] for t in tokens], dtype=dtype) / 3
    adv = torch.tensor([t[2] for t in tokens], dtype=dtype)
    mask = torch.tensor([t[3] for t in tokens], dtype=dtype)
    datums, policies = [], []
    for span in cut(list(range(len(tokens))), datum_cuts):
        a, b = span[0], span[-1] + 1
        datums.append({"logprobs": sampling[a:b], "advantages": adv[a:b], "mask": mask[a:b]})
        policies.append(policy[a:b])
    eligible = [(float(p), float(s)) for p, s, m in zip(policy, sampling, mask, strict=True) if m]
    return datums, policies, eligible


@settings(deadline=None, max_examples=60)
@given(
    tokens=st.lists(token, min_size=1, max_size=90),
    datum_cuts=st.lists(st.integers(1, 89), max_size=25),
    chunk_cuts=st.lists(st.integers(1, 24), max_size=6),
    loss_fn=st.sampled_from(sorted(GAUGE_LOSSES)),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 2**16),
)
def test_any_chunking_and_order_gives_the_unchunked_gauge_bit_for_bit(
    tokens, datum_cuts, chunk_cuts, loss_fn, dtype, seed
):
    datums, policies, eligible = batch(tokens, datum_cuts, dtype)
    config = GAUGE_LOSSES[loss_fn]
    whole = forward_backward_loss(datums, policies, loss_fn, config).output
    unchunked = aggregate_datums(whole)
    assert_gauge_matches(unchunked, gauge_reference(eligible), len(eligible))
    # the runtime's own metrics: the same gauge from the float64 per-datum values
    assert_gauge_matches(whole.metrics, gauge_reference(eligible), len(eligible))

    outputs = []
    clipping = ("ppo", "cispo")
    for n, chunk in enumerate(cut(list(range(len(datums))), chunk_cuts)):
        # mixed datums: PPO and CISPO chunks sum together in one step (same l, same gauge)
        chunk_loss = clipping[(n + seed) % 2] if loss_fn in clipping else loss_fn
        outputs.append(
            forward_backward_loss(
                [datums[i] for i in chunk], [policies[i] for i in chunk], chunk_loss, config
            ).output
        )
    random.Random(seed).shuffle(outputs)
    wire = [json.loads(json.dumps(output_to_json(o), allow_nan=False)) for o in outputs]
    merged = combine_fwd_bwd_output_results([output_from_json(w) for w in wire])
    agg = ClientAggregator()
    agg.register("run")
    for i, o in enumerate(outputs):
        agg.add("run", 3, wire[i] if i % 2 else o)
    gauge = (*keys.GAUGE_KEYS, keys.LOSS_TOKENS)
    expected = {k: unchunked[k] for k in gauge if k in unchunked}
    for metrics in (aggregate_datums(outputs), aggregate_datums(wire), aggregate_datums(merged)):
        assert {k: metrics[k] for k in gauge if k in metrics} == expected
    assert {k: v for k, v in agg.emit("run", 3).metrics.items() if k in gauge} == expected


def test_each_datum_carries_its_own_sequences_gauge():
    """Per datum: the sums and extremes of that sequence alone; a datum with no eligible token has
    zero sums and no extreme (its wire placeholders are ignored)."""
    gen = torch.Generator().manual_seed(3)
    datums, policies, pairs = [], [], []
    for n, masked in ((7, False), (4, True), (12, False)):
        sampling = -torch.rand(n, generator=gen) * 3 - 0.1
        lp = sampling + torch.randn(n, generator=gen) * 0.5
        mask = torch.zeros(n) if masked else (torch.rand(n, generator=gen) > 0.2).float()
        datums.append({"logprobs": sampling, "advantages": torch.randn(n, generator=gen), "mask": mask})
        policies.append(lp)
        pairs.append([(float(a), float(b)) for a, b, m in zip(lp, sampling, mask, strict=True) if m])
    out = forward_backward_loss(datums, policies, "ppo").output
    for i, (datum, eligible) in enumerate(zip(out.loss_fn_outputs, pairs, strict=True)):
        assert set(keys.DATUM_GAUGE_FIELDS) <= set(datum)
        assert datum[keys.DATUM_LOSS_TOKENS].tolist() == [len(eligible)]
        one = aggregate_datums([datum])
        assert_gauge_matches(one, gauge_reference(eligible), len(eligible))
        assert datum["kl_k3"].dtype == "float32" and datum["kl_k3"].shape == [2], i
        assert datum["ratio_outside_tokens"].dtype == "int64"
    assert out.loss_fn_outputs[1]["log_ratio_max"].tolist() == [0.0, 0.0]  # placeholder, no token
    step = aggregate_datums(out)
    everything = [p for ps in pairs for p in ps]
    assert_gauge_matches(step, gauge_reference(everything), len(everything))
    assert step[keys.LOG_RATIO_MAX] == max(
        aggregate_datums([d])[keys.LOG_RATIO_MAX] for d in (out.loss_fn_outputs[0], out.loss_fn_outputs[2])
    )


def test_the_outside_bound_is_a_per_request_option():
    sampling = torch.full((6,), -1.0)
    lp = sampling + torch.tensor([0.0, 0.3, -0.3, 0.6, -0.6, 1.2])
    datums = [{"logprobs": sampling, "advantages": torch.ones(6)}]
    default = forward_backward_loss(datums, [lp], "importance_sampling").output.metrics
    assert default[keys.RATIO_OUTSIDE_TOKENS] == 1  # only exp(1.2) > 2
    narrow = forward_backward_loss(
        datums, [lp], "importance_sampling", {"ratio_outside_low": 0.8, "ratio_outside_high": 1.25}
    ).output.metrics
    assert narrow[keys.RATIO_OUTSIDE_TOKENS] == 5  # every token but l = 0
    assert aggregate_datums(forward_backward_loss(datums, [lp], "ppo").output)[keys.RATIO_OUTSIDE_TOKENS] == 1


def test_protobuf_round_trip_keeps_the_gauge():
    gen = torch.Generator().manual_seed(5)
    datums, policies = [], []
    for n in (5, 9, 3):
        sampling = -torch.rand(n, generator=gen) - 0.5
        datums.append(
            {"logprobs": sampling, "advantages": torch.randn(n, generator=gen), "mask": torch.ones(n)}
        )
        policies.append(sampling + torch.randn(n, generator=gen) * 0.3)
    datums[2]["mask"] = torch.zeros(3)  # a datum with no eligible token: placeholders, same fields
    out = forward_backward_loss(datums, policies, "cispo").output
    decoded = deserialize_forward_backward_output(output_to_proto(out))
    assert aggregate_datums(decoded) == aggregate_datums(out)


def test_mixing_a_loss_with_the_gauge_and_one_without_is_refused():
    sampling = torch.full((4,), -1.0)
    lp = sampling + 0.1
    gauged = forward_backward_loss(
        [{"logprobs": sampling, "advantages": torch.ones(4)}], [lp], "importance_sampling"
    )
    plain = forward_backward_loss([{"weights": torch.ones(4)}], [lp], "cross_entropy")
    with pytest.raises(ValueError, match=r"^outputs\[1\]: this output does not carry the gauge"):
        aggregate_datums([gauged.output, plain.output])
    agg = ClientAggregator()
    agg.register("run")
    agg.add("run", 0, plain.output)
    with pytest.raises(ValueError, match="carries the gauge measures but earlier outputs"):
        agg.add("run", 0, gauged.output)
    assert agg.emit("run", 0).metrics == aggregate_datums(plain.output)  # the sums are unchanged
    # a datum with part of the gauge
    broken = output_to_json(gauged.output)
    broken["loss_fn_outputs"][0].pop("kl_k3")
    with pytest.raises(ValueError, match=r"but not \['kl_k3'\]: the gauge's sums come together"):
        aggregate_datums(broken)
    # output metrics claiming a gauge its datums lack
    claim = output_to_json(plain.output)
    claim["metrics"].update({k: v for k, v in gauged.output.metrics.items() if k in keys.GAUGE_KEYS})
    with pytest.raises(ValueError, match="carry no gauge"):
        aggregate_datums(claim)


def test_bad_gauge_values_are_refused_naming_the_field():
    out = output_to_json(
        forward_backward_loss(
            [{"logprobs": torch.full((3,), -1.0), "advantages": torch.ones(3)}],
            [torch.full((3,), -0.9)],
            "ppo",
        ).output
    )
    negative = json.loads(json.dumps(out))
    negative["loss_fn_outputs"][0]["abs_log_ratio"] = {"data": [-1.0, 0.0], "dtype": "float32", "shape": [2]}
    with pytest.raises(ValueError, match="abs_log_ratio:sum.* must be >= 0"):
        aggregate_datums(negative)
    outside = json.loads(json.dumps(out))
    outside["loss_fn_outputs"][0]["ratio_outside_tokens"] = {"data": [4], "dtype": "int64", "shape": [1]}
    with pytest.raises(ValueError, match="ratio_outside_tokens:sum.*exceeds loss_tokens=3"):
        aggregate_datums(outside)
    wrong = json.loads(json.dumps(out))
    wrong["loss_fn_outputs"][0]["kl_k3"] = {"data": [1, 2, 3], "dtype": "float32", "shape": [3]}
    with pytest.raises(ValueError, match=r"\['kl_k3'\] must hold one value or a \[hi, lo\] pair"):
        aggregate_datums(wrong)


@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-3e38, max_value=3e38))
def test_a_float_travels_as_a_float32_pair_to_within_2_to_the_minus_48(value):
    pair = float_data(value)
    hi, lo = pair.to_numpy().tolist()
    assert np.float32(value) == np.float32(hi)  # the first element alone is the float32 value
    assert abs(read_float(pair, "x") - value) <= 2.0**-48 * abs(value) + 1e-45
    assert read_float({"data": [hi, lo], "dtype": "float32", "shape": [2]}, "x") == read_float(pair, "x")


def test_a_float_beyond_float32_or_not_finite_cannot_travel():
    for value in (math.inf, math.nan, 1e39):
        with pytest.raises(ValueError, match="datum 3 kl_k3 = .* cannot travel as float32"):
            float_data(value, "datum 3 kl_k3")


def gauge_datum(tokens: int, outside: int, values: tuple[float, ...]) -> dict:
    """A per-datum output (JSON) of another producer: each float measure one float64 value."""
    log_ratio, abs_part, kl, weight, weight_sq, high, low = values
    fields = {
        keys.DATUM_LOSS_TOKENS: {"data": [tokens], "dtype": "int64", "shape": [1]},
        "ratio_outside_tokens": {"data": [outside], "dtype": "int64", "shape": [1]},
    }
    floats = {
        "log_ratio": log_ratio,
        "abs_log_ratio": abs(log_ratio) + abs_part,
        "kl_k3": kl,
        "is_weight": weight,
        "is_weight_sq": weight_sq,
        "log_ratio_max": max(high, low),
        "log_ratio_min": min(high, low),
    }
    fields.update({name: {"data": [v], "dtype": "float32", "shape": [1]} for name, v in floats.items()})
    return fields


datum_gauge = st.tuples(
    st.integers(1, 10**6),
    st.floats(0, 1),
    st.tuples(
        st.floats(-1e4, 1e4),
        *(st.floats(0, 1e4) for _ in range(4)),
        st.floats(-30, 30),
        st.floats(-30, 30),
    ),
).map(lambda t: (t[0], int(t[1] * t[0]), t[2]))


@settings(deadline=None)
@given(
    clients=st.dictionaries(
        st.sampled_from(["a", "b"]),
        st.tuples(st.lists(datum_gauge, min_size=1, max_size=40), st.lists(st.integers(1, 39), max_size=8)),
        min_size=1,
    ),
    seed=st.integers(0, 2**16),
)
def test_a_clients_gauge_is_the_exact_sum_of_its_datums_in_any_chunking(clients, seed):
    """Full float64 values (rounding at every addition): the step's float sums are the one correctly
    rounded sum of all its datums' values (``math.fsum``), whatever the chunking, order and the
    other client's chunks in between; extremes the max / min; counts exact; means from the sums."""
    agg = ClientAggregator()
    arrivals = []
    for client, (datums, cuts) in clients.items():
        agg.register(client)
        for chunk in cut(datums, cuts):
            arrivals.append((client, {"loss_fn_outputs": [gauge_datum(*d) for d in chunk], "metrics": {}}))
    random.Random(seed).shuffle(arrivals)
    for client, output in arrivals:
        agg.add(client, 0, output)
    for client, (datums, _) in clients.items():
        metrics = agg.emit(client, 0).metrics
        outputs = [gauge_datum(*d) for d in datums]
        tokens = sum(d[0] for d in datums)
        assert metrics[keys.LOSS_TOKENS] == tokens
        assert metrics[keys.RATIO_OUTSIDE_TOKENS] == sum(d[1] for d in datums)
        for field, key in (
            ("log_ratio", keys.LOG_RATIO_SUM),
            ("abs_log_ratio", keys.ABS_LOG_RATIO_SUM),
            ("kl_k3", keys.KL_K3_SUM),
            ("is_weight", keys.IS_WEIGHT_SUM),
            ("is_weight_sq", keys.IS_WEIGHT_SQ_SUM),
        ):
            assert metrics[key] == math.fsum(o[field]["data"][0] for o in outputs), key
        assert metrics[keys.LOG_RATIO_MAX] == max(o["log_ratio_max"]["data"][0] for o in outputs)
        assert metrics[keys.LOG_RATIO_MIN] == min(o["log_ratio_min"]["data"][0] for o in outputs)
        assert metrics[keys.KL_K3_MEAN] == metrics[keys.KL_K3_SUM] / tokens
        assert metrics[keys.ABS_LOG_RATIO_MEAN] == metrics[keys.ABS_LOG_RATIO_SUM] / tokens


def chunked(datums, policies, loss_fn, config, chunk_cuts, seed):
    """A step's datums in chunks (``chunk_cuts``), shuffled (``seed``), in every form a client meets:
    the outputs, their JSON wire (sent and read back), their protobuf round trip and tinker's own
    combine of the JSON chunks."""
    outputs = [
        forward_backward_loss([datums[i] for i in c], [policies[i] for i in c], loss_fn, config).output
        for c in cut(list(range(len(datums))), chunk_cuts)
    ]
    random.Random(seed).shuffle(outputs)
    wire = [json.loads(json.dumps(output_to_json(o), allow_nan=False)) for o in outputs]
    proto = [deserialize_forward_backward_output(output_to_proto(o)) for o in outputs]
    merged = combine_fwd_bwd_output_results([output_from_json(w) for w in wire])
    return outputs, wire, proto, merged


def _causes_reference(rows: list[tuple[float, float, float, float]]) -> dict:
    """The engine and drift parts and the lag of eligible tokens ``(logprob, sampling, old, lag)``,
    plainly in float64: ``e = old - sampling``, ``d = (logprob - sampling) - e``."""
    es = [o - s for _, s, o, _ in rows]
    ds = [(p - s) - e for (p, s, _, _), e in zip(rows, es, strict=True)]
    return {
        keys.ENGINE_LOG_RATIO_SUM: math.fsum(es),
        keys.ENGINE_ABS_LOG_RATIO_SUM: math.fsum(abs(e) for e in es),
        keys.ENGINE_KL_K3_SUM: math.fsum(math.expm1(e) - e for e in es),
        keys.DRIFT_LOG_RATIO_SUM: math.fsum(ds),
        keys.DRIFT_ABS_LOG_RATIO_SUM: math.fsum(abs(d) for d in ds),
        keys.DRIFT_KL_K3_SUM: math.fsum(math.expm1(d) - d for d in ds),
        keys.WEIGHT_LAG_SUM: math.fsum(g for *_, g in rows),
    }


@settings(deadline=None, max_examples=40)
@given(
    tokens=st.lists(token, min_size=1, max_size=60),
    datum_cuts=st.lists(st.integers(1, 59), max_size=15),
    chunk_cuts=st.lists(st.integers(1, 14), max_size=5),
    loss_fn=st.sampled_from(sorted(GAUGE_LOSSES)),
    seed=st.integers(0, 2**16),
)
def test_engine_drift_and_lag_travel_per_datum_and_sum_per_client_in_any_chunking(
    tokens, datum_cuts, chunk_cuts, loss_fn, seed
):
    """Datums with old log-probs per token and one weight lag per datum: each datum's fields, the
    runtime's metrics, the JSON and protobuf wire, tinker's combine and the client aggregator all
    give the parts of a plain reference, and total = engine + drift after every merge."""
    datums, policies, _ = batch(tokens, datum_cuts)
    gen = torch.Generator().manual_seed(seed)
    rows: list[tuple[float, float, float, float]] = []
    for i, (datum, policy) in enumerate(zip(datums, policies, strict=True)):
        datum["old_logprobs"] = datum["logprobs"] + 0.05 * torch.randn(policy.shape, generator=gen)
        datum["weight_lag"] = [i % 4]  # one number for the datum's tokens
        for p, s, o, m in zip(policy, datum["logprobs"], datum["old_logprobs"], datum["mask"], strict=True):
            if m:
                rows.append((float(p), float(s), float(o), float(i % 4)))
    config = GAUGE_LOSSES[loss_fn]
    whole = forward_backward_loss(datums, policies, loss_fn, config).output
    expected = _causes_reference(rows)
    parts = (*keys.CAUSES_KEYS, keys.WEIGHT_LAG_SUM)
    unchunked = aggregate_datums(whole)
    for key, value in expected.items():
        assert unchunked[key] == pytest.approx(value, rel=1e-5, abs=1e-5 * max(1, len(rows))), key
    assert (keys.WEIGHT_LAG_MAX in unchunked) == bool(rows)
    if rows:
        assert unchunked[keys.WEIGHT_LAG_MAX] == max(r[3] for r in rows)
    for datum in whole.loss_fn_outputs:
        assert {"engine_log_ratio", "drift_kl_k3", "weight_lag", "weight_lag_max"} <= set(datum)
    outputs, wire, proto, merged = chunked(datums, policies, loss_fn, config, chunk_cuts, seed)
    agg = ClientAggregator()
    agg.register("run")
    for i, o in enumerate(outputs):
        agg.add("run", 1, wire[i] if i % 2 else o)
    for metrics in (
        aggregate_datums(outputs),
        aggregate_datums(wire),
        aggregate_datums(proto),
        aggregate_datums(merged),
        agg.emit("run", 1).metrics,
    ):
        assert {k: metrics[k] for k in parts} == {k: unchunked[k] for k in parts}
        identity = (
            metrics[keys.LOG_RATIO_SUM]
            - metrics[keys.ENGINE_LOG_RATIO_SUM]
            - metrics[keys.DRIFT_LOG_RATIO_SUM]
        )
        scale = sum(
            metrics[k]
            for k in (keys.ABS_LOG_RATIO_SUM, keys.ENGINE_ABS_LOG_RATIO_SUM, keys.DRIFT_ABS_LOG_RATIO_SUM)
        )
        assert abs(identity) <= 1e-12 * scale + 1e-300  # float64 sums of values sent to 2**-48


@settings(deadline=None, max_examples=30)
@given(
    tokens=st.lists(token, min_size=1, max_size=60),
    datum_cuts=st.lists(st.integers(1, 59), max_size=20),
    chunk_cuts=st.lists(st.integers(1, 19), max_size=5),
    loss_fn=st.sampled_from(sorted(GAUGE_LOSSES)),
    k=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_the_worst_sequences_of_a_step_in_any_chunking_equal_a_sort_of_every_datum(
    tokens, datum_cuts, chunk_cuts, loss_fn, k, seed
):
    """Datums with ids: each output names its datums' worst token; the aggregator's (and the
    JSON, protobuf and tinker-combined outputs') worst sequences equal a plain sort of every datum
    by its own fields, in any chunking and order."""
    from cliptrack.adapters.miles.client import datum_sequence, worst_of_outputs
    from cliptrack.core.worst import CRITERIA

    datums, policies, _ = batch(tokens, datum_cuts)
    ids = random.Random(seed).sample(range(1000), len(datums))
    for datum, datum_id in zip(datums, ids, strict=True):
        datum[keys.DATUM_ID] = [datum_id]
    config = GAUGE_LOSSES[loss_fn]
    whole = forward_backward_loss(datums, policies, loss_fn, config).output
    sequences = [datum_sequence(d) for d in whole.loss_fn_outputs]
    for datum, policy, seq in zip(datums, policies, sequences, strict=True):
        assert seq is not None
        ratios = [  # l as the loss forms it, in the inputs' dtype
            float(x) if m else None for x, m in zip(policy - datum["logprobs"], datum["mask"], strict=True)
        ]
        eligible = [abs(x) for x in ratios if x is not None]
        assert seq.tokens == len(eligible)
        if eligible:  # the first token with the largest |l|
            assert seq.worst_token == next(
                i for i, x in enumerate(ratios) if x is not None and abs(x) == max(eligible)
            )
            assert seq.max_abs_log_ratio == pytest.approx(max(eligible), rel=1e-6, abs=1e-7)
    plain = {c: plain_worst(sequences, c, k) for c in CRITERIA}
    outputs, wire, proto, merged = chunked(datums, policies, loss_fn, config, chunk_cuts, seed)
    agg = ClientAggregator()
    agg.register("run")
    for i in range(len(outputs)):
        agg.add("run", 2, wire[i] if i % 2 else proto[i])
    emitted = agg.emit_step("run", 2, worst_k=k)
    assert emitted.worst is not None and emitted.worst.step == 2
    for worst in (emitted.worst, worst_of_outputs(outputs, 2, k), worst_of_outputs(merged, 2, k)):
        assert worst is not None and worst.by == plain


def test_datum_ids_are_all_or_none_and_whole_numbers():
    sampling = torch.full((4,), -1.0)
    datum = {"logprobs": sampling, "advantages": torch.ones(4)}
    with pytest.raises(ValueError, match=r"datums \[1\] have no 'datum_id' while others do"):
        forward_backward_loss([{**datum, keys.DATUM_ID: [3]}, datum], [sampling, sampling], "ppo")
    with pytest.raises(ValueError, match=r"datum 0: loss_fn_inputs\['datum_id'\] must be one integer"):
        forward_backward_loss([{**datum, keys.DATUM_ID: [1.5]}], [sampling], "ppo")
    plain = forward_backward_loss([datum], [sampling], "ppo").output
    agg = ClientAggregator()
    agg.register("run")
    agg.add("run", 0, plain)
    assert agg.emit_step("run", 0).worst is None  # no ids: no worst sequences, the sums as before


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_lag_is_summed_exactly_whatever_the_policys_dtype(dtype):
    """bfloat16 holds integers exactly only up to 256 (float16: 2048): the lag is read in float64,
    not in the log-probs' dtype, so a lag of 257 versions is summed as 257."""
    sampling = torch.full((4,), -1.0)
    policy = torch.full((4,), -0.9, dtype=dtype)
    datums = [
        {"logprobs": sampling, "advantages": torch.ones(4), "weight_lag": [257.0]},
        {"logprobs": sampling, "advantages": torch.ones(4), "weight_lag": [2049.0, 4097.0, 1.0, 0.0]},
    ]
    metrics = forward_backward_loss(datums, [policy, policy], "ppo").output.metrics
    assert metrics[keys.WEIGHT_LAG_SUM] == 4 * 257 + 2049 + 4097 + 1
    assert metrics[keys.WEIGHT_LAG_MAX] == 4097


def test_datum_ids_are_non_negative_integers_kept_exactly_at_any_size():
    """A negative id is refused where it enters (the client could not read it back); an integer id
    at or above 2**53 travels as int64 and comes back exactly, through JSON and the client."""
    from cliptrack.adapters.miles.client import worst_of_outputs

    sampling = torch.full((4,), -1.0)
    datum = {"logprobs": sampling, "advantages": torch.ones(4)}
    with pytest.raises(ValueError, match=r"datum 0: loss_fn_inputs\['datum_id'\] must be an integer >= 0"):
        forward_backward_loss([{**datum, keys.DATUM_ID: [-1]}], [sampling], "ppo")
    big = [2**53 + 1, 2**62 + 3]
    output = forward_backward_loss(
        [{**datum, keys.DATUM_ID: [i]} for i in big], [sampling + 0.1, sampling - 0.3], "ppo"
    ).output
    worst = worst_of_outputs(output_from_json(json.loads(json.dumps(output_to_json(output)))), 0)
    assert worst is not None and [s.datum for s in worst.by["abs_log_ratio"]] == big[::-1]
