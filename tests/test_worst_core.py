"""The worst sequences' order and merge (torch-free), against a plain sort of every sequence."""

from __future__ import annotations

import random

import pytest
from cliptrack.core.worst import COLUMNS, CRITERIA, SequenceGauge, Worst, merge_worst, worst_of
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference import plain_worst

values = st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5])  # few values: ties are common


@st.composite
def steps(draw):
    n = draw(st.integers(0, 40))
    ids = draw(st.lists(st.integers(0, 15), min_size=n, max_size=n))  # repeated ids: several passes
    return [
        SequenceGauge(
            datum=i,
            tokens=draw(st.integers(0, 5)),
            log_ratio=draw(st.sampled_from([-1.0, 0.0, 1.0])),
            abs_log_ratio=draw(values),
            kl_k3=draw(values),
            max_abs_log_ratio=draw(values),
            worst_token=draw(st.integers(0, 9)),
        )
        for i in ids
    ]


@settings(max_examples=200)
@given(
    sequences=steps(),
    k=st.integers(1, 12),
    cuts=st.lists(st.integers(0, 40), max_size=6),
    seed=st.integers(0, 99),
)
def test_the_worst_of_any_chunking_is_the_worst_of_the_whole(sequences, k, cuts, seed):
    whole = worst_of(sequences, k)
    for c in CRITERIA:
        assert whole[c] == plain_worst(sequences, c, k), c
    points = sorted({0, len(sequences), *(x % (len(sequences) + 1) for x in cuts)})
    parts = [worst_of(sequences[a:b], k) for a, b in zip(points[:-1], points[1:], strict=False)]
    random.Random(seed).shuffle(parts)
    assert merge_worst(parts, k) == whole
    record = Worst(3, k, whole)
    assert Worst.from_records(3, k, record.records()) == record


def test_bad_input_is_named():
    s = SequenceGauge(1, 2, 0.1, 0.1, 0.01, 0.1, 0)
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        worst_of([s], 0)
    with pytest.raises(ValueError, match="sequence 7: kl_k3 must be >= 0"):
        SequenceGauge(7, 2, 0.1, 0.1, -0.01, 0.1, 0)
    with pytest.raises(ValueError, match="sequence 7: abs_log_ratio must be finite"):
        SequenceGauge(7, 2, 0.1, float("nan"), 0.01, 0.1, 0)
    with pytest.raises(ValueError, match=f"a sequence row has {len(COLUMNS)} values"):
        SequenceGauge.from_row([1.0, 2.0])
    with pytest.raises(ValueError, match="unknown criteria"):
        Worst(0, 1, {"loss": ()})
