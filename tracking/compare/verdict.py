"""``compare``: per-run estimates, paired differences against a reference run, and the verdict.

The first run named is the reference; every other run is compared with it. For each quantity
(``metrics.MetricSpec``) the table holds, per run, the ratio-of-sums estimate over the window with a
block-bootstrap interval (and, for token fractions, the Wilson interval on token counts for
reference), and per pair the difference over the units both runs logged with a paired
block-bootstrap interval and a TOST-style verdict against the tolerance:

- ``equivalent``: the whole interval of the difference lies within ``±tolerance``;
- ``different``: the whole interval lies outside ``±tolerance``;
- ``inconclusive``: anything else (more steps would settle it).

Intervals are 90 % by default (``DEFAULT_CONFIDENCE``), which makes "equivalent" a two one-sided
test at the 5 % level. The bootstrap generator is seeded (``seed=0``), so a comparison repeats exactly.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from tracking.compare import metrics as m
from tracking.compare.align import ALIGNMENTS, Window, unit_table
from tracking.compare.frame import RunSet
from tracking.compare.stats import (
    DIFFERENT,
    EQUIVALENT,
    INCONCLUSIVE,
    Estimate,
    equivalence_verdict,
    paired_ratio_difference,
    ratio_estimate,
    wilson_interval,
)

MetricSpec = m.MetricSpec
DEFAULT_CONFIDENCE = 0.90
"""Two-sided confidence of every interval (TOST at 5 %)."""
DEFAULT_TOLERANCES = {spec.name: spec.tolerance for spec in m.DEFAULT_SPECS}
"""Equivalence margins by quantity: clip fractions 0.02 absolute, reward and throughput 5 % relative."""
DEFAULT_N_BOOT = 2000


@dataclass(frozen=True)
class RunEstimate:
    """One run's estimate of one quantity over the window."""

    metric: str
    run: str
    backend: str
    estimate: Estimate
    total_numerator: float
    total_denominator: float
    wilson_low: float = float("nan")
    wilson_high: float = float("nan")


@dataclass(frozen=True)
class Difference:
    """Run ``run`` minus the reference on one quantity, over the units both logged.

    ``estimate`` is absolute (``R_run - R_ref``) or relative (``(R_run - R_ref) / |R_ref|``) as ``relative``
    says; ``tolerance`` is in the same terms.
    """

    metric: str
    reference: str
    run: str
    estimate: Estimate
    tolerance: float
    relative: bool
    verdict: str
    counts_for_verdict: bool


