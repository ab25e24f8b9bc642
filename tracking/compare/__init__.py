"""Run comparison: runs in one tidy frame (loaded by a backend's reader, ``cliptrack.backends.load_runs``)
are aligned; token-weighted clip fractions, reward and throughput are estimated with intervals that
stay honest under autocorrelation (``stats``); an equivalence verdict — or ``insufficient data`` — is stated and shown
as a table, a summary, JSON, panels or a dashboard.

Parts: ``engine`` (``compare``, drawing on ``estimates``, ``pairs``, ``verdicts`` and ``groups``),
``reasons`` (why, as data) and ``notes`` (reasons into sentences), ``findings`` and ``result`` (the
model; ``ComparisonResult``), ``report`` (text, markdown, HTML, JSON), ``views.panels`` (the one
panel list) drawn by ``views.dashboard`` and the backends' panels.

Nothing here imports torch. Plotting libraries, MLflow and wandb are imported only by the modules
that need them.
"""

from typing import TYPE_CHECKING, Any

from cliptrack.core.lazy import lazy_attribute

_HOMES = {
    "ALIGNMENTS": "cliptrack.compare.align",
    "Window": "cliptrack.compare.window",
    "parse_window": "cliptrack.compare.window",
    "unit_table": "cliptrack.compare.align",
    "DEFAULT_CONFIDENCE": "cliptrack.compare.engine",
    "DEFAULT_TOLERANCES": "cliptrack.compare.engine",
    "compare": "cliptrack.compare.engine",
    "COLUMNS": "cliptrack.store.frame",
    "LoadedRun": "cliptrack.store.frame",
    "Point": "cliptrack.store.frame",
    "RunSet": "cliptrack.store.frame",
    "build_frame": "cliptrack.store.frame",
    "QUANTITIES": "cliptrack.compare.quantities",
    "Quantity": "cliptrack.compare.quantities",
    "absolute": "cliptrack.compare.quantities",
    "relative": "cliptrack.compare.quantities",
    "ComparisonResult": "cliptrack.compare.result",
    "Difference": "cliptrack.compare.result",
    "DifferenceSegment": "cliptrack.compare.result",
    "GroupDifference": "cliptrack.compare.result",
    "Note": "cliptrack.compare.result",
    "RunEstimate": "cliptrack.compare.result",
    "MIN_ESS": "cliptrack.compare.stats",
    "MIN_UNITS": "cliptrack.compare.stats",
    "Estimate": "cliptrack.compare.stats",
    "wilson_interval": "cliptrack.compare.stats",
}
"""Name -> the module that holds it (imported on first use, so that ``cliptrack compare --help``
does not import pandas). The public ones are ``__all__`` (docs/API.md); the others serve the
command line, the views and the tests."""

if TYPE_CHECKING:
    from cliptrack.compare.engine import compare
    from cliptrack.compare.quantities import absolute, relative
    from cliptrack.compare.result import ComparisonResult
    from cliptrack.compare.window import parse_window


def __getattr__(name: str) -> Any:
    return lazy_attribute(__name__, _HOMES, name)


__all__ = ["ComparisonResult", "absolute", "compare", "parse_window", "relative"]
