"""Simulated runs with known truth: how often the comparison's intervals cover and its verdicts err.

A run of ``n`` steps: per-step clip probability ``p_t = mean + x_t`` with ``x`` a stationary AR(1)
wobble (coefficient ``phi``, marginal standard deviation ``sd``), ``loss_tokens_t`` uniform on
5,000..50,000 and ``clipped_t ~ Binomial(loss_tokens_t, p_t)``. Two runs are independent (their
wobbles are not shared: the hardest case for a paired comparison). The truth of a run's clip
fraction is ``mean``, of a difference ``mean_b - mean_a``.

``measure`` returns, per autocorrelation and run length: the coverage of 90 % intervals for one run
and for a difference, the share of comparisons given a verdict (enough steps and effective sample),
and the verdict rates against a margin ``tol``:

- ``false_equivalent``: called equivalent at a true difference of exactly ``tol``, among the
  comparisons given a verdict (nominal at most 5 %);
- ``false_different``: called different at no difference, among those given a verdict;
- ``power``: called different at a true difference of ``2 tol`` (all comparisons);
- ``equivalent``: called equivalent at no difference (all comparisons).

``method="fixed-b"`` measures the shipped code (``stats.mean_intervals``). The other candidates,
measured once to choose it (``python -m tracking.compare.simulation --candidates``):

- ``"bootstrap-cuberoot"``: circular block bootstrap, block ``ceil(n^(1/3))``, percentile interval
  (the method this package used before);
- ``"bootstrap-pw"``: circular block bootstrap with the Politis–White block length (Patton's
  correction) estimated on the linearised series, percentile interval;
- ``"newey-west"``: Bartlett HAC with Andrews' AR(1) plug-in bandwidth and normal critical values.

Block sums come from running totals (one cumulative sum per series), so a bootstrap replicate costs
one draw per block, not one index per step.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np

from tracking.compare.stats import MIN_ESS, MIN_UNITS, autocovariances


def fixed_b_critical_value(b: float, confidence: float = 0.90) -> float:
    """Two-sided critical value of the Bartlett fixed-b t statistic at bandwidth ``b * n``
    (Kiefer & Vogelsang 2005 cubic fits at 90 % and 95 %, interpolated in the normal quantile)."""
    b = min(max(float(b), 0.0), 1.0)
    fits = {0.90: (2.1859, 0.3142, -0.3427), 0.95: (2.9694, 0.4160, -0.5324)}
    z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
    z90, z95 = NormalDist().inv_cdf(0.95), NormalDist().inv_cdf(0.975)
    w = (z - z90) / (z95 - z90)
    c = [lo + w * (hi - lo) for lo, hi in zip(fits[0.90], fits[0.95], strict=True)]
    return z + c[0] * b + c[1] * b * b + c[2] * b**3


def lag1_ess(gammas: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The previous ESS: ``n (1 - r) / (1 + r)`` from the lag-1 autocorrelation with Kendall's bias
    correction ``r = rho + (1 + 3 rho) / n`` (within ±0.99), capped at ``n``."""
    g = np.atleast_2d(gammas)
    if n < 2:
        return np.full(g.shape[0], np.nan), np.full(g.shape[0], float(n))
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.where(g[:, 0] > 0, g[:, 1] / g[:, 0], np.nan)
        r = np.clip(rho + (1.0 + 3.0 * rho) / n, -0.99, 0.99)
        ess = np.where(np.isfinite(rho), np.minimum(n, n * (1.0 - r) / (1.0 + r)), float(n))
    return rho, ess


