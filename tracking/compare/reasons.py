"""Why the comparison says what it says, as data: one small frozen dataclass per kind of reason,
holding the numbers its sentence needs and nothing else. The engine decides and records these;
``notes`` (the one place that writes sentences) turns each into words.

Two families:

- **verdict reasons** (``VerdictReason``): why a pair or a pair of groups got its verdict, or no
  verdict at all (``insufficient data``);
- **note reasons** (``NoteReason``): something the reader must know about a quantity of a run, or
  about the comparison. ``warning`` says whether the summary flags it.

Units: ``steps`` are trainer steps; ``units`` are the comparison's units (steps, or bins of steps
when aligned by tokens or time); ``x`` values are on the alignment axis (steps, tokens seen or
seconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

# ----------------------------------------------------------------------------- verdict reasons

SEGMENTS = "segments"
"""The verdict holds throughout the window: the whole window and every segment were tested."""
WINDOW = "window"
"""The whole window only: a diagnostic quantity, or a window too short for more than one segment."""
SEEDS = "seeds"
"""Groups of seeds, the window average over seeds only: the window is too short for segments across seeds."""


@dataclass(frozen=True)
class WholeWindow:
    """The whole-window interval's verdict (``equivalent``, ``different`` or ``inconclusive``).

    ``detected``: the interval excludes 0; ``tested``: what else was tested (``SEGMENTS``,
    ``WINDOW`` or ``SEEDS``)."""

    verdict: str
    detected: bool
    tested: str


@dataclass(frozen=True)
class Span:
    """A stretch of the window: ``start``-``end`` on the alignment axis ``align`` and its verdict."""

    align: str
    start: float
    end: float
    verdict: str


@dataclass(frozen=True)
class NotThroughout:
    """The whole window says ``window``, but these segments keep the verdict from it."""

    window: WholeWindow
    spans: tuple[Span, ...]


@dataclass(frozen=True)
class NothingLogged:
    """``run`` logged no ``key`` in the window."""

    run: str
    key: str


@dataclass(frozen=True)
class NoCommonUnits:
    """No unit where both runs logged finite values."""


@dataclass(frozen=True)
class ZeroDenominator:
    """``run`` logged 0 ``key`` at all ``units`` paired units: ``metric`` is undefined there."""

    run: str
    key: str
    units: int
    metric: str


@dataclass(frozen=True)
class NoLogRatio:
    """``metric`` is not positive in both runs, so a log-ratio difference does not exist."""

    metric: str


@dataclass(frozen=True)
class TooLittleData:
    """The statistics' own account of why the interval cannot be trusted (``Estimate.insufficiency``,
    ``GroupEstimate.reason``); empty when there is no interval at all."""

    account: str


@dataclass(frozen=True)
class RestsOnUnits:
    """The whole-window interval lies outside the margin only with the units at ``xs`` (leaving out
    any one of them, or the outliers among them together, brings it back): no ``different`` from
    them alone (``by_step``: x are steps)."""

    xs: tuple[float, ...]
    by_step: bool


VerdictReason = (
    WholeWindow
    | NotThroughout
    | RestsOnUnits
    | NothingLogged
    | NoCommonUnits
    | ZeroDenominator
    | NoLogRatio
    | TooLittleData
)
"""Why a difference got its verdict."""

# -------------------------------------------------------------------------------- note reasons


@dataclass(frozen=True)
class Approximate:
    """``run``'s tracker logged ``key`` only as a mean of per-sample or per-micro-batch means, so its
    ``metric`` is the mean of that value over steps."""

    warning: ClassVar[bool] = True
    run: str
    metric: str
    key: str


@dataclass(frozen=True)
class FrameworkRun:
    """``run`` was logged by ``framework`` itself (at ``version`` as read): its keys of ours read
    from a mean of means (``approximate``), from an exact per-step value without token counts
    (``per_step``), and its different quantities kept under their own names (``different``)."""

    warning: ClassVar[bool] = False
    run: str
    framework: str
    version: str
    approximate: tuple[str, ...]
    per_step: tuple[str, ...]
    different: tuple[str, ...]


@dataclass(frozen=True)
class LoggedTwice:
    """``run`` logged ``key`` more than once with different values at ``steps``; the last is kept."""

    warning: ClassVar[bool] = True
    run: str
    key: str
    steps: tuple[int, ...]


@dataclass(frozen=True)
class RefusedCounts:
    """``run``'s ``key`` is ``problem`` (negative, fractional, above its total) at ``steps``: those steps
    are left out of ``metrics``."""

    warning: ClassVar[bool] = True
    run: str
    key: str
    problem: str
    steps: tuple[int, ...]
    metrics: tuple[str, ...]


@dataclass(frozen=True)
class TokenDensity:
    """``run`` logged ``loss_tokens:sum`` at ``logged`` of the ``span`` trainer steps of its range."""

    run: str
    logged: int
    span: int


@dataclass(frozen=True)
class SparseTokenAxis:
    """Tokens seen counts only the steps that logged ``loss_tokens:sum``; every run skips alike."""

    warning: ClassVar[bool] = True
    densities: tuple[TokenDensity, ...]


@dataclass(frozen=True)
class NotInWindow:
    """``run`` logs no ``estimand`` (its keys, as words) in the window; a warning when ``warning``."""

    run: str
    estimand: str
    warning: bool


@dataclass(frozen=True)
class NonFinite:
    """``run``'s ``estimand`` is NaN or infinite at ``count`` of ``units`` units (``per``: "step" or
    "unit"), the first at ``first`` (None: unknown), through to the end when ``to_end``."""

    warning: ClassVar[bool] = True
    run: str
    estimand: str
    metric: str
    count: int
    units: int
    per: str
    first: float | None
    to_end: bool


@dataclass(frozen=True)
class Unlogged:
    """``run`` did not log ``estimand`` at ``count`` of ``units`` units (``per``: "step" or "unit")."""

    warning: ClassVar[bool] = False
    run: str
    estimand: str
    count: int
    units: int
    per: str


@dataclass(frozen=True)
class WeightingGap:
    """Token-weighted ``token`` and step-weighted ``step`` values of ``metric`` (for ``subject``: a
    run, or "B - A") differ by more than the margin."""

    warning: ClassVar[bool] = True
    subject: str
    metric: str
    token: float
    step: float


@dataclass(frozen=True)
class MissingPattern:
    """``absent`` lacks a valid ``metric`` at ``count`` units where ``present`` has one, and there
    ``present``'s value is ``there`` against ``paired`` at the paired units (``percent``: shown in %)."""

    warning: ClassVar[bool] = True
    absent: str
    present: str
    metric: str
    count: int
    there: float
    paired: float
    percent: bool


