"""The comparison's panels, defined once: the dashboard, the MLflow figures, the notebook and the
W&B workspace and report all draw this list, in this order.

Two kinds of panel:

- **series** panels draw each run's per-step series (``series.run_series``): a line names the
  column of the plot series the dashboard and the figures draw and the logged metric key the W&B
  line plot shows (W&B plots logged keys only: the *split* panel shows the low/high clipped-token
  counts there and their fractions of loss tokens in the dashboard and figures);
- **difference over training** panels (``quantity`` set, no lines) draw, for one compared
  quantity, the paired difference of each run from the reference per segment of the window with
  its interval band, the ± margin lines and the segments whose verdict is *different* shaded
  (``plots.panel_figures`` computes what to draw from the comparison result). In W&B they plot
  the keys of :func:`difference_keys`, which the comparison logs.

Every compared quantity that counts for a verdict gets its difference panel from its entry in the
registry of compared quantities (``quantities.QUANTITIES``, read by ``compared_quantities``): a new
quantity is one registry entry and needs no panel code.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cliptrack.compare.quantities import QUANTITIES
from cliptrack.core import frameworks, keys

SERIES = "series"
"""Panel kind: each run's per-step series."""
DIFFERENCE = "difference"
"""Panel kind: the per-segment paired difference of one compared quantity ("difference over training")."""


@dataclass(frozen=True)
class Line:
    """One line of a panel: ``column`` of the plot series, W&B ``key``, legend ``label`` suffix, dash style."""

    column: str
    key: str
    label: str = ""
    dash: str = "solid"


@dataclass(frozen=True)
class Panel:
    """One panel. ``band``: draw the rolling clip fraction with its band and the per-step points;
    ``percent``: the y axis is a fraction shown in percent (a difference panel: percentage points);
    ``quantity``: the compared quantity of a difference panel (empty for a series panel)."""

    id: str
    section: str
    title: str
    y_title: str
    lines: tuple[Line, ...]
    percent: bool = False
    band: bool = False
    quantity: str = ""

    @property
    def kind(self) -> str:
        return DIFFERENCE if self.quantity else SERIES

    @property
    def wandb_keys(self) -> list[str]:
        """The logged keys the W&B line plot of this panel shows: a series panel's keys, then the
        frameworks' own names read as one of them (a run that logged one beside ours shows both)."""
        if self.quantity:
            return list(difference_keys(self.quantity))
        ours = [line.key for line in self.lines]
        return ours + [
            m.name for m in frameworks.METRICS if m.key in ours and m.agreement != frameworks.DIFFERENT
        ]


DIFFERENCE_PREFIX = "difference"
"""Prefix of the keys a comparison logs for the difference panels (``difference/<quantity>...``)."""


def difference_keys(quantity: str) -> tuple[str, str, str, str, str]:
    """W&B keys of one quantity's difference panel: the per-segment difference, its interval's
    low and high edges and the −/+ margin, logged by the comparison at each segment's steps."""
    base = f"{DIFFERENCE_PREFIX}/{quantity}"
    return (base, f"{base}:low", f"{base}:high", f"{base}:margin_low", f"{base}:margin_high")


