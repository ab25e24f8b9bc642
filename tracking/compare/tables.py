"""The comparison's tables (``findings.Findings``, and so a ``ComparisonResult``), as data frames:

- :func:`table`: one row per quantity and compared run (or group), every number;
- :func:`segments_table`: the difference of each segment of the window;
- :func:`estimates_table`: each run's estimate over the whole window;
- :func:`formatted_table`: :func:`table` for people (``--verbose``); :func:`compact_table`: the
  columns a reader needs first (the terminal).

Run-provided text (labels) is held as given: it is escaped where a table is printed. The cells'
numbers are shown by ``cliptrack.compare.formatting``, the cells' phrases by ``notes.phrases``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cliptrack.compare import formatting as fmt
from cliptrack.compare.findings import Difference, Findings, GroupDifference
from cliptrack.compare.notes import phrases as p

if TYPE_CHECKING:  # pandas is imported when a table is built, so importing the tables stays light
    import pandas as pd
    from cliptrack.compare.stats import Estimate


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows as a data frame, one column per key."""
    import pandas as pd

    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------- the numbers


def _step_weighted_columns(sw: Estimate | None, value_column: str) -> dict[str, float]:
    """The step-weighted estimate as table columns (value, interval); NaN where there is none."""
    nan = float("nan")
    return {
        value_column: nan if sw is None else sw.value,
        "step_weighted_ci_low": nan if sw is None else sw.low,
        "step_weighted_ci_high": nan if sw is None else sw.high,
    }


def _pair_row(result: Findings, d: Difference) -> dict[str, Any]:
    return {
        "metric": d.metric,
        "reference": d.reference,
        "reference_value": d.reference_paired.value,
        "reference_full_value": result.run_estimate(d.metric, d.reference).estimate.value,
        "run": d.run,
        "run_value": d.run_paired.value,
        "run_full_value": result.run_estimate(d.metric, d.run).estimate.value,
        "difference": d.estimate.value,
        "ci_low": d.estimate.low,
        "ci_high": d.estimate.high,
        **_step_weighted_columns(d.step_weighted, "step_weighted_difference"),
        "scale": d.scale,
        "margin": d.margin,
        "tolerance": d.tolerance,
        "paired_units": d.estimate.n_units,
        "lag1": d.estimate.lag1,
        "ess": d.estimate.ess,
        "reference_lag1": d.reference_paired.lag1,
        "reference_ess": d.reference_paired.ess,
        "run_lag1": d.run_paired.lag1,
        "run_ess": d.run_paired.ess,
        "segments": len(d.segments),
        "differing": p.spans(result, d.differing),
        "influential": ", ".join(fmt.axis_value(x) for x in d.influential),
        "average_verdict": d.average_verdict,
        "verdict": p.verdict_cell(d),
        "reason": d.reason,
    }


def _group_row(d: GroupDifference) -> dict[str, Any]:
    e = d.estimate
    return {
        "metric": d.metric,
        "reference": d.reference,
        "run": d.group,
        "difference": e.value,
        "ci_low": e.low,
        "ci_high": e.high,
        "scale": d.scale,
        "margin": d.margin,
        "tolerance": d.tolerance,
        "reference_seeds": e.seeds_a,
        "run_seeds": e.seeds_b,
        "reference_between_sd": e.between_sd_a,
        "run_between_sd": e.between_sd_b,
        "df": e.df,
        "seeds_needed": d.seeds_needed,
        "verdict": p.verdict_cell(d),
        "reason": d.reason,
    }


def table(result: Findings) -> pd.DataFrame:
    """One row per quantity and compared run (or group, when groups were compared): paired-window
    estimates, token- and step-weighted differences with intervals, ESS, segments, verdict."""
    if result.groups:
        return _frame([_group_row(d) for d in result.group_differences])
    return _frame([_pair_row(result, d) for d in result.differences])


def segments_table(result: Findings) -> pd.DataFrame:
    """One row per quantity, compared run and segment of the window: the difference over training."""
    rows = [
        {
            "metric": d.metric,
            "reference": d.reference,
            "run": d.run,
            "start": s.start,
            "end": s.end,
            "units": s.estimate.n_units,
            "difference": s.estimate.value,
            "ci_low": s.estimate.low,
            "ci_high": s.estimate.high,
            "verdict": s.verdict,
        }
        for d in result.differences
        for s in d.segments
    ]
    return _frame(rows)


