"""``compare`` on runs with known truth: the registry, verdicts throughout the window, lags,
influential steps, weighting, alignment, bad data, seed groups and mirroring.

Runs are built from given per-step curves with integer counts (``run_from_curves``); expected
values are plain sums over the points written, never the code under test. Seeds are fixed.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from cliptrack.backends import load_runs
from cliptrack.compare import RunSet, compare, report
from cliptrack.compare import quantities as qs
from cliptrack.compare import reasons as r
from cliptrack.compare.notes import steps_text
from cliptrack.compare.stats import DIFFERENT, EQUIVALENT, INCONCLUSIVE, INSUFFICIENT
from cliptrack.core import keys
from cliptrack.store.frame import LoadedRun, Point
from cliptrack.store.records import RunInfo

from tests._compare_fixtures import _ar1, megatron_vs_miles, run_from_curves, write_jsonl

KL = "kl_k3:sum"


def runset_of(*runs) -> RunSet:
    return RunSet.from_points(
        (LoadedRun(RunInfo(r.run_id, r.run_name, r.backend), "test"), r.points) for r in runs
    )


def noisy(seed: int, n: int, level: float = 0.10, sd: float = 0.02, phi: float = 0.5) -> np.ndarray:
    return level + _ar1(np.random.default_rng(seed), n, phi, sd)


# ------------------------------------------------------------------------------------ registry


def test_the_mismatch_kl_is_one_entry_and_joins_the_on_policy_answer():
    entry = qs.quantity("kl_k3")
    assert entry.on_policy and entry.optional and entry.margin == qs.KL_MARGIN == 0.25
    assert entry.scale == qs.AUTO and entry.abs_margin == qs.KL_FLOOR and entry.bounds == qs.NONNEGATIVE
    assert entry.estimand == qs.Estimand(KL, keys.LOSS_TOKENS)
    n = 400
    tokens = np.full(n, 3000)
    kl_a = tokens * 0.001  # 0.001 nats per token
    kl_b = tokens * (0.001 + 0.01 * (np.arange(n) >= 0))  # 11 times as much: far beyond ±25 %
    a = run_from_curves("a", "megatron", seed=1, clip_p=noisy(1, n), loss_tokens=tokens, extra={KL: kl_a})
    b = run_from_curves("b", "miles", seed=2, clip_p=noisy(2, n), loss_tokens=tokens, extra={KL: kl_b})
    result = compare(runset_of(a, b))
    assert result.on_policy == ["clip_fraction", "kl_k3"]
    assert result.difference("clip_fraction").verdict == EQUIVALENT
    kl = result.difference("kl_k3")
    assert kl.estimate.value == pytest.approx(math.log(kl_b.sum() / kl_a.sum()))
    assert kl.verdict == DIFFERENT and result.on_policy_verdict == DIFFERENT
    assert (
        result.summary().startswith("Not equally on-policy")
        and "mismatch KL (k3) beyond ±25%" in result.summary()
    )
    assert "kl_k3" in result.formatted_table()["metric"].tolist()
    data = json.loads(result.to_json())
    assert data["on_policy"] == ["clip_fraction", "kl_k3"]
    assert {"metric": "kl_k3", "on_policy": True}.items() <= next(
        q for q in data["quantities"] if q["metric"] == "kl_k3"
    ).items()


@pytest.mark.parametrize("cause", ["engine", "drift"])
def test_the_why_line_names_the_part_of_the_mismatch_kl_that_differs(cause):
    """Two runs whose mismatch KL differs tenfold through one part only (the other equal): the
    parts are compared for diagnosis (no verdict of their own) and the headline's "Why:" line
    names the part that carries the gap; without the parts there is no such line."""
    n = 400
    tokens = np.full(n, 3000)
    low, high = (
        tokens * 0.001 * noisy(3, n, level=1.0, sd=0.05),
        tokens * 0.01 * noisy(4, n, level=1.0, sd=0.05),
    )
    same = tokens * 0.0005 * noisy(5, n, level=1.0, sd=0.05)
    parts_a = {
        keys.ENGINE_KL_K3_SUM: same if cause == "drift" else low,
        keys.DRIFT_KL_K3_SUM: low if cause == "drift" else same,
    }
    parts_b = {
        keys.ENGINE_KL_K3_SUM: same if cause == "drift" else high,
        keys.DRIFT_KL_K3_SUM: high if cause == "drift" else same,
    }
    runs = []
    for name, parts, seed in (("a", parts_a, 1), ("b", parts_b, 2)):
        kl = parts[keys.ENGINE_KL_K3_SUM] + parts[keys.DRIFT_KL_K3_SUM]  # any total: k3 does not add
        runs.append(
            run_from_curves(
                name, name, seed=seed, clip_p=noisy(seed, n), loss_tokens=tokens, extra={KL: kl, **parts}
            )
        )
    result = compare(runset_of(*runs))
    assert result.difference("kl_k3").verdict == DIFFERENT
    own, other = (f"{cause}_kl_k3", "drift_kl_k3" if cause == "engine" else "engine_kl_k3")
    assert result.difference(own).verdict == DIFFERENT and result.difference(other).verdict == EQUIVALENT
    assert own not in result.on_policy  # diagnosis: the parts never add a verdict of their own
    lines = result.headline_lines()
    why = lines[-1]
    assert why.startswith("Why: of the mismatch KL, ") and f"the {cause} part differs (b " in why
    assert why.endswith(
        f"The gap is in the {cause} part: {dict((c[1], c[2]) for c in report.CAUSES)[cause]}."
    )
    assert json.loads(result.to_json())["why"] == why
    plain = [
        run_from_curves(r.run_id, r.backend, seed=i + 1, clip_p=noisy(i + 1, n), loss_tokens=tokens)
        for i, r in enumerate(runs)
    ]
    assert not any(line.startswith("Why:") for line in compare(runset_of(*plain)).headline_lines())


def test_an_optional_on_policy_quantity_not_logged_is_left_out_of_the_answer():
    megatron, miles = megatron_vs_miles()
    result = compare(runset_of(megatron, miles))
    assert result.on_policy == ["clip_fraction"]
    assert result.on_policy_verdict == EQUIVALENT
    assert not any(n.warning for n in result.notes if n.metric == "kl_k3")


def test_margins_by_name_and_bad_margins():
    megatron, miles = megatron_vs_miles(miles_clip_p=0.16)
    rs = runset_of(megatron, miles)
    result = compare(rs, margins={"clip_fraction": qs.absolute(0.1)})
    q = result.quantity("clip_fraction")
    assert q.margin == 0.1 and q.scale == qs.ABSOLUTE
    assert result.quantity("clip_low_fraction").margin == 0.1  # margin_of
    assert result.difference("clip_fraction").scale == qs.ABSOLUTE
    assert result.on_policy_verdict == EQUIVALENT
    wide = compare(rs, margins={"clip_fraction": qs.relative(0.8, floor=0.001)})
    q = wide.quantity("clip_fraction")
    assert (q.scale, q.margin, q.abs_margin) == (qs.AUTO, 0.8, 0.001)
    assert wide.difference("clip_fraction").tolerance == pytest.approx(math.log(1.8))
    assert wide.on_policy_verdict == EQUIVALENT  # 16 % against 10 %: within ±80 %
    assert compare(rs).on_policy_verdict == DIFFERENT  # and beyond the default ±25 %
    assert compare(rs, margins={"clip_fraction": 0.1}).quantity("clip_fraction").scale == qs.ABSOLUTE
    plain = compare(rs, margins={"clip_fraction": 0.1, "throughput": 0.1})  # plain numbers: absolute
    assert (
        plain.quantity("clip_fraction").scale == qs.ABSOLUTE and plain.quantity("clip_fraction").margin == 0.1
    )
    assert plain.quantity("throughput").scale == qs.ABSOLUTE and plain.quantity("throughput").margin == 0.1
    with pytest.raises(TypeError, match="tolerances"):
        compare(rs, tolerances={"clip_fraction": 0.1})  # type: ignore[call-arg]  # removed: margins=
    with pytest.raises(ValueError, match="has no floor"):
        qs.Margin(0.01, False, 0.001)
    with pytest.raises(ValueError, match="unknown quantities"):
        compare(rs, margins={"kl": qs.relative(0.25)})


def test_compare_is_pure_and_repeats_exactly():
    megatron, miles = megatron_vs_miles(miles_clip_p=0.13, miles_missing=(5, 6, 7))
    rs = runset_of(megatron, miles)
    first, second = compare(rs), compare(rs)
    assert first.to_json() == second.to_json()
    pairing = [n for n in first.notes if "in only one run" in n.text]
    assert len(pairing) == 1  # one note for the pair, naming every quantity with that count
    assert "clip_fraction, clip_low_fraction, clip_high_fraction, reward, throughput" in pairing[0].text


# ------------------------------------------------------------------------- throughout the window


def _episode_pair(seed: int, n: int = 1000):
    """Equal runs except +10 pp clipping in b during steps 430-479 (5 % of the steps)."""
    rng = np.random.default_rng(seed)
    a, b = 0.10 + _ar1(rng, n, 0.5, 0.02), 0.10 + _ar1(rng, n, 0.5, 0.02)
    b[430:480] += 0.10
    ta, tb = rng.integers(5000, 50000, n), rng.integers(5000, 50000, n)
    return (
        run_from_curves("megatron-run", "megatron", seed=1 + seed, clip_p=a, loss_tokens=ta),
        run_from_curves("miles-run", "miles", seed=200 + seed, clip_p=b, loss_tokens=tb),
    )


@pytest.mark.parametrize("seed", [1, 3])
def test_an_episode_of_one_pair_is_named_in_a_note_not_made_a_verdict(seed):
    """One pair's episode (run b clips more during steps 420-490 only) is named by its steps and size
    in a note; the verdict is the whole window's (issue #27: a spike in one run is no difference of
    the runs, and more steps never make the answer worse)."""
    result = compare(runset_of(*_episode_pair(seed)))
    d = result.difference("clip_fraction")
    assert d.verdict == d.average_verdict != DIFFERENT, d.reason
    assert abs(d.estimate.value) < math.log(1.25)  # the average is within
    [episode] = [s for s in d.differing if s.verdict == DIFFERENT]
    assert 420 <= episode.start and episode.end <= 490 and episode.episode
    span = f"steps {episode.start:g}-{episode.end:g}"
    [stretch] = [n for n in result.notes if isinstance(n.reason, r.Stretches)]
    assert span in stretch.text and "×" in stretch.text and "not a verdict" in stretch.text
    assert stretch.warning and span in result.summary()
    assert "Not equally on-policy" not in result.summary().splitlines()[0]
    assert span in result.formatted_table().loc[0, "segments"]
    segments = result.to_dict()["differences"][0]["segments"]
    assert segments[0]["start"] == 0 and segments[-1]["end"] == 999


def test_equal_stationary_runs_are_equivalent_throughout():
    n = 1000
    result = compare(
        runset_of(
            run_from_curves("a", "megatron", seed=1, clip_p=noisy(1, n)),
            run_from_curves("b", "miles", seed=2, clip_p=noisy(2, n)),
        )
    )
    d = result.difference("clip_fraction")
    assert d.verdict == EQUIVALENT and d.average_verdict == EQUIVALENT
    assert len(d.segments) >= 2 and all(s.verdict == EQUIVALENT for s in d.segments) and not d.differing
    assert d.segments[0].start == 0 and d.segments[-1].end == n - 1
    assert result.summary().startswith("Equally on-policy")


@pytest.mark.parametrize("n", [300, 1000])
def test_an_equivalent_too_short_for_the_long_memory_test_says_it_assumes_short_memory(n):
    result = compare(
        runset_of(
            run_from_curves("a", "megatron", seed=1, clip_p=noisy(1, n, sd=0.005, phi=0.0)),
            run_from_curves("b", "miles", seed=2, clip_p=noisy(2, n, sd=0.005, phi=0.0)),
        )
    )
    d = result.difference("clip_fraction")
    assert d.verdict == EQUIVALENT
    assert d.estimate.memory_tested == (n == 1000)
    notes = [x for x in result.notes if x.metric == "clip_fraction" and "long memory" in x.text]
    if n == 300:
        [note] = notes
        assert "300 paired units" in note.text and "assumes short memory" in note.text and not note.warning
        assert len(d.segments) == 1 and "; 1 segment against" in result.summary()
    else:
        assert not notes
    clip = next(x for x in json.loads(result.to_json())["differences"] if x["metric"] == "clip_fraction")
    assert clip["difference"]["memory_tested"] == (n == 1000)


def test_a_lagging_reward_curve_is_reported_as_a_lag_in_steps():
    n = 1000
    x = np.arange(n)
    rng = np.random.default_rng(0)
    ra = 0.2 + 0.6 / (1 + np.exp(-(x - 400) / 80.0)) + rng.normal(0, 0.02, n)
    rb = 0.2 + 0.6 / (1 + np.exp(-(x - 500) / 80.0)) + rng.normal(0, 0.02, n)  # 100 steps behind
    result = compare(
        runset_of(
            run_from_curves("a", "megatron", seed=1, clip_p=noisy(1, n), reward=ra),
            run_from_curves("b", "miles", seed=2, clip_p=noisy(2, n), reward=rb),
        )
    )
    lead = result.difference("reward").lead
    assert lead is not None and lead.explained and 80 <= lead.lag <= 120
    [note] = [n for n in result.notes if "lags" in n.text]
    assert f"b's reward curve lags a's by {lead.shift:g} steps" in note.text


def test_a_single_outlier_step_that_decides_the_verdict_is_named():
    n = 200
    rng = np.random.default_rng(3)
    a = 0.10 + rng.normal(0, 0.003, n)
    b = a + 0.012  # +1.2 pp: equivalent within an absolute ±2 pp
    b[120] = 0.95  # one step at 95 %
    tokens = np.full(n, 4000)
    ra = run_from_curves("a", "megatron", seed=1, clip_p=a, loss_tokens=tokens)
    rb = run_from_curves("b", "miles", seed=2, clip_p=b, loss_tokens=tokens)
    margins = {"clip_fraction": qs.absolute(0.02)}
    d = compare(runset_of(ra, rb), margins=margins).difference("clip_fraction")
    rb_without = replace(rb, points=[p for p in rb.points if p.step != 120])
    without = compare(runset_of(ra, rb_without), margins=margins).difference("clip_fraction")
    assert without.average_verdict != d.average_verdict  # the step decides it
    assert 120.0 in d.influential
    notes = [
        n.text for n in compare(runset_of(ra, rb), margins=margins).notes if "rests on single units" in n.text
    ]
    assert notes and "step 120" in notes[0]


def test_token_and_step_weighted_estimates_side_by_side_with_a_note_when_they_disagree():
    n = 400
    rng = np.random.default_rng(4)
    p = np.where(rng.random(n) < 0.5, 0.05, 0.25)
    tokens = np.where(p > 0.1, 8000, 1000)  # big steps clip more
    ra = run_from_curves("a", "megatron", seed=1, clip_p=p, loss_tokens=tokens)
    rb = run_from_curves("b", "miles", seed=2, clip_p=p, loss_tokens=tokens)
    result = compare(runset_of(ra, rb))
    e = result.run_estimate("clip_fraction", "a")
    clipped = np.array([pt.metrics[keys.CLIPPED_TOKENS] for pt in ra.points])
    per_step = clipped / tokens
    assert e.estimate.value == pytest.approx(clipped.sum() / tokens.sum())
    assert e.step_weighted is not None and e.step_weighted.value == pytest.approx(per_step.mean())
    assert any(
        n.run == "a" and "token-weighted" in n.text and "step-weighted" in n.text for n in result.notes
    )
    row = result.table().set_index("metric").loc["clip_fraction"]
    assert math.isfinite(row["step_weighted_difference"])
    assert "step-weighted" in result.formatted_table().columns


# ------------------------------------------------------------------------------- alignment


def test_tokens_alignment_refuses_step_grids_of_different_density():
    n = 400
    a = run_from_curves("a", "megatron", seed=1, clip_p=noisy(1, n))
    b = run_from_curves("b", "miles", seed=2, clip_p=noisy(2, n), steps=np.arange(0, n, 2))
    with pytest.raises(
        ValueError,
        match=r"step grids differ in density \(a logs loss_tokens:sum at 400 of 400 steps, b logs loss_tokens:sum at 200 of 399",
    ):
        compare(runset_of(a, b), align="tokens")
    assert compare(runset_of(a, b)).difference("clip_fraction").estimate.n_units == 200  # by step: fine


def test_steps_missing_where_the_metric_is_high_are_flagged_with_figures():
    n = 600
    p = noisy(5, n, sd=0.04, phi=0.9)
    high = np.flatnonzero(p > np.quantile(p, 0.85))
    a = run_from_curves("megatron-run", "megatron", seed=1, clip_p=p)
    b = run_from_curves("miles-run", "miles", seed=2, clip_p=p, steps=np.setdiff1d(np.arange(n), high))
    result = compare(runset_of(a, b))
    [note] = [n for n in result.notes if "missing in a pattern" in n.text]
    clipped = {pt.step: pt.metrics[keys.CLIPPED_TOKENS] / pt.metrics[keys.LOSS_TOKENS] for pt in a.points}
    assert f"at {high.size} units" in note.text and note.warning
    there = sum(a.points[s].metrics[keys.CLIPPED_TOKENS] for s in high) / sum(
        a.points[s].metrics[keys.LOSS_TOKENS] for s in high
    )
    assert f"{there * 100:.2f}%" in note.text and clipped


def test_fraction_intervals_stay_in_zero_one():
    n = 300
    p = np.where(np.arange(n) % 50 == 0, 0.02, 0.0)  # almost never clips
    result = compare(
        runset_of(
            run_from_curves("a", "megatron", seed=1, clip_p=p, loss_tokens=np.full(n, 200)),
            run_from_curves("b", "miles", seed=2, clip_p=p, loss_tokens=np.full(n, 200)),
        )
    )
    for e in result.estimates:
        if e.metric == "clip_fraction":
            assert 0.0 <= e.estimate.low <= e.estimate.value <= e.estimate.high <= 1.0
    data = result.to_dict()
    assert all(e["ci_low"] >= 0 for e in data["estimates"] if e["metric"] == "clip_fraction")


# ------------------------------------------------------------------------------------ bad data


def _edit(run, step: int, **metrics):
    run.points = [
        Point(p.step, p.wall_time, {**p.metrics, **metrics}) if p.step == step else p for p in run.points
    ]


def test_bad_counts_are_refused_and_named_by_run_step_and_key():
    megatron, miles = megatron_vs_miles()
    _edit(miles, 10, **{keys.CLIPPED_TOKENS: 5000.0, keys.LOSS_TOKENS: 3000.0})
    _edit(miles, 11, **{keys.LOSS_TOKENS: -3.0})
    _edit(miles, 12, **{keys.CLIPPED_TOKENS: 3.5})
    _edit(miles, 13, **{keys.CLIPPED_TOKENS: float("inf")})
    result = compare(runset_of(megatron, miles))
    texts = [n.text for n in result.notes if n.warning and n.run == "miles-run"]
    assert any("clipped_tokens:sum is above loss_tokens:sum at 2 steps (10-11)" in t for t in texts)
    assert any("loss_tokens:sum is negative at 1 step (11)" in t for t in texts)
    assert any("clipped_tokens:sum is fractional at 1 step (12)" in t for t in texts)
    assert any("NaN or infinite at 1 of 200 steps (first at step 13)" in t for t in texts)
    e = result.run_estimate("clip_fraction", "miles-run")
    good = {p.step for p in miles.points} - {10, 11, 12, 13}
    assert e.units == 196 and e.invalid == 3 and e.nonfinite == 1
    assert e.estimate.value == pytest.approx(miles.clip_fraction(good))


def test_a_step_logged_twice_keeps_the_last_value_and_says_so(tmp_path):
    megatron, miles = megatron_vs_miles()
    replayed = [
        Point(
            p.step,
            p.wall_time + 5000,
            {**p.metrics, keys.CLIPPED_TOKENS: p.metrics[keys.CLIPPED_TOKENS] + 100},
        )
        for p in miles.points
        if 100 <= p.step < 200
    ]
    miles.points = miles.points + replayed  # a resume replays steps 100-199 with other values
    write_jsonl(tmp_path, megatron)
    write_jsonl(tmp_path, miles)
    result = compare(load_runs(["megatron0001", "miles0000002"], jsonl_dir=tmp_path))
    last = {p.step: p for p in miles.points}  # the last point of each step wins
    clipped = sum(p.metrics[keys.CLIPPED_TOKENS] for p in last.values())
    tokens = sum(p.metrics[keys.LOSS_TOKENS] for p in last.values())
    e = result.run_estimate("clip_fraction", "miles-run")
    assert e.units == 200 and e.estimate.value == pytest.approx(clipped / tokens)
    [note] = [n for n in result.notes if "logged more than once" in n.text]
    assert note.run == "miles-run" and note.warning
    assert (
        "clipped_tokens:sum logged more than once with different values at 100 steps (100-199)" in note.text
    )
    assert "last value logged is kept" in note.text


def test_steps_text_compresses_ranges():
    assert steps_text([5, 1, 2, 3, 9]) == "1-3, 5, 9"
    assert steps_text(list(range(0, 20, 2)), most=3) == "0, 2, 4, and 7 more ranges"


# ------------------------------------------------------------------------------------- groups


def seeds(backend: str, clip: float, first_seed: int, k: int = 3, n: int = 300):
    out = []
    for i in range(k):
        level = clip + np.random.default_rng(first_seed + i).normal(0, 0.004)  # seed-to-seed spread
        out.append(
            run_from_curves(
                f"{backend}-s{i}",
                backend,
                seed=first_seed + 10 + i,
                clip_p=noisy(first_seed + 20 + i, n, level=level),
            )
        )
    return out


def test_groups_compare_stacks_over_seeds():
    megatron = seeds("megatron", 0.10, 100)
    miles = seeds("miles", 0.16, 200)
    rs = runset_of(*megatron, *miles)
    groups = {"megatron": [r.run_id for r in megatron], "miles": [r.run_id for r in miles]}
    result = compare(rs, groups=groups)
    assert result.seeds_covered and result.groups == groups and result.differences == []
    d = result.group_difference("clip_fraction")
    means = {
        g: np.mean([r.clip_fraction() for r in runs])
        for g, runs in (("megatron", megatron), ("miles", miles))
    }
    assert d.scale == "log-ratio"  # the relative margin: both stacks clip well above the floor
    assert d.estimate.value == pytest.approx(math.log(means["miles"] / means["megatron"]))
    assert d.estimate.seeds_a == 3 and d.estimate.seeds_b == 3
    assert d.verdict == DIFFERENT and result.on_policy_verdict == DIFFERENT
    assert isinstance(d.seeds_needed, int) and d.seeds_needed >= 2
    assert {e.group for e in result.estimates if e.metric == "clip_fraction"} == {"megatron", "miles"}
    assert result.summary().startswith(
        "Not equally on-policy: these stacks (miles and megatron, 3 and 3 seeds)"
    )
    data = result.to_dict()
    assert data["seeds_covered"] and data["group_differences"][0]["difference"]["seeds_group"] == 3
    row = next(g for g in data["group_differences"] if g["metric"] == "clip_fraction")
    assert (
        row["probability_greater"] == pytest.approx(d.probability_greater)
        and row["probability_greater"] > 0.95
    )
    assert row["difference"]["se"] > 0 and row["seeds_needed"] == d.seeds_needed
    assert [s["verdict"] for s in row["segments"]] == [s.verdict for s in d.segments]
    assert json.loads(result.to_json())["group_differences"] == json.loads(
        json.dumps(data["group_differences"])
    )
    assert any("between-seed variation" in n.text for n in result.notes)


def test_group_interval_includes_seed_variation_and_single_pairs_say_they_do_not():
    megatron = seeds("megatron", 0.10, 300)
    miles = seeds("miles", 0.10, 400)
    rs = runset_of(*megatron, *miles)
    grouped = compare(rs, groups={"a": [r.run_id for r in megatron], "b": [r.run_id for r in miles]})
    d = grouped.group_difference("clip_fraction")
    assert d.verdict in (EQUIVALENT, INCONCLUSIVE)
    pair = compare(rs, [megatron[0].run_id, miles[0].run_id])
    assert not pair.seeds_covered
    assert any("seed-to-seed variation is not covered" in n.text for n in pair.notes)
    pair_width = (
        pair.difference("clip_fraction").estimate.high - pair.difference("clip_fraction").estimate.low
    )
    assert d.estimate.high - d.estimate.low > pair_width  # seeds spread more than one pair's steps


def test_group_errors_are_clear():
    megatron = seeds("megatron", 0.10, 100, k=2)
    miles = seeds("miles", 0.10, 200, k=2)
    rs = runset_of(*megatron, *miles)
    with pytest.raises(ValueError, match="group 'miles' has 1 run"):
        compare(rs, groups={"megatron": ["megatron-s0", "megatron-s1"], "miles": ["miles-s0"]})
    with pytest.raises(ValueError, match="at least two groups"):
        compare(rs, groups={"megatron": ["megatron-s0", "megatron-s1"]})
    with pytest.raises(ValueError, match="named twice"):
        compare(rs, groups={"a": ["megatron-s0", "miles-s0"], "b": ["miles-s0", "miles-s1"]})
    with pytest.raises(ValueError, match="not both"):
        compare(
            rs,
            ["megatron-s0", "miles-s0"],
            groups={"a": ["megatron-s0", "megatron-s1"], "b": ["miles-s0", "miles-s1"]},
        )


# ------------------------------------------------------------------------------------ mirror


@pytest.mark.parametrize("seed", [0, 1])
def test_swapping_the_runs_mirrors_segments_and_verdicts(seed):
    n = 1200
    a, b = noisy(seed, n), noisy(seed + 50, n)
    b[600:680] += 0.08
    ra = run_from_curves("a", "megatron", seed=seed, clip_p=a)
    rb = run_from_curves("b", "miles", seed=seed + 9, clip_p=b)
    ab = compare(runset_of(ra, rb)).difference("clip_fraction")
    ba = compare(runset_of(rb, ra)).difference("clip_fraction")
    assert ab.verdict == ba.verdict and ab.average_verdict == ba.average_verdict
    assert ab.estimate.value == pytest.approx(-ba.estimate.value)
    assert [(s.start, s.end, s.verdict) for s in ab.segments] == [
        (s.start, s.end, s.verdict) for s in ba.segments
    ]
    for s, t in zip(ab.segments, ba.segments, strict=True):
        assert s.estimate.low == pytest.approx(-t.estimate.high) and s.estimate.high == pytest.approx(
            -t.estimate.low
        )
    assert ab.influential == ba.influential


def test_insufficient_data_is_never_equivalent():
    megatron, miles = megatron_vs_miles(n_megatron=50, n_miles=50)
    result = compare(runset_of(megatron, miles))
    assert result.on_policy_verdict == INSUFFICIENT
    assert result.summary().startswith("Insufficient data")