def mean_intervals(
    z: np.ndarray, values: np.ndarray, confidence: float = 0.90
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The previous method: fixed-b Bartlett HAC (b = 1) interval and lag-1 ESS, per row."""
    z = np.atleast_2d(np.asarray(z, dtype=float))
    values = np.asarray(values, dtype=float).reshape(-1)
    n = z.shape[1]
    g = autocovariances(z)
    rho, ess = lag1_ess(g, n)
    weights = np.clip(1.0 - np.arange(1, n) / n, 0.0, None)
    lrv = np.maximum(g[:, 0] + 2.0 * (g[:, 1:] @ weights), 0.0)
    half = fixed_b_critical_value(1.0, confidence) * np.sqrt(lrv / n)
    return values - half, values + half, rho, ess


TOKENS = (5_000, 50_000)
"""Loss tokens per step, uniform integers in this closed range."""
MEAN = 0.10
"""Clip probability of run a (fraction of tokens)."""
SD = 0.02
"""Marginal standard deviation of the per-step wobble of the clip probability."""
TOLERANCE = 0.02
"""Equivalence margin (absolute, fraction of tokens)."""
METHODS = ("fixed-b", "newey-west", "bootstrap-cuberoot", "bootstrap-pw")


def simulate(
    rng: np.random.Generator, replicates: int, n: int, phi: float, mean: float, sd: float = SD
) -> tuple[np.ndarray, np.ndarray]:
    """``(clipped, loss_tokens)``, each ``(replicates, n)`` float arrays of integer counts."""
    from scipy.signal import lfilter

    shocks = rng.normal(0.0, sd * math.sqrt(1.0 - phi * phi), (replicates, n))
    start = rng.normal(0.0, sd, replicates)
    wobble = lfilter([1.0], [1.0, -phi], shocks, axis=1, zi=(phi * start)[:, None])[0]
    tokens = rng.integers(TOKENS[0], TOKENS[1] + 1, (replicates, n))
    clipped = rng.binomial(tokens, np.clip(mean + wobble, 0.001, 0.999))
    return clipped.astype(float), tokens.astype(float)


def _linearise(num: np.ndarray, den: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ratio = num.sum(axis=1) / den.sum(axis=1)
    return ratio, (num - ratio[:, None] * den) / den.mean(axis=1, keepdims=True)


def _newey_west(
    z: np.ndarray, values: np.ndarray, confidence: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    n = z.shape[1]
    g = autocovariances(z)
    rho, ess = lag1_ess(g, n)
    r = np.clip(np.nan_to_num(rho), -0.99, 0.99)
    alpha = 4 * r * r / ((1 - r) ** 2 * (1 + r) ** 2)
    m = np.minimum(1.1447 * (alpha * n) ** (1 / 3), n - 1)
    w = np.clip(1 - np.arange(1, n)[None, :] / (m[:, None] + 1), 0, None)
    lrv = np.maximum(g[:, 0] + 2 * (w * g[:, 1:]).sum(axis=1), 0)
    half = NormalDist().inv_cdf(0.5 + confidence / 2) * np.sqrt(lrv / n)
    return values - half, values + half, rho, ess


def politis_white_block(z: np.ndarray) -> int:
    """Politis & White (2004) block length for the circular bootstrap, with Patton, Politis & White's
    (2009) correction (``D = 4/3 g(0)^2``), on one series; at least 1, at most ``n``."""
    n = z.size
    g = autocovariances(z)
    if not g[0] > 0:
        return 1
    rho = g / g[0]
    kn = max(5, int(math.ceil(math.sqrt(math.log10(n)))))
    mmax = int(math.ceil(math.sqrt(n))) + kn
    c = 2.0 * math.sqrt(math.log10(n) / n)
    mhat = mmax
    for m in range(1, min(mmax, n - kn)):
        if np.all(np.abs(rho[m + 1 : m + 1 + kn]) < c):
            mhat = m
            break
    big_m = min(2 * mhat, mmax, n - 1)
    k = np.arange(-big_m, big_m + 1)
    t = np.abs(k) / max(big_m, 1)
    lam = np.where(t <= 0.5, 1.0, 2.0 * (1.0 - t))
    gk = g[np.abs(k)]
    big_g = float(np.sum(lam * np.abs(k) * gk))
    g0 = float(np.sum(lam * gk))
    d = 4.0 / 3.0 * g0 * g0
    if d <= 0:
        return 1
    return int(min(n, max(1, round((2 * big_g * big_g / d) ** (1 / 3) * n ** (1 / 3)))))


def block_sums(x: np.ndarray, block: int) -> np.ndarray:
    """Sums of the ``n`` circular blocks ``x[s], ..., x[s + block - 1]`` (mod ``n``), from one running total."""
    n = x.size
    ext = np.concatenate([x, x[: block - 1]]) if block > 1 else x
    c = np.concatenate([[0.0], np.cumsum(ext)])
    return c[block : block + n] - c[:n]


def bootstrap_replicates(
    series: list[np.ndarray], block: int, n_boot: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """Circular block bootstrap totals of each series, the same block draws for all of them.

    ``ceil(n / block)`` blocks per replicate; the last is cut so a replicate has ``n`` units: its
    total is the full blocks' sums plus the running-total sum of the cut block.
    """
    n = series[0].size
    block = max(1, min(block, n))
    k_full, rest = divmod(n, block)
    starts = rng.integers(0, n, (n_boot, k_full + (1 if rest else 0)))
    out = []
    for x in series:
        totals = block_sums(x, block)[starts[:, :k_full]].sum(axis=1)
        if rest:
            totals = totals + block_sums(x, rest)[starts[:, k_full]]
        out.append(totals)
    return out


def _bootstrap(
    arrays: list[np.ndarray],
    paired: bool,
    method: str,
    confidence: float,
    rng: np.random.Generator,
    n_boot: int,
) -> tuple[np.ndarray, np.ndarray]:
    rows, n = arrays[0].shape
    low, high = np.empty(rows), np.empty(rows)
    alpha = (1 - confidence) / 2
    for i in range(rows):
        series = [a[i] for a in arrays]
        if method == "bootstrap-cuberoot":
            block = max(1, math.ceil(n ** (1 / 3)))
        else:
            if paired:
                _, za = _linearise(series[0][None], series[1][None])
                _, zb = _linearise(series[2][None], series[3][None])
                z = (zb - za)[0]
            else:
                z = _linearise(series[0][None], series[1][None])[1][0]
            block = politis_white_block(z)
        tot = bootstrap_replicates(series, block, n_boot, rng)
        stat = tot[2] / tot[3] - tot[0] / tot[1] if paired else tot[0] / tot[1]
        low[i], high[i] = np.quantile(stat, [alpha, 1 - alpha])
    return low, high


def _intervals(
    method: str, arrays: list[np.ndarray], confidence: float, rng: np.random.Generator, n_boot: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(value, low, high, n_eff)`` per replicate for one run (2 arrays) or a difference (4 arrays)."""
    paired = len(arrays) == 4
    if paired:
        ra, za = _linearise(arrays[0], arrays[1])
        rb, zb = _linearise(arrays[2], arrays[3])
        value, z = rb - ra, zb - za
    else:
        value, z = _linearise(arrays[0], arrays[1])
    if method == "fixed-b":
        low, high, _, ess = mean_intervals(z, value, confidence)
    elif method == "newey-west":
        low, high, _, ess = _newey_west(z, value, confidence)
    elif method in ("bootstrap-cuberoot", "bootstrap-pw"):
        _, ess = lag1_ess(autocovariances(z), z.shape[1])
        low, high = _bootstrap(arrays, paired, method, confidence, rng, n_boot)
    else:
        raise ValueError(f"method {method!r} is not one of {METHODS}")
    return value, low, high, ess


@dataclass(frozen=True)
class Row:
    """Measured rates for one method, autocorrelation and run length (fractions of replicates)."""

    method: str
    phi: float
    steps: int
    replicates: int
    coverage_run: float
    coverage_difference: float
    with_verdict: float
    false_equivalent: float
    false_different: float
    power: float
    equivalent: float


def _rate(hits: np.ndarray, given: np.ndarray) -> float:
    return float(hits[given].mean()) if given.any() else float("nan")


def measure_one(
    method: str,
    phi: float,
    n: int,
    replicates: int,
    seed: int,
    *,
    confidence: float = 0.90,
    tol: float = TOLERANCE,
    n_boot: int = 500,
) -> Row:
    """One row of the table (see the module docstring); fixed ``seed``, so it repeats exactly."""
    rng = np.random.default_rng([seed, int(round(phi * 1000)), n])
    a = simulate(rng, replicates, n, phi, MEAN)
    value, low, high, _ = _intervals(method, list(a), confidence, rng, n_boot)
    coverage_run = float(np.mean((low < MEAN) & (MEAN < high)))
    verdicts = {}
    for shift in (0.0, tol, 2 * tol):
        b = simulate(rng, replicates, n, phi, MEAN + shift)
        d, lo, hi, ess = _intervals(method, [*a, *b], confidence, rng, n_boot)
        given = (ess >= MIN_ESS) & (n >= MIN_UNITS)
        verdicts[shift] = (d, lo, hi, given)
    d, lo, hi, given = verdicts[tol]
    coverage_difference = float(np.mean((lo < tol) & (tol < hi)))
    false_equivalent = _rate((lo > -tol) & (hi < tol), given)
    d0, lo0, hi0, given0 = verdicts[0.0]
    false_different = _rate((lo0 > tol) | (hi0 < -tol), given0)
    equivalent = float(np.mean(given0 & (lo0 > -tol) & (hi0 < tol)))
    _, lo2, hi2, given2 = verdicts[2 * tol]
    power = float(np.mean(given2 & ((lo2 > tol) | (hi2 < -tol))))
    return Row(
        method,
        phi,
        n,
        replicates,
        coverage_run,
        coverage_difference,
        float(given.mean()),
        false_equivalent,
        false_different,
        power,
        equivalent,
    )


def measure(
    method: str = "fixed-b",
    phis: tuple[float, ...] = (0.0, 0.5, 0.9),
    steps: tuple[int, ...] = (20, 50, 100, 200, 1000),
    replicates: int = 400,
    seed: int = 0,
    n_boot: int = 500,
) -> list[Row]:
    """The table for ``method``: one row per autocorrelation ``phi`` and run length."""
    return [measure_one(method, phi, n, replicates, seed, n_boot=n_boot) for phi in phis for n in steps]


def markdown(rows: list[Row]) -> str:
    """Rows as a markdown table (rates in %)."""
    head = (
        "| method | AR coef. | steps | coverage, run | coverage, difference | with a verdict | "
        "false equivalent | false different | different at 2× margin | equivalent at 0 |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def pct(x: float) -> str:
        return "–" if x != x else f"{x * 100:.0f}%"

    for r in rows:
        lines.append(
            f"| {r.method} | {r.phi:g} | {r.steps} | {pct(r.coverage_run)} | {pct(r.coverage_difference)} | "
            f"{pct(r.with_verdict)} | {pct(r.false_equivalent)} | {pct(r.false_different)} | "
            f"{pct(r.power)} | {pct(r.equivalent)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--candidates", action="store_true", help="measure every candidate method, not only fixed-b"
    )
    parser.add_argument("--replicates", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print rows as JSON lines too")
    args = parser.parse_args(argv)
    methods = METHODS if args.candidates else ("fixed-b",)
    rows = []
    for method in methods:
        reps = args.replicates if not method.startswith("bootstrap") else max(100, args.replicates // 4)
        rows += measure(method, replicates=reps, seed=args.seed)
        print(markdown([r for r in rows if r.method == method]), flush=True)
    if args.json:
        import json

        for r in rows:
            print(json.dumps(asdict(r)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