@dataclass
class ComparisonResult:
    """Everything ``compare`` found, with table, summary and markdown renderings."""

    runs: list[str]
    backends: dict[str, str]
    align: str
    window: Window
    confidence: float
    n_boot: int
    seed: int
    specs: list[MetricSpec]
    estimates: list[RunEstimate] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def reference(self) -> str:
        return self.runs[0]

    def difference(self, metric: str, run: str | None = None) -> Difference:
        """The difference of ``run`` (default: the second run) from the reference on ``metric``."""
        run = run or self.runs[1]
        for d in self.differences:
            if d.metric == metric and d.run == run:
                return d
        raise KeyError(f"no difference for metric {metric!r} and run {run!r}")

    def run_estimate(self, metric: str, run: str) -> RunEstimate:
        for e in self.estimates:
            if e.metric == metric and e.run == run:
                return e
        raise KeyError(f"no estimate for metric {metric!r} and run {run!r}")

    @property
    def on_policy_verdict(self) -> str:
        """The clip-fraction verdict over all compared pairs (worst of them)."""
        verdicts = [d.verdict for d in self.differences if d.metric == m.CLIP.name]
        if not verdicts:
            return INCONCLUSIVE
        if DIFFERENT in verdicts:
            return DIFFERENT
        if INCONCLUSIVE in verdicts:
            return INCONCLUSIVE
        return EQUIVALENT

    def estimates_table(self) -> pd.DataFrame:
        """One row per (metric, run): estimate, interval, Wilson interval, units, totals."""
        rows = []
        for e in self.estimates:
            rows.append({
                "metric": e.metric, "run": e.run, "backend": e.backend, "estimate": e.estimate.value,
                "ci_low": e.estimate.low, "ci_high": e.estimate.high,
                "wilson_low": e.wilson_low, "wilson_high": e.wilson_high,
                "units": e.estimate.n_units, "block": e.estimate.block_length,
                "numerator": e.total_numerator, "denominator": e.total_denominator,
            })
        return pd.DataFrame(rows)

    def differences_table(self) -> pd.DataFrame:
        """One row per (metric, run vs reference): difference, interval, tolerance, verdict."""
        rows = []
        for d in self.differences:
            rows.append({
                "metric": d.metric, "reference": d.reference, "run": d.run,
                "difference": d.estimate.value, "ci_low": d.estimate.low, "ci_high": d.estimate.high,
                "kind": "relative" if d.relative else "absolute", "tolerance": d.tolerance,
                "paired_units": d.estimate.n_units, "verdict": d.verdict if d.counts_for_verdict else f"({d.verdict})",
            })
        return pd.DataFrame(rows)

    def table(self) -> pd.DataFrame:
        """The verdict table: per metric and compared run, both estimates, the difference and verdict."""
        rows = []
        for d in self.differences:
            ref = self.run_estimate(d.metric, d.reference).estimate
            other = self.run_estimate(d.metric, d.run).estimate
            rows.append({
                "metric": d.metric,
                "reference": d.reference,
                "reference_value": ref.value,
                "run": d.run,
                "run_value": other.value,
                "difference": d.estimate.value,
                "ci_low": d.estimate.low,
                "ci_high": d.estimate.high,
                "tolerance": d.tolerance,
                "kind": "relative" if d.relative else "absolute",
                "paired_units": d.estimate.n_units,
                "verdict": d.verdict if d.counts_for_verdict else f"({d.verdict})",
            })
        return pd.DataFrame(rows)

    def formatted_table(self) -> pd.DataFrame:
        """``table()`` with numbers formatted for people (percent for fractions and relative terms)."""
        rows = []
        for d in self.differences:
            spec = next(s for s in self.specs if s.name == d.metric)
            ref = self.run_estimate(d.metric, d.reference).estimate
            other = self.run_estimate(d.metric, d.run).estimate
            rows.append({
                "metric": d.metric,
                d.reference if len(self.runs) == 2 else "reference": _fmt_value(ref, spec),
                d.run if len(self.runs) == 2 else "run": _fmt_value(other, spec),
                "difference [CI]": _fmt_diff(d),
                "tolerance": _fmt_tol(d),
                "paired": d.estimate.n_units,
                "verdict": d.verdict if d.counts_for_verdict else f"({d.verdict})",
            })
        return pd.DataFrame(rows)

    def summary(self) -> str:
        """A plain-language summary: one sentence per verdict quantity and compared run."""
        lines = []
        pct = int(round(self.confidence * 100))
        for d in self.differences:
            if not d.counts_for_verdict:
                continue
            spec = next(s for s in self.specs if s.name == d.metric)
            ref = self.run_estimate(d.metric, d.reference).estimate
            other = self.run_estimate(d.metric, d.run).estimate
            what = {"clip_fraction": "clip fraction (token-weighted)", "reward": "mean reward",
                    "throughput": "throughput"}.get(d.metric, d.metric)
            head = (f"{what}: {d.run} {_fmt_value(other, spec, ci=False)} vs {d.reference} "
                    f"{_fmt_value(ref, spec, ci=False)}; difference {_fmt_diff(d)} ({pct}% CI, "
                    f"{d.estimate.n_units} paired units) against a tolerance of {_fmt_tol(d)}")
            if d.verdict == EQUIVALENT:
                tail = "equivalent: the whole interval lies within the tolerance."
            elif d.verdict == DIFFERENT:
                tail = "different: the whole interval lies outside the tolerance."
            elif not d.estimate.has_interval:
                tail = "inconclusive: too few paired units for an interval."
            elif d.estimate.low > 0 or d.estimate.high < 0:
                tail = ("inconclusive: a difference is detected (the interval excludes 0) but it may be "
                        "within the tolerance.")
            else:
                tail = "inconclusive: the interval is wider than the tolerance; more steps would settle it."
            lines.append(f"- {head} -> {tail}")
        verdict = self.on_policy_verdict
        if len(self.runs) == 2:
            subject = f"{self.runs[1]} and {self.runs[0]}"
        else:
            subject = f"the runs compared with {self.reference}"
        head = {
            EQUIVALENT: f"Equally on-policy: {subject} clip within ±{_tol_text(self, m.CLIP.name)} of each other.",
            DIFFERENT: f"Not equally on-policy: {subject} differ in clip fraction by more than "
                       f"±{_tol_text(self, m.CLIP.name)}.",
            INCONCLUSIVE: f"Inconclusive: the clip fractions of {subject} cannot be shown equal or different "
                          f"within ±{_tol_text(self, m.CLIP.name)}.",
        }[verdict]
        axis = {"step": "step", "tokens": "tokens seen", "time": "wall time"}[self.align]
        span = "all steps" if self.window.start is None and self.window.end is None else f"window {self.window}"
        context = (f"Aligned by {axis}, {span}; intervals: {pct}% circular block bootstrap "
                   f"over steps ({self.n_boot} replicates, seed {self.seed}).")
        return "\n".join([head, context, *lines, *(f"Note: {n}" for n in self.notes)])

    def to_markdown(self) -> str:
        """Summary and table as markdown."""
        table = self.formatted_table()
        header = "| " + " | ".join(table.columns) + " |"
        rule = "|" + "|".join("---" for _ in table.columns) + "|"
        body = ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in table.itertuples(index=False)]
        return "\n".join([self.summary(), "", header, rule, *body]) + "\n"

    def to_html_table(self) -> str:
        """The formatted table as an HTML ``<table>``; every cell is escaped."""
        table = self.formatted_table()
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in table.columns)
        body = []
        for row in table.itertuples(index=False):
            cells = []
            for column, value in zip(table.columns, row, strict=True):
                cls = f' class="verdict {html.escape(str(value).strip("()"))}"' if column == "verdict" else ""
                cells.append(f"<td{cls}>{html.escape(str(value))}</td>")
            body.append("<tr>" + "".join(cells) + "</tr>")
        return f'<table class="verdict-table"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _tol_text(result: ComparisonResult, metric: str) -> str:
    spec = next((s for s in result.specs if s.name == metric), None)
    if spec is None:
        return "?"
    return f"{spec.tolerance * 100:.3g}%" + (" (relative)" if spec.relative else " of tokens")


