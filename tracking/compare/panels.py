"""The comparison's panels, defined once: the dashboard, the MLflow figures and the W&B workspace
and report all draw this list, in this order.

Each panel has an id, the W&B section it belongs to, a title, a y-axis title and its lines. A line
names the column of ``series.run_series`` the dashboard and the figures plot and the logged metric
key the W&B line plot shows (W&B plots logged keys only: the *split* panel shows the low/high
clipped-token counts there and their fractions of loss tokens in the dashboard and figures).
"""

from __future__ import annotations

from dataclasses import dataclass

from tracking import keys


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
    ``percent``: the y axis is a fraction shown in percent."""

    id: str
    section: str
    title: str
    y_title: str
    lines: tuple[Line, ...]
    percent: bool = False
    band: bool = False

    @property
    def wandb_keys(self) -> list[str]:
        return [line.key for line in self.lines]


PANELS: tuple[Panel, ...] = (
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
)
"""Every panel, in drawing order."""


def sections() -> dict[str, list[Panel]]:
    """Panels grouped by W&B section, sections in first-appearance order."""
    out: dict[str, list[Panel]] = {}
    for panel in PANELS:
        out.setdefault(panel.section, []).append(panel)
    return out
