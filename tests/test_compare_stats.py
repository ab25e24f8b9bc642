"""Statistics of the comparison on synthetic runs with known counts (no store involved).

Expected values are computed here from the runs' own integer counts (plain sums), never taken
from the code under test; the building blocks are checked against plain reference loops.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from cliptrack.compare import RunSet, Window, compare, parse_window, unit_table
from cliptrack.compare.quantities import quantity
from cliptrack.compare.stats import (
    ABSOLUTE,
    DIFFERENT,
    EQUIVALENT,
    INCONCLUSIVE,
    INSUFFICIENT,
    LOG_RATIO,
    MIN_ESS,
    MIN_UNITS,
    Estimate,
    autocovariances,
    equivalence_verdict,
    long_run_variance,
    paired_difference,
    ratio_estimate,
    wilson_interval,
)
from cliptrack.compare.stats.cosines import cosine_coefficients
from cliptrack.core import keys
from cliptrack.store.frame import LoadedRun, Point
from cliptrack.store.records import RunInfo
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests._compare_fixtures import megatron_vs_miles, synthetic_run

CLIP, REWARD = quantity("clip_fraction"), quantity("reward")


def runset_of(*runs) -> RunSet:
    return RunSet.from_points(
        (LoadedRun(RunInfo(r.run_id, r.run_name, r.backend), "test"), r.points) for r in runs
    )


# ------------------------------------------------------------------------------- verdicts on runs


def test_known_difference_is_detected():
    megatron, miles = megatron_vs_miles(miles_clip_p=0.16)
    result = compare(runset_of(megatron, miles))
    d = result.difference("clip_fraction")
    expected = math.log(miles.clip_fraction() / megatron.clip_fraction())  # all steps paired
    assert d.estimate.value == pytest.approx(expected, abs=1e-12)
    assert math.log(1.25) < d.estimate.low < expected < d.estimate.high  # beyond ±25 %
    assert d.verdict == DIFFERENT and d.scale == LOG_RATIO
    assert result.on_policy_verdict == DIFFERENT
    assert "Not equally on-policy" in result.summary()


def test_no_difference_is_equivalent():
    megatron, miles = megatron_vs_miles(miles_clip_p=0.10)
    result = compare(runset_of(megatron, miles))
    d = result.difference("clip_fraction")
    assert -math.log(1.25) < d.estimate.low <= d.estimate.value <= d.estimate.high < math.log(1.25)
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
    # Wilson treats ~600k tokens as independent: narrower than the autocorrelated truth.
    assert est.wilson_high - est.wilson_low < (est.estimate.high - est.estimate.low) / 1.5
    mean_of_fractions = np.mean([p.metrics[keys.CLIP_FRACTION] for p in megatron.points])
    assert est.estimate.value != mean_of_fractions
    assert est.estimate.n_units == 200 and 0 < est.estimate.ess <= 200


def test_unequal_lengths_pair_only_common_steps_and_per_run_values_use_the_same_window():
    missing = (3, 4, 10, 11, 12)
    megatron, miles = megatron_vs_miles(miles_clip_p=0.16, n_megatron=300, n_miles=200, miles_missing=missing)
    result = compare(runset_of(megatron, miles))
    common = set(megatron.steps) & set(miles.steps)
    assert len(common) == 200 - len(missing)
    d = result.difference("clip_fraction")
    assert d.estimate.n_units == len(common)
    assert d.estimate.value == pytest.approx(
        math.log(miles.clip_fraction(common) / megatron.clip_fraction(common)), abs=1e-12
    )
    # the per-run values beside the difference are over the same paired steps ...
    assert d.reference_paired.value == pytest.approx(megatron.clip_fraction(common), abs=1e-15)
    assert d.run_paired.value == pytest.approx(miles.clip_fraction(common), abs=1e-15)
    assert math.log(d.run_paired.value / d.reference_paired.value) == pytest.approx(
        d.estimate.value, abs=1e-12
    )
    # ... and the full-window value is kept beside them
    full = result.run_estimate("clip_fraction", "megatron-run")
    assert full.units == 300 and full.estimate.value == pytest.approx(megatron.clip_fraction(), abs=1e-15)
    cell = result.formatted_table().set_index("metric").loc["clip_fraction", "megatron-run"]
    assert f"{megatron.clip_fraction(common) * 100:.3f}%" in cell and "(all 300 units:" in cell
    assert d.verdict == DIFFERENT
    assert sum("left out of the paired comparison" in n.text for n in result.notes) == 1


def test_equivalent_with_unequal_lengths_and_gaps():
    megatron, miles = megatron_vs_miles(n_megatron=230, n_miles=210, miles_missing=(0, 1, 30))
    assert compare(runset_of(megatron, miles)).difference("clip_fraction").verdict == EQUIVALENT


def test_small_difference_against_tight_tolerance_is_not_equivalent():
    megatron, miles = megatron_vs_miles(miles_clip_p=0.112)
    result = compare(runset_of(megatron, miles), margins={"clip_fraction": 0.01})  # absolute
    d = result.difference("clip_fraction")
    assert d.estimate.high > 0.01
    assert d.verdict in (INCONCLUSIVE, DIFFERENT)
    assert d.tolerance == 0.01


def test_reward_and_throughput_on_the_log_ratio_scale():
    megatron, miles = megatron_vs_miles(miles_reward=0.6, miles_throughput=1500.0)
    result = compare(runset_of(megatron, miles))
    reward = result.difference("reward")
    ref = np.mean([p.metrics[keys.REWARD] for p in megatron.points])
    other = np.mean([p.metrics[keys.REWARD] for p in miles.points])
    assert reward.scale == LOG_RATIO and reward.estimate.value == pytest.approx(math.log(other / ref))
    assert reward.tolerance == pytest.approx(math.log(1.05))
    assert reward.verdict == DIFFERENT  # +20 % against 5 %
    tps = result.difference("throughput")
    tps_ref = np.mean([p.metrics[keys.THROUGHPUT] for p in megatron.points])
    tps_other = np.mean([p.metrics[keys.THROUGHPUT] for p in miles.points])
    assert tps.estimate.value == pytest.approx(math.log(tps_other / tps_ref))
    assert tps.verdict == DIFFERENT
    assert result.formatted_table().set_index("metric").loc["throughput", "difference [CI]"].startswith("-2")


def test_negative_rewards_keep_the_sign_of_the_difference():
    a = synthetic_run("a", "a", "megatron", seed=3, reward=-0.5)
    b = synthetic_run("b", "b", "miles", seed=4, reward=-0.6)  # lower reward than the reference
    result = compare(runset_of(a, b))
    reward = result.difference("reward")
    ref = np.mean([p.metrics[keys.REWARD] for p in a.points])
    other = np.mean([p.metrics[keys.REWARD] for p in b.points])
    assert other < ref < 0
    assert reward.scale == LOG_RATIO
    assert reward.estimate.value == pytest.approx(-math.log(other / ref))  # negative: b is lower
    assert reward.estimate.high < -math.log(1.05) and reward.verdict == DIFFERENT
    assert result.formatted_table().set_index("metric").loc["reward", "difference [CI]"].startswith("-")


def test_throughput_from_step_time_is_tokens_over_seconds():
    a = synthetic_run("a", "a", "megatron", seed=3, step_time_s=1.0)
    b = synthetic_run("b", "b", "miles", seed=4, step_time_s=1.0)
    result = compare(runset_of(a, b))
    est = result.run_estimate("throughput", "a")
    assert est.estimate.value == pytest.approx(a.total(keys.LOSS_TOKENS) / a.total(keys.STEP_TIME))
    assert result.quantity("throughput").denominator == keys.STEP_TIME


def test_throughput_margin_is_symmetric():
    """The same data read both ways: 4.79 % slower one way is 5.03 % faster the other; one verdict."""
    a = synthetic_run("a", "a", "megatron", seed=3, n_steps=300, throughput=2000.0)
    b = synthetic_run("b", "b", "miles", seed=4, n_steps=300, throughput=2000.0 * 0.952)
    ab, ba = compare(runset_of(a, b)), compare(runset_of(b, a))
    d_ab, d_ba = ab.difference("throughput"), ba.difference("throughput")
    assert d_ab.verdict == d_ba.verdict != EQUIVALENT
    assert d_ab.estimate.value == pytest.approx(-d_ba.estimate.value, abs=1e-12)


def test_comparison_repeats_exactly():
    megatron, miles = megatron_vs_miles(miles_clip_p=0.13)
    rs = runset_of(megatron, miles)
    assert compare(rs).table().equals(compare(rs).table())


def test_window_restricts_steps():
    megatron, miles = megatron_vs_miles(miles_clip_p=0.16)
    result = compare(runset_of(megatron, miles), window=parse_window("10:130"))
    steps = set(range(10, 130))
    assert result.difference("clip_fraction").estimate.n_units == 120
    assert result.run_estimate("clip_fraction", "miles-run").estimate.value == pytest.approx(
        miles.clip_fraction(steps)
    )


@pytest.mark.parametrize("align", ["tokens", "time"])
def test_alignment_by_tokens_and_time(align):
    megatron, miles = megatron_vs_miles(miles_clip_p=0.16, n_miles=180, miles_missing=(7,))
    rs = runset_of(megatron, miles)
    units = unit_table(rs, rs.labels, [CLIP, REWARD], by=align)
    # every step inside the shared range lands in exactly one bin, counts are summed exactly
    for label, run in zip(rs.labels, (megatron, miles), strict=True):
        table = units[label]
        assert table["n_steps"].sum() <= len(run.points)
        assert float(table["clip_fraction.num"].sum()).is_integer()
    result = compare(rs, align=align)
    assert result.difference("clip_fraction").verdict == DIFFERENT


def test_loss_without_clip_keys_is_never_counted_as_zero():
    a = synthetic_run("a", "a", "megatron", seed=1)
    b = synthetic_run("b", "b", "miles", seed=2)
    b.points = [
        Point(p.step, p.wall_time, {k: v for k, v in p.metrics.items() if k not in keys.CLIP_COUNT_KEYS})
        if p.step % 2
        else p
        for p in b.points
    ]
    result = compare(runset_of(a, b))
    assert result.run_estimate("clip_fraction", "b").estimate.n_units == 100
    assert result.run_estimate("clip_fraction", "b").missing == 100
    assert result.difference("clip_fraction").estimate.n_units == 100
    assert any(n.run == "b" and "not logged at 100 of 200 steps" in n.text for n in result.notes)


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
        compare(rs, margins={"clip_fraction": -1})
    with pytest.raises(ValueError, match="absolute tolerance for reward must be > 0"):
        compare(rs, reward_abs_tolerance=0)
    with pytest.raises(ValueError, match="unknown quantities"):
        compare(rs, margins={"kl": 0.1})
    with pytest.raises(ValueError, match="window '5:1' is empty"):
        parse_window("5:1")
    with pytest.raises(ValueError, match="START:END"):
        parse_window("5")
    assert parse_window(":7") == Window(None, 7.0)


# ------------------------------------------------------------------------------------ edge cases


def _with(run, step_from: int, **changes):
    """A copy of ``run`` whose points from ``step_from`` on have ``changes`` applied to their metrics."""
    out = []
    for p in run.points:
        metrics = dict(p.metrics)
        if p.step >= step_from:
            metrics.update(changes)
        out.append(Point(p.step, p.wall_time, metrics))
    run.points = out
    return run


def test_nan_mid_run_is_left_out_and_flagged():
    megatron, miles = megatron_vs_miles()
    _with(miles, 130, **{keys.REWARD: float("nan")})
    result = compare(runset_of(megatron, miles))
    reward = result.difference("reward")
    assert reward.estimate.n_units == 130  # steps 130..199 left out for both runs
    ref = np.mean([p.metrics[keys.REWARD] for p in megatron.points if p.step < 130])
    assert reward.reference_paired.value == pytest.approx(ref)
    est = result.run_estimate("reward", "miles-run")
    assert est.nonfinite == 70 and est.first_nonfinite == 130 and est.units == 130
    [note] = [n for n in result.notes if n.metric == "reward" and n.warning and "NaN" in n.text]
    assert note.run == "miles-run"
    assert "NaN or infinite at 70 of 200 steps (first at step 130 from there to the end)" in note.text
    assert f"Warning: {note.text}" in result.summary()
    assert reward.verdict == EQUIVALENT  # over the 130 paired steps, and said so


def test_all_zero_token_steps_say_so():
    megatron, miles = megatron_vs_miles()
    zero = {
        keys.LOSS_TOKENS: 0.0,
        keys.CLIPPED_TOKENS: 0.0,
        keys.CLIPPED_LOW_TOKENS: 0.0,
        keys.CLIPPED_HIGH_TOKENS: 0.0,
    }
    _with(miles, 0, **zero)
    result = compare(runset_of(megatron, miles))
    d = result.difference("clip_fraction")
    assert d.verdict == INSUFFICIENT and d.estimate.n_units == 200
    assert (
        d.reason == "miles-run logged 0 loss_tokens:sum at all 200 paired units: clip_fraction is undefined"
    )
    assert "too few" not in result.summary() and "only" not in d.reason
    assert result.summary().startswith("Insufficient data")


def test_reward_near_zero_is_compared_on_the_absolute_scale_with_a_warning():
    a = synthetic_run("a", "a", "megatron", seed=3, reward=0.01)
    b = synthetic_run("b", "b", "miles", seed=4, reward=0.012)
    ab, ba = compare(runset_of(a, b)), compare(runset_of(b, a))
    for result in (ab, ba):
        d = result.difference("reward")
        assert d.scale == ABSOLUTE and d.tolerance == 0.02 and d.margin == 0.02
        assert d.verdict == EQUIVALENT
        [note] = [n for n in result.notes if n.metric == "reward" and n.warning]
        assert "absolute scale (±0.02, the floor near zero) instead of ±5%" in note.text
        assert "Warning:" in result.summary()
    ref = np.mean([p.metrics[keys.REWARD] for p in a.points])
    other = np.mean([p.metrics[keys.REWARD] for p in b.points])
    assert ab.difference("reward").estimate.value == pytest.approx(other - ref)
    assert ba.difference("reward").estimate.value == pytest.approx(ref - other)
    assert "%" not in ab.formatted_table().set_index("metric").loc["reward", "difference [CI]"]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_one_to_four_steps_give_insufficient_data(n):
    a = synthetic_run("a", "a", "megatron", seed=1, n_steps=n)
    b = synthetic_run("b", "b", "miles", seed=2, n_steps=n, clip_p=0.5)
    result = compare(runset_of(a, b))
    for d in result.differences:
        assert d.verdict == INSUFFICIENT, d
        assert d.reason == f"only {n} paired unit{'s' if n > 1 else ''} (minimum {MIN_UNITS})"
    assert result.on_policy_verdict == INSUFFICIENT
    assert result.summary().startswith(
        "Insufficient data: the clip fractions of these runs (b and a) cannot be compared"
    )
    assert "Not equally" not in result.summary()


# ------------------------------------------------------------------------------ property tests


def _arrays(seed: int, n: int, phi: float) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for mean in (0.1, 0.1 + rng.uniform(-0.05, 0.05)):
        wobble = np.zeros(n)
        for i in range(1, n):
            wobble[i] = phi * wobble[i - 1] + rng.normal(0, 0.01)
        tokens = rng.integers(1000, 5000, n).astype(float)
        out += [rng.binomial(tokens.astype(int), np.clip(mean + wobble, 0.001, 0.999)).astype(float), tokens]
    return out


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(2, 300),
    phi=st.sampled_from([0.0, 0.5, 0.9]),
    scale=st.sampled_from([ABSOLUTE, LOG_RATIO]),
)
def test_swapping_the_runs_mirrors_the_difference(seed, n, phi, scale):
    ca, ta, cb, tb = _arrays(seed, n, phi)
    ab = paired_difference(ca, ta, cb, tb, scale=scale)
    ba = paired_difference(cb, tb, ca, ta, scale=scale)
    assert ab.value == pytest.approx(-ba.value, abs=1e-12)
    assert ab.low == pytest.approx(-ba.high, abs=1e-12) and ab.high == pytest.approx(-ba.low, abs=1e-12)
    assert ab.ess == pytest.approx(ba.ess) and ab.n_units == ba.n_units == n
    assert equivalence_verdict(ab, 0.02) == equivalence_verdict(ba, 0.02)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 1000), clip_p=st.floats(0.05, 0.3), n=st.integers(80, 260))
def test_swapping_runs_in_compare_mirrors_every_row(seed, clip_p, n):
    a = synthetic_run("a", "a", "megatron", seed=seed, n_steps=n)
    b = synthetic_run("b", "b", "miles", seed=seed + 1, n_steps=n, clip_p=clip_p)
    ab, ba = compare(runset_of(a, b)), compare(runset_of(b, a))
    for d in ab.differences:
        other = ba.difference(d.metric)
        assert d.verdict == other.verdict and d.scale == other.scale
        assert d.estimate.value == pytest.approx(-other.estimate.value, abs=1e-12)
        assert d.estimate.low == pytest.approx(-other.estimate.high, abs=1e-12)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 1000), n=st.integers(MIN_UNITS, 300))
def test_a_run_compared_with_itself_is_equivalent_given_enough_steps(seed, n):
    a = synthetic_run("a", "a", "megatron", seed=seed, n_steps=n)
    twin = synthetic_run("a", "a", "megatron", seed=seed, n_steps=n)
    twin.run_id, twin.run_name = "twin", "twin"
    result = compare(runset_of(a, twin))
    for d in result.differences:
        assert d.estimate.value == 0 and d.estimate.low == 0 and d.estimate.high == 0
        assert d.verdict == EQUIVALENT, d


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 1000), n=st.integers(1, MIN_UNITS - 1), clip_p=st.floats(0.0, 0.5))
def test_fewer_steps_than_the_minimum_give_insufficient_data(seed, n, clip_p):
    a = synthetic_run("a", "a", "megatron", seed=seed, n_steps=n)
    b = synthetic_run("b", "b", "miles", seed=seed + 1, n_steps=n, clip_p=clip_p)
    result = compare(runset_of(a, b))
    assert {d.verdict for d in result.differences} == {INSUFFICIENT}


# ------------------------------------------------------------------------------- building blocks


@given(st.lists(st.tuples(st.integers(0, 500), st.integers(1, 500)), min_size=1, max_size=40))
def test_ratio_estimate_matches_plain_ratio_of_sums(pairs):
    clipped = np.array([min(c, t) for c, t in pairs], dtype=float)
    tokens = np.array([t for _, t in pairs], dtype=float)
    est = ratio_estimate(clipped, tokens)
    assert est.value == sum(min(c, t) for c, t in pairs) / sum(t for _, t in pairs)
    if est.has_interval:
        assert est.low <= est.value <= est.high


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 120), k=st.integers(1, 130), seed=st.integers(0, 2**32 - 1))
def test_cosine_coefficients_match_the_plain_sum(n, k, seed):
    """``phi_j' x = sqrt(2 / n) sum_t x_t cos(pi j (t + 1/2) / n)`` for ``j = 1 .. min(k, n)``."""
    x = np.random.default_rng(seed).standard_normal((2, n))
    j = np.arange(1, min(k, n) + 1)[:, None]
    basis = np.sqrt(2.0 / n) * np.cos(np.pi * j * (np.arange(n) + 0.5) / n)
    assert np.allclose(cosine_coefficients(x, k), x @ basis.T, rtol=1e-10, atol=1e-10)


