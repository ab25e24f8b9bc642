"""Margins that fit on-policy quantities (relative, with an absolute floor near zero), intervals that
stay in the range of non-negative quantities, and sentences that are true of their numbers."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from cliptrack.compare import RunSet, compare
from cliptrack.compare import quantities as qs
from cliptrack.compare import reasons as r
from cliptrack.compare.stats import DIFFERENT, EQUIVALENT, INCONCLUSIVE, INSUFFICIENT, ratio_estimate
from cliptrack.compare.stats.intervals import _bounded
from cliptrack.core import keys
from cliptrack.store.frame import LoadedRun, Point
from cliptrack.store.records import RunInfo
from hypothesis import given, settings
from hypothesis import strategies as st

from tests._compare_fixtures import _ar1, run_from_curves


def runset_of(*runs) -> RunSet:
    return RunSet.from_points(
        (LoadedRun(RunInfo(r.run_id, r.run_name, r.backend), "test"), r.points) for r in runs
    )


def level_curve(seed: int, n: int, level: float, wobble: float = 0.2) -> np.ndarray:
    """A per-step rate around ``level`` with a relative AR(1) wobble."""
    return level * np.exp(_ar1(np.random.default_rng(seed), n, 0.5, wobble))


def clip_pair(level_a: float, level_b: float, n: int = 1000, tokens: int = 20_000, kl=None):
    steps = np.full(n, tokens)
    a = run_from_curves("a", "megatron", seed=1, clip_p=level_curve(11, n, level_a), loss_tokens=steps)
    b = run_from_curves("b", "miles", seed=2, clip_p=level_curve(12, n, level_b), loss_tokens=steps)
    return a, b


# ------------------------------------------------------------------------------------- registry


def test_the_gauge_quantities_have_relative_margins_with_floors_and_absolute_ones_can_be_set():
    for name, floor in (
        ("clip_fraction", qs.CLIP_FLOOR),
        ("clip_low_fraction", qs.CLIP_FLOOR),
        ("clip_high_fraction", qs.CLIP_FLOOR),
        ("ratio_outside_fraction", qs.CLIP_FLOOR),
        ("kl_k3", qs.KL_FLOOR),
        ("abs_log_ratio", qs.ABS_LOG_RATIO_FLOOR),
    ):
        q = qs.quantity(name)
        assert (q.scale, q.margin, q.abs_margin) == (qs.AUTO, 0.25, floor), name
        assert qs.DEFAULT_MARGINS[name] == qs.relative(0.25, floor)
    assert qs.quantity("clip_fraction").relative_floor() == pytest.approx(0.0004)  # 0.04 % of tokens
    assert qs.quantity("clip_fraction").margin_text() == "±25% (±0.01 pp near zero)"
    for name in ("kl_k3", "abs_log_ratio", "throughput"):
        assert qs.quantity(name).bounds == qs.NONNEGATIVE
    absolute = qs.quantity("clip_fraction").with_given(qs.absolute(0.002))
    assert (absolute.scale, absolute.margin, absolute.margin_text()) == (qs.ABSOLUTE, 0.002, "±0.2 pp")
    relative = qs.quantity("throughput").with_given(qs.relative(0.1))
    assert (relative.scale, relative.margin) == (qs.LOG_RATIO, 0.1)  # no floor: relative at every level


def test_margins_as_written_on_the_command_line():
    clip = qs.quantity("clip_fraction")
    assert qs.parse_margin(clip, "25%") == qs.relative(0.25)
    assert qs.parse_margin(clip, "0.002") == qs.absolute(0.002)
    assert qs.parse_margin(qs.quantity("throughput"), "0.05") == qs.absolute(0.05)  # as for every quantity
    assert qs.parse_margin(qs.quantity("reward"), "5%") == qs.relative(0.05)
    for bad in ("x", "-5%", "0", "inf", "25%,x", "25%,-1", "25%,0"):
        with pytest.raises(ValueError):
            qs.parse_margin(clip, bad)
    # a floor after the comma, in either form of the share; cliptrack probe writes margins the same way
    assert qs.parse_margin(clip, "25%,0.0001") == qs.relative(0.25, 0.0001)
    assert qs.parse_margin(clip, "0.25, 0.0001") == qs.relative(0.25, 0.0001)
    assert qs.margin_from_text("logprob_gap", "0.002") == qs.absolute(0.002)
    with pytest.raises(ValueError, match="for kl_k3"):
        qs.margin_from_text("kl_k3", "20%,")


@given(
    share=st.floats(1e-4, 10.0),
    floor=st.none() | st.floats(1e-9, 1.0),
    default=st.none() | st.floats(1e-9, 1.0),
    size=st.floats(0.0, 1e6),
)
def test_a_margin_near_a_size_is_the_larger_of_its_floor_and_its_share(share, floor, default, size):
    """``Margin.near``, as the paired probe takes its margins, against the plain rule."""
    own = floor if floor is not None else default
    expected = max(own if own is not None else 0.0, share * size)
    assert qs.relative(share, floor).near(size, default) == expected
    assert qs.absolute(share).near(size, default) == share


# ------------------------------------------------------------------------- intervals in range


@settings(max_examples=300, deadline=None)
@given(
    value=st.floats(0.0, 1e6, allow_nan=False),
    half=st.floats(0.0, 1e6, allow_nan=False),
)
def test_a_lower_bounded_interval_is_the_log_scale_interval_and_stays_above_its_bound(value, half):
    low, high = _bounded(value, half, qs.NONNEGATIVE)
    assert 0.0 <= low <= value <= high
    if value > 0 and half > 0:  # plain reference: value * exp(±half / value), the spread capped
        spread = min(half / value, 700.0)
        assert low == pytest.approx(min(value, value * math.exp(-spread)), rel=1e-12, abs=1e-300)
        assert high == pytest.approx(max(value, value * math.exp(spread)), rel=1e-12)
    elif value == 0:
        assert (low, high) == (0.0, half)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), level=st.floats(1e-6, 1.0))
def test_ratio_estimates_of_non_negative_quantities_never_go_below_zero(seed, level):
    rng = np.random.default_rng(seed)
    n = 120
    den = rng.integers(100, 2000, n).astype(float)
    num = den * level * rng.exponential(1.0, n) * (rng.random(n) < 0.2)  # mostly zero, heavy tail
    plain = ratio_estimate(num, den)
    kept = ratio_estimate(num, den, bounds=qs.NONNEGATIVE)
    assert kept.value == plain.value
    if kept.has_interval:
        assert 0.0 <= kept.low <= kept.value <= kept.high


def test_per_run_intervals_of_kl_and_throughput_stay_non_negative():
    n = 300
    tokens = np.full(n, 500)
    rng = np.random.default_rng(5)
    kl = np.zeros(n)
    kl[[40, 200]] = tokens[0] * 0.2  # a KL near 0 with two large steps
    time = np.where(rng.random(n) < 0.05, 5.0, 0.05)  # throughput that sometimes stalls
    runs = [
        run_from_curves(
            label,
            label,
            seed=seed,
            clip_p=np.full(n, 0.01),
            loss_tokens=tokens,
            extra={keys.KL_K3_SUM: kl, keys.STEP_TIME: time},
        )
        for label, seed in (("a", 1), ("b", 2))
    ]
    result = compare(runset_of(*runs))
    for metric in ("kl_k3", "throughput"):
        for e in result.estimates:
            if e.metric == metric:
                assert e.estimate.has_interval and 0 <= e.estimate.low <= e.estimate.value <= e.estimate.high
    plain = ratio_estimate(kl, tokens)
    assert plain.low < 0  # the plain interval would have gone below zero


# --------------------------------------------------------------------------------- the margins


def test_a_twenty_fold_clip_fraction_is_different_and_a_ten_percent_one_equivalent():
    far = compare(runset_of(*clip_pair(0.0005, 0.01))).difference("clip_fraction")
    assert far.scale == qs.LOG_RATIO and far.verdict == DIFFERENT
    assert far.estimate.value == pytest.approx(math.log(20), abs=0.1)
    # an absolute margin of 2 pp, as before, called these two equivalent
    old = compare(runset_of(*clip_pair(0.0005, 0.01)), margins={"clip_fraction": qs.absolute(0.02)})
    assert old.difference("clip_fraction").verdict == EQUIVALENT
    near = compare(runset_of(*clip_pair(0.01, 0.0105)))
    assert near.difference("clip_fraction").verdict == EQUIVALENT
    assert near.summary().startswith(
        "Equally on-policy"
    ) and "within clip fraction (token-weighted) ±25%" in (near.summary())


def test_clip_fractions_near_zero_use_the_floor_and_say_so_in_percentage_points():
    result = compare(runset_of(*clip_pair(0.00002, 0.00003)))
    d = result.difference("clip_fraction")
    assert d.scale == qs.ABSOLUTE and d.margin == qs.CLIP_FLOOR and d.verdict == EQUIVALENT
    [note] = [
        n for n in result.notes if n.metric == "clip_fraction" and isinstance(n.reason, r.AbsoluteScale)
    ]
    assert "absolute scale (±0.01 pp, the floor near zero) instead of ±25%" in note.text
    assert "|clip_fraction| >= 0.04%" in note.text
    assert "±0.01 pp (the floor near zero)" in result.summary()


# ------------------------------------------------------------------------- the simulation


@pytest.mark.slow
def test_the_floor_keeps_size_power_and_twenty_fold_differences_by_simulation():
    """Fixed seed, 200 replicates, 1,000 steps of 1k-10k tokens: the chosen floors keep the false
    "equivalent" and false "different" at the margin within 5 % (Monte-Carlo bound 2 se), give
    "equivalent" at no difference in 80 %+ at every level, and never call a 20-fold difference
    equivalent; without a floor the power is gone near zero, and a floor ten times as large calls
    a 20-fold difference equivalent."""
    from research.simulation import margin_floor

    reps = 200
    bound = 0.05 + 2 * math.sqrt(0.05 * 0.95 / reps)
    for kind, level, floor in (
        ("counts", 1e-2, qs.CLIP_FLOOR),
        ("counts", 4e-4, qs.CLIP_FLOOR),
        ("counts", 1e-4, qs.CLIP_FLOOR),
        ("counts", 1e-5, qs.CLIP_FLOOR),
        ("sums", 1e-3, qs.KL_FLOOR),
        ("sums", 1e-6, qs.KL_FLOOR),
    ):
        row = margin_floor(kind, level, floor, 1000, reps, 0)
        assert row.size <= bound and row.false_different <= bound, row
        assert row.power >= 0.8, row
        assert row.twenty == 0.0, row
    assert margin_floor("counts", 1e-5, 0.0, 1000, reps, 0).power < 0.2  # no floor: no power near 0
    assert margin_floor("counts", 3e-5, 1e-3, 1000, reps, 0).twenty > 0.5  # too high a floor


# ---------------------------------------------------------------------- sentences true of numbers


def _equal_pair(n: int):
    return clip_pair(0.1, 0.1, n=n, tokens=3000)


def test_inconclusive_segments_are_not_called_beyond_the_margin():
    result = compare(runset_of(*_equal_pair(1000)))
    d = result.difference("clip_fraction")
    assert d.verdict == EQUIVALENT and len(d.segments) > 1
    unclear = tuple(replace(s, verdict=INSUFFICIENT) for s in d.segments)
    changed = replace(
        result,
        differences=[
            replace(d, verdict=INCONCLUSIVE, average_verdict=EQUIVALENT, segments=unclear, differing=unclear)
            if x is d
            else x
            for x in result.differences
        ],
    )
    headline = changed.summary().splitlines()[0]
    assert headline.startswith("Inconclusive") and "beyond" not in headline
    assert "not shown within ±25% at steps 0-" in headline and "(insufficient data)" in headline
    assert "(within the margin on average)" in headline


def test_insufficient_names_only_what_cannot_be_compared():
    """With the mismatch KL short of data and the clip fraction inconclusive, the headline says the
    KL cannot be compared and the clip fraction is inconclusive, not that both cannot be compared;
    two reasons that differ are each labelled with their quantity."""
    n, tokens = 1000, np.full(1000, 3000)
    runs = [
        run_from_curves(
            name,
            backend,
            seed=seed,
            clip_p=level_curve(seed + 10, n, 0.1),
            loss_tokens=tokens,
            extra={keys.KL_K3_SUM: tokens * 0.001 * (1 + 0.1 * np.random.default_rng(seed).random(n))},
        )
        for name, backend, seed in (("a", "megatron", 1), ("b", "miles", 2))
    ]
    result = compare(runset_of(*runs))
    clip, kl = result.difference("clip_fraction"), result.difference("kl_k3")

    def changed(rows):
        return replace(result, differences=[rows.get(x.metric, x) for x in result.differences])

    one = changed(
        {
            "clip_fraction": replace(clip, verdict=INCONCLUSIVE),
            "kl_k3": replace(kl, verdict=INSUFFICIENT, reason="effective sample size 3.8 < 10"),
        }
    )
    headline = one.summary().splitlines()[0]
    assert headline.startswith(
        "Insufficient data: the mismatch KLs of these runs (b and a) cannot be compared "
        "(effective sample size 3.8 < 10)."
    ), headline
    assert (
        "The clip fraction (token-weighted) is inconclusive: neither within nor beyond ±25% is shown."
        in headline
    )
    both = changed(
        {
            "clip_fraction": replace(clip, verdict=INSUFFICIENT, reason="effective sample size 2.7 < 10"),
            "kl_k3": replace(kl, verdict=INSUFFICIENT, reason="effective sample size 0.8 < 10"),
        }
    )
    headline = both.summary().splitlines()[0]
    assert "the clip fractions and mismatch KLs of these runs (b and a) cannot be compared" in headline
    assert "clip fraction (token-weighted): effective sample size 2.7 < 10" in headline
    assert "mismatch KL (k3): effective sample size 0.8 < 10" in headline


def test_equivalent_says_these_runs_over_the_window_never_throughout():
    """One pair answers for these runs, over the window (segments name stretches, not verdicts)."""
    for n in (300, 1000):
        result = compare(runset_of(*_equal_pair(n)))
        d = result.difference("clip_fraction")
        headline = result.summary().splitlines()[0]
        assert d.verdict == EQUIVALENT, d.reason
        assert headline.startswith("Equally on-policy: these runs (b and a) agree over the window within")
        assert "throughout" not in headline and "stacks" not in headline
        assert d.reason == "the whole interval lies within the margin"  # no "every segment's"


def _seed_groups():
    runs = []
    for stack, level, first in (("megatron", 0.10, 100), ("miles", 0.10, 200)):
        for i in range(3):
            mean = level * math.exp(np.random.default_rng(first + i).normal(0, 0.03))
            curve = level_curve(first + 20 + i, 300, mean)
            runs.append(
                run_from_curves(
                    f"{stack}-s{i}", stack, seed=first + 10 + i, clip_p=curve, loss_tokens=np.full(300, 3000)
                )
            )
    groups = {"megatron": [x.run_id for x in runs[:3]], "miles": [x.run_id for x in runs[3:]]}
    return runset_of(*runs), groups


def test_seeds_needed_only_on_rows_more_seeds_could_settle_and_groups_are_not_throughout():
    rs, groups = _seed_groups()
    result = compare(rs, groups=groups)
    d = result.group_difference("clip_fraction")
    assert d.verdict == EQUIVALENT and d.seeds_needed is not None
    summary = result.summary()
    assert "would settle" not in summary and "throughout" not in summary.splitlines()[0]
    assert "agree on the window average over seeds" in summary.splitlines()[0]
    assert result.formatted_table().loc[0, "seeds needed"] == "-"
    for verdict in (DIFFERENT, EQUIVALENT):
        settled = replace(result, group_differences=[replace(d, verdict=verdict)])
        assert "would settle" not in settled.summary()
    open_row = replace(result, group_differences=[replace(d, verdict=INCONCLUSIVE)])
    assert f"{d.seeds_needed} seeds per stack would settle ±25%" in open_row.summary()
    unknown = replace(result, group_differences=[replace(d, verdict=INCONCLUSIVE, seeds_needed=None)])
    assert "None" not in unknown.summary() and "would settle" not in unknown.summary()


def test_the_token_weighting_note_fires_only_where_token_counts_vary():
    n = 400
    rng = np.random.default_rng(7)
    slow = rng.random(n) < 0.3
    time = np.where(slow, 2.0, 0.2)  # throughput per step varies 10-fold: time- and step-weighted differ
    runs = [
        run_from_curves(
            label,
            label,
            seed=seed,
            clip_p=np.full(n, 0.1),
            loss_tokens=np.full(n, 3000),
            extra={keys.STEP_TIME: time},
        )
        for label, seed in (("a", 1), ("b", 2))
    ]
    result = compare(runset_of(*runs))
    est = result.run_estimate("throughput", "a")
    assert est.step_weighted is not None
    assert abs(math.log(est.estimate.value / est.step_weighted.value)) > math.log(1.05)  # they differ
    assert not [x for x in result.notes if isinstance(x.reason, r.WeightingGap)]  # tokens do not vary
    p = np.where(rng.random(n) < 0.5, 0.05, 0.25)
    tokens = np.where(p > 0.1, 8000, 1000)  # big steps clip more
    varying = [
        run_from_curves(label, label, seed=seed, clip_p=p, loss_tokens=tokens)
        for label, seed in (("a", 1), ("b", 2))
    ]
    noted = compare(runset_of(*varying))
    assert [x for x in noted.notes if isinstance(x.reason, r.WeightingGap) and x.metric == "clip_fraction"]


# ---------------------------------------------------------------------- real demo-trainer runs


@pytest.mark.slow
def test_two_against_four_ppo_epochs_of_the_demo_trainer_are_not_equally_on_policy():
    """The demo trainer (110 steps each): 2 PPO epochs clip about 0.03 % of tokens, 4 epochs about
    2 %, some 60 times as many; the default margins never call that equivalent (an absolute ±2 pp
    margin did: the difference is about 2 pp)."""
    from cliptrack.adapters.demo.train import RunConfig, train

    runs = []
    for epochs in (2, 4):
        metrics = [
            r.output.metrics for r in train(RunConfig(path="megatron", steps=110, epochs=epochs, seed=0))
        ]
        points = [Point(step, 1000.0 + step, dict(m)) for step, m in enumerate(metrics)]
        runs.append((LoadedRun(RunInfo(f"e{epochs}", f"epochs-{epochs}", "megatron"), "test"), points))
    result = compare(RunSet.from_points(runs))
    d = result.difference("clip_fraction")
    # never "equivalent": the 90 % interval lies wholly beyond the floor near zero; "different"
    # needs the 99.5 % direction interval there, which 110 steps (t = 4.8 on 4 degrees of freedom,
    # p = 0.009) do not give, so "inconclusive" is the honest answer of one pair this short
    assert d.estimate.low > d.tolerance and d.verdict in (DIFFERENT, INCONCLUSIVE), result.summary()
    assert result.on_policy_verdict != EQUIVALENT
    assert not result.summary().startswith("Equally on-policy")
    absolute = compare(RunSet.from_points(runs), margins={"clip_fraction": qs.absolute(0.02)})
    assert absolute.difference("clip_fraction").verdict != DIFFERENT
