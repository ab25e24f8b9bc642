"""The long-memory step of the long-run variance (``cliptrack.compare.stats.memory``).

The model's expectations are checked against a plain dense reference (the ``n x n`` ARFIMA
covariance matrix, the residual maker and the cosine vectors formed explicitly); the estimate of
``d``, its test, its confirmation against an episode and the coverage it buys are checked by
simulation with known truth and fixed seeds.
"""

from __future__ import annotations

import math

import cliptrack.compare.stats.memory as memory
import numpy as np
import pytest
from cliptrack.compare.stats.cosines import cosine_coefficients, trend_basis
from cliptrack.compare.stats.lrv import long_run_variance
from cliptrack.compare.stats.memory import (
    GRID,
    autocorrelations,
    confirm,
    correct,
    excursions,
    indicator_coefficients,
    indicator_model,
    model,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from research import simulation as sim
from tests._compare_fixtures import _ar1


def _dense(n: int, d: float, basis: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """``E[(phi_j' M x)^2]`` for ``j = 1 .. k`` and ``n Var(mean(x))`` from the full matrices."""
    lags = np.abs(np.subtract.outer(np.arange(n), np.arange(n)))
    k_ = np.arange(1, n)
    rho = np.concatenate([[1.0], np.cumprod((k_ - 1 + d) / (k_ - d))])
    gamma = rho[lags]
    resid = np.eye(n) - basis @ basis.T
    t = np.arange(n)
    phi = np.stack([math.sqrt(2.0 / n) * np.cos(math.pi * j * (t + 0.5) / n) for j in range(1, k + 1)], 1)
    mphi = resid @ phi
    return np.einsum("tj,ts,sj->j", mphi, gamma, mphi), float(np.ones(n) @ gamma @ np.ones(n)) / n


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(8, 160),
    degree=st.integers(0, 2),
    g=st.integers(0, GRID.size - 1),
    episode=st.booleans(),
    data=st.data(),
)
def test_model_expectations_match_the_dense_matrices(n, degree, g, episode, data):
    extra = None
    if episode:
        s = data.draw(st.integers(0, n - 2))
        extra = np.zeros((n, 1))
        extra[s : data.draw(st.integers(s + 1, n)), 0] = 1.0
    basis = trend_basis(n, degree, extra)
    k = min(n - 1, 12)
    e, nvar = model(basis, k)
    ref, ref_nvar = _dense(n, float(GRID[g]), basis, k)
    assert e[g] == pytest.approx(ref, rel=1e-9, abs=1e-12)
    assert nvar[g] == pytest.approx(ref_nvar, rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(8, 400), degree=st.integers(0, 2), data=st.data())
def test_the_indicator_model_matches_the_general_one(n, degree, data):
    """``indicator_model`` (cached trend terms, ``Gamma 1`` by cumulative sums) against ``model`` on
    the orthonormalised basis with the indicator, including indicators inside the trend's span."""
    s = data.draw(st.integers(0, n - 1))
    t = data.draw(st.integers(s + 1, n))
    k = data.draw(st.integers(1, n - 1))
    extra = np.zeros((n, 1))
    extra[s:t, 0] = 1.0
    e, nvar = model(trend_basis(n, degree, extra), k)
    fast, fast_nvar = indicator_model(n, degree, s, t, k)
    assert fast == pytest.approx(e, rel=1e-9, abs=1e-12)
    assert fast_nvar == pytest.approx(nvar, rel=1e-12)


@settings(max_examples=50, deadline=None)
@given(n=st.integers(2, 3000), data=st.data())
def test_an_indicator_s_cosine_coefficients_in_closed_form_match_the_transform(n, data):
    s = data.draw(st.integers(0, n - 1))
    t = data.draw(st.integers(s + 1, n))
    k = data.draw(st.integers(1, n - 1)) if n > 1 else 1
    x = np.zeros(n)
    x[s:t] = 1.0
    assert indicator_coefficients(n, s, t, k) == pytest.approx(cosine_coefficients(x, k), abs=1e-9)


def test_white_noise_gives_the_plain_estimate_exactly():
    """At ``d = 0`` the model is white noise: the factor is 1 and nothing is corrected."""
    e, nvar = model(trend_basis(200, 2), 20)
    assert nvar[0] == pytest.approx(1.0) and np.all(e[0] <= 1.0 + 1e-12)
    assert np.all(np.diff(nvar) > 0)  # more memory, more variance of the mean
    assert autocorrelations(5, 0.0).tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_the_test_runs_only_where_enough_cosines_tell_memory_from_chance():
    """``memory_tested``: whether ``se(d_hat) <= SE_MAX``: not over 300 units (17 cosines), over
    1,000 (40); a trend's terms and strong persistence (fewer cosines) take more units."""
    rng = np.random.default_rng(0)
    slope = np.linspace(0.0, 4.0, 600) ** 2

    def tested(z):
        return bool(long_run_variance(z).memory_tested[0])

    assert not tested(rng.standard_normal(300)) and tested(rng.standard_normal(1000))
    assert tested(rng.standard_normal(600)) and not tested(rng.standard_normal(600) + slope)
    assert not tested(_ar1(rng, 1000, 0.97, 1.0))


def test_the_memory_parameter_is_recovered_and_short_memory_is_rarely_flagged():
    rng = np.random.default_rng(7)
    n, k = 4000, 100
    long = sim.arfima(rng, 60, n, 0.35, sd=1.0)
    white = rng.normal(size=(60, n))
    fits = {}
    for name, x in (("long", long), ("white", white)):
        fits[name] = correct(cosine_coefficients(x - x.mean(axis=1, keepdims=True), k), n, 0, k)
    assert abs(float(np.median(fits["long"].d)) - 0.35) < 0.07
    assert fits["long"].found.mean() > 0.9 and np.all(fits["long"].point[fits["long"].found] > 1)
    white = fits["white"]
    assert white.found.mean() < 0.3  # reported: a one-sided test at about 16 %
    assert 0.3 < white.applied.mean() < 0.7  # corrected wherever d_hat > 0: about half
    assert np.all(white.applied[white.found]) and np.all(white.d[white.applied] > 0)
    assert np.all(white.point[~white.found] == 1.0) and np.all(white.interval[~white.applied] == 1.0)
    assert np.all(white.interval[white.applied] > white.point[white.applied])  # d_hat + WIDEN se


def test_an_episode_is_found_where_it_is_and_removing_it_takes_the_memory_away(monkeypatch):
    """White noise with a level shift of 1.5 sd during 5 % of the window: its low cosines rise as
    long memory's do; without its excursion they do not, so the correction stays small."""
    rng = np.random.default_rng(3)
    n, reps, k = 1000, 40, 40
    z = rng.normal(0.0, 1.0, (reps, n))
    starts = rng.integers(0, n - 60, reps)
    for i, s in enumerate(starts):
        z[i, s : s + 50] += 1.5
    e = z - z.mean(axis=1, keepdims=True)
    lo, hi = excursions(e)
    miss = np.concatenate([np.abs(lo - starts), np.abs(hi - (starts + 50))])
    assert np.median(miss) <= 3 and miss.max() <= 15
    coef = cosine_coefficients(e, k)
    whole = correct(coef, n, 0, k)
    plausible, d_without, se_without = confirm(e, 0, k)  # d_hat + se without the excursion
    se = float(whole.se[0])
    assert np.median(whole.d) >= 0.2 and np.median(plausible - se) <= 0.05
    assert np.allclose(plausible, d_without + se_without) and np.allclose(se_without, se, rtol=0.05)
    with_step = long_run_variance(z)
    monkeypatch.setattr(memory, "APPLY_GATE", math.inf)
    without = long_run_variance(z)
    assert np.median(with_step.ess) >= 0.5 * np.median(without.ess)


def _size_at_margin(d: float, n: int, reps: int, seed: int) -> tuple[float, float]:
    rng = np.random.default_rng([seed, int(d * 1000), n])
    a = sim.counts(rng, sim.MEAN + sim.wobble(rng, reps, n, d=d))
    b = sim.counts(rng, sim.MEAN + sim.TOLERANCE + sim.wobble(rng, reps, n, d=d))
    diff = sim.intervals("ewc", [*a, *b])
    return float(np.mean(diff.equivalent(n))), float(np.mean(diff.covers(sim.TOLERANCE)))


@pytest.mark.parametrize("d", [0.2, 0.4])
def test_long_memory_no_longer_passes_as_equivalent(monkeypatch, d):
    """ARFIMA d = 0.2 / 0.4, 1,000 steps, a true difference at the margin: called equivalent in at
    most 5 % plus 2 Monte-Carlo sd over 300 replicates, with the 90 % interval covering at least
    85 %. Two controls that show the test can fail: the correction behind a significance pre-test
    (the previous rule: applied only where ``d_hat > se``, at ``d_hat + se``) passes more as
    equivalent and covers less; with the step off, twice as many pass and over 10 %."""
    size, coverage = _size_at_margin(d, 1000, 300, 5)
    assert size <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 300) and coverage >= 0.85
    with monkeypatch.context() as m:
        m.setattr(memory, "APPLY_GATE", memory.GATE)
        m.setattr(memory, "WIDEN", 1.0)
        pre, pre_coverage = _size_at_margin(d, 1000, 300, 5)
    assert pre > size and pre_coverage < coverage
    monkeypatch.setattr(memory, "APPLY_GATE", math.inf)
    off, off_coverage = _size_at_margin(d, 1000, 300, 5)
    assert off > 2 * size and off > 0.1 and off_coverage < coverage