@given(st.lists(st.floats(-100, 100), min_size=2, max_size=60))
def test_autocovariances_match_a_plain_loop(values):
    z = np.array(values)
    n = z.size
    d = z - z.mean()
    reference = [sum(d[t] * d[t + k] for t in range(n - k)) / n for k in range(n)]
    assert autocovariances(z) == pytest.approx(reference, abs=1e-7 * (1 + float(np.abs(d).max()) ** 2))


def _reference_lrv(z: np.ndarray, degree: int, k: int) -> tuple[float, float]:
    """Plain EWC: least-squares residual on powers of t, explicit cosine matrix, explicit traces;
    the larger of the estimate over ``k`` cosines and over the fewest lowest cosines whose part
    outside the trend reaches 4 (with that estimate's degrees of freedom)."""
    n = z.size
    t = np.arange(n)
    x = (2 * t + 1) / n - 1
    design = np.column_stack([x**p for p in range(degree + 1)])
    resid_maker = np.eye(n) - design @ np.linalg.pinv(design)
    e = resid_maker @ z

    def ewc(terms: int) -> tuple[float, float, float]:
        phi = np.array([np.sqrt(2 / n) * np.cos(np.pi * j * (t + 0.5) / n) for j in range(1, terms + 1)])
        c = phi @ resid_maker @ phi.T
        return (
            float(np.sum((phi @ e) ** 2) / np.trace(c)),
            float(np.trace(c) ** 2 / np.sum(c * c)),
            float(np.trace(c)),
        )

    low = next((j for j in range(1, n) if ewc(j)[2] >= 4 - 1e-9), n)
    lrv, df, _ = ewc(k)
    if low < k:
        coarse, coarse_df, _ = ewc(low)
        if coarse > lrv:
            return coarse, coarse_df
    return lrv, df


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(8, 400), phi=st.sampled_from([0.0, 0.5, 0.95]))
def test_long_run_variance_matches_a_plain_reference(seed, n, phi):
    rng = np.random.default_rng(seed)
    z = np.zeros(n)
    for i in range(n):
        z[i] = (phi * z[i - 1] if i else 0.0) + rng.normal()
    v = long_run_variance(z)
    lrv, df = _reference_lrv(z, int(v.trend_terms[0]), int(v.terms[0]))
    assert int(v.trend_terms[0]) in ((0, 2) if n >= 50 else (0,))
    if not v.long_memory[0]:
        assert v.lrv[0] == pytest.approx(lrv, rel=1e-8)
    else:
        assert v.lrv[0] >= lrv * (1 - 1e-8)
    assert v.df[0] == pytest.approx(df, rel=1e-8)
    assert v.ess[0] <= n


