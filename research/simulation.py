"""Simulated runs with known truth: how often the comparison's intervals cover and its verdicts err.

A run of ``n`` steps has per-step clip probability ``p_t = trend_t + x_t`` with ``x`` a stationary
wobble — AR(1) with coefficient ``phi`` or fractionally integrated noise ARFIMA(0, d, 0) — of
marginal standard deviation ``SD`` (0.02, i.e. ±2 pp from step to step around a clip fraction of
0.10), ``loss_tokens_t`` uniform on 5,000..50,000 and ``clipped_t ~ Binomial(loss_tokens_t, p_t)``.
The two runs of a pair are independent (their wobbles are not shared: the hardest case for a
paired comparison). The truth of a run's clip fraction is its expected ratio of sums given the
tokens, ``sum(tokens_t trend_t) / sum(tokens_t)``; of a difference, the difference of the truths.
The margin is ``TOLERANCE`` = 0.02 (absolute).

Every case of ``cases()`` is one ``Row``: the coverage of 90 % intervals (one run, a difference),
the share given a verdict, the **size** (called equivalent at a true difference equal to the
margin, over all replicates: nominal at most 5 %), the **power** (called equivalent throughout —
whole window and every segment — at no difference), the median reported effective sample size
against the true one (``gamma0 / Var(estimate)`` with ``gamma0`` the marginal variance of the
linearised series, both measured over the replicates), the median half-width against the
estimator's real spread, and a case-specific **detection** rate (described per case).

``method="ewc"`` is the shipped code (``lrv.long_run_variance`` and ``intervals.interval_rows``,
vectorised over replicates; segments, outliers, lags and groups through the public functions).
``method="fixed-b"`` is the previous method (Bartlett kernel at bandwidth ``n`` with
Kiefer–Vogelsang critical values, ESS from the lag-1 autocorrelation), kept as a control.

Run: ``python -m research.simulation [--replicates N] [--quick]`` prints the table.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from statistics import NormalDist

import numpy as np
from cliptrack.compare.stats import (
    EQUIVALENT,
    MIN_ESS,
    MIN_UNITS,
    group_difference,
    influential_units,
    lead_lag,
    paired_difference,
    ratio_estimate,
    seeds_needed,
    segment_differences,
    step_weighted_estimate,
    throughout_verdict,
)
from cliptrack.compare.stats.estimate import LOG_RATIO, interval_verdict
from cliptrack.compare.stats.intervals import direction_rows, interval_rows
from cliptrack.compare.stats.lrv import autocovariances, long_run_variance
from cliptrack.compare.stats.seeds import MAX_SEEDS

TOKENS = (5_000, 50_000)
"""Loss tokens per step, uniform integers in this closed range."""
MEAN = 0.10
"""Clip probability of run a (fraction of tokens)."""
SD = 0.02
"""Marginal standard deviation of the per-step wobble of the clip probability."""
TOLERANCE = 0.02
"""Equivalence margin (absolute, fraction of tokens)."""
CONFIDENCE = 0.90
METHODS = ("ewc", "fixed-b")


# ------------------------------------------------------------------------------------- generators


def ar1(rng: np.random.Generator, reps: int, n: int, phi: float, sd: float = SD) -> np.ndarray:
    """``(reps, n)`` stationary AR(1) paths with coefficient ``phi`` and marginal sd ``sd``."""
    from scipy.signal import lfilter

    shocks = rng.normal(0.0, sd * math.sqrt(1.0 - phi * phi), (reps, n))
    start = rng.normal(0.0, sd, reps)
    return lfilter([1.0], [1.0, -phi], shocks, axis=1, zi=(phi * start)[:, None])[0]


def arfima(rng: np.random.Generator, reps: int, n: int, d: float, sd: float = SD) -> np.ndarray:
    """``(reps, n)`` ARFIMA(0, d, 0) paths (MA(inf) weights truncated at ``8 n`` lags, scaled to
    marginal sd ``sd`` exactly for the truncated process), by FFT convolution."""
    lags = 8 * n
    k = np.arange(1, lags)
    psi = np.concatenate([[1.0], np.cumprod((k - 1 + d) / k)])
    total = lags + n
    size = 1 << int(total + lags - 1).bit_length()
    eps = rng.normal(0.0, 1.0, (reps, total))
    x = np.fft.irfft(np.fft.rfft(eps, size, axis=1) * np.fft.rfft(psi, size), size, axis=1)[:, lags:total]
    return x * (sd / math.sqrt(float(np.sum(psi * psi))))


def wobble(rng: np.random.Generator, reps: int, n: int, phi: float = 0.0, d: float = 0.0) -> np.ndarray:
    return arfima(rng, reps, n, d) if d else ar1(rng, reps, n, phi)


def counts(
    rng: np.random.Generator, p: np.ndarray, tokens: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(clipped, loss_tokens)`` float arrays of integer counts for per-step probabilities ``p``."""
    if tokens is None:
        tokens = rng.integers(TOKENS[0], TOKENS[1] + 1, p.shape).astype(float)
    clipped = rng.binomial(tokens.astype(np.int64), np.clip(p, 0.001, 0.999)).astype(float)
    return clipped, tokens


