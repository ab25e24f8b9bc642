"""The live watch against W&B's z-score filter: false alarms per 1,000 healthy steps and the delay
(steps) to a planted jump of the mismatch KL (x2, x5), on simulated series and on demo-trainer runs.

Simulated: 40 series of 2,000 steps per regime (a KL around 1e-3 with log-scale noise of marginal sd
0.2: independent, AR(1) 0.5 and 0.9, ARFIMA d 0.3 and 0.4, falling 100x, rising 10x), and 40 of
3,000 steps of a fresh sampler's KL sinking below its floor with clustered healthy bursts
(``fresh_sampler``, matched to the demo runs' summary statistics). Demo: the cached
runs of ``benchmarks/demo_pairs.py`` (``benchmarks/.demo_runs``; ``kl_k3:mean`` as logged, zeros
included), in two groups: a fresh sampler (staleness 0) and one 2 steps stale, each several seeds.
A jump is planted at the series' midpoint (every later value times the factor); the delay is the
median over series of the steps from the jump to the first alarm at or after it ("missed": none
within the rest of the series; a series whose alarm episode covers the jump is left out of the
delays). On the series that sit at their floor (a fresh sampler), where a jump multiplies values
the floor hides, the delay to the KL back at about 1e-3 from the midpoint is measured too. The watch (``cliptrack.compare.stats.watch`` at its defaults: band from the first 100
points, ``log(x + 1e-5)``, the KL's floor) and W&B's ``MetricZScoreFilter`` at its defaults (window
30, threshold 3, on the values) read the same series. "worst run": the highest false-alarm rate of a
single series of the row.

Run: ``python -m benchmarks.watch``.
"""

from __future__ import annotations

import math

import numpy as np
from cliptrack.compare.quantities import KL_FLOOR
from cliptrack.compare.stats import watch as rule

from benchmarks.demo_pairs import CACHE
from research import simulation as sim

N, REPS = 2000, 40
N_FRESH = 3000
KEY = "kl_k3:mean"


def regimes(rng: np.random.Generator) -> dict[str, np.ndarray]:
    t = np.arange(N)
    return {
        "independent": sim.ar1(rng, REPS, N, 0.0, 0.2),
        "AR(1) 0.5": sim.ar1(rng, REPS, N, 0.5, 0.2),
        "AR(1) 0.9": sim.ar1(rng, REPS, N, 0.9, 0.2),
        "ARFIMA d=0.3": sim.arfima(rng, REPS, N, 0.3, 0.2),
        "ARFIMA d=0.4": sim.arfima(rng, REPS, N, 0.4, 0.2),
        "falling 100x": sim.ar1(rng, REPS, N, 0.5, 0.2) - np.log(100) * t / N,
        "rising 10x": sim.ar1(rng, REPS, N, 0.5, 0.2) + np.log(10) * t / N,
    }


def fresh_sampler(rng: np.random.Generator, n: int = 3000) -> np.ndarray:
    """A fresh sampler's mismatch KL as the demo trainer logs it (its summary statistics after step
    300 match the cached runs': about 15 % of points above 1e-4, 7 % above 1e-3, 1.5 % above 1e-2,
    9 % exact zeros, bursts in clusters whose rate drifts from none to half the points of a 50-step
    block). Steps 0-99: about 2.5e-3, AR(1) 0.6 on the log scale; then a level falling a decade per
    ~80 steps with log10 noise widening from sd 1 to 3 (1e-7 to 1e-15), exact zeros in up to 12 % of
    steps; over it, bursts starting with a probability ``0.09 exp(u_t - 1/2)`` (``u`` AR(1) 0.98 of sd
    1: a slowly drifting burst rate), of size ``10^N(-2.6, 0.6)`` (about 2.5e-3) decaying 10x a step."""
    t = np.arange(n)
    early, drift = np.zeros(n), np.zeros(n)
    eps, kicks = rng.normal(0.0, 1.0, n), rng.normal(0.0, math.sqrt(1 - 0.98**2), n)
    for i in range(1, n):
        early[i] = 0.6 * early[i - 1] + eps[i]
        drift[i] = 0.98 * drift[i - 1] + kicks[i]
    x = 2.5e-3 * np.exp(0.32 * early)
    since = np.maximum(t - 100, 0)
    low = 10 ** (-2.6 - 0.012 * since + rng.normal(0.0, 1.0 + 2.0 * np.minimum(since / 500, 1.0)))
    x[100:] = low[100:]
    zero = rng.random(n) < 0.12 * np.minimum(since / 300, 1.0)
    x[zero & (t >= 100)] = 0.0
    starts = np.flatnonzero((rng.random(n) < np.minimum(0.09 * np.exp(drift - 0.5), 0.8)) & (t >= 100))
    for s in starts:
        burst = 10 ** rng.normal(-2.6, 0.6) * 0.1 ** np.arange(min(6, n - s))
        x[s : s + burst.size] = np.maximum(x[s : s + burst.size], burst)
    return x