def _fmt_value(e: Estimate, spec: MetricSpec, ci: bool = True) -> str:
    if spec.unit.startswith("fraction"):
        text = f"{e.value * 100:.3f}%"
        bounds = f" [{e.low * 100:.3f}, {e.high * 100:.3f}]%" if e.has_interval else ""
    else:
        text = f"{e.value:.4g}"
        bounds = f" [{e.low:.4g}, {e.high:.4g}]" if e.has_interval else ""
    return text + (bounds if ci else "")


def _fmt_diff(d: Difference) -> str:
    e = d.estimate
    if d.relative:
        text = f"{e.value * 100:+.2f}%"
        bounds = f" [{e.low * 100:+.2f}, {e.high * 100:+.2f}]%" if e.has_interval else " [no interval]"
    else:
        text = f"{e.value * 100:+.3f} pp"
        bounds = f" [{e.low * 100:+.3f}, {e.high * 100:+.3f}] pp" if e.has_interval else " [no interval]"
    return text + bounds


def _fmt_tol(d: Difference) -> str:
    return f"±{d.tolerance * 100:.3g}%" if d.relative else f"±{d.tolerance * 100:.3g} pp"


def _choose_specs(runset: RunSet, labels: Sequence[str], tolerances: Mapping[str, float]) -> list[MetricSpec]:
    from tracking import keys

    throughput = m.THROUGHPUT
    if all(keys.STEP_TIME in runset.wide(label) and keys.LOSS_TOKENS in runset.wide(label) for label in labels):
        throughput = m.THROUGHPUT_FROM_TIME
    specs = [m.CLIP, m.CLIP_LOW, m.CLIP_HIGH, m.REWARD, throughput]
    unknown = set(tolerances) - {s.name for s in specs}
    if unknown:
        raise ValueError(f"tolerance given for unknown quantities {sorted(unknown)}; known: {[s.name for s in specs]}")
    out = []
    for spec in specs:
        if spec.name in tolerances:
            spec = spec.with_tolerance(tolerances[spec.name])
        elif spec in (m.CLIP_LOW, m.CLIP_HIGH) and m.CLIP.name in tolerances:
            spec = spec.with_tolerance(tolerances[m.CLIP.name])
        out.append(spec)
    return out


