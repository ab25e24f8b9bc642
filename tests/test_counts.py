"""The counting model and the shared validation: exact sums, the optional split, one mixing rule,
steps and values checked in one torch-free place (docs/CONTRACT.md, "Aggregation" and "Bad input")."""

from __future__ import annotations

import math
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import cliptrack
import numpy as np
import pytest
from cliptrack.core import keys
from cliptrack.core.sums import MeasuredSums, exact_clip_metrics, sum_counts
from cliptrack.core.validation import MAX_STEP, check_metrics, check_step
from hypothesis import given
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]

# (loss_tokens, clipped or None, (low, high) or None) drawn consistent
clip_terms = st.tuples(st.integers(0, 10**9), st.integers(0, 10**9), st.integers(0, 10**9), st.booleans())


def _sums(
    loss_tokens: object, clipped: object = None, low: object = None, high: object = None
) -> MeasuredSums:
    """Measured sums from the counts by name (``None``: absent)."""
    values = dict(zip(keys.TOKEN_COUNT_KEYS, (loss_tokens, clipped, low, high), strict=True))
    return MeasuredSums({key: value for key, value in values.items() if value is not None})


def _counts(term: tuple[int, int, int, bool]) -> MeasuredSums:
    low, high, rest, split = term
    return _sums(low + high + rest, low + high, low if split else None, high if split else None)


@given(st.lists(clip_terms, min_size=1, max_size=30))
def test_sums_are_exact_and_the_split_survives_only_when_every_term_has_it(terms):
    total = sum_counts(_counts(t) for t in terms)
    assert total is not None
    assert total.loss_tokens == sum(t[0] + t[1] + t[2] for t in terms)
    assert total.get(keys.CLIPPED_TOKENS) == sum(t[0] + t[1] for t in terms)
    if all(t[3] for t in terms):
        assert (total.get(keys.CLIPPED_LOW_TOKENS), total.get(keys.CLIPPED_HIGH_TOKENS)) == (
            sum(t[0] for t in terms),
            sum(t[1] for t in terms),
        )
    else:
        assert total.get(keys.CLIPPED_LOW_TOKENS) is None and total.get(keys.CLIPPED_HIGH_TOKENS) is None
    metrics = total.to_metrics()
    if total.loss_tokens:
        assert metrics[keys.CLIP_FRACTION] == float(Fraction(total[keys.CLIPPED_TOKENS], total.loss_tokens))
    else:
        assert keys.CLIP_FRACTION not in metrics
    assert (keys.CLIPPED_LOW_TOKENS in metrics) == total.has_split


def test_a_loss_that_never_clips_carries_loss_tokens_alone():
    counts = _sums(12) + _sums(30)
    assert counts.to_metrics() == {keys.LOSS_TOKENS: 42.0}
    assert not counts.clips and counts.fraction is None
    for former in ("ClipCounts", "TokenCounts"):  # removed: MeasuredSums is the one name
        assert not hasattr(cliptrack, former)
    assert sum_counts([]) is None


def test_mixing_clipping_and_non_clipping_counts_is_refused_once_for_all_paths():
    with pytest.raises(
        ValueError, match="comes from a loss that never clips but earlier outputs .* one that clips"
    ):
        _sums(10, 2, 1, 1) + _sums(5)
    with pytest.raises(
        ValueError, match="comes from a loss that clips but earlier outputs .* one that never clips"
    ):
        _sums(5) + _sums(10, 2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((5, 6), "clipped_tokens=6 exceeds loss_tokens=5"),
        ((5, 3, 1, 1), r"clipped_low_tokens=1 \+ clipped_high_tokens=1 != clipped_tokens=3"),
        ((5, 3, 3, None), "come together"),
        ((5, None, 0, 0), "without clipped_tokens"),
        ((-1,), "loss_tokens must be >= 0"),
        ((5.5,), "whole number"),
        ((True,), "boolean"),
    ],
)
def test_inconsistent_counts_are_named(args, message):
    with pytest.raises(ValueError, match=message):
        _sums(*args)


