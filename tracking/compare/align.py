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
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas and numpy are imported when a table is built, so the CLI starts fast
    import pandas as pd

    from tracking.compare.frame import RunSet
    from tracking.compare.quantities import Quantity

ALIGNMENTS = {"step": "step", "tokens": "tokens_seen", "time": "elapsed_s"}
"""Alignment name -> frame column used as the x axis."""


@dataclass(frozen=True)
class Window:
    """Half-open range ``[start, end)`` on the alignment axis; None = unbounded."""

    start: float | None = None
    end: float | None = None

    def mask(self, x: pd.Series) -> pd.Series:
        import pandas as pd

        keep = pd.Series(True, index=x.index)
        if self.start is not None:
            keep &= x >= self.start
        if self.end is not None:
            keep &= x < self.end
        return keep

    def __str__(self) -> str:
        def fmt(v: float | None) -> str:
            return "" if v is None else f"{v:g}"

        return f"{fmt(self.start)}:{fmt(self.end)}"


def parse_window(text: str | None) -> Window:
    """Parse ``"A:B"``, ``"A:"``, ``":B"`` (numbers on the alignment axis) into a Window."""
    if text is None or text.strip() in ("", ":"):
        return Window()
    if text.count(":") != 1:
        raise ValueError(f"window {text!r} must be 'START:END' (either side may be empty), e.g. '100:500'")
    left, right = (part.strip() for part in text.split(":"))
    try:
        start = float(left) if left else None
        end = float(right) if right else None
    except ValueError as exc:
        raise ValueError(f"window {text!r}: START and END must be numbers ({exc})") from exc
    if start is not None and end is not None and end <= start:
        raise ValueError(f"window {text!r} is empty: END must be greater than START")
    return Window(start, end)


def _per_step(runset: RunSet, label: str, specs: Sequence[Quantity], axis: str) -> pd.DataFrame:
    import numpy as np
    import pandas as pd

    wide = runset.wide(label)
    nonfinite = runset.nonfinite(label)
    out = pd.DataFrame(index=wide.index)
    out["x"] = wide.index.to_numpy(dtype=float) if axis == "step" else wide[axis]
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
        out[f"{spec.name}.num"] = num.where(valid)
        out[f"{spec.name}.den"] = den.where(valid)
        out[f"{spec.name}.bad"] = bad.astype(float)
        out[f"{spec.name}.logged"] = logged.astype(float)
    return out


def unit_table(
    runset: RunSet,
    labels: Sequence[str],
    specs: Sequence[Quantity],
    by: str = "step",
    window: Window | None = None,
) -> dict[str, pd.DataFrame]:
    """Per run, a unit-indexed table with ``x``, ``n_steps`` and per quantity ``<spec>.num`` /
    ``<spec>.den`` sums, ``<spec>.bad`` (steps where a key of it was logged non-finite: NaN or
    infinite) and ``<spec>.logged`` (steps where all its keys were logged, finite or not).

    A numerator/denominator pair counts at a step only when both were logged there with finite
    values (a loss that does not clip logs no clip counts; nothing is invented). Index: the step (``by="step"``) or
    the bin number (``"tokens"``, ``"time"``); ``x`` is the step or the bin centre.
    """
    import numpy as np

    if by not in ALIGNMENTS:
        raise ValueError(f"alignment {by!r} is not one of {sorted(ALIGNMENTS)}")
    window = window or Window()
    axis = ALIGNMENTS[by]
    steps = {}
    for label in labels:
        table = _per_step(runset, label, specs, axis)
        if by != "step" and table["x"].isna().all():
            what = "loss_tokens:sum" if by == "tokens" else "wall times"
            raise ValueError(f"run {label!r} logs no {what}: it cannot be aligned by {by}")
        table = table[window.mask(table["x"]) & table["x"].notna()]
        table.insert(1, "n_steps", 1)
        steps[label] = table
    if by == "step":
        return {label: table.rename_axis("unit") for label, table in steps.items()}

    lo = max((t["x"].min() for t in steps.values() if len(t)), default=np.nan)
    hi = min((t["x"].max() for t in steps.values() if len(t)), default=np.nan)
    if not np.isfinite(lo) or not np.isfinite(hi) or hi <= lo:
        raise ValueError(f"the runs {list(labels)} share no range of {axis} to align on (window {window})")
    inside = {label: t[(t["x"] >= lo) & (t["x"] <= hi)] for label, t in steps.items()}
    n_bins = max(1, min(len(t) for t in inside.values()))
    edges = np.linspace(lo, hi, n_bins + 1)
    centres = (edges[:-1] + edges[1:]) / 2
    out = {}
    for label, table in inside.items():
        unit = np.clip(np.searchsorted(edges, table["x"].to_numpy(), side="right") - 1, 0, n_bins - 1)
        sums = table.drop(columns="x").groupby(unit).sum(min_count=1)
        sums.index.name = "unit"
        sums.insert(0, "x", centres[sums.index.to_numpy()])
        out[label] = sums
    return out