def test_interval_is_t_with_the_lrv_degrees_of_freedom():
    from scipy.stats import t as student_t

    rng = np.random.default_rng(5)
    num, den = rng.integers(0, 100, 150).astype(float), np.full(150, 100.0)
    est = ratio_estimate(num, den)
    r = num.sum() / den.sum()
    z = (num - r * den) / den.mean()
    lrv, df = _reference_lrv(z, est.trend_terms, int(round(150 / est.bandwidth)))
    half = student_t.ppf(0.95, df) * math.sqrt(lrv / 150)
    assert est.trend_terms == 0 and not est.long_memory  # independent steps: no trend, no widening
    assert est.low == pytest.approx(r - half) and est.high == pytest.approx(r + half)
    assert est.df == pytest.approx(df) and est.lrv == pytest.approx(lrv)


def test_paired_difference_cancels_shared_step_effects():
    rng = np.random.default_rng(0)
    tokens = rng.integers(1000, 2000, 200).astype(float)
    shared = 0.1 + 0.05 * np.sin(np.arange(200) / 10)  # both runs follow the same schedule
    a = np.round(tokens * shared)
    b = np.round(tokens * (shared + 0.01))
    paired = paired_difference(a, tokens, b, tokens)
    assert paired.value == pytest.approx(b.sum() / tokens.sum() - a.sum() / tokens.sum())
    assert paired.high - paired.low < 0.002  # the schedule cancels
    assert 0.009 < paired.low and paired.high < 0.011