def truth(trend: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Expected ratio of sums given the tokens: ``sum(tokens trend) / sum(tokens)`` per replicate."""
    return np.sum(tokens * trend, axis=1) / np.sum(tokens, axis=1)


# ------------------------------------------------------------------------------ shipped estimators


def linearise_rows(num: np.ndarray, den: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the ratio of sums and its linearised series (as ``intervals.linearised``)."""
    ratio = num.sum(axis=1) / den.sum(axis=1)
    return ratio, (num - ratio[:, None] * den) / (den.sum(axis=1, keepdims=True) / num.shape[1])


@dataclass(frozen=True)
class Intervals:
    value: np.ndarray
    low: np.ndarray
    high: np.ndarray
    ess: np.ndarray

    def given(self, n: int) -> np.ndarray:
        return (self.ess >= MIN_ESS) & (n >= MIN_UNITS)

    def equivalent(self, n: int, tol: float = TOLERANCE) -> np.ndarray:
        return self.given(n) & (self.low > -tol) & (self.high < tol)

    def covers(self, target: np.ndarray | float) -> np.ndarray:
        return (self.low < target) & (target < self.high)


def previous_intervals(z: np.ndarray, values: np.ndarray, confidence: float) -> Intervals:
    """The previous method: fixed-b Bartlett HAC (b = 1, Kiefer–Vogelsang critical value) and the
    lag-1 ESS ``n (1 - r) / (1 + r)`` with Kendall's bias correction."""
    n = z.shape[1]
    g = autocovariances(z)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.where(g[:, 0] > 0, g[:, 1] / g[:, 0], 0.0)
    r = np.clip(rho + (1.0 + 3.0 * rho) / n, -0.99, 0.99)
    ess = np.minimum(n, n * (1.0 - r) / (1.0 + r))
    weights = np.clip(1.0 - np.arange(1, n) / n, 0.0, None)
    lrv = np.maximum(g[:, 0] + 2.0 * (g[:, 1:] @ weights), 0.0)
    zq = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    crit = zq + 2.1859 + 0.3142 - 0.3427 if confidence == 0.90 else zq * 3.0
    half = crit * np.sqrt(lrv / n)
    return Intervals(values, values - half, values + half, ess)


def intervals(
    method: str,
    arrays: list[np.ndarray],
    confidence: float = CONFIDENCE,
    bounds: tuple[float, float] | None = None,
) -> Intervals:
    """Intervals per replicate for one run (2 arrays) or a difference b − a (4 arrays)."""
    if len(arrays) == 4:
        ra, za = linearise_rows(arrays[0], arrays[1])
        rb, zb = linearise_rows(arrays[2], arrays[3])
        value, z = rb - ra, zb - za
    else:
        value, z = linearise_rows(arrays[0], arrays[1])
    if method == "fixed-b":
        return previous_intervals(z, value, confidence)
    if method != "ewc":
        raise ValueError(f"method {method!r} is not one of {METHODS}")
    v = long_run_variance(z)
    low, high = interval_rows(value, z.shape[1], v, confidence, bounds)
    return Intervals(value, low, high, v.ess)


def throughout_equivalent(arrays: list[np.ndarray], i: int, tol: float = TOLERANCE) -> tuple[bool, bool]:
    """``(equivalent throughout, some segment different)`` for replicate ``i`` (public functions)."""
    row = [a[i] for a in arrays]
    overall = paired_difference(*row, confidence=CONFIDENCE)
    segments = segment_differences(*row, confidence=CONFIDENCE, tolerance=tol)
    verdict = throughout_verdict(overall, segments, tol)
    return verdict.verdict == EQUIVALENT, any(s.verdict == "different" for s in segments)


# ------------------------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class Row:
    """Measured rates for one case (fractions of replicates; NaN where not measured)."""

    case: str
    method: str
    steps: int
    replicates: int
    coverage_run: float = math.nan
    coverage_difference: float = math.nan
    with_verdict: float = math.nan
    size: float = math.nan
    power: float = math.nan
    ess_reported: float = math.nan
    ess_true: float = math.nan
    half_width: float = math.nan
    spread: float = math.nan
    detection: float = math.nan
    note: str = field(default="")


def _ess_true(value: np.ndarray, target: np.ndarray, z_true: np.ndarray) -> float:
    """``gamma0 / Var(estimate)``: marginal variance of the linearised series over the variance of
    the estimate, both over the replicates."""
    return float(np.mean(z_true * z_true) / np.var(value - target))


def stationary(
    method: str, n: int, reps: int, seed: int, *, phi: float = 0.0, d: float = 0.0, throughout: bool = True
) -> Row:
    """Stationary wobble (AR ``phi`` or ARFIMA ``d``): coverage, size at the margin, power, ESS."""
    rng = np.random.default_rng([seed, int(phi * 1000), int(d * 1000), n])
    xa = wobble(rng, reps, n, phi, d)
    a = counts(rng, MEAN + xa)
    ta = np.full(reps, MEAN)
    run = intervals(method, list(a), bounds=(0.0, 1.0) if method == "ewc" else None)
    z_true = (a[0] - MEAN * a[1]) / a[1].mean(axis=1, keepdims=True)
    b0 = counts(rng, MEAN + wobble(rng, reps, n, phi, d))
    bt = counts(rng, MEAN + TOLERANCE + wobble(rng, reps, n, phi, d))
    diff0 = intervals(method, [*a, *b0])
    difft = intervals(method, [*a, *bt])
    power = math.nan
    if throughout and method == "ewc":
        power = float(np.mean([throughout_equivalent([*a, *b0], i)[0] for i in range(reps)]))
    elif method == "fixed-b":
        power = float(np.mean(diff0.equivalent(n)))
    case = f"ARFIMA d={d:g}" if d else f"AR {phi:g}"
    return Row(
        case,
        method,
        n,
        reps,
        coverage_run=float(np.mean(run.covers(ta))),
        coverage_difference=float(np.mean(difft.covers(TOLERANCE))),
        with_verdict=float(np.mean(difft.given(n))),
        size=float(np.mean(difft.equivalent(n))),
        power=power,
        ess_reported=float(np.median(run.ess)),
        ess_true=_ess_true(run.value, ta, z_true),
        half_width=float(np.median(run.high - run.low) / 2),
        spread=float(np.std(run.value - ta)),
    )


def drift(method: str, n: int, reps: int, seed: int, *, phi: float = 0.5) -> Row:
    """Run a drifts linearly from 0.15 to 0.05 (AR ``phi`` wobble around it): per-run coverage and
    half-width against the estimator's spread; both runs drifting alike, b at the margin: coverage
    of the difference and size; detection: one run drifting, the other flat at the same average,
    called not equivalent throughout (the runs differ by ±5 pp at the ends)."""
    rng = np.random.default_rng([seed, 77, n])
    trend = np.linspace(0.15, 0.05, n)[None, :]
    a = counts(rng, trend + wobble(rng, reps, n, phi))
    ta = truth(np.broadcast_to(trend, a[1].shape), a[1])
    run = intervals(method, list(a), bounds=(0.0, 1.0) if method == "ewc" else None)
    bt = counts(rng, trend + TOLERANCE + wobble(rng, reps, n, phi))
    difft = intervals(method, [*a, *bt])
    target = truth(np.broadcast_to(trend + TOLERANCE, bt[1].shape), bt[1]) - ta
    detection = math.nan
    if method == "ewc" and n <= 5000:
        flat = counts(rng, MEAN + wobble(rng, reps, n, phi))
        detection = float(np.mean([not throughout_equivalent([*a, *flat], i)[0] for i in range(reps)]))
    return Row(
        "drift 0.15→0.05",
        method,
        n,
        reps,
        coverage_run=float(np.mean(run.covers(ta))),
        coverage_difference=float(np.mean(difft.covers(target))),
        with_verdict=float(np.mean(difft.given(n))),
        size=float(np.mean(difft.equivalent(n))),
        half_width=float(np.median(run.high - run.low) / 2),
        spread=float(np.std(run.value - ta)),
        detection=detection,
        note="detection: a drifting run vs a flat one with the same average, not equivalent throughout",
    )


def episode(
    n: int, reps: int, seed: int, *, phi: float = 0.5, share: float = 0.05, jump: float = 0.10
) -> Row:
    """Run b clips ``jump`` more during ``share`` of the steps (one contiguous stretch at a random
    place), equal otherwise. Detection: called not equivalent throughout; ``power`` here: a segment
    called different overlapping the stretch."""
    rng = np.random.default_rng([seed, 55, n])
    a = counts(rng, MEAN + wobble(rng, reps, n, phi))
    width = int(round(share * n))
    starts = rng.integers(0, n - width + 1, reps)
    bump = np.zeros((reps, n))
    for i, s in enumerate(starts):
        bump[i, s : s + width] = jump
    b = counts(rng, MEAN + bump + wobble(rng, reps, n, phi))
    arrays = [*a, *b]
    caught, located = 0, 0
    for i in range(reps):
        row = [x[i] for x in arrays]
        overall = paired_difference(*row)
        segments = segment_differences(*row, tolerance=TOLERANCE)
        verdict = throughout_verdict(overall, segments, TOLERANCE)
        caught += verdict.verdict != EQUIVALENT
        s0, e0 = int(starts[i]), int(starts[i]) + width
        located += any(s.verdict == "different" and s.start < e0 and s0 < s.stop for s in segments)
    return Row(
        f"episode +{jump * 100:g} pp in {share * 100:g} % of steps",
        "ewc",
        n,
        reps,
        detection=caught / reps,
        power=located / reps,
        note="detection: not equivalent throughout; power column: a 'different' segment on the episode",
    )


def lagged(n: int, reps: int, seed: int, *, fraction: float = 0.10, phi: float = 0.5) -> Row:
    """Reward of run b lags run a by ``fraction`` of training: ``r(t) = 0.2 + 0.6 (1 - exp(-3 t / n))``
    plus an AR wobble (sd 0.05). Detection: ``lead_lag`` explains the difference with a lag within
    ±30 % of the true one; ``size`` column here: a lag explained between two unlagged runs."""
    rng = np.random.default_rng([seed, 33, n])
    shift = int(round(fraction * n))
    t = np.arange(-shift, n)
    curve = 0.2 + 0.6 * (1.0 - np.exp(-3.0 * np.clip(t, 0, None) / n))
    xa = curve[shift:] + ar1(rng, reps, n, phi, 0.05)
    xb = curve[:n] + ar1(rng, reps, n, phi, 0.05)
    xc = curve[shift:] + ar1(rng, reps, n, phi, 0.05)
    hit, false = 0, 0
    for i in range(reps):
        lag = lead_lag(xa[i], xb[i])
        hit += lag is not None and lag.explained and abs(lag.lag - shift) <= 0.3 * shift
        same = lead_lag(xa[i], xc[i])
        false += same is not None and same.explained
    return Row(
        f"reward lagging by {fraction * 100:g} % of steps",
        "ewc",
        n,
        reps,
        detection=hit / reps,
        size=false / reps,
        note="detection: lead_lag finds the lag (±30 %); size column: a lag found between unlagged runs",
    )


def outliers(
    n: int, reps: int, seed: int, *, share: float = 0.025, level: float = 0.9, phi: float = 0.5
) -> Row:
    """Run b has ``share`` of its steps at clip probability ``level`` (random steps), which puts its
    true clip fraction ``share * (level - MEAN)`` = 0.02 above a's, at the margin. ``size``: called
    equivalent; ``detection``: called equivalent and no influential unit found (the verdict a user
    can act on); ``with_verdict``: share with influential units reported."""
    rng = np.random.default_rng([seed, 99, n])
    a = counts(rng, MEAN + wobble(rng, reps, n, phi))
    k = max(1, int(round(share * n)))
    mask = np.zeros((reps, n), bool)
    for i in range(reps):
        mask[i, rng.choice(n, k, replace=False)] = True
    b = counts(rng, np.where(mask, level, MEAN + wobble(rng, reps, n, phi)))
    arrays = [*a, *b]
    tol = TOLERANCE
    diff = intervals("ewc", arrays)
    equivalent = diff.equivalent(n, tol)
    flagged = np.array([bool(influential_units(*(x[i] for x in arrays), tolerance=tol)) for i in range(reps)])
    return Row(
        f"{share * 100:g} % outlier steps at {level:g}",
        "ewc",
        n,
        reps,
        size=float(np.mean(equivalent)),
        detection=float(np.mean(equivalent & ~flagged)),
        with_verdict=float(np.mean(flagged)),
        note="size: equivalent; detection column: equivalent with no influential unit; with a verdict: units flagged",
    )


def weighting(n: int, reps: int, seed: int, *, c: float = 0.5, phi: float = 0.5) -> Row:
    """Tokens rise with the clip rate: ``tokens_t = T exp(c x_t / SD - c^2 / 2)``, so the token-weighted
    clip fraction is ``MEAN + c SD`` and the step-weighted one ``MEAN``. Coverage run: token-weighted
    interval covers ``MEAN + c SD``; coverage difference: step-weighted interval covers ``MEAN``."""
    rng = np.random.default_rng([seed, 11, n])
    x = wobble(rng, reps, n, phi)
    tokens = np.round(20_000 * np.exp(c * x / SD - c * c / 2))
    clipped, tokens = counts(rng, MEAN + x, tokens)
    tw = [ratio_estimate(clipped[i], tokens[i], bounds=(0, 1)) for i in range(reps)]
    sw = [step_weighted_estimate(clipped[i], tokens[i], bounds=(0, 1)) for i in range(reps)]
    target = MEAN + c * SD
    return Row(
        "tokens rising with the clip rate",
        "ewc",
        n,
        reps,
        coverage_run=float(np.mean([e.low < target < e.high for e in tw])),
        coverage_difference=float(np.mean([e.low < MEAN < e.high for e in sw])),
        note=f"coverage run: token-weighted of {target:g}; coverage difference: step-weighted of {MEAN:g}",
    )


def bounded(n: int, reps: int, seed: int, *, mean: float = 0.004, phi: float = 0.5) -> Row:
    """A clip fraction near 0 (``mean`` 0.4 %, sd 0.2 pp): coverage and the share of intervals within
    [0, 1] (detection column)."""
    rng = np.random.default_rng([seed, 22, n])
    a = counts(rng, mean + ar1(rng, reps, n, phi, mean / 2))
    run = intervals("ewc", list(a), bounds=(0.0, 1.0))
    return Row(
        f"clip fraction near 0 ({mean * 100:g} %)",
        "ewc",
        n,
        reps,
        coverage_run=float(np.mean(run.covers(mean))),
        detection=float(np.mean((run.low >= 0) & (run.high <= 1))),
        note="detection: intervals within [0, 1]",
    )


def seeds(
    n: int, reps: int, seed: int, *, per_group: int = 3, between: float = 0.01, phi: float = 0.5
) -> Row:
    """Two stacks with the same clip fraction; each seed's mean is offset by N(0, ``between``^2).
    Coverage difference: the group interval covers 0; coverage run: one pair's paired interval
    covers 0 (it ignores seed variation)."""
    rng = np.random.default_rng([seed, 44, n, per_group])
    cover_group, cover_pair = 0, 0
    for _ in range(reps):
        runs = []
        for _g in range(2):
            offsets = rng.normal(0.0, between, per_group)
            runs.append([counts(rng, MEAN + o + wobble(rng, 1, n, phi))[0:2] for o in offsets])
        ga = [(c[0], t[0]) for c, t in runs[0]]
        gb = [(c[0], t[0]) for c, t in runs[1]]
        g = group_difference(ga, gb)
        cover_group += g.low < 0 < g.high
        p = paired_difference(ga[0][0], ga[0][1], gb[0][0], gb[0][1])
        cover_pair += p.low < 0 < p.high
    return Row(
        f"{per_group} seeds per stack, seed sd {between * 100:g} pp",
        "ewc",
        n,
        reps,
        coverage_run=cover_pair / reps,
        coverage_difference=cover_group / reps,
        note="coverage difference: group interval; coverage run: one pair's interval (no seed variation)",
    )


# ------------------------------------------------------------------------ stacks judged on seeds

RUN_STEPS = 100
"""Steps per seed of the run-level cases (short runs: the within-run spread is not negligible)."""
RUN_SEEDS = (2, 3, 5)
"""Seeds per stack of the run-level cases."""
RUN_SPREADS = (0.5, 1.0, 3.0)
"""Between-seed sd as a multiple of the within-run sd of one seed's window value."""
RUN_SHIFTS = (0.0, 1.0, 2.0)
"""True stack difference in margins (log-ratio units of ``log 1.25``): none, at the margin, twice it."""


@dataclass(frozen=True)
class RunLevelRow:
    """One run-level case (fractions of replicates): two stacks of ``seeds`` seeds each, seed sd
    ``spread`` times the within-run sd, true difference ``shift`` margins. ``coverage``: the 90 %
    interval covers the true log-ratio; ``equivalent``/``different``: the verdicts (at ``shift`` 1
    these are the false "equivalent" and false "different" rates, nominal at most 5 %; at 0,
    ``equivalent`` is the power; at 2, ``different`` is); ``p_above``: P(b > a) above 95 % (5 % at
    no difference); ``seeds_needed``: median over replicates of the seeds per stack the tool says
    the margin needs; ``within``: the within-run sd measured (relative to the mean)."""

    seeds: int
    spread: float
    shift: float
    steps: int
    replicates: int
    coverage: float
    equivalent: float
    different: float
    p_above: float
    seeds_needed: float
    within: float


def _stack_ratios(
    rng: np.random.Generator, reps: int, seeds: int, n: int, mean: float, between: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(clipped totals, token totals, seed means)``, each ``(reps, seeds)``: every seed a run of
    ``n`` steps (AR(1) wobble at ``phi`` 0.5, binomial clips) around its own mean, drawn
    N(``mean``, ``between``^2)."""
    offsets = rng.normal(0.0, between, (reps, seeds))
    x = ar1(rng, reps * seeds, n, 0.5).reshape(reps, seeds, n)
    p = np.clip(mean + offsets[..., None] + x, 0.0, 1.0)
    tokens = rng.integers(TOKENS[0], TOKENS[1] + 1, (reps, seeds, n))
    clipped = rng.binomial(tokens, p)
    return clipped.sum(-1).astype(float), tokens.sum(-1).astype(float), mean + offsets


def run_level(
    seeds: int, spread: float, shift: float, reps: int, seed: int, n: int = RUN_STEPS
) -> RunLevelRow:
    """One run-level case through ``group_difference`` (log-ratio scale, margin ``log 1.25``), its
    verdict, ``probability_greater`` and ``seeds_needed`` at the seeds' measured spread."""
    rng = np.random.default_rng([seed, 66, seeds, int(spread * 10), int(shift * 10), n])
    tol = math.log1p(MARGIN_RELATIVE)
    within = SD * math.sqrt(1.5 / (0.5 * n))  # sd of an AR(1) (phi 0.5) window mean, roughly
    level_b = MEAN * math.exp(shift * tol)
    ca, ta, sa = _stack_ratios(rng, reps, seeds, n, MEAN, spread * within)
    cb, tb, sb = _stack_ratios(rng, reps, seeds, n, level_b, spread * within * level_b / MEAN)
    truth = shift * tol
    cover = eq = diff = above = 0
    needed = []
    for i in range(reps):
        ga = [(ca[i, j : j + 1], ta[i, j : j + 1]) for j in range(seeds)]
        gb = [(cb[i, j : j + 1], tb[i, j : j + 1]) for j in range(seeds)]
        g = group_difference(ga, gb, scale=LOG_RATIO, confidence=CONFIDENCE)
        cover += g.low < truth < g.high
        verdict = interval_verdict(g.low, g.high, tol)
        eq += verdict == EQUIVALENT
        diff += verdict == "different"
        above += g.probability_greater > 0.95
        ra, rb = ca[i] / ta[i], cb[i] / tb[i]
        rel = math.sqrt((np.var(ra, ddof=1) / ra.mean() ** 2 + np.var(rb, ddof=1) / rb.mean() ** 2) / 2)
        try:
            needed.append(seeds_needed(rel, 0.0, tol, confidence=CONFIDENCE))
        except ValueError:
            needed.append(MAX_SEEDS)
    measured = float(
        np.std(np.concatenate([(ca / ta - sa).ravel() / MEAN, (cb / tb - sb).ravel() / level_b]))
    )
    return RunLevelRow(
        seeds,
        spread,
        shift,
        n,
        reps,
        cover / reps,
        eq / reps,
        diff / reps,
        above / reps,
        float(np.median(needed)),
        measured,
    )


def run_level_table(reps: int = 400, seed: int = 0) -> list[RunLevelRow]:
    """Every run-level case (docs/STATISTICS.md, "Stacks judged on seeds")."""
    return [
        run_level(m, spread, shift, reps, seed)
        for m in RUN_SEEDS
        for spread in RUN_SPREADS
        for shift in RUN_SHIFTS
    ]


def seeds_needed_check(spread: float, reps: int, seed: int, n: int = RUN_STEPS) -> tuple[int, float]:
    """``(m, rate)``: the seeds per stack ``seeds_needed`` asks for at the true spread (seed sd
    ``spread`` times the within-run sd, both stacks equal) and the share of replicates with that many
    seeds called equivalent (nominal power 80 %)."""
    tol = math.log1p(MARGIN_RELATIVE)
    within = SD * math.sqrt(1.5 / (0.5 * n))
    total = math.sqrt(1.0 + spread**2) * within / MEAN
    m = seeds_needed(total, 0.0, tol, confidence=CONFIDENCE)
    rng = np.random.default_rng([seed, 77, int(spread * 10), n])
    ca, ta, _ = _stack_ratios(rng, reps, m, n, MEAN, spread * within)
    cb, tb, _ = _stack_ratios(rng, reps, m, n, MEAN, spread * within)
    eq = 0
    for i in range(reps):
        ga = [(ca[i, j : j + 1], ta[i, j : j + 1]) for j in range(m)]
        gb = [(cb[i, j : j + 1], tb[i, j : j + 1]) for j in range(m)]
        g = group_difference(ga, gb, scale=LOG_RATIO, confidence=CONFIDENCE)
        eq += interval_verdict(g.low, g.high, tol) == EQUIVALENT
    return m, eq / reps


def run_level_markdown(rows: list[RunLevelRow]) -> str:
    """The run-level table as markdown (rates in %)."""
    lines = [
        "| seeds per stack | seed sd / within-run sd | true difference | steps | reps | coverage | "
        "equivalent | different | P(b > a) > 95 % | seeds needed (median) |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    truth = {0.0: "none", 1.0: "= margin (+25 %)", 2.0: "2× margin (+56 %)"}
    for r in rows:
        lines.append(
            f"| {r.seeds} | {r.spread:g}× | {truth.get(r.shift, f'{r.shift:g} margins')} | {r.steps} | "
            f"{r.replicates} | {r.coverage * 100:.0f}% | {r.equivalent * 100:.0f}% | {r.different * 100:.0f}% | "
            f"{r.p_above * 100:.0f}% | {r.seeds_needed:g} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------- one pair: "different"

PAIR_CASES = (
    ("AR 0", 100), ("AR 0", 300), ("AR 0", 1000),
    ("AR 0.5", 100), ("AR 0.5", 300), ("AR 0.5", 1000), ("AR 0.5", 3000),
    ("AR 0.9", 100), ("AR 0.9", 300), ("AR 0.9", 1000),
    ("AR 0.97", 100), ("AR 0.97", 300), ("AR 0.97", 1000),
    ("AR 0.99", 100), ("AR 0.99", 300), ("AR 0.99", 1000),
    ("ARFIMA d=0.2", 300), ("ARFIMA d=0.2", 1000),
    ("ARFIMA d=0.3", 300), ("ARFIMA d=0.3", 1000),
    ("ARFIMA d=0.4", 300), ("ARFIMA d=0.4", 1000),
    ("drift 0.15→0.05", 200), ("drift 0.15→0.05", 2000),
    ("t(2) noise", 150), ("t(2) noise", 1000),
    ("1 % outlier steps", 1000),
    ("one outlier step", 150),
    ("one 20-step spike", 3000),
)  # fmt: skip
"""Regimes of the one-pair calibration: every stationary and drift regime of the main table
(including those the ESS gate withholds), heavy tails, outliers and a single spike of one run."""


@dataclass(frozen=True)
class PairRow:
    """One pair's whole-window verdicts in one regime (fractions of replicates): ``gated`` below
    ``MIN_ESS`` (no ``equivalent`` possible, ``different`` still); ``different``: called different at
    a true difference equal to the margin (nominal at most 5 %); ``equivalent``: called equivalent at
    no difference; ``detected``: called different at four times the margin."""

    case: str
    steps: int
    replicates: int
    gated: float
    different: float
    equivalent: float
    detected: float


def _pair_noise(rng: np.random.Generator, case: str, reps: int, n: int) -> np.ndarray:
    """``(reps, n)`` per-step values of one run around 0 (the level is added by the caller)."""
    if case.startswith("AR "):
        return ar1(rng, reps, n, float(case[3:]))
    if case.startswith("ARFIMA"):
        return arfima(rng, reps, n, float(case.split("=")[1]))
    if case.startswith("drift"):
        return np.linspace(0.05, -0.05, n)[None, :] + ar1(rng, reps, n, 0.5)
    if case.startswith("t(2)"):
        return SD / 2 * rng.standard_t(2, (reps, n))
    x = ar1(rng, reps, n, 0.5)
    if case.startswith("1 %"):
        mask = rng.random((reps, n)) < 0.01
        return np.where(mask, rng.choice([-0.5, 0.5], (reps, n)), x)
    return x


def _spike(case: str, reps: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """One run's spike (``one outlier step``: +1.0 at one step; ``one 20-step spike``: +0.5 over 20
    steps), at a random place, with its window mean taken off the level so the truth is unchanged."""
    bump = np.zeros((reps, n))
    if case == "one outlier step":
        bump[np.arange(reps), rng.integers(0, n, reps)] = 1.0
    elif case == "one 20-step spike":
        for i, s in enumerate(rng.integers(0, n - 20, reps)):
            bump[i, s : s + 20] = 0.5
    return bump - bump.mean(axis=1, keepdims=True)


def _pair_verdicts(
    rng: np.random.Generator, case: str, reps: int, n: int, shift: float, trend_degree: int | None = None
) -> tuple[np.ndarray, ...]:
    """``(gated, different, equivalent)`` per replicate for run b at ``shift`` above run a, whole
    window, through the shipped interval code (``interval_rows``, ``direction_rows``).
    ``trend_degree``: a trend of that degree always removed before the variance (the rejected
    alternative of docs/STATISTICS.md, "A trend is not taken out on trust"); ``None``: the shipped
    rule (a trend only where the test finds one)."""
    ones = np.ones((reps, n))
    a = MEAN + _pair_noise(rng, case, reps, n)
    b = MEAN + shift + _pair_noise(rng, case, reps, n) + _spike(case, reps, n, rng)
    ra, za = linearise_rows(a, ones)
    rb, zb = linearise_rows(b, ones)
    value, z = rb - ra, zb - za
    v = long_run_variance(z, degree=trend_degree if trend_degree is not None and n >= MIN_UNITS else None)
    low, high = interval_rows(value, n, v, CONFIDENCE)
    d_low, d_high = direction_rows(value, n, v, z.std(axis=1))
    enough = n >= MIN_UNITS
    gated = ~(v.ess >= MIN_ESS)
    different = enough & ((d_low > TOLERANCE) | (d_high < -TOLERANCE))
    equivalent = enough & ~gated & ~different & (low > -TOLERANCE) & (high < TOLERANCE)
    return gated, different, equivalent


def pair_different(case: str, n: int, reps: int, seed: int, trend_degree: int | None = None) -> PairRow:
    """One regime of the one-pair calibration: per-step values (a reward-like quantity, one unit per
    step, so the truth is exact) of run a at ``MEAN`` and run b at ``MEAN + TOLERANCE`` (the margin),
    ``MEAN`` (no difference) and ``MEAN + 4 TOLERANCE``, each with its own noise of ``case``. A
    ``different`` that rests on single steps is further turned ``inconclusive`` by the comparison
    (``verdicts.judge``), so these rates of ``different`` are upper bounds of the shipped ones."""
    rng = np.random.default_rng([seed, 202, n, sum(map(ord, case))])
    gated, at_margin, _ = _pair_verdicts(rng, case, reps, n, TOLERANCE, trend_degree)
    _, _, at_zero = _pair_verdicts(rng, case, reps, n, 0.0, trend_degree)
    _, far, _ = _pair_verdicts(rng, case, reps, n, 4 * TOLERANCE, trend_degree)
    rate = lambda x: float(np.mean(x))  # noqa: E731
    return PairRow(case, n, reps, rate(gated), rate(at_margin), rate(at_zero), rate(far))


def pair_table(reps: int = 400, seed: int = 0, trend_degree: int | None = None) -> list[PairRow]:
    """Every row of the one-pair calibration table (docs/STATISTICS.md, "One pair of runs");
    ``trend_degree`` as in ``_pair_verdicts``."""
    return [pair_different(case, n, reps, seed, trend_degree) for case, n in PAIR_CASES]


def pair_markdown(rows: list[PairRow]) -> str:
    lines = [
        "| regime | steps | reps | ESS below the gate | different at the margin | equivalent at 0 | different at 4× the margin |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.case} | {r.steps} | {r.replicates} | {r.gated * 100:.0f}% | {r.different * 100:.1f}% | "
            f"{r.equivalent * 100:.0f}% | {r.detected * 100:.0f}% |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------ margins near zero

MARGIN_RELATIVE = 0.25
"""The gauge quantities' relative margin (``quantities.GAUGE_MARGIN``): ``|log(B / A)| < log(1.25)``."""
MARGIN_TOKENS = (1_000, 10_000)
"""Loss tokens per step of the margin simulation: a small run (5.5 M tokens over 1,000 steps)."""
MARGIN_WOBBLE = 0.3
"""Relative step-to-step wobble of a gauge quantity (sd of ``log p_t``), AR(1) at ``MARGIN_PHI``."""
MARGIN_PHI = 0.5
KL_SHAPE = 0.1
"""Gamma shape of one token's k3 (heavy-tailed: most tokens near 0, a few large)."""


@dataclass(frozen=True)
class MarginRow:
    """Whole-window verdicts at one level and floor (fractions of replicates). ``power``: equivalent
    at no difference; ``size``: equivalent at a true difference equal to the margin that applies
    (relative at ``level`` from ``floor / 25 %`` up, else the floor); ``false_different``: different
    there; ``twenty``: equivalent when run b is 20 times run a."""

    kind: str
    level: float
    floor: float
    steps: int
    replicates: int
    power: float
    size: float
    false_different: float
    twenty: float


def _gauge_runs(
    rng: np.random.Generator, kind: str, level: float, reps: int, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(num, den)`` of a gauge quantity at mean ``level``: clipped-token counts (``counts``) or
    per-token k3 sums (``sums``) over ``MARGIN_TOKENS`` tokens per step, with a multiplicative AR(1)
    wobble of the per-step rate."""
    tokens = rng.integers(MARGIN_TOKENS[0], MARGIN_TOKENS[1] + 1, (reps, n)).astype(float)
    x = ar1(rng, reps, n, MARGIN_PHI, MARGIN_WOBBLE)
    rate = level * np.exp(x - MARGIN_WOBBLE**2 / 2.0)
    if kind == "counts":
        return rng.binomial(tokens.astype(np.int64), np.minimum(rate, 1.0)).astype(float), tokens
    return rng.gamma(KL_SHAPE * tokens, rate / KL_SHAPE), tokens


def gauge_verdicts(
    a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], floor: float
) -> tuple[np.ndarray, np.ndarray]:
    """``(equivalent, different)`` per replicate, whole window, as ``pairs`` decides a quantity of
    scale ``auto``: on the log-ratio scale within ``log(1.25)`` when both runs are at least
    ``floor / 25 %`` (``floor = 0``: always relative), else on the absolute scale within ``floor``."""
    n = a[0].shape[1]
    ra, za = linearise_rows(*a)
    rb, zb = linearise_rows(*b)
    positive = (ra > 0) & (rb > 0)
    rel = positive & (np.minimum(ra, rb) >= floor / MARGIN_RELATIVE)
    safe_a, safe_b = np.where(positive, ra, 1.0), np.where(positive, rb, 1.0)
    z_log = zb / safe_b[:, None] - za / safe_a[:, None]
    value = np.where(rel, np.log(safe_b / safe_a), rb - ra)
    z = np.where(rel[:, None], z_log, zb - za)
    tol = np.where(rel, math.log1p(MARGIN_RELATIVE), floor)
    v = long_run_variance(z)
    low, high = interval_rows(value, n, v, CONFIDENCE)
    given = (v.ess >= MIN_ESS) & (n >= MIN_UNITS) & (rel | (floor > 0))
    return given & (low > -tol) & (high < tol), given & ((low > tol) | (high < -tol))


def margin_floor(kind: str, level: float, floor: float, n: int, reps: int, seed: int) -> MarginRow:
    """One row of the margin table: run a at ``level``; run b at ``level`` (power), at the margin
    that applies (size, false different) and at 20 times ``level``."""
    rng = np.random.default_rng([seed, int(round(-math.log10(level) * 100)), int(floor * 1e7), n])
    a = _gauge_runs(rng, kind, level, reps, n)
    at_margin = level * (1 + MARGIN_RELATIVE) if level >= floor / MARGIN_RELATIVE else level + floor
    eq0, _ = gauge_verdicts(a, _gauge_runs(rng, kind, level, reps, n), floor)
    eqm, diffm = gauge_verdicts(a, _gauge_runs(rng, kind, at_margin, reps, n), floor)
    eq20, _ = gauge_verdicts(a, _gauge_runs(rng, kind, 20 * level, reps, n), floor)
    rate = lambda x: float(np.mean(x))  # noqa: E731
    return MarginRow(kind, level, floor, n, reps, rate(eq0), rate(eqm), rate(diffm), rate(eq20))


MARGIN_LEVELS = {"counts": (1e-2, 1e-3, 4e-4, 1e-4, 3e-5, 1e-5), "sums": (1e-3, 1e-4, 1e-5, 1e-6)}
"""Levels of run a: clip fractions (fraction of tokens) and KL (nats per token)."""
MARGIN_FLOORS = {"counts": (0.0, 1e-5, 1e-4, 1e-3), "sums": (0.0, 1e-5)}
"""Floors compared (0: relative at every level)."""


def margin_table(reps: int = 200, seed: int = 0, n: int = 1000) -> list[MarginRow]:
    """Every row of the margin table (docs/STATISTICS.md, "Margins near zero")."""
    return [
        margin_floor(kind, level, floor, n, reps, seed)
        for kind, levels in MARGIN_LEVELS.items()
        for floor in MARGIN_FLOORS[kind]
        for level in levels
    ]


def margin_markdown(rows: list[MarginRow]) -> str:
    """The margin table as markdown (rates in %)."""
    lines = [
        "| quantity | floor | level of run a | steps | reps | equivalent at 0 | equivalent at the margin | "
        "different at the margin | equivalent at 20× |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        what = "clip fraction" if r.kind == "counts" else "mismatch KL"
        floor = "none" if r.floor == 0 else f"{r.floor:g}"
        lines.append(
            f"| {what} | {floor} | {r.level:g} | {r.steps} | {r.replicates} | {r.power * 100:.0f}% | "
            f"{r.size * 100:.0f}% | {r.false_different * 100:.0f}% | {r.twenty * 100:.0f}% |"
        )
    return "\n".join(lines)


def cases(reps: int = 400, seed: int = 0, quick: bool = False) -> list[Callable[[], Row]]:
    """Every case of the table, as thunks (run them to measure)."""
    from functools import partial

    out: list[Callable[[], Row]] = []
    ns = (300, 1000) if quick else (100, 300, 1000)
    for method in METHODS:
        for phi in (0.0, 0.5, 0.9, 0.97, 0.99):
            for n in ns:
                out.append(partial(stationary, method, n, reps, seed, phi=phi, throughout=n == 1000))
        for d in (0.2, 0.3, 0.4):
            for n in (300, 1000):
                out.append(partial(stationary, method, n, reps, seed, d=d, throughout=False))
        for n in (200, 2000, 20000):
            out.append(partial(drift, method, n, max(50, reps // (1 + n // 2000)), seed))
    out += [
        partial(episode, 1000, reps, seed),
        partial(episode, 3000, reps, seed),
        partial(lagged, 1000, reps, seed),
        partial(outliers, 150, reps, seed),
        partial(weighting, 1000, reps, seed),
        partial(bounded, 200, reps, seed),
        partial(seeds, 1000, max(100, reps // 2), seed),
    ]
    return out


def markdown(rows: list[Row]) -> str:
    """Rows as a markdown table (rates in %)."""
    head = (
        "| case | method | steps | reps | coverage, run | coverage, difference | with a verdict | "
        "size at margin | power (equivalent throughout at 0) | ESS reported / true | half-width / spread (pp) | detection |"
    )
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def pct(x: float) -> str:
        return "–" if x != x else f"{x * 100:.0f}%"

    for r in rows:
        ess = "–" if r.ess_true != r.ess_true else f"{r.ess_reported:.1f} / {r.ess_true:.1f}"
        hw = "–" if r.spread != r.spread else f"{r.half_width * 100:.3f} / {r.spread * 100:.3f}"
        lines.append(
            f"| {r.case} | {r.method} | {r.steps} | {r.replicates} | {pct(r.coverage_run)} | "
            f"{pct(r.coverage_difference)} | {pct(r.with_verdict)} | {pct(r.size)} | {pct(r.power)} | "
            f"{ess} | {hw} | {pct(r.detection)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="fewer run lengths")
    parser.add_argument("--json", action="store_true", help="print rows as JSON lines too")
    parser.add_argument("--margins", action="store_true", help="the margins-near-zero table only")
    parser.add_argument("--seeds", action="store_true", help="the stacks-judged-on-seeds table only")
    parser.add_argument("--pairs", action="store_true", help="the one-pair 'different' calibration only")
    parser.add_argument(
        "--trend-degree",
        type=int,
        default=None,
        help="with --pairs: always remove a trend of this degree (the rejected alternative; default: the shipped rule)",
    )
    args = parser.parse_args(argv)
    if args.pairs:
        print(pair_markdown(pair_table(args.replicates, args.seed, args.trend_degree)))
        return 0
    if args.seeds:
        print(run_level_markdown(run_level_table(args.replicates, args.seed)))
        for spread in RUN_SPREADS:
            m, rate = seeds_needed_check(spread, args.replicates, args.seed)
            print(
                f"seed sd {spread:g}x within: seeds_needed says {m}; equivalent with {m} seeds: {rate * 100:.0f}%"
            )
        return 0
    if args.margins:
        print(margin_markdown(margin_table(args.replicates, args.seed)))
        return 0
    rows = []
    for thunk in cases(args.replicates, args.seed, args.quick):
        rows.append(thunk())
        print(markdown(rows[-1:]).splitlines()[-1], flush=True)
    print(markdown(rows))
    if args.json:
        import json

        for r in rows:
            print(json.dumps(asdict(r)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