# ---- metric validation: the bugs fixed here ------------------------------------------------------


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        ({keys.CLIPPED_LOW_TOKENS: -1.5}, "clipped_low_tokens:sum must be a whole number"),
        ({keys.CLIPPED_HIGH_TOKENS: math.nan}, "clipped_high_tokens:sum must be a finite token count"),
        ({keys.CLIPPED_LOW_TOKENS: 3.0}, r"carry \['clipped_low_tokens:sum'\] but not 'loss_tokens:sum'"),
        (
            {keys.LOSS_TOKENS: 5, keys.CLIPPED_TOKENS: 3, keys.CLIPPED_LOW_TOKENS: 3.0},
            "clipped_low_tokens:sum' without its other side",
        ),
        (
            {keys.LOSS_TOKENS: 5, keys.CLIPPED_LOW_TOKENS: 1.0, keys.CLIPPED_HIGH_TOKENS: 1.0},
            "but not 'clipped_tokens:sum', the count it splits",
        ),
        ({keys.CLIP_FRACTION: 7.3}, r"clip_fraction:mean must be a fraction of tokens in \[0, 1\], got 7.3"),
        ({keys.CLIP_FRACTION: -0.01}, r"in \[0, 1\]"),
        ({keys.CLIP_FRACTION: math.nan}, r"in \[0, 1\]"),
        ({keys.CLIP_FRACTION: math.inf}, r"in \[0, 1\]"),
    ],
)
def test_split_keys_alone_are_counts_and_a_fraction_alone_lies_in_0_1(metrics, message):
    with pytest.raises(ValueError, match=message):
        check_metrics(metrics)
    with pytest.raises(ValueError, match=message):
        exact_clip_metrics(metrics)


def test_a_fraction_without_counts_is_kept_once_checked():
    assert check_metrics({keys.CLIP_FRACTION: 0.25, "reward:mean": np.float32(0.5)}) == {
        keys.CLIP_FRACTION: 0.25,
        "reward:mean": 0.5,
    }
    assert check_metrics({keys.CLIP_FRACTION: 1}) == {keys.CLIP_FRACTION: 1.0}


def test_the_miles_client_shares_the_checks():
    from cliptrack.adapters.miles import aggregate_datums
    from cliptrack.adapters.miles.wire import count_data

    datum = {keys.DATUM_LOSS_TOKENS: count_data(4), keys.DATUM_CLIPPED_TOKENS: count_data(1)}
    with pytest.raises(ValueError, match=r"outputs\[0\]\.metrics: clip_fraction:mean must be a fraction"):
        aggregate_datums({"loss_fn_outputs": [datum], "metrics": {keys.CLIP_FRACTION: 7.3}})
    with pytest.raises(ValueError, match=r"outputs\[0\]\.metrics: clipped_low_tokens:sum must be a whole"):
        aggregate_datums({"loss_fn_outputs": [datum], "metrics": {keys.CLIPPED_LOW_TOKENS: -1.5}})


# ---- steps ---------------------------------------------------------------------------------------


@given(st.integers(0, MAX_STEP))
def test_every_step_in_range_is_kept_as_an_int(step):
    assert check_step(step) == step and type(check_step(np.int64(min(step, 2**63 - 1)))) is int


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (-1, "step must be >= 0, got -1"),
        (2**63, "does not fit a signed 64-bit integer"),
        (True, "got bool"),
        (1.0, "got float"),
        ("3", "got str"),
        (np.float64(2), "got float64"),
    ],
)
def test_bad_steps_are_named(step, message):
    with pytest.raises(ValueError, match=message):
        check_step(step)


def test_validation_and_the_miles_client_import_neither_torch_nor_the_tracker():
    code = (
        "import sys\n"
        "import cliptrack.core.validation, cliptrack.core.sums, cliptrack.core.outputs\n"
        "assert 'torch' not in sys.modules\n"
        "import cliptrack.adapters.miles.client\n"
        "bad = sorted(m for m in ('cliptrack.log.tracker', 'cliptrack.log._pipeline.writer', 'cliptrack.store.spool') if m in sys.modules)\n"
        "print(bad)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