@dataclass(frozen=True)
class AbsoluteScale:
    """``run`` vs ``reference`` on ``metric`` is on the absolute scale (``abs_margin``) instead of the
    relative ``margin``: the values ``reference_value`` and ``run_value`` are not clearly away from
    zero (``floor``: the smallest ``|value|`` for a relative margin; ``percent``: shown in %)."""

    warning: ClassVar[bool] = True
    run: str
    reference: str
    metric: str
    abs_margin: float
    margin: float
    floor: float
    reference_value: float
    run_value: float
    percent: bool = False


@dataclass(frozen=True)
class PairedOnly:
    """``count`` units of ``run`` vs ``reference`` have a valid value of ``metrics`` in one run only."""

    warning: ClassVar[bool] = False
    run: str
    reference: str
    count: int
    metrics: tuple[str, ...]


@dataclass(frozen=True)
class Influential:
    """The whole-window ``metric`` verdict ``verdict`` of ``run`` vs ``reference`` changes when any one
    of the units at ``xs`` (or their outliers together) is left out (``by_step``: x are steps)."""

    warning: ClassVar[bool] = True
    run: str
    reference: str
    metric: str
    verdict: str
    xs: tuple[float, ...]
    by_step: bool


@dataclass(frozen=True)
class Stretches:
    """Stretches of the window where ``run`` and ``reference`` differ beyond the margin on ``metric``
    (``spans``, with the difference over each in ``sizes``, on ``scale``: log-ratio units or the
    quantity's own, ``percent`` for a fraction), named only: one pair's episode is no verdict."""

    warning: ClassVar[bool] = True
    run: str
    reference: str
    metric: str
    spans: tuple[Span, ...]
    sizes: tuple[float, ...]
    scale: str
    percent: bool


@dataclass(frozen=True)
class ShortMemory:
    """``metric`` of ``run`` vs ``reference`` is equivalent over ``units`` paired units, too few for the
    long-memory test."""

    warning: ClassVar[bool] = False
    run: str
    reference: str
    metric: str
    units: int


@dataclass(frozen=True)
class Lagging:
    """``behind``'s ``metric`` curve lags ``ahead``'s by ``shift`` on the axis ``align`` (``lag`` units);
    the shift removes ``gain`` (0..1) of the squared difference of the smoothed curves."""

    warning: ClassVar[bool] = True
    run: str
    reference: str
    behind: str
    ahead: str
    metric: str
    shift: float
    align: str
    lag: int
    gain: float


@dataclass(frozen=True)
class SeedsCovered:
    """Groups were compared: ``sizes`` (group, seeds) in order."""

    warning: ClassVar[bool] = False
    sizes: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class OnePerStack:
    """One run per stack: seed-to-seed variation is not covered."""

    warning: ClassVar[bool] = False


@dataclass(frozen=True)
class RecipesDiffer:
    """The runs record different values of one recipe ``field`` (``cliptrack.core.recipe.Recipe``):
    ``values`` (run, value in words) in run order."""

    warning: ClassVar[bool] = True
    field: str
    values: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class DefinedDifferently:
    """``metric`` is defined by recipe ``fields`` that differ between the runs: it measures different
    things in them, so it gets no verdict (each run's own estimate is still shown)."""

    warning: ClassVar[bool] = True
    label: str
    fields: tuple[str, ...]


@dataclass(frozen=True)
class RecipeUnknown:
    """``runs`` record no recipe while others do: whether they counted alike is not known."""

    warning: ClassVar[bool] = True
    runs: tuple[str, ...]


NoteReason = (
    Approximate
    | FrameworkRun
    | LoggedTwice
    | RefusedCounts
    | SparseTokenAxis
    | NotInWindow
    | NonFinite
    | Unlogged
    | WeightingGap
    | MissingPattern
    | AbsoluteScale
    | PairedOnly
    | Influential
    | Stretches
    | ShortMemory
    | Lagging
    | SeedsCovered
    | OnePerStack
    | RecipesDiffer
    | DefinedDifferently
    | RecipeUnknown
)
"""Something a reader of the comparison must know."""
