"""The comparison's result: ``ComparisonResult``, what ``engine.compare`` returns. It is
``findings.Findings`` (every estimate, difference, verdict and note, with the lookups) plus its
renderings as methods, each a function of ``report`` that reads the result and nothing else.

The model's parts (``RunEstimate``, ``Difference``, ``GroupDifference``, ``Note``, ...) are named
here too, so a result and its parts import from one place.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from cliptrack.compare import report
from cliptrack.compare.findings import (
    FAIL_ON,
    Difference,
    DifferenceSegment,
    Findings,
    GroupDifference,
    Lead,
    Note,
    RunEstimate,
    combined_verdict,
)
from cliptrack.core.secrets import redact_value

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "FAIL_ON",
    "ComparisonResult",
    "Difference",
    "DifferenceSegment",
    "GroupDifference",
    "Lead",
    "Note",
    "RunEstimate",
    "combined_verdict",
]


class ComparisonResult(Findings):
    """Everything ``compare`` found (``findings.Findings``), with its renderings (``report``)."""

    def table(self) -> pd.DataFrame:
        return report.table(self)

    def formatted_table(self) -> pd.DataFrame:
        return report.formatted_table(self)

    def compact_table(self) -> pd.DataFrame:
        return report.compact_table(self)

    def headline_lines(self) -> list[str]:
        return report.headline_lines(self)

    def grouped_notes(self) -> list[str]:
        return report.grouped_notes(self)

    def summary(self) -> str:
        return report.summary(self)

    def to_markdown(self) -> str:
        return report.markdown(self)

    def to_html_table(self) -> str:
        return report.html_table(self)

    def to_dict(self) -> dict[str, Any]:
        out = report.as_dict(self)
        if self.worst is not None:  # the diagnostic beside the verdicts (cliptrack.compare.worst)
            out["worst_sequences"] = self.worst.to_dict()
        return out

    def to_json(self) -> str:
        if self.worst is None:
            return report.as_json(self)
        return json.dumps(redact_value(self.to_dict()), indent=2, allow_nan=False)
