"""Stacks judged on seeds: the run-level simulation's claims at a fixed seed (coverage, false
"different" and "equivalent", power, P(b > a), seeds needed), the new math against plain references,
segments across seeds, ``group_by``, and real demo-trainer runs (slow)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cliptrack.compare import RunSet, compare
from cliptrack.compare.groups import groups_by
from cliptrack.compare.stats import DIFFERENT, EQUIVALENT
from cliptrack.compare.stats.estimate import probability_greater
from cliptrack.compare.stats.seeds import (
    group_difference,
    seeds_needed,
    segment_verdict,
    stack_verdict,
    steps_factor,
)
from cliptrack.store.frame import LoadedRun, Point
from cliptrack.store.records import RunInfo
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as scipy_stats

from research import simulation as sim
from tests._compare_fixtures import run_from_curves

REPS = 200
MC = 3 * math.sqrt(0.9 * 0.1 / REPS)
"""Three Monte-Carlo standard errors of a 90 % coverage at ``REPS`` replicates (6.4 pp)."""
SIZE = 0.05 + 2.33 * math.sqrt(0.05 * 0.95 / REPS)
"""Nominal 5 % plus its one-sided 99 % Monte-Carlo allowance at ``REPS`` replicates (8.6 %)."""


# ------------------------------------------------------------------------------- simulation


@pytest.mark.parametrize("seeds", sim.RUN_SEEDS)
@pytest.mark.parametrize("spread", (0.5, 3.0))
def test_group_intervals_cover_at_2_to_5_seeds_and_the_margin_errs_at_most_5_percent(seeds, spread):
    none = sim.run_level(seeds, spread, 0.0, REPS, seed=1)
    at_margin = sim.run_level(seeds, spread, 1.0, REPS, seed=1)
    for row in (none, at_margin):
        assert abs(row.coverage - 0.90) <= MC, row
    assert none.different == 0.0, none
    assert at_margin.different <= SIZE and at_margin.equivalent <= SIZE, at_margin
    assert none.p_above <= SIZE, none  # P(b > a) > 95 % at no difference: a 5 % error
    # the seed spread really is the stated multiple of the within-run spread (the case is what it says)
    assert 0.5 <= none.within / (sim.SD * math.sqrt(3 / sim.RUN_STEPS) / sim.MEAN) <= 1.5


def test_power_grows_with_seeds_and_a_large_difference_is_called_different():
    two, five = sim.run_level(2, 3.0, 2.0, REPS, seed=2), sim.run_level(5, 3.0, 2.0, REPS, seed=2)
    assert five.different >= 0.8 and five.different > two.different + 0.4, (two, five)
    assert sim.run_level(5, 1.0, 0.0, REPS, seed=2).equivalent >= 0.95  # power at no difference


@pytest.mark.parametrize("spread", (1.0, 3.0))
def test_the_seeds_the_tool_asks_for_reach_their_power(spread):
    m, rate = sim.seeds_needed_check(spread, REPS, seed=3)
    assert m >= 3 and rate >= 0.8 - 2.33 * math.sqrt(0.16 / REPS), (m, rate)


# --------------------------------------------------------------------------- math vs references


@settings(max_examples=40, deadline=None)
@given(value=st.floats(-5, 5), se=st.floats(1e-3, 3), df=st.floats(1.0, 200.0))
def test_probability_greater_is_the_t_distribution_function(value, se, df):
    assert probability_greater(value, se, df) == pytest.approx(scipy_stats.t.cdf(value / se, df), abs=1e-9)
    assert probability_greater(value, se, df) + probability_greater(-value, se, df) == pytest.approx(1.0)


def test_probability_greater_at_the_edges():
    assert probability_greater(0.1, 0.0, 3.0) == 1.0 and probability_greater(-0.1, 0.0, 3.0) == 0.0
    assert math.isnan(probability_greater(float("nan"), 1.0, 3.0))
    rng = np.random.default_rng(0)
    runs = [(rng.integers(90, 110, 5).astype(float), np.full(5, 1000.0)) for _ in range(4)]
    g = group_difference(runs[:2], runs[2:])
    assert g.probability_greater == pytest.approx(scipy_stats.t.cdf(g.value / g.se, g.df))
    half = (g.high - g.low) / 2
    assert half == pytest.approx(scipy_stats.t.ppf(0.95, g.df) * g.se)


@settings(max_examples=40, deadline=None)
@given(
    between=st.floats(0.0, 0.05),
    within=st.floats(1e-4, 0.05),
    margin=st.floats(0.005, 0.1),
    seeds=st.integers(2, 8),
)
def test_steps_factor_is_the_least_factor_meeting_the_power_rule(between, within, margin, seeds):
    def ok(v: float) -> bool:
        return margin / math.sqrt(2 * v / seeds) >= scipy_stats.t.ppf(0.95, seeds - 1) + scipy_stats.t.ppf(
            0.9, 2 * seeds - 2
        )

    f = steps_factor(between, within, margin, seeds)
    if f is None:
        assert not ok(between**2 + 1e-12 * within**2)  # even steps without end cannot
    elif f == 1.0:
        assert ok(between**2 + within**2)
    else:
        assert ok(between**2 + within**2 / f * (1 - 1e-9)) and not ok(between**2 + within**2 / f * 1.01)


def test_segment_verdicts_need_the_bonferroni_level_to_differ_and_only_a_differing_segment_overrides_the_window():
    rng = np.random.default_rng(4)
    a = [(rng.binomial(1000, 0.10, 50).astype(float), np.full(50, 1000.0)) for _ in range(3)]
    b = [(rng.binomial(1000, 0.13, 50).astype(float), np.full(50, 1000.0)) for _ in range(3)]
    g = group_difference(a, b)
    tol = g.low - 0.1 * (g.high - g.low)  # the plain interval lies just beyond the margin
    assert segment_verdict(g, tol, 1) == DIFFERENT and segment_verdict(g, tol, 8) != DIFFERENT
    assert stack_verdict(EQUIVALENT, [EQUIVALENT, EQUIVALENT]) == EQUIVALENT
    assert stack_verdict(EQUIVALENT, [EQUIVALENT, "inconclusive", "insufficient data"]) == EQUIVALENT
    assert stack_verdict(EQUIVALENT, [DIFFERENT, EQUIVALENT]) == DIFFERENT
    assert stack_verdict("inconclusive", [EQUIVALENT, EQUIVALENT]) == "inconclusive"
    assert stack_verdict("insufficient data", [DIFFERENT]) == "insufficient data"
    assert seeds_needed(0.0, 0.0, 0.1) == 2


# ------------------------------------------------------------------------ the engine, segments


def _runset(runs, recipe: dict[str, str] | None = None) -> RunSet:
    return RunSet.from_points(
        (
            LoadedRun(
                RunInfo(r.run_id, r.run_name, r.backend, config={"recipe": (recipe or {}).get(r.run_id, "")}),
                "test",
            ),
            r.points,
        )
        for r in runs
    )


def _stacks(n: int, early: float = 0.0, early_steps: int = 0):
    """3 megatron and 3 miles seeds of ``n`` steps at clip fraction 0.10 (seed sd 3 %); miles adds
    ``early`` (absolute) over its first ``early_steps`` steps."""
    runs = []
    for stack, first in (("megatron", 100), ("miles", 200)):
        for i in range(3):
            rng = np.random.default_rng(first + i)
            p = 0.10 * math.exp(rng.normal(0, 0.03)) * np.exp(0.1 * rng.standard_normal(n))
            if stack == "miles":
                p[:early_steps] += early
            runs.append(
                run_from_curves(
                    f"{stack}-s{i}", stack, seed=first + 10 + i, clip_p=p, loss_tokens=np.full(n, 3000)
                )
            )
    return runs


def test_equal_stacks_over_a_long_window_agree_on_the_window_with_no_segment_shown_to_differ():
    result = compare(_runset(_stacks(1000)), group_by="stack")
    d = result.group_difference("clip_fraction")
    assert result.groups == {
        "megatron": [f"megatron-s{i}" for i in range(3)],
        "miles": [f"miles-s{i}" for i in range(3)],
    }
    assert d.verdict == EQUIVALENT and len(d.segments) == 4 and not d.differing
    assert 0 < d.probability_greater < 1
    head = result.summary().splitlines()[0]
    assert head.startswith(
        "Equally on-policy: these stacks (miles and megatron, 3 and 3 seeds) agree on the window average "
        "over seeds"
    )
    assert "no segment across seeds shown to differ" in head
    assert "4 segments across seeds" in result.summary()


def test_an_early_phase_is_not_averaged_away_by_a_grouped_comparison():
    """+5 pp over the first 250 of 1,000 steps in every miles seed: +1.25 pp over the window (within
    ±25 % of 10 %), but the first segment across seeds is not within the margin."""
    result = compare(_runset(_stacks(1000, early=0.05, early_steps=250)), group_by="stack")
    d = result.group_difference("clip_fraction")
    assert d.average_verdict == EQUIVALENT and d.verdict != EQUIVALENT, result.summary()
    assert d.differing and d.differing[0].start == 0 and d.differing[0].end == 249
    head = result.summary().splitlines()[0]
    assert "agree" not in head and "these stacks" in head and "steps 0-249" in head


def test_a_short_window_says_the_window_average_over_seeds_only():
    result = compare(_runset(_stacks(300)), group_by="stack")
    d = result.group_difference("clip_fraction")
    assert d.verdict == EQUIVALENT and d.segments == ()
    head = result.summary().splitlines()[0]
    assert "throughout" not in head and "agree on the window average over seeds" in head
    assert "too short to test segments of it across seeds" in d.reason


def test_group_by_a_run_parameter_and_its_errors():
    runs = _stacks(300)
    recipe = {r.run_id: ("a" if i % 2 else "b") for i, r in enumerate(runs)}
    rs = _runset(runs, recipe)
    assert groups_by(rs, "recipe") == {
        "b": ["megatron-s0", "megatron-s2", "miles-s1"],
        "a": ["megatron-s1", "miles-s0", "miles-s2"],
    }
    assert compare(rs, group_by="recipe").groups == groups_by(rs, "recipe")
    with pytest.raises(ValueError, match="have no 'seed_recipe'"):
        compare(rs, group_by="seed_recipe")
    with pytest.raises(ValueError, match="form 1 group"):
        groups_by(rs, "stack", ["megatron-s0", "megatron-s1"])
    with pytest.raises(ValueError, match="not both"):
        compare(rs, groups={"x": ["megatron-s0", "megatron-s1"]}, group_by="stack")


def test_an_inconclusive_group_row_says_how_many_more_seeds_or_steps_would_settle_it():
    runs = []
    for stack, first in (("megatron", 300), ("miles", 400)):
        for i in range(2):
            rng = np.random.default_rng(first + i)
            p = np.full(120, 0.10 * math.exp(rng.normal(0, 0.15)))
            runs.append(
                run_from_curves(
                    f"{stack}-s{i}", stack, seed=first + 10 + i, clip_p=p, loss_tokens=np.full(120, 800)
                )
            )
    result = compare(_runset(runs), group_by="stack")
    d = result.group_difference("clip_fraction")
    assert d.verdict == "inconclusive" and d.seeds_needed is not None and d.seeds_needed > 2, result.summary()
    assert (
        f"{d.seeds_needed - 2} more seeds per stack ({d.seeds_needed} in all) would settle ±25%"
        in result.summary()
    )


# -------------------------------------------------------------------------- real demo runs


@pytest.fixture(scope="module")
def demo_runs() -> RunSet:
    """Two seeds per recipe of the demo trainer (30 steps, Megatron path): staleness 0 and 2."""
    from cliptrack.adapters.demo.train import RunConfig, train

    items = []
    for staleness in (0, 2):
        for seed in (0, 1):
            config = RunConfig(path="megatron", steps=30, staleness=staleness, seed=seed)
            metrics = [out.output.metrics for out in train(config)]
            points = [Point(step, 1000.0 + step, dict(m)) for step, m in enumerate(metrics)]
            info = RunInfo(
                f"s{staleness}-{seed}",
                f"stale{staleness}-seed{seed}",
                "megatron",
                config={"recipe": f"stale{staleness}"},
            )
            items.append((LoadedRun(info, "test"), points))
    return RunSet.from_points(items)


@pytest.mark.slow  # trains four short demo runs
def test_demo_runs_grouped_by_recipe_find_the_staleness_the_seed_means_show(demo_runs):
    result = compare(demo_runs, group_by="recipe")
    d = result.group_difference("clip_fraction")
    means = {
        g: np.mean([result.run_estimate("clip_fraction", run).estimate.value for run in members])
        for g, members in result.groups.items()
    }
    assert means["stale2"] > means["stale0"]
    assert d.verdict in (DIFFERENT, "inconclusive") and d.probability_greater > 0.5, result.summary()
    assert "these stacks" in result.summary().splitlines()[0]


def _six_by_six(n: int, seed_sd: float, tokens: int, wobble: float = 0.0):
    """6 megatron and 6 miles seeds of one recipe: clip fraction 0.02 times a seed's level
    (``exp(N(0, seed_sd))``) times a slow wobble of its own (AR(1), coefficient 0.995, marginal sd
    ``wobble`` on the log scale: it averages out over the window more than over a segment), Binomial
    noise of ``tokens`` tokens a step."""
    runs = []
    for stack, first in (("megatron", 500), ("miles", 600)):
        for i in range(6):
            rng = np.random.default_rng(first + i)
            x = np.zeros(n)
            for t in range(1, n):
                x[t] = 0.995 * x[t - 1] + rng.normal(0, wobble * math.sqrt(1 - 0.995**2))
            p = 0.02 * math.exp(rng.normal(0, seed_sd)) * np.exp(x)
            runs.append(
                run_from_curves(
                    f"{stack}-s{i}", stack, seed=first + 10 + i, clip_p=p, loss_tokens=np.full(n, tokens)
                )
            )
    return runs


def test_an_untestable_segment_no_longer_blocks_an_equivalent_window():
    """Same recipe, 6 vs 6 seeds: the window average over seeds is shown within ±25 % while a segment
    of a quarter of the window (a quarter of the tokens) is not; the stack verdict is the window's."""
    result = compare(_runset(_six_by_six(1000, 0.03, 150, wobble=0.2)), group_by="stack")
    d = result.group_difference("clip_fraction")
    assert d.average_verdict == EQUIVALENT and len(d.segments) == 4, result.summary()
    assert any(s.verdict != EQUIVALENT for s in d.segments), [s.verdict for s in d.segments]
    assert d.verdict == EQUIVALENT and not d.differing
    assert "agree on the window average over seeds" in result.summary().splitlines()[0]


def test_seeds_needed_plans_with_the_seeds_observed_spread():
    """A run's own long-run standard error can exceed the seeds' whole spread (few tokens a step): the
    seeds needed are those the observed spread asks for, not the larger per-run error's."""
    from cliptrack.compare.groups import _between_sd

    runs = _six_by_six(200, 0.0, 40)[:3] + _six_by_six(200, 0.0, 40)[6:9]
    result = compare(_runset(runs), group_by="stack")
    d = result.group_difference("clip_fraction")
    within = [result.run_estimate("clip_fraction", run).estimate for g in result.groups.values() for run in g]
    assert d.seeds_needed is not None, result.summary()
    scale = d.scale
    spread = _between_sd(d.estimate, within, scale)
    assert spread is not None
    assert d.seeds_needed == seeds_needed(spread, 0.0, d.tolerance)
    per_run = float(np.sqrt(np.mean([e.lrv / e.n_units for e in within]))) / (
        float(np.mean([e.value for e in within])) if scale == "log-ratio" else 1.0
    )
    assert per_run > spread  # the case the old planning got wrong
    assert d.seeds_needed < seeds_needed(0.0, per_run, d.tolerance)
