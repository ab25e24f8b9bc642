"""Hypothesis: however a batch is split into datums and chunks, and in whatever order the chunks
arrive (as JSON, tinker's types, or tinker's merge), the sums never change.

The reference is plain: ``tests/reference.py``'s per-token rules over the whole batch at once, or
Python sums of the per-datum counts.
"""

from __future__ import annotations

import json
import random
from fractions import Fraction

import pytest
import torch
from cliptrack.adapters.miles import (
    ClientAggregator,
    aggregate_datums,
    forward_backward_loss,
    output_from_json,
    output_to_json,
)
from cliptrack.core import keys
from hypothesis import given
from hypothesis import strategies as st
from tinker.lib.chunked_fwdbwd_helpers import combine_fwd_bwd_output_results

from tests import reference

token = st.tuples(
    st.one_of(st.floats(-1.0, 1.0, width=32), st.sampled_from([0.0, -0.2231435, 0.1823216])),  # log ratio
    st.one_of(st.floats(-2.0, 2.0, width=32), st.sampled_from([0.0, 1.0, -1.0])),  # advantage
    st.booleans(),  # eligible
)


def cut(items: list, cuts: list[int]) -> list[list]:
    """Split ``items`` at the given positions (sorted, deduplicated, inside the list)."""
    points = sorted({c for c in cuts if 0 < c < len(items)})
    bounds = [0, *points, len(items)]
    return [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@given(
    tokens=st.lists(token, min_size=1, max_size=120),
    datum_cuts=st.lists(st.integers(1, 119), max_size=30),
    chunk_cuts=st.lists(st.integers(1, 29), max_size=8),
    loss_fn=st.sampled_from(["ppo", "cispo"]),
    seed=st.integers(0, 2**16),
)
def test_random_splits_into_datums_and_chunks_never_change_the_sums(
    tokens, datum_cuts, chunk_cuts, loss_fn, seed
):
    low, high = (0.8, 1.2) if loss_fn == "ppo" else (0.5, 1.5)
    config = {"clip_low_threshold": low, "clip_high_threshold": high}
    log_ratio = torch.tensor([t[0] for t in tokens], dtype=torch.float32)
    sampling = torch.full_like(log_ratio, -1.0)
    policy = sampling + log_ratio
    adv = torch.tensor([t[1] for t in tokens], dtype=torch.float32)
    mask = torch.tensor([float(t[2]) for t in tokens])
    per_token = reference.per_token_ppo if loss_fn == "ppo" else reference.per_token_cispo
    ref = per_token(policy, sampling, adv, mask, low, high)

    positions = list(range(len(tokens)))
    datums, policies = [], []
    for span in cut(positions, datum_cuts):
        a, b = span[0], span[-1] + 1
        datums.append({"logprobs": sampling[a:b], "advantages": adv[a:b], "mask": mask[a:b]})
        policies.append(policy[a:b])
    outputs = []
    for chunk in cut(list(range(len(datums))), chunk_cuts):
        result = forward_backward_loss(
            [datums[i] for i in chunk], [policies[i] for i in chunk], loss_fn, config
        )
        outputs.append(result.output)
    rng = random.Random(seed)
    rng.shuffle(outputs)
    wire = [json.loads(json.dumps(output_to_json(o))) for o in outputs]

    expected = {
        keys.LOSS_TOKENS: ref.loss_tokens,
        keys.CLIPPED_TOKENS: ref.clipped,
        keys.CLIPPED_LOW_TOKENS: ref.low,
        keys.CLIPPED_HIGH_TOKENS: ref.high,
    }
    if ref.loss_tokens:
        expected[keys.CLIP_FRACTION] = float(Fraction(ref.clipped, ref.loss_tokens))
    merged = combine_fwd_bwd_output_results([output_from_json(w) for w in wire])
    agg = ClientAggregator()
    agg.register("run")
    for i, o in enumerate(outputs):
        agg.add("run", 7, wire[i] if i % 2 else o)
    for metrics in (
        aggregate_datums(outputs),
        aggregate_datums(wire),
        aggregate_datums(merged),
        agg.emit("run", 7).metrics,
    ):
        assert {k: metrics.get(k) for k in expected} == expected
        assert (keys.CLIP_FRACTION in metrics) == (ref.loss_tokens > 0)


datum_counts = st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6)).map(
    lambda t: (t[0] + t[1] + t[2], t[1], t[2])  # (loss_tokens, low, high), low + high <= loss_tokens
)


