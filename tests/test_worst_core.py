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
    return [_sequence(draw, i) for i in ids]


def _sequence(draw, datum: int) -> SequenceGauge:
    """One sequence whose sums agree with each other (``|sum l|`` and ``max |l|`` at most ``sum |l|``)."""
    total = draw(values)
    return SequenceGauge(
        datum=datum,
        tokens=draw(st.integers(0, 5)),
        log_ratio=draw(st.sampled_from([-1.0, 0.0, 1.0])) * total,
        abs_log_ratio=total,
        kl_k3=draw(values),
        max_abs_log_ratio=min(draw(values), total),
        worst_token=draw(st.integers(0, 9)),
    )


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
    with pytest.raises(ValueError, match="sequence 7: abs_log_ratio must be a finite number"):
        SequenceGauge(7, 2, 0.1, float("nan"), 0.01, 0.1, 0)
    with pytest.raises(ValueError, match="sequence 7: kl_k3 must be a finite number, got '0.1'"):
        SequenceGauge(7, 2, 0.1, 0.1, "0.1", 0.1, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sequence 1.5: datum must be an integer, got 1.5"):
        SequenceGauge(1.5, 2, 0.1, 0.1, 0.01, 0.1, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sequence 7: tokens must be an integer, got True"):
        SequenceGauge(7, True, 0.1, 0.1, 0.01, 0.1, 0)
    with pytest.raises(ValueError, match="sequence 7: worst_token must be a position >= 0"):
        SequenceGauge(7, 2, 0.1, 0.1, 0.01, 0.1, -1)
    # columns given in the wrong order: the largest token |l| above the sum of |l|
    with pytest.raises(ValueError, match=r"sequence 7: max_abs_log_ratio=0.5 exceeds abs_log_ratio=0.1"):
        SequenceGauge(7, 2, 0.1, 0.1, 0.01, 0.5, 0)
    with pytest.raises(ValueError, match=r"sequence 7: \|log_ratio\|=0.3 exceeds abs_log_ratio=0.1"):
        SequenceGauge(7, 2, -0.3, 0.1, 0.01, 0.1, 0)
    assert SequenceGauge(7.0, 0, 0, 0, 0, 0, -1).datum == 7  # type: ignore[arg-type]  # device rows: whole floats
    with pytest.raises(ValueError, match=f"a sequence row has {len(COLUMNS)} values"):
        SequenceGauge.from_row([1.0, 2.0])
    with pytest.raises(ValueError, match="unknown criteria"):
        Worst(0, 1, {"loss": ()})