def ours(x: np.ndarray) -> list[int]:
    z = [w for v in x[: rule.WINDOW] if (w := rule.watched(float(v), "log", KL_FLOOR)) is not None]
    cusum = rule.Cusum(rule.own_band(z, "log", KL_FLOOR))
    return [i for i in range(rule.WINDOW, x.size) if cusum.update(i, float(x[i])) is not None]


def zscore(x: np.ndarray) -> list[int]:
    f = rule.ZScoreFilter()
    return [i for i in range(x.size) if f.update(float(x[i]))]


def measure(series: list[np.ndarray]) -> dict[str, str]:
    out = {}
    for name, detect in (("watch", ours), ("z-score", zscore)):
        skip = rule.WINDOW if name == "watch" else 0
        rates = [(len(detect(x)), x.size - skip) for x in series]
        out[f"{name} FA"] = f"{1000 * sum(a for a, _ in rates) / sum(s for _, s in rates):.2f}"
        out[f"{name} worst"] = f"{max(1000 * a / s for a, s in rates):.2f}"
        for factor in (2, 5):

            def jump(y: np.ndarray, at: int, _: np.random.Generator, factor: float = factor) -> None:
                y[at:] *= factor

            out[f"{name} x{factor}"] = delay(detect, series, jump)
        out[f"{name} 1e-3"] = delay(detect, series, back_to)
    return out


def delay(detect, series: list[np.ndarray], plant) -> str:
    """Median steps from the midpoint to the first alarm at or after it, over the series with
    ``plant(y, at, rng)`` applied from the midpoint on (a series whose alarm episode covers it is
    left out; "missed": no alarm in the rest of the series)."""
    rng = np.random.default_rng(1)
    delays, missed = [], 0
    for x in series:
        at = x.size // 2
        y = x.copy()
        plant(y, at, rng)
        alarms = detect(y)
        if any(at - rule.COOLDOWN <= i < at for i in alarms):
            continue  # an alarm episode already covers the change
        after = [i for i in alarms if i >= at]
        if after:
            delays.append(after[0] - at)
        else:
            missed += 1
    med = f"{np.median(delays):.0f}" if delays else "-"
    return med + (f" ({missed} missed)" if missed else "")


def back_to(y: np.ndarray, at: int, rng: np.random.Generator) -> None:
    """The KL back at about 1e-3 (log-scale sd 0.3) from ``at`` on, where it is below that."""
    y[at:] = np.maximum(y[at:], 1e-3 * np.exp(rng.normal(0.0, 0.3, y.size - at)))


def demo_series(staleness: int) -> list[np.ndarray]:
    out = []
    for path in sorted(CACHE.glob(f"miles-s{staleness}-seed*.npz")):
        with np.load(path) as data:
            x = data[KEY]
        x = x[np.isfinite(x)]
        if x.size >= 300:
            out.append(x)
    return out


COLUMNS = ["watch FA", "watch worst", "z-score FA", "watch x2", "z-score x2", "watch x5", "z-score x5"]


def main() -> None:
    rng = np.random.default_rng(0)
    rows = {name: measure(list(1e-3 * np.exp(z))) for name, z in regimes(rng).items()}
    rows["fresh sampler, simulated"] = measure([fresh_sampler(rng, N_FRESH) for _ in range(REPS)])
    for staleness, group in ((0, "fresh"), (2, "2 steps stale")):
        demo = demo_series(staleness)
        if demo:
            steps = sum(x.size - rule.WINDOW for x in demo)
            rows[f"demo, {group} ({len(demo)} runs, {steps} steps)"] = measure(demo)
    print("| series | " + " | ".join(COLUMNS) + " |")
    print("|---|" + "---:|" * len(COLUMNS))
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(row[c] for c in COLUMNS) + " |")
    print("\nDelay (steps) to a KL back at 1e-3 from the midpoint, series at their floor:\n")
    print("| series | watch | z-score |\n|---|---:|---:|")
    for name, row in rows.items():
        if "fresh" in name:
            print(f"| {name} | {row['watch 1e-3']} | {row['z-score 1e-3']} |")


if __name__ == "__main__":
    main()