def datum_json(loss_tokens: int, low: int, high: int) -> dict:
    def one(v: int) -> dict:
        return {"data": [v], "dtype": "int64", "shape": [1]}

    return {
        keys.DATUM_LOSS_TOKENS: one(loss_tokens),
        keys.DATUM_CLIPPED_TOKENS: one(low + high),
        keys.DATUM_CLIPPED_LOW_TOKENS: one(low),
        keys.DATUM_CLIPPED_HIGH_TOKENS: one(high),
    }


@given(
    clients=st.dictionaries(
        st.sampled_from(["a", "b", "c"]),
        st.tuples(st.lists(datum_counts, max_size=60), st.lists(st.integers(1, 59), max_size=10)),
        min_size=1,
    ),
    bad_positions=st.lists(st.integers(0, 40), max_size=4),
    seed=st.integers(0, 2**16),
)
def test_interleaved_clients_chunks_and_rejected_chunks_sum_exactly(clients, bad_positions, seed):
    """Large counts (up to 3e6 tokens per datum), any chunking, clients interleaved, bad chunks
    rejected mid-stream: every client's sums are the plain Python sums of its own datums."""
    agg = ClientAggregator()
    for client in clients:
        agg.register(client)
    rng = random.Random(seed)
    arrivals = shuffled_chunks(clients, rng)
    for position in sorted(bad_positions, reverse=True):
        arrivals.insert(min(position, len(arrivals)), (rng.choice(list(clients)), BAD_CHUNK))
    for client, output in arrivals:
        if output is BAD_CHUNK:
            with pytest.raises(ValueError):
                agg.add(client, 0, output)  # a datum with clipped_tokens > loss_tokens
        else:
            agg.add(client, 0, output)
    for client, (counts, _) in clients.items():
        if any(c == client and o is not BAD_CHUNK for c, o in arrivals):
            assert_plain_sums(agg.emit(client, 0).metrics, counts)


# A chunk whose second datum clips more tokens than its loss has: the aggregator must reject it whole.
BAD_CHUNK = {
    "loss_fn_outputs": [
        datum_json(5, 1, 1),
        {
            keys.DATUM_LOSS_TOKENS: {"data": [2], "dtype": "int64"},
            keys.DATUM_CLIPPED_TOKENS: {"data": [3], "dtype": "int64"},
            keys.DATUM_CLIPPED_LOW_TOKENS: {"data": [3], "dtype": "int64"},
            keys.DATUM_CLIPPED_HIGH_TOKENS: {"data": [0], "dtype": "int64"},
        },
    ]
}


def shuffled_chunks(clients: dict, rng: random.Random) -> list[tuple[str, dict]]:
    """Every client's datums cut into chunks (as JSON outputs), all clients' chunks shuffled together."""
    arrivals = []
    for client, (counts, cuts) in clients.items():
        for chunk in cut(counts, cuts):
            arrivals.append((client, {"loss_fn_outputs": [datum_json(*c) for c in chunk], "metrics": {}}))
    rng.shuffle(arrivals)
    return arrivals


def assert_plain_sums(metrics: dict, counts: list[tuple[int, int, int]]) -> None:
    """``metrics`` are the plain Python sums of the ``(loss_tokens, low, high)`` datums, the clip
    fraction formed once from them."""
    if not counts:  # no datum: nothing says whether the loss clips, so no clip keys
        assert metrics == {keys.LOSS_TOKENS: 0.0}
        return
    loss_tokens = sum(c[0] for c in counts)
    clipped = sum(c[1] + c[2] for c in counts)
    assert metrics[keys.LOSS_TOKENS] == loss_tokens
    assert metrics[keys.CLIPPED_TOKENS] == clipped
    assert metrics[keys.CLIPPED_LOW_TOKENS] == sum(c[1] for c in counts)
    assert metrics[keys.CLIPPED_HIGH_TOKENS] == sum(c[2] for c in counts)
    if loss_tokens:
        assert metrics[keys.CLIP_FRACTION] == float(Fraction(clipped, loss_tokens))
    else:
        assert keys.CLIP_FRACTION not in metrics
