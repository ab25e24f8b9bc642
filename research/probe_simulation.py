"""The paired probe's verdict measured with known truth: ``python -m research.probe_simulation``.

A probe batch is ``datums`` sequences of 20–400 eligible tokens. Clip fraction: each sequence has
its own clip propensity ``p_i ~ Beta(1, 12)`` (mean 7.7 %: tokens of a sequence are correlated,
which the clustered interval must absorb); stack a clips each token with ``p_i``; stack b clips
the tokens a clips, and of the others a share ``(k - 1) p_i / (1 - p_i)`` (so its rate is
``k p_i``), with symmetric disagreement on 2 % of a's clipped tokens each way on top (rounding near
the band). Mismatch KL: a sequence's k3 sum is its tokens times a log-normal level (sd 1); stack b's
is ``k`` times a's times ``1 + N(0, 0.05^2)`` per sequence. ``k = 1``: no difference;
``k = 1.10526``: the true difference equals the margin (relative 10 %: ``c_b - c_a = 0.1 (c_a +
c_b) / 2``); ``k = 1.25``: a real difference of about twice the margin. Columns: **equivalent** and **different** shares (at the margin both are errors,
nominal <= 5 % each; at 0, equivalent is the power).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
from cliptrack.compare.probe import CLIP_FRACTION, KL_K3, MARGINS
from cliptrack.compare.stats import probe as ps
from cliptrack.compare.stats.estimate import DIFFERENT, EQUIVALENT

AT_MARGIN = 1.05 / 0.95
"""Ratio b/a at which the true difference equals a 10 % relative margin of the two stacks' mean."""
DETECT = 1.25
"""Ratio b/a of a real difference (about twice the margin), which the probe should call different."""


@dataclass(frozen=True)
class Row:
    """One case: its quantity, datums, ratio ``k`` (b / a), replicates, and the shares called
    equivalent and different."""

    quantity: str
    datums: int
    ratio: float
    replicates: int
    equivalent: float
    different: float


def _clip_replicate(rng: np.random.Generator, datums: int, k: float) -> str:
    tokens = rng.integers(20, 401, datums)
    p = rng.beta(1.0, 12.0, datums)
    flip = 0.02
    both_p = p * (1 - flip)
    a_only_p = p * flip
    b_only_p = np.minimum((k - 1.0) * p + p * flip, 1.0 - p)  # b's rate: p (1 - flip) + this = k p
    neither_p = np.clip(1.0 - both_p - a_only_p - b_only_p, 0.0, 1.0)
    probs = np.stack([both_p, a_only_p, b_only_p, neither_p], axis=1)
    counts = np.array([rng.multinomial(t, pr / pr.sum()) for t, pr in zip(tokens, probs, strict=True)])
    both, a_only, b_only = counts[:, 0], counts[:, 1], counts[:, 2]
    num_a, num_b = both + a_only, both + b_only
    pair = ps.paired_ratio(num_a, num_b, tokens)
    test = ps.clip_test(int(a_only.sum()), int(b_only.sum()), int(both.sum()), int(tokens.sum()))
    margin = MARGINS[CLIP_FRACTION].near(0.5 * (pair.value_a + pair.value_b))
    return ps.hull_verdict(min(pair.low, test.low), max(pair.high, test.high), margin, pair.reason)


def _kl_replicate(rng: np.random.Generator, datums: int, k: float) -> str:
    tokens = rng.integers(20, 401, datums).astype(float)
    level = 0.01 * np.exp(rng.normal(0.0, 1.0, datums))
    num_a = tokens * level
    num_b = k * num_a * (1.0 + rng.normal(0.0, 0.05, datums))
    pair = ps.paired_ratio(num_a, num_b, tokens)
    margin = MARGINS[KL_K3].near(0.5 * (abs(pair.value_a) + abs(pair.value_b)))
    return ps.hull_verdict(pair.low, pair.high, margin, pair.reason)


CASES = tuple(
    (quantity, datums, ratio)
    for quantity in (CLIP_FRACTION, KL_K3)
    for datums in (32, 256)
    for ratio in (1.0, AT_MARGIN, DETECT)
)


def simulate(
    replicates: int = 400, seed: int = 0, cases: tuple[tuple[str, int, float], ...] = CASES
) -> list[Row]:
    """Every case of ``cases`` over ``replicates`` replicates (fixed ``seed``)."""
    rng = np.random.default_rng(seed)
    rows = []
    for quantity, datums, ratio in cases:
        one = _clip_replicate if quantity == CLIP_FRACTION else _kl_replicate
        verdicts = [one(rng, datums, ratio) for _ in range(replicates)]
        rows.append(
            Row(
                quantity,
                datums,
                ratio,
                replicates,
                verdicts.count(EQUIVALENT) / replicates,
                verdicts.count(DIFFERENT) / replicates,
            )
        )
    return rows


def table(rows: list[Row]) -> str:
    """The rows as a markdown table."""
    lines = [
        "| quantity | datums | true difference | reps | equivalent | different |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for row in rows:
        truth = {1.0: "0", AT_MARGIN: "= margin"}.get(row.ratio, f"b = {row.ratio:g} × a")
        lines.append(
            f"| {row.quantity} | {row.datums} | {truth} | {row.replicates} | "
            f"{row.equivalent:.1%} | {row.different:.1%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--replicates", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(table(simulate(args.replicates, args.seed)))


if __name__ == "__main__":
    main()
