"""Seed groups (``group_difference``, ``seeds_needed``), influential units and lead–lag, against plain
references computed here (the seeds' own ratios of sums, Welch's formula, brute-force shifts)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cliptrack.compare.stats import (
    DIFFERENT,
    EQUIVALENT,
    LOG_RATIO,
    equivalence_verdict,
    group_difference,
    influential_units,
    lead_lag,
    paired_difference,
    seeds_needed,
)
from cliptrack.compare.stats.quantiles import f_quantile, t_criticals, t_quantile
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats


def _seed(rng, n, p):
    tokens = rng.integers(1_000, 5_000, n).astype(float)
    return rng.binomial(tokens.astype(int), p).astype(float), tokens


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), ma=st.integers(2, 6), mb=st.integers(2, 6))
def test_group_difference_is_welch_on_the_seeds_ratios(seed, ma, mb):
    rng = np.random.default_rng(seed)
    ga = [_seed(rng, 50, rng.uniform(0.05, 0.15)) for _ in range(ma)]
    gb = [_seed(rng, 80, rng.uniform(0.05, 0.15)) for _ in range(mb)]
    ra = [c.sum() / t.sum() for c, t in ga]
    rb = [c.sum() / t.sum() for c, t in gb]
    g = group_difference(ga, gb)
    va, vb = np.var(ra, ddof=1) / ma, np.var(rb, ddof=1) / mb
    df = (va + vb) ** 2 / (va**2 / (ma - 1) + vb**2 / (mb - 1))
    half = scipy_stats.t.ppf(0.95, df) * math.sqrt(va + vb)
    assert g.value == pytest.approx(np.mean(rb) - np.mean(ra), abs=1e-12)
    assert g.low == pytest.approx(g.value - half) and g.high == pytest.approx(g.value + half)
    assert g.df == pytest.approx(df) and (g.seeds_a, g.seeds_b) == (ma, mb)
    assert g.between_sd_a == pytest.approx(np.std(ra, ddof=1)) and g.reason == ""
    mirrored = group_difference(gb, ga)
    assert mirrored.value == pytest.approx(-g.value, abs=1e-12) and mirrored.low == pytest.approx(-g.high)


def test_group_difference_on_the_log_ratio_scale():
    rng = np.random.default_rng(1)
    ga = [_seed(rng, 100, 0.10) for _ in range(3)]
    gb = [_seed(rng, 100, 0.12) for _ in range(3)]
    g = group_difference(ga, gb, scale=LOG_RATIO)
    ma = np.mean([c.sum() / t.sum() for c, t in ga])
    mb = np.mean([c.sum() / t.sum() for c, t in gb])
    assert g.value == pytest.approx(math.log(mb / ma))
    assert g.low < g.value < g.high


def test_one_seed_per_group_says_why_there_is_no_interval():
    rng = np.random.default_rng(2)
    g = group_difference([_seed(rng, 100, 0.1)], [_seed(rng, 100, 0.1), _seed(rng, 100, 0.1)])
    assert not g.has_interval and "2 or more seeds per group (a has 1, b has 2)" in g.reason


def test_group_difference_refuses_bad_runs():
    rng = np.random.default_rng(3)
    good = [_seed(rng, 10, 0.1), _seed(rng, 10, 0.1)]
    with pytest.raises(ValueError, match="group b, seed 1: the ratio of sums is undefined"):
        group_difference(good, [good[0], (np.ones(10), np.zeros(10))])
    with pytest.raises(ValueError, match="group a, seed 0: numerator and denominator differ in length"):
        group_difference([(np.ones(3), np.ones(4)), good[0]], good)
    with pytest.raises(ValueError, match="scale"):
        group_difference(good, good, scale="ratio")


@pytest.mark.parametrize(
    "between,within,margin", [(0.01, 0.002, 0.02), (0.005, 0.005, 0.01), (0.02, 0.0, 0.01)]
)
def test_seeds_needed_is_the_smallest_count_meeting_the_power_rule(between, within, margin):
    m = seeds_needed(between, within, margin)
    v = between**2 + within**2

    def ok(k: int) -> bool:
        return margin / math.sqrt(2 * v / k) >= scipy_stats.t.ppf(0.95, k - 1) + scipy_stats.t.ppf(
            0.9, 2 * k - 2
        )

    assert ok(m) and (m == 2 or not ok(m - 1))


def test_seeds_needed_achieves_its_power_in_simulation():
    between, margin = 0.01, 0.02
    m = seeds_needed(between, 0.0, margin)
    rng = np.random.default_rng(4)
    hits = 0
    for _ in range(400):
        a, b = rng.normal(0, between, m), rng.normal(0, between, m)
        se = math.sqrt(a.var(ddof=1) / m + b.var(ddof=1) / m)
        df = (a.var(ddof=1) / m + b.var(ddof=1) / m) ** 2 / (
            (a.var(ddof=1) / m) ** 2 / (m - 1) + (b.var(ddof=1) / m) ** 2 / (m - 1)
        )
        d = b.mean() - a.mean()
        hits += abs(d) + scipy_stats.t.ppf(0.95, df) * se < margin
    assert hits / 400 >= 0.72  # nominal 80 %, Welch df a little below 2m - 2


def test_seeds_needed_refuses_bad_input():
    with pytest.raises(ValueError, match="margin must be a finite number > 0"):
        seeds_needed(0.01, 0.0, 0.0)
    with pytest.raises(ValueError, match="between_sd must be a finite number >= 0"):
        seeds_needed(-1.0, 0.0, 0.1)
    with pytest.raises(ValueError, match="more than 10,000 seeds"):
        seeds_needed(1.0, 0.0, 1e-4)


def test_t_and_f_quantiles_match_scipy():
    for df in (1.0, 2.5, 4.0, 17.3, 200.0):
        for p in (0.05, 0.9, 0.95, 0.999):
            assert t_quantile(p, df) == pytest.approx(scipy_stats.t.ppf(p, df), rel=1e-8)
            assert f_quantile(p, 2.0, df) == pytest.approx(scipy_stats.f.ppf(p, 2.0, df), rel=1e-7)
    with pytest.raises(ValueError, match="degrees of freedom must be > 0"):
        t_quantile(0.9, 0.0)


T_BEFORE = {  # (p, df): the quantile of the former incomplete-beta continued fraction, bisected
    (0.95, 1.5): 3.7051808200966434,
    (0.95, 4.0): 2.131846786326662,
    (0.95, 7.3): 1.8829300179564257,
    (0.95, 25.5): 1.706853695866755,
    (0.95, 198.0): 1.652585783618008,
    (0.975, 2.0): 4.302652729749411,
    (0.975, 3.7): 2.8675207071911473,
    (0.975, 10.0): 2.22813885198633,
    (0.975, 60.0): 2.000297822014261,
    (0.975, 1000.0): 1.962339080826439,
    (0.99, 1.5): 11.197316179568134,
    (0.99, 4.0): 3.746947387979276,
    (0.99, 25.5): 2.4818011132914535,
    (0.995, 2.0): 9.92484320091853,
    (0.995, 7.3): 3.4510316556221596,
    (0.995, 198.0): 2.6008872779904095,
    (0.9975, 3.7): 5.9875151388939685,
    (0.9975, 60.0): 2.914552575419407,
    (0.99875, 1.5): 44.968113168271884,
    (0.99875, 10.0): 4.004530447671073,
    (0.99875, 1000.0): 3.0310239471963314,
}
"""Two-sided critical values at 90 % to 99.75 % (segments widen by their count) and the degrees of
freedom the intervals use (EWC terms, Welch, seeds)."""
F_BEFORE = {  # (p, d1, d2): the trend test's F quantiles (1 - 0.01 / degree, d terms, K cosines)
    (0.99, 1.0, 4.0): 21.1976895843909,
    (0.99, 1.0, 30.0): 7.56247609464117,
    (0.99, 2.0, 4.0): 17.999999999992724,
    (0.99, 2.0, 120.0): 4.786509739662506,
    (0.975, 2.0, 9.0): 5.714705386382775,
    (0.95, 1.0, 120.0): 3.920124408969059,
}


def test_quantiles_from_scipy_agree_with_the_former_ones_at_the_values_used():
    for (p, df), before in T_BEFORE.items():
        assert t_quantile(p, df) == pytest.approx(before, rel=1e-9, abs=0)
        assert t_quantile(1 - p, df) == pytest.approx(-before, rel=1e-9, abs=0)
        assert scipy_stats.t.ppf(p, df) == pytest.approx(before, rel=1e-9, abs=0)
    for (p, d1, d2), before in F_BEFORE.items():
        assert f_quantile(p, d1, d2) == pytest.approx(before, rel=1e-9, abs=0)
        assert scipy_stats.f.ppf(p, d1, d2) == pytest.approx(before, rel=1e-9, abs=0)
    dfs = np.array([4.0, 7.3, 0.0, np.nan, np.inf])
    crit = t_criticals(0.90, dfs)
    assert crit[:2] == pytest.approx([T_BEFORE[0.95, 4.0], T_BEFORE[0.95, 7.3]], rel=1e-9)
    assert np.isnan(crit[2]) and np.isnan(crit[3]) and crit[4] == pytest.approx(scipy_stats.norm.ppf(0.95))


# ----------------------------------------------------------------------------- influential units


def test_one_outlier_step_that_decides_the_verdict_is_named():
    rng = np.random.default_rng(5)
    n = 150
    ca, ta = _seed(rng, n, 0.10)
    cb, tb = _seed(rng, n, 0.115)
    cb[37] = round(tb[37] * 0.95)  # one step with 95 % of its tokens clipped
    full = equivalence_verdict(paired_difference(ca, ta, cb, tb), 0.02)
    without = [np.delete(x, 37) for x in (ca, ta, cb, tb)]
    assert full != EQUIVALENT and equivalence_verdict(paired_difference(*without), 0.02) == EQUIVALENT
    assert 37 in influential_units(ca, ta, cb, tb, tolerance=0.02)


def test_no_unit_is_influential_when_the_verdict_is_clear():
    rng = np.random.default_rng(6)
    ca, ta = _seed(rng, 400, 0.10)
    cb, tb = _seed(rng, 400, 0.20)
    assert equivalence_verdict(paired_difference(ca, ta, cb, tb), 0.02) == DIFFERENT
    assert influential_units(ca, ta, cb, tb, tolerance=0.02) == []


# --------------------------------------------------------------------------------------- lead-lag


def test_a_shifted_curve_is_found_with_its_lag_and_sign():
    rng = np.random.default_rng(7)
    n, shift = 1000, 100
    t = np.arange(-shift, n)
    curve = 0.2 + 0.6 * (1 - np.exp(-3 * np.clip(t, 0, None) / n))
    a = curve[shift:] + rng.normal(0, 0.03, n)
    b = curve[:n] + rng.normal(0, 0.03, n)  # b reaches each level 100 steps later
    lag = lead_lag(a, b)
    assert lag is not None and lag.explained and abs(lag.lag - shift) <= 10 and lag.gain > 0.8
    back = lead_lag(b, a)
    assert back is not None and back.explained and abs(back.lag + shift) <= 10


def test_shifted_msd_matches_brute_force():
    from cliptrack.compare.stats.influence import _shifted_msd

    rng = np.random.default_rng(8)
    a, b = rng.normal(size=60), rng.normal(size=60)
    got = _shifted_msd(a, b, 15)
    for i, k in enumerate(range(-15, 16)):
        pairs = [(b[t], a[t - k]) for t in range(60) if 0 <= t - k < 60]
        assert got[i] == pytest.approx(np.mean([(x - y) ** 2 for x, y in pairs]))


def test_unshifted_or_identical_curves_have_no_lag():
    rng = np.random.default_rng(9)
    a = np.cumsum(rng.normal(size=500)) * 0.01
    assert lead_lag(a, a) is None
    flat = lead_lag(rng.normal(0.5, 0.05, 500), rng.normal(0.5, 0.05, 500))
    assert flat is None or not flat.explained
    assert lead_lag(a[:10], a[:10]) is None
    with pytest.raises(ValueError, match="one value per paired unit"):
        lead_lag(a, a[:-1])


def test_a_heavy_outlier_step_is_named_in_a_long_window_too():
    rng = np.random.default_rng(10)
    n = 6000  # above EXACT_UNITS: only the most extreme units are tried
    ca, ta = _seed(rng, n, 0.10)
    cb, tb = _seed(rng, n, 0.115)
    tb[4321] = 2_000_000.0  # one step with 100x the tokens of the others, 95 % of them clipped
    cb[4321] = 1_900_000.0
    without = [np.delete(x, 4321) for x in (ca, ta, cb, tb)]
    assert equivalence_verdict(paired_difference(*without), 0.02) == EQUIVALENT
    assert equivalence_verdict(paired_difference(ca, ta, cb, tb), 0.02) != EQUIVALENT
    assert 4321 in influential_units(ca, ta, cb, tb, tolerance=0.02)
