"""The live watch against W&B's z-score filter: false alarms per 1,000 healthy steps and the delay
(steps) to a planted jump of the mismatch KL (x2, x5), on simulated series and on demo-trainer runs.

Simulated: 40 series of 2,000 steps per regime (a KL around 1e-3 with log-scale noise of marginal sd
0.2: independent, AR(1) 0.5 and 0.9, ARFIMA d 0.3 and 0.4, falling 100x, rising 10x). Demo: the cached
runs of ``benchmarks/demo_pairs.py`` (``benchmarks/.demo_runs``; ``kl_k3:mean``, positive values).
A jump is planted at the series' midpoint; the delay is the median over series of the steps from the
jump to the first alarm at or after it ("missed": none within the rest of the series). The watch
(``cliptrack.compare.stats.watch``: band from the first 100 points) and W&B's ``MetricZScoreFilter``
at its defaults (window 30, threshold 3, on the values) read the same series.

Run: ``python benchmarks/watch.py``.
"""

from __future__ import annotations

import numpy as np
from cliptrack.compare import simulation as sim
from cliptrack.compare.stats import watch as rule

from benchmarks.demo_pairs import CACHE

N, REPS = 2000, 40


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
    band = rule.own_band([z for v in x[: rule.WINDOW] if (z := rule.watched(float(v), "log")) is not None])
    cusum = rule.Cusum(band)
    return [i for i in range(rule.WINDOW, x.size) if cusum.update(i, float(x[i])) is not None]


def zscore(x: np.ndarray) -> list[int]:
    f = rule.ZScoreFilter()
    return [i for i in range(x.size) if f.update(float(x[i]))]


def measure(series: list[np.ndarray]) -> dict[str, str]:
    out = {}
    for name, detect in (("watch", ours), ("z-score", zscore)):
        alarms = sum(len(detect(x)) for x in series)
        steps = sum(x.size - (rule.WINDOW if name == "watch" else 0) for x in series)
        out[f"{name} FA"] = f"{1000 * alarms / steps:.2f}"
        for factor in (2, 5):
            delays, missed = [], 0
            for x in series:
                at = x.size // 2
                y = x.copy()
                y[at:] *= factor
                after = [i for i in detect(y) if i >= at]
                if after:
                    delays.append(after[0] - at)
                else:
                    missed += 1
            med = f"{np.median(delays):.0f}" if delays else "-"
            out[f"{name} x{factor}"] = med + (f" ({missed} missed)" if missed else "")
    return out


def demo_series() -> list[np.ndarray]:
    out = []
    for path in sorted(CACHE.glob("miles-s*-seed*.npz")):
        with np.load(path) as data:
            x = data["kl_k3:mean"]
        x = x[np.isfinite(x) & (x > 0)]
        if x.size >= 300:
            out.append(x)
    return out


def main() -> None:
    rng = np.random.default_rng(0)
    rows = {name: measure(list(1e-3 * np.exp(z))) for name, z in regimes(rng).items()}
    demo = demo_series()
    if demo:
        rows[f"demo runs ({len(demo)})"] = measure(demo)
    cols = ["watch FA", "z-score FA", "watch x2", "z-score x2", "watch x5", "z-score x5"]
    print("| series | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(row[c] for c in cols) + " |")


if __name__ == "__main__":
    main()
