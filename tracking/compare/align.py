"""Align runs on a common axis and reduce them to comparable units.

Alignments:

- ``"step"``: a unit is one trainer step; runs are paired on the steps both logged.
- ``"tokens"``: the axis is ``tokens_seen`` (cumulative ``loss_tokens:sum``); ``"time"``: the
  axis is ``elapsed_s`` (seconds since the run's first point). Runs are cut to the axis range they
  share, which is split into equal-width bins, as many as the sparsest run has steps in that range;
  a unit is one bin, holding the sums of the steps that ended in it.

A ``Window`` ``start:end`` keeps points with ``start <= x < end`` on the alignment axis (steps,
tokens or seconds); either side may be open.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from cliptrack.compare.columns import N_STEPS, UNIT, Columns, X
from cliptrack.compare.notes import AXIS_WORDS, densities_text
from cliptrack.compare.reasons import SparseTokenAxis, TokenDensity
from cliptrack.compare.window import Window
from cliptrack.core import keys

if TYPE_CHECKING:  # pandas and numpy are imported when a table is built, so the CLI starts fast
    import pandas as pd
    from cliptrack.compare.quantities import Quantity
    from cliptrack.store.frame import RunSet


ALIGNMENTS = {"step": "step", "tokens": "tokens_seen", "time": "elapsed_s"}
"""Alignment name -> the frame column that is its axis (trainer steps, tokens, seconds)."""


def _per_step(runset: RunSet, label: str, specs: Sequence[Quantity], axis: str) -> pd.DataFrame:
    import numpy as np
    import pandas as pd
    from cliptrack.store.frame import count_problems

    wide = runset.wide(label)
    nonfinite = runset.nonfinite(label)
    out = pd.DataFrame(index=wide.index)
    out[X] = wide.index.to_numpy(dtype=float) if axis == "step" else wide[axis]
    missing = pd.Series(np.nan, index=wide.index)
    for spec in specs:
        num = wide[spec.numerator] if spec.numerator in wide else missing
        bad = pd.Series(wide.index.isin(list(nonfinite.get(spec.numerator, ()))), index=wide.index)
        logged = num.notna() | bad
        if spec.denominator is None:
            den = pd.Series(np.where(np.isfinite(num), 1.0, np.nan), index=wide.index)
        else:
            den = wide[spec.denominator] if spec.denominator in wide else missing
            den_bad = wide.index.isin(list(nonfinite.get(spec.denominator, ())))
            bad |= den_bad
            logged &= den.notna() | den_bad
        valid = pd.Series(
            np.isfinite(num.to_numpy(dtype=float)) & np.isfinite(den.to_numpy(dtype=float)), index=wide.index
        )
        invalid = np.zeros(len(wide), dtype=bool)
        if spec.estimand.counts and spec.denominator is not None:
            for _, _, mask in count_problems(wide, spec.numerator, spec.denominator):
                invalid |= mask
        valid &= ~invalid
        columns = Columns.of(spec.name)
        out[columns.num] = num.where(valid)
        out[columns.den] = den.where(valid)
        out[columns.bad] = bad.astype(float)
        out[columns.invalid] = invalid.astype(float)
        out[columns.logged] = logged.astype(float)
    return out


DENSITY_TOLERANCE = 0.05
"""Largest relative difference of step-grid density (steps logging ``loss_tokens:sum`` per trainer
step of the run's range) for which runs may be aligned by tokens seen: beyond it the sparser run's
tokens seen would be undercounted by more than 5 % against the other's."""


def token_density(runset: RunSet, label: str) -> tuple[int, int]:
    """``(steps logging finite loss_tokens:sum, trainer steps from the first to the last of them)``."""
    import numpy as np

    wide = runset.wide(label)
    if keys.LOSS_TOKENS not in wide:
        return 0, 0
    steps = wide.index.to_numpy()[np.isfinite(wide[keys.LOSS_TOKENS].to_numpy(dtype=float))]
    if steps.size == 0:
        return 0, 0
    return int(steps.size), int(steps.max() - steps.min() + 1)


def token_axis(runset: RunSet, labels: Sequence[str]) -> SparseTokenAxis | None:
    """Tokens seen is the running sum of every step's ``loss_tokens:sum``, so it is complete only
    when each run logs it at every trainer step. Raise ValueError naming the runs when their step
    grids differ in density (one run's tokens seen would be undercounted against the other's);
    return the reason to note (None when none) when every run skips steps alike (the axis is then
    scaled alike)."""
    densities = tuple(TokenDensity(label, *token_density(runset, label)) for label in labels)
    if all(d.span and d.logged == d.span for d in densities):
        return None
    ratio = [d.logged / d.span for d in densities if d.span]
    if ratio and max(ratio) - min(ratio) > DENSITY_TOLERANCE * max(ratio):
        raise ValueError(
            f"cannot align by tokens seen: the runs' step grids differ in density ({densities_text(densities)}), "
            "so tokens seen would count only the logged steps and undercount the sparser run; align by step "
            "(--align step) or log loss_tokens:sum at every step"
        )
    return SparseTokenAxis(densities)


def _step_tables(
    runset: RunSet, labels: Sequence[str], specs: Sequence[Quantity], by: str, window: Window
) -> dict[str, pd.DataFrame]:
    """Per run, the per-step table cut to the window (steps with an axis value only)."""
    steps = {}
    for label in labels:
        table = _per_step(runset, label, specs, ALIGNMENTS[by])
        if by != "step" and table[X].isna().all():
            what = "loss_tokens:sum" if by == "tokens" else "wall times"
            raise ValueError(f"run {label!r} logs no {what}: it cannot be aligned by {by}")
        table = table[window.mask(table[X]) & table[X].notna()]
        table.insert(1, N_STEPS, 1)
        steps[label] = table
    return steps


def _shared_range(steps: dict[str, pd.DataFrame], by: str, window: Window) -> tuple[float, float]:
    """The axis range every run covers: ``(lo, hi)``; ValueError when the runs share none."""
    import numpy as np

    lo = max((t[X].min() for t in steps.values() if len(t)), default=np.nan)
    hi = min((t[X].max() for t in steps.values() if len(t)), default=np.nan)
    if not (np.isfinite(lo) and np.isfinite(hi) and hi > lo):
        raise ValueError(
            f"the runs {list(steps)} share no range of {ALIGNMENTS[by]} to align on (window {window})"
        )
    return float(lo), float(hi)


def _binned(steps: dict[str, pd.DataFrame], lo: float, hi: float) -> dict[str, pd.DataFrame]:
    """Each run's steps in ``[lo, hi]`` summed into equal-width bins, as many as the sparsest run has steps."""
    import numpy as np

    inside = {label: t[(t[X] >= lo) & (t[X] <= hi)] for label, t in steps.items()}
    n_bins = max(1, min(len(t) for t in inside.values()))
    edges = np.linspace(lo, hi, n_bins + 1)
    centres = (edges[:-1] + edges[1:]) / 2
    out = {}
    for label, table in inside.items():
        unit = np.clip(np.searchsorted(edges, table[X].to_numpy(), side="right") - 1, 0, n_bins - 1)
        sums = table.drop(columns=X).groupby(unit).sum(min_count=1)
        sums.index.name = UNIT
        sums.insert(0, X, centres[sums.index.to_numpy()])
        out[label] = sums
    return out


def unit_table(
    runset: RunSet,
    labels: Sequence[str],
    specs: Sequence[Quantity],
    by: str = "step",
    window: Window | None = None,
) -> dict[str, pd.DataFrame]:
    """Per run, a unit-indexed table with ``columns.X``, ``columns.N_STEPS`` and per quantity the
    columns of ``columns.Columns.of(name)``: ``num`` / ``den`` sums, ``bad`` (steps where a key of
    it was logged non-finite: NaN or infinite), ``invalid`` (steps whose exact counts were refused:
    negative, fractional or a count above its total, ``frame.count_problems``) and ``logged``
    (steps where all its keys were logged, finite or not).

    A numerator/denominator pair counts at a step only when both were logged there with finite
    values (a loss that does not clip logs no clip counts; nothing is invented). Index: the step (``by="step"``) or
    the bin number (``"tokens"``, ``"time"``); ``x`` is the step or the bin centre.
    """
    if by not in ALIGNMENTS:
        raise ValueError(f"alignment {by!r} is not one of {sorted(ALIGNMENTS)}")
    window = window or Window()
    steps = _step_tables(runset, labels, specs, by, window)
    if by == "step":
        return {label: table.rename_axis(UNIT) for label, table in steps.items()}
    return _binned(steps, *_shared_range(steps, by, window))


def check_window(runset: RunSet, align: str, window: Window) -> None:
    """Every run has data inside ``window`` on the ``align`` axis; ValueError naming the run and its
    range otherwise (an empty window would compare nothing and report NaN)."""
    if window.start is None and window.end is None:
        return
    axis = ALIGNMENTS[align]
    frame = runset.frame
    for info in runset.runs:
        values = frame.loc[frame["run_id"] == info.run.run_id, axis]
        if values.empty or window.mask(values).any():
            continue
        raise ValueError(
            f"--window {window} holds no data of run {info.display}: its {AXIS_WORDS[align].units} run from "
            f"{values.min():g} to {values.max():g}; choose a window inside that range"
        )
