"""The comparison's result model: what ``compute.compare`` found, as plain dataclasses.

Every rendering (``render``: text table, summary, markdown, HTML, JSON; ``panels_mlflow``: the
MLflow comparison run; ``dashboard``) reads a ``ComparisonResult`` and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tracking.compare.align import Window
from tracking.compare.metrics import MetricSpec
from tracking.compare.stats import DIFFERENT, EQUIVALENT, INCONCLUSIVE, INSUFFICIENT, LOG_RATIO, Estimate

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class RunEstimate:
    """One run's estimate of one quantity over every unit of the window it logged validly.

    ``units``: units with finite numerator and denominator; ``nonfinite``: units where the run
    logged a NaN or infinite value of a key of this quantity (left out); ``missing``: units the
    run logged (some metric) without this quantity's keys; ``first_nonfinite``: x of the first
    such unit (step, or bin centre). Totals are the sums over ``units``.
    """

    metric: str
    run: str
    backend: str
    estimate: Estimate
    total_numerator: float
    total_denominator: float
    units: int
    nonfinite: int = 0
    missing: int = 0
    first_nonfinite: float | None = None
    wilson_low: float = float("nan")
    wilson_high: float = float("nan")


@dataclass(frozen=True)
class Difference:
    """Run ``run`` minus the reference on one quantity, over the units both logged validly.

    ``estimate`` is ``R_run - R_ref`` (``scale="absolute"``) or ``s * log(R_run / R_ref)``
    (``"log-ratio"``, ``s`` the sign of the ratios); ``tolerance`` is on the same scale (for a
    log-ratio, ``log(1 + margin)``) and ``margin`` is the margin as stated (0.05 = ±5 %).
    ``reference_paired`` / ``run_paired``: each run's estimate over the same paired units.
    ``reason`` says why the verdict is what it is (always set for ``insufficient data``).
    """

    metric: str
    reference: str
    run: str
    estimate: Estimate
    reference_paired: Estimate
    run_paired: Estimate
    tolerance: float
    margin: float
    scale: str
    verdict: str
    reason: str
    counts_for_verdict: bool

    @property
    def relative(self) -> bool:
        return self.scale == LOG_RATIO


@dataclass(frozen=True)
class Note:
    """Something the reader must know about a quantity of a run (``run`` "" when about the comparison).

    ``warning``: flagged in the summary (non-finite values, a scale switched, a metric missing).
    """

    metric: str
    run: str
    text: str
    warning: bool = False


@dataclass
class ComparisonResult:
    """Everything ``compare`` found. Renderings live in ``tracking.compare.render``."""

    runs: list[str]
    backends: dict[str, str]
    align: str
    window: Window
    confidence: float
    method: str
    specs: list[MetricSpec]
    estimates: list[RunEstimate] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)

    @property
    def reference(self) -> str:
        return self.runs[0]

    def spec(self, metric: str) -> MetricSpec:
        for s in self.specs:
            if s.name == metric:
                return s
        raise KeyError(f"no quantity {metric!r}; compared: {[s.name for s in self.specs]}")

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

    def notes_for(self, metric: str) -> list[Note]:
        return [n for n in self.notes if n.metric == metric]

    @property
    def on_policy_verdict(self) -> str:
        """The clip-fraction verdict over all compared pairs: ``different`` if any pair differs,
        else ``insufficient data`` if any pair has too little data, else ``inconclusive`` if any
        is, else ``equivalent``."""
        verdicts = [d.verdict for d in self.differences if d.metric == "clip_fraction"]
        if not verdicts:
            return INSUFFICIENT
        for worst in (DIFFERENT, INSUFFICIENT, INCONCLUSIVE):
            if worst in verdicts:
                return worst
        return EQUIVALENT

    # Renderings (each reads this result; see ``tracking.compare.render``).

    def table(self) -> pd.DataFrame:
        from tracking.compare import render

        return render.table(self)

    def formatted_table(self) -> pd.DataFrame:
        from tracking.compare import render

        return render.formatted_table(self)

    def summary(self) -> str:
        from tracking.compare import render

        return render.summary(self)

    def to_markdown(self) -> str:
        from tracking.compare import render

        return render.markdown(self)

    def to_html_table(self) -> str:
        from tracking.compare import render

        return render.html_table(self)

    def to_dict(self) -> dict[str, Any]:
        from tracking.compare import render

        return render.as_dict(self)

    def to_json(self) -> str:
        from tracking.compare import render

        return render.as_json(self)