def test_a_comparison_of_long_memory_runs_says_so_in_its_reason_and_json():
    """Two runs whose clip probability wanders as ARFIMA d = 0.45 noise over 1,200 steps: the
    difference's estimate carries the memory found, its JSON names it, and a gated verdict's reason
    names long memory with the d found (not the batch check's wording)."""
    from cliptrack.compare import RunSet, compare
    from cliptrack.compare.report import as_dict
    from cliptrack.core import keys
    from cliptrack.store.frame import LoadedRun, Point
    from cliptrack.store.records import RunInfo

    rng = np.random.default_rng(21)
    n = 1200
    runs = []
    for name in ("megatron-run", "miles-run"):
        p = np.clip(0.10 + sim.arfima(rng, 1, n, 0.45, sd=0.03)[0], 0.001, 0.999)
        tokens = rng.integers(5_000, 50_000, n)
        clipped = rng.binomial(tokens, p)
        points = [
            Point(s, 1.0e9 + s, {keys.LOSS_TOKENS: float(t), keys.CLIPPED_TOKENS: float(c)})
            for s, (t, c) in enumerate(zip(tokens, clipped, strict=True))
        ]
        runs.append((LoadedRun(RunInfo(name, name, name.split("-")[0]), "test"), points))
    result = compare(RunSet.from_points(runs))
    d = result.difference("clip_fraction")
    assert d.estimate.long_memory and d.estimate.memory >= 0.2
    out = as_dict(result)
    [entry] = [x for x in out["differences"] if x["metric"] == "clip_fraction"]
    assert entry["difference"]["long_memory"] is True and entry["difference"]["memory_d"] == d.estimate.memory
    assert not d.estimate.enough_data and d.verdict == "insufficient data"  # d = 0.45: a few effective units
    reason = d.estimate.insufficiency()
    assert f"memory parameter d = {d.estimate.memory:.2f}" in reason and "batch means" not in reason
