"""Statistics of the comparison on synthetic runs with known counts (no store involved)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests._compare_fixtures import megatron_vs_miles, synthetic_run
from tracking import keys
from tracking.compare import RunSet, Window, compare, parse_window, unit_table
from tracking.compare.frame import RunInfo
from tracking.compare.metrics import CLIP, REWARD
from tracking.compare.stats import (
    DIFFERENT,
    EQUIVALENT,
    INCONCLUSIVE,
    Estimate,
    block_bootstrap_indices,
    default_block_length,
    equivalence_verdict,
    paired_ratio_difference,
    ratio_estimate,
    wilson_interval,
)


def runset_of(*runs) -> RunSet:
    return RunSet.from_points((RunInfo(r.run_id, r.run_name, r.backend, "test"), r.points) for r in runs)


# ------------------------------------------------------------------------------- verdicts on runs


def test_known_difference_is_detected():
    megatron, miles = megatron_vs_miles(miles_clip_p=0.16)
    result = compare(runset_of(megatron, miles))
    d = result.difference("clip_fraction")
    expected = miles.clip_fraction() - megatron.clip_fraction()  # all steps paired
    assert d.estimate.value == pytest.approx(expected, abs=1e-12)
    assert 0.02 < d.estimate.low < expected < d.estimate.high
    assert d.verdict == DIFFERENT
    assert result.on_policy_verdict == DIFFERENT
    assert "Not equally on-policy" in result.summary()


def test_no_difference_is_equivalent():
    megatron, miles = megatron_vs_miles(miles_clip_p=0.10)
    result = compare(runset_of(megatron, miles))
    d = result.difference("clip_fraction")
    assert -0.02 < d.estimate.low <= d.estimate.value <= d.estimate.high < 0.02
    assert d.verdict == EQUIVALENT
    assert result.difference("reward").verdict == EQUIVALENT
    assert result.difference("throughput").verdict == EQUIVALENT
    assert result.summary().startswith("Equally on-policy")


def test_per_run_estimate_is_ratio_of_sums_and_wilson_is_narrower():
    megatron, miles = megatron_vs_miles(miles_clip_p=0.16)
    result = compare(runset_of(megatron, miles))
    est = result.run_estimate("clip_fraction", "megatron-run")
    assert est.estimate.value == pytest.approx(megatron.clip_fraction(), abs=1e-15)
    assert est.total_numerator == megatron.total(keys.CLIPPED_TOKENS)
    assert est.total_denominator == megatron.total(keys.LOSS_TOKENS)
    # Wilson treats ~180k tokens as independent: far narrower than the autocorrelated truth.
    assert est.wilson_high - est.wilson_low < (est.estimate.high - est.estimate.low) / 2
    mean_of_fractions = np.mean([p.metrics[keys.CLIP_FRACTION] for p in megatron.points])
    assert est.estimate.value != mean_of_fractions


def test_unequal_length_and_missing_steps_pair_only_common_steps():
    missing = (3, 4, 10, 11, 12)
    megatron, miles = megatron_vs_miles(miles_clip_p=0.16, n_megatron=80, n_miles=50, miles_missing=missing)
    result = compare(runset_of(megatron, miles))
    common = set(megatron.steps) & set(miles.steps)
    assert len(common) == 50 - len(missing)
    d = result.difference("clip_fraction")
    assert d.estimate.n_units == len(common)
    assert d.estimate.value == pytest.approx(miles.clip_fraction(common) - megatron.clip_fraction(common), abs=1e-12)
    # per-run estimates use all of each run's steps
    assert result.run_estimate("clip_fraction", "megatron-run").estimate.n_units == 80
    assert result.run_estimate("clip_fraction", "miles-run").estimate.value == pytest.approx(miles.clip_fraction())
    assert d.verdict == DIFFERENT
    assert any("left out of the paired difference" in n for n in result.notes)


def test_equivalent_with_unequal_lengths_and_gaps():
    megatron, miles = megatron_vs_miles(n_megatron=70, n_miles=55, miles_missing=(0, 1, 30))
    assert compare(runset_of(megatron, miles)).difference("clip_fraction").verdict == EQUIVALENT


def test_small_difference_against_tight_tolerance_is_inconclusive_or_different():
    megatron, miles = megatron_vs_miles(miles_clip_p=0.112)
    result = compare(runset_of(megatron, miles), tolerances={"clip_fraction": 0.01})
    d = result.difference("clip_fraction")
    assert d.estimate.low < 0.01 < d.estimate.high or d.estimate.low > 0.01
    assert d.verdict in (INCONCLUSIVE, DIFFERENT)
    assert result.difference("clip_fraction").tolerance == 0.01


def test_reward_and_throughput_relative_differences():
    megatron, miles = megatron_vs_miles(miles_reward=0.6, miles_throughput=1500.0)
    result = compare(runset_of(megatron, miles))
    reward = result.difference("reward")
    ref = np.mean([p.metrics[keys.REWARD] for p in megatron.points])
    other = np.mean([p.metrics[keys.REWARD] for p in miles.points])
    assert reward.relative and reward.estimate.value == pytest.approx(other / ref - 1)
    assert reward.verdict == DIFFERENT  # +20 % against 5 %
    tps = result.difference("throughput")
    assert tps.estimate.value == pytest.approx(-0.25, abs=0.02)
    assert tps.verdict == DIFFERENT


def test_relative_difference_keeps_its_sign_for_a_negative_reference_reward():
    a = synthetic_run("a", "a", "megatron", seed=3, reward=-0.5)
    b = synthetic_run("b", "b", "miles", seed=4, reward=-0.6)  # lower reward than the reference
    result = compare(runset_of(a, b))
    reward = result.difference("reward")
    ref = np.mean([p.metrics[keys.REWARD] for p in a.points])
    other = np.mean([p.metrics[keys.REWARD] for p in b.points])
    assert other < ref < 0
    assert reward.estimate.value == pytest.approx((other - ref) / abs(ref))
    assert reward.estimate.high < -0.05 and reward.verdict == DIFFERENT
    assert reward.estimate.value == pytest.approx(-0.2, abs=0.03)
    assert result.formatted_table().set_index("metric").loc["reward", "difference [CI]"].startswith("-")


def test_throughput_from_step_time_is_tokens_over_seconds():
    a = synthetic_run("a", "a", "megatron", seed=3, step_time_s=1.0)
    b = synthetic_run("b", "b", "miles", seed=4, step_time_s=1.0)
    result = compare(runset_of(a, b))
    est = result.run_estimate("throughput", "a")
    assert est.estimate.value == pytest.approx(a.total(keys.LOSS_TOKENS) / a.total(keys.STEP_TIME))


def test_seeded_and_reproducible():
    megatron, miles = megatron_vs_miles(miles_clip_p=0.13)
    rs = runset_of(megatron, miles)
    one, two = compare(rs, seed=7), compare(rs, seed=7)
    assert one.table().equals(two.table())
    other = compare(rs, seed=8).difference("clip_fraction").estimate
    assert other.low != one.difference("clip_fraction").estimate.low


def test_window_restricts_steps():
    megatron, miles = megatron_vs_miles(miles_clip_p=0.16)
    result = compare(runset_of(megatron, miles), window=parse_window("10:30"))
    steps = set(range(10, 30))
    assert result.difference("clip_fraction").estimate.n_units == 20
    assert result.run_estimate("clip_fraction", "miles-run").estimate.value == pytest.approx(miles.clip_fraction(steps))


@pytest.mark.parametrize("align", ["tokens", "time"])
def test_alignment_by_tokens_and_time(align):
    megatron, miles = megatron_vs_miles(miles_clip_p=0.16, n_miles=40, miles_missing=(7,))
    rs = runset_of(megatron, miles)
    units = unit_table(rs, rs.labels, [CLIP, REWARD], by=align)
    # every step inside the shared range lands in exactly one bin, counts are summed exactly
    for label, run in zip(rs.labels, (megatron, miles), strict=True):
        table = units[label]
        assert table["n_steps"].sum() <= len(run.points)
        assert float(table["clip_fraction.num"].sum()).is_integer()
    result = compare(rs, align=align)
    assert result.difference("clip_fraction").verdict == DIFFERENT


def test_too_few_steps_is_inconclusive_not_an_error():
    a = synthetic_run("a", "a", "megatron", seed=1, n_steps=2)
    b = synthetic_run("b", "b", "miles", seed=2, n_steps=2, clip_p=0.5)
    result = compare(runset_of(a, b))
    d = result.difference("clip_fraction")
    assert not d.estimate.has_interval and d.verdict == INCONCLUSIVE
    assert "too few paired units" in result.summary()


def test_loss_without_clip_keys_is_never_counted_as_zero():
    a = synthetic_run("a", "a", "megatron", seed=1)
    b = synthetic_run("b", "b", "miles", seed=2)
    stripped = [type(p)(p.step, p.wall_time, {k: v for k, v in p.metrics.items() if k not in keys.CLIP_COUNT_KEYS})
                if p.step % 2 else p for p in b.points]
    b.points = stripped
    result = compare(runset_of(a, b))
    assert result.run_estimate("clip_fraction", "b").estimate.n_units == 30
    assert result.difference("clip_fraction").estimate.n_units == 30


def test_bad_input_is_named():
    megatron, miles = megatron_vs_miles()
    rs = runset_of(megatron, miles)
    with pytest.raises(ValueError, match="at least two runs"):
        compare(rs, ["megatron-run"])
    with pytest.raises(KeyError, match="nope"):
        compare(rs, ["megatron-run", "nope"])
    with pytest.raises(ValueError, match="alignment 'steps'"):
        compare(rs, align="steps")
    with pytest.raises(ValueError, match="tolerance for clip_fraction must be > 0"):
        compare(rs, tolerances={"clip_fraction": -1})
    with pytest.raises(ValueError, match="unknown quantities"):
        compare(rs, tolerances={"kl": 0.1})
    with pytest.raises(ValueError, match="window '5:1' is empty"):
        parse_window("5:1")
    with pytest.raises(ValueError, match="START:END"):
        parse_window("5")
    assert parse_window(":7") == Window(None, 7.0)


# ------------------------------------------------------------------------------- building blocks


@given(n=st.integers(1, 60), block=st.integers(1, 20), seed=st.integers(0, 2**32 - 1))
def test_block_bootstrap_indices_are_circular_blocks(n, block, seed):
    idx = block_bootstrap_indices(n, 5, block, np.random.default_rng(seed))
    assert idx.shape == (5, n)
    assert idx.min() >= 0 and idx.max() < n
    b = min(block, n)
    for row in idx:
        for start in range(0, n, b):
            chunk = row[start:start + b]
            assert all((chunk[i + 1] - chunk[i]) % n == 1 % n for i in range(len(chunk) - 1))


@given(st.lists(st.tuples(st.integers(0, 500), st.integers(1, 500)), min_size=1, max_size=40))
def test_ratio_estimate_matches_plain_ratio_of_sums(pairs):
    clipped = np.array([min(c, t) for c, t in pairs], dtype=float)
    tokens = np.array([t for _, t in pairs], dtype=float)
    est = ratio_estimate(clipped, tokens, n_boot=50)
    assert est.value == sum(min(c, t) for c, t in pairs) / sum(t for _, t in pairs)
    if est.has_interval:
        assert est.low <= est.high


def test_block_length_default():
    assert [default_block_length(n) for n in (1, 8, 9, 27, 28, 1000)] == [1, 2, 3, 3, 4, 10]


def test_paired_difference_cancels_shared_step_effects():
    rng = np.random.default_rng(0)
    tokens = rng.integers(1000, 2000, 200).astype(float)
    shared = 0.1 + 0.05 * np.sin(np.arange(200) / 10)  # both runs follow the same schedule
    a = np.round(tokens * shared)
    b = np.round(tokens * (shared + 0.01))
    paired = paired_ratio_difference(a, tokens, b, tokens)
    assert paired.value == pytest.approx(b.sum() / tokens.sum() - a.sum() / tokens.sum())
    assert paired.high - paired.low < 0.002  # the schedule cancels
    assert 0.009 < paired.low and paired.high < 0.011


def test_wilson_interval_reference_values():
    low, high = wilson_interval(50, 100, confidence=0.95)
    assert low == pytest.approx(0.4038, abs=1e-4) and high == pytest.approx(0.5962, abs=1e-4)
    assert all(math.isnan(v) for v in wilson_interval(0, 0))


@pytest.mark.parametrize(
    "low,high,verdict",
    [(-0.01, 0.01, EQUIVALENT), (0.03, 0.05, DIFFERENT), (-0.05, -0.03, DIFFERENT), (0.01, 0.03, INCONCLUSIVE),
     (-0.03, 0.03, INCONCLUSIVE), (float("nan"), float("nan"), INCONCLUSIVE), (-0.02, 0.0, INCONCLUSIVE)],
)
def test_equivalence_verdict_rules(low, high, verdict):
    assert equivalence_verdict(Estimate(0.0, low, high, 10, 3, 0.9), 0.02) == verdict