def test_wilson_interval_reference_values():
    low, high = wilson_interval(50, 100, confidence=0.95)
    assert low == pytest.approx(0.4038, abs=1e-4) and high == pytest.approx(0.5962, abs=1e-4)
    assert all(math.isnan(v) for v in wilson_interval(0, 0))


def _est(low: float, high: float, n: int = 200, ess: float = 50.0) -> Estimate:
    return Estimate(0.0, low, high, n, 0.3, ess, n, 0.9)


@pytest.mark.parametrize(
    "estimate,verdict",
    [
        (_est(-0.01, 0.01), EQUIVALENT),
        (_est(0.03, 0.05), DIFFERENT),
        (_est(-0.05, -0.03), DIFFERENT),
        (_est(0.01, 0.03), INCONCLUSIVE),
        (_est(-0.03, 0.03), INCONCLUSIVE),
        (_est(-0.02, 0.0), INCONCLUSIVE),
        (_est(float("nan"), float("nan")), INSUFFICIENT),
        (_est(-0.01, 0.01, n=MIN_UNITS - 1), INSUFFICIENT),
        (_est(0.03, 0.05, ess=MIN_ESS - 0.1), DIFFERENT),  # a direction is trusted below the ESS gate
        (_est(-0.01, 0.01, ess=MIN_ESS - 0.1), INSUFFICIENT),  # equivalence is not
        (_est(0.01, 0.03, ess=MIN_ESS - 0.1), INSUFFICIENT),
        (_est(0.03, 0.05, n=MIN_UNITS - 1), INSUFFICIENT),
        (_est(-0.01, 0.01, n=MIN_UNITS, ess=MIN_ESS), EQUIVALENT),
    ],
)
def test_equivalence_verdict_rules(estimate, verdict):
    assert equivalence_verdict(estimate, 0.02) == verdict


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 5000)), min_size=2, max_size=300),
    st.sampled_from([0.5, 0.9, 0.99]),
)
@example(pairs=[(0, 3), (1, 1), (0, 3)], confidence=0.5)  # a tiny spread: the logit round trip
def test_fraction_intervals_stay_within_bounds_and_step_weighting_is_the_plain_mean(pairs, confidence):
    from cliptrack.compare.stats import step_weighted_estimate

    tokens = np.array([t for _, t in pairs], dtype=float)
    clipped = np.array([min(c, t) for c, t in pairs], dtype=float)
    if tokens.sum() == 0:
        return
    est = ratio_estimate(clipped, tokens, confidence=confidence, bounds=(0.0, 1.0))
    assert est.value == clipped.sum() / tokens.sum()
    if est.has_interval:
        assert 0.0 <= est.low <= est.value <= est.high <= 1.0
    steps = step_weighted_estimate(clipped, tokens, confidence=confidence, bounds=(0.0, 1.0))
    per_step = [c / t for c, t in zip(clipped, tokens, strict=True) if t != 0]
    assert steps.value == pytest.approx(sum(per_step) / len(per_step), rel=1e-12, abs=1e-15)
    if steps.has_interval:
        assert 0.0 <= steps.low <= steps.high <= 1.0


def test_bounds_refuse_values_outside_them_and_bad_bounds():
    with pytest.raises(ValueError, match=r"outside its bounds \[0, 1\]"):
        ratio_estimate(np.full(50, 3.0), np.ones(50) + np.arange(50) % 2, bounds=(0.0, 1.0))
    with pytest.raises(ValueError, match="bounds must be two finite numbers low < high"):
        ratio_estimate(np.ones(5), np.ones(5), bounds=(1.0, 0.0))


def test_the_ess_gate_names_the_persistence():
    rng = np.random.default_rng(12)
    n = 300
    x = np.zeros(n)
    for i in range(1, n):
        x[i] = 0.995 * x[i - 1] + rng.normal(0, 0.01)
    tokens = np.full(n, 10_000.0)
    est = ratio_estimate(np.round(tokens * np.clip(0.1 + x, 0, 1)), tokens)
    assert not est.enough_data and est.ess < MIN_ESS
    text = est.insufficiency()
    assert text.startswith(f"effective sample size {est.ess:.1f} < 10: the steps are too persistent")
    assert f"over {n} units" in text
