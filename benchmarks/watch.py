"""The live watch against W&B's z-score filter: false alarms per 1,000 healthy steps and the delay
(steps) to a planted jump of the mismatch KL (x2, x5), on simulated series and on demo-trainer runs.

Simulated: 40 series of 2,000 steps per regime (a KL around 1e-3 with log-scale noise of marginal sd
0.2: independent, AR(1) 0.5 and 0.9, ARFIMA d 0.3 and 0.4, falling 100x, rising 10x). Demo: the cached
runs of ``benchmarks/demo_pairs.py`` (``benchmarks/.demo_runs``; ``kl_k3:mean`` as logged, zeros
included), in two groups: a fresh sampler (staleness 0) and one 2 steps stale, each several seeds.
A jump is planted at the series' midpoint (every later value times the factor); the delay is the
median over series of the steps from the jump to the first alarm at or after it ("missed": none
within the rest of the series; a series whose alarm episode covers the jump is left out of the
delays). The watch (``cliptrack.compare.stats.watch`` at its defaults: band from the first 100
points, ``log(x + 1e-5)``, the KL's floor) and W&B's ``MetricZScoreFilter`` at its defaults (window
30, threshold 3, on the values) read the same series. "worst run": the highest false-alarm rate of a
single series of the row.

Run: ``python -m benchmarks.watch``.
"""

from __future__ import annotations

import numpy as np
from cliptrack.compare import simulation as sim
from cliptrack.compare.quantities import KL_FLOOR
from cliptrack.compare.stats import watch as rule

from benchmarks.demo_pairs import CACHE

N, REPS = 2000, 40
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
            delays, missed = [], 0
            for x in series:
                at = x.size // 2
                y = x.copy()
                y[at:] *= factor
                alarms = detect(y)
                if any(at - rule.COOLDOWN <= i < at for i in alarms):
                    continue  # an alarm episode already covers the jump
                after = [i for i in alarms if i >= at]
                if after:
                    delays.append(after[0] - at)
                else:
                    missed += 1
            med = f"{np.median(delays):.0f}" if delays else "-"
            out[f"{name} x{factor}"] = med + (f" ({missed} missed)" if missed else "")
    return out


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
    for staleness, group in ((0, "fresh"), (2, "2 steps stale")):
        demo = demo_series(staleness)
        if demo:
            steps = sum(x.size - rule.WINDOW for x in demo)
            rows[f"demo, {group} ({len(demo)} runs, {steps} steps)"] = measure(demo)
    print("| series | " + " | ".join(COLUMNS) + " |")
    print("|---|" + "---:|" * len(COLUMNS))
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(row[c] for c in COLUMNS) + " |")


if __name__ == "__main__":
    main()