def compare(
    runset: RunSet,
    runs: Sequence[str] | None = None,
    *,
    align: str = "step",
    window: Window | None = None,
    tolerances: Mapping[str, float] | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
    block_length: int | None = None,
) -> ComparisonResult:
    """Compare two or more runs of ``runset`` (default: all, in load order; the first is the reference).

    ``tolerances`` maps quantity names (``clip_fraction``, ``reward``, ``throughput``) to margins
    (absolute for clip fractions, relative for reward and throughput); ``block_length`` overrides the
    default ``ceil(n ** (1/3))`` steps.
    """
    labels = [runset.info(r).display for r in (runs or runset.labels)]
    if len(labels) < 2:
        raise ValueError(f"compare needs at least two runs, got {labels}")
    if len(set(labels)) != len(labels):
        raise ValueError(f"a run is named twice in {labels}")
    if align not in ALIGNMENTS:
        raise ValueError(f"alignment {align!r} is not one of {sorted(ALIGNMENTS)}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    window = window or Window()
    specs = _choose_specs(runset, labels, tolerances or {})
    units = unit_table(runset, labels, specs, by=align, window=window)
    rng = np.random.default_rng(seed)
    result = ComparisonResult(
        runs=labels, backends={label: runset.info(label).backend for label in labels}, align=align,
        window=window, confidence=confidence, n_boot=n_boot, seed=seed, specs=specs,
    )
    reference = labels[0]
    for spec in specs:
        num, den = f"{spec.name}.num", f"{spec.name}.den"
        present = {}
        for label in labels:
            table = units[label]
            valid = table[table[num].notna() & table[den].notna()]
            present[label] = valid
            est = ratio_estimate(valid[num].to_numpy(), valid[den].to_numpy(), confidence=confidence,
                                 n_boot=n_boot, block_length=block_length, rng=rng)
            w_low, w_high = float("nan"), float("nan")
            if spec.unit.startswith("fraction"):
                w_low, w_high = wilson_interval(valid[num].sum(), valid[den].sum(), confidence)
            result.estimates.append(RunEstimate(spec.name, label, result.backends[label], est,
                                                float(valid[num].sum()), float(valid[den].sum()), w_low, w_high))
        if any(len(p) == 0 for p in present.values()):
            missing = [label for label, p in present.items() if len(p) == 0]
            result.notes.append(f"{spec.name}: not logged by {', '.join(missing)}")
        for label in labels[1:]:
            a, b = present[reference], present[label]
            common = a.index.intersection(b.index)
            only = len(a.index.union(b.index)) - len(common)
            if only and spec is specs[0]:
                result.notes.append(f"{label} vs {reference}: {only} units logged by only one run are left out "
                                    f"of the paired difference ({len(common)} paired)")
            est = paired_ratio_difference(
                a.loc[common, num].to_numpy(), a.loc[common, den].to_numpy(),
                b.loc[common, num].to_numpy(), b.loc[common, den].to_numpy(),
                relative=spec.relative, confidence=confidence, n_boot=n_boot, block_length=block_length, rng=rng,
            )
            result.differences.append(Difference(
                spec.name, reference, label, est, spec.tolerance, spec.relative,
                equivalence_verdict(est, spec.tolerance), spec.verdict,
            ))
    return result