def estimates_table(result: Findings) -> pd.DataFrame:
    """One row per quantity and run over the whole window: estimate, interval, step-weighted
    estimate, units, ESS, totals."""
    rows = [
        {
            "metric": e.metric,
            "run": e.run,
            "group": e.group,
            "backend": e.backend,
            "estimate": e.estimate.value,
            "ci_low": e.estimate.low,
            "ci_high": e.estimate.high,
            **_step_weighted_columns(e.step_weighted, "step_weighted"),
            "wilson_low": e.wilson_low,
            "wilson_high": e.wilson_high,
            "units": e.units,
            "lag1": e.estimate.lag1,
            "ess": e.estimate.ess,
            "nonfinite": e.nonfinite,
            "invalid": e.invalid,
            "missing": e.missing,
            "numerator": e.total_numerator,
            "denominator": e.total_denominator,
        }
        for e in result.estimates
    ]
    return _frame(rows)


# ------------------------------------------------------------------------------- for people


def _formatted_groups(result: Findings) -> pd.DataFrame:
    rows = [
        {
            "metric": d.metric,
            "reference": f"{d.reference}: {p.group_value(result, d.reference, d.metric)}",
            "group": f"{d.group}: {p.group_value(result, d.group, d.metric)}",
            "difference [CI]": p.approximate(d) + p.difference(result, d),
            "margin": p.full_margin(result, d),
            "seeds": f"{d.estimate.seeds_a}+{d.estimate.seeds_b}",
            "seeds needed": d.seeds_needed if p.unsettled(d) else "-",
            "verdict": p.verdict_cell(d),
        }
        for d in result.group_differences
    ]
    return _frame(rows)


def formatted_table(result: Findings) -> pd.DataFrame:
    """:func:`table` formatted for people (percent for fractions and relative differences)."""
    if result.groups:
        return _formatted_groups(result)
    two = len(result.runs) == 2
    rows = [
        {
            "metric": d.metric,
            d.reference if two else "reference": p.paired_value(result, d, d.reference),
            d.run if two else "run": p.paired_value(result, d, d.run),
            "difference [CI]": p.approximate(d) + p.difference(result, d),
            "step-weighted": "-" if d.step_weighted is None else p.difference(result, d, d.step_weighted),
            "margin": p.full_margin(result, d),
            "paired": d.estimate.n_units,
            "lag-1": fmt.lag1(d.estimate.lag1),
            "ESS": fmt.ess(d.estimate.ess),
            "segments": p.segments_cell(result, d),
            "verdict": p.verdict_cell(d),
        }
        for d in result.differences
    ]
    return _frame(rows)


def _compact_groups(result: Findings, ci_column: str) -> pd.DataFrame:
    two = len(result.groups) == 2
    rows = [
        {
            "metric": g.metric,
            g.reference if two else "reference": p.group_mean(result, g.reference, g.metric, not two),
            g.group if two else "group": p.group_mean(result, g.group, g.metric, not two),
            ci_column: p.approximate(g) + p.difference(result, g),
            "margin": p.short_margin(result, g),
            "seeds": f"{g.estimate.seeds_a}+{g.estimate.seeds_b}",
            "verdict": p.verdict_cell(g),
        }
        for g in result.group_differences
    ]
    return _frame(rows)


def compact_table(result: Findings) -> pd.DataFrame:
    """:func:`formatted_table` with the columns a reader needs first (quantity, the two values, the
    difference with its interval, the margin, the verdict); every other column is in
    :func:`formatted_table` (``--verbose``) and the JSON (``--json``)."""
    ci_column = f"difference [{int(round(result.confidence * 100))}% CI]"
    if result.groups:
        return _compact_groups(result, ci_column)
    two = len(result.runs) == 2
    rows = []
    for d in result.differences:
        percent = result.quantity(d.metric).percent
        rows.append(
            {
                "metric": d.metric,
                d.reference if two else "reference": fmt.value(d.reference_paired, percent, ci=False),
                d.run if two else "run": fmt.value(d.run_paired, percent, ci=False),
                ci_column: p.approximate(d) + p.difference(result, d),
                "margin": p.short_margin(result, d),
                "paired": d.estimate.n_units,
                "verdict": p.verdict_cell(d),
            }
        )
    return _frame(rows)