SERIES_PANELS: tuple[Panel, ...] = (
    Panel(
        "clip",
        "clipping",
        "Clip fraction (token-weighted, rolling, with 90% band)",
        "clipped / loss tokens",
        (Line("clip_rolling", keys.CLIP_FRACTION),),
        percent=True,
        band=True,
    ),
    Panel(
        "tokens",
        "clipping",
        "Clipped and loss tokens per step (loss dotted)",
        "tokens",
        (
            Line("clipped_tokens", keys.CLIPPED_TOKENS, "clipped"),
            Line("loss_tokens", keys.LOSS_TOKENS, "loss", "dot"),
        ),
    ),
    Panel(
        "split",
        "clipping",
        "Clipping by side of the band (low dotted, high solid)",
        "clipped / loss tokens",
        (
            Line("low_fraction", keys.CLIPPED_LOW_TOKENS, "low", "dot"),
            Line("high_fraction", keys.CLIPPED_HIGH_TOKENS, "high"),
        ),
        percent=True,
    ),
    Panel("reward", "reward", "Reward", "reward:mean", (Line("reward", keys.REWARD),)),
    Panel(
        "throughput",
        "throughput",
        "Throughput (loss tokens/s)",
        "loss tokens / s",
        (Line("throughput", keys.THROUGHPUT),),
    ),
    Panel("step_time", "throughput", "Step time (s)", "seconds", (Line("step_time", keys.STEP_TIME),)),
    Panel(
        "kl_k3",
        "gauge",
        "Sampler–trainer mismatch KL (k3, nats per token)",
        "kl_k3:sum / loss tokens",
        (Line("kl_k3", keys.KL_K3_MEAN),),
    ),
    Panel(
        "kl_parts",
        "gauge",
        "Mismatch KL split into its causes: engine (dotted) and drift (solid), nats per token",
        "part's kl_k3:sum / loss tokens",
        (
            Line("engine_kl_k3", keys.ENGINE_KL_K3_MEAN, "engine", "dot"),
            Line("drift_kl_k3", keys.DRIFT_KL_K3_MEAN, "drift"),
        ),
    ),
    Panel(
        "abs_log_ratio",
        "gauge",
        "Mean |log ratio| (nats per token)",
        "abs_log_ratio:sum / loss tokens",
        (Line("abs_log_ratio", keys.ABS_LOG_RATIO_MEAN),),
    ),
)
"""The per-run series panels, in drawing order."""

SECTIONS = {
    "clip_fraction": "clipping",
    "reward": "reward",
    "throughput": "throughput",
    "kl_k3": "gauge",
    "abs_log_ratio": "gauge",
    "ratio_outside_fraction": "gauge",
}
"""The section of a quantity's difference panel; a quantity not named here gets ``differences``."""


@dataclass(frozen=True)
class Shown:
    """What a difference panel needs to know of a compared quantity: its name, a label for the
    title, and whether it is a fraction (its difference is shown in percentage points)."""

    name: str
    label: str
    fraction: bool


def difference_panel(quantity: Shown) -> Panel:
    """The "difference over training" panel of one compared quantity."""
    return Panel(
        f"{quantity.name}_difference",
        SECTIONS.get(quantity.name, "differences"),
        f"{quantity.label}: difference over training (per segment, 90% band, ± margin)",
        "run − reference",
        (),
        percent=quantity.fraction,
        quantity=quantity.name,
    )


def compared_quantities() -> list[Shown]:
    """The compared quantities that count for a verdict, from the registry (``quantities.QUANTITIES``)."""
    return [Shown(q.name, q.label[:1].upper() + q.label[1:], q.percent) for q in QUANTITIES if q.verdict]


def difference_panels(quantities: Iterable[Shown]) -> tuple[Panel, ...]:
    """One difference panel per quantity, in the quantities' order."""
    return tuple(difference_panel(q) for q in quantities)


def _ordered(series: tuple[Panel, ...], differences: tuple[Panel, ...]) -> tuple[Panel, ...]:
    """Sections in first-appearance order; in each, its first series panel, the section's
    difference panels (side by side with it on the dashboard), then its other series panels."""
    names = list(dict.fromkeys([p.section for p in series] + [p.section for p in differences]))
    out: list[Panel] = []
    for name in names:
        own = [p for p in series if p.section == name]
        out.extend(own[:1] + [p for p in differences if p.section == name] + own[1:])
    return tuple(out)


PANELS: tuple[Panel, ...] = _ordered(SERIES_PANELS, difference_panels(compared_quantities()))
"""Every panel, in drawing order."""


def sections() -> dict[str, list[Panel]]:
    """Panels grouped by W&B section, sections in first-appearance order."""
    out: dict[str, list[Panel]] = {}
    for panel in PANELS:
        out.setdefault(panel.section, []).append(panel)
    return out


def panel(panel_id: str) -> Panel:
    """The panel with id ``panel_id``."""
    for p in PANELS:
        if p.id == panel_id:
            return p
    raise KeyError(f"no panel {panel_id!r}; panels: {[p.id for p in PANELS]}")
