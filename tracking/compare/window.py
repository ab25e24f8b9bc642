"""The window of a comparison: a half-open range on the alignment axis (steps, tokens seen or seconds)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas is imported when a window cuts a table
    import pandas as pd

__all__ = ["Window", "parse_window"]


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


def _bound(text: str, side: str) -> float | None:
    """One side of a window (None when empty); ValueError naming the window when not a number."""
    try:
        return float(side) if side else None
    except ValueError as exc:
        raise ValueError(f"window {text!r}: START and END must be numbers ({exc})") from exc


def parse_window(text: str | None) -> Window:
    """Parse ``"A:B"``, ``"A:"``, ``":B"`` (numbers on the alignment axis) into a Window."""
    if text is None or text.strip() in ("", ":"):
        return Window()
    if text.count(":") != 1:
        raise ValueError(f"window {text!r} must be 'START:END' (either side may be empty), e.g. '100:500'")
    start, end = (_bound(text, part.strip()) for part in text.split(":"))
    if start is not None and end is not None and end <= start:
        raise ValueError(f"window {text!r} is empty: END must be greater than START")
    return Window(start, end)
