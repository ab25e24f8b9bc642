"""The dashboard as it was before downsampling and the basic plotly.js bundle (kept as the anchor of
``benchmarks/dashboard.py``): every point of every series through ``plotly.graph_objects``, the
full plotly.js inline, the six per-run series panels.

Original description: a self-contained HTML dashboard: interactive plotly figures, the verdict
table and the runs.

plotly.js is embedded inline, so the file opens with no network. Every run name and config value is
escaped: HTML text goes through ``html.escape``; the figure data is embedded as JSON in a
``<script type="application/json">`` element with ``<``, ``>`` and ``&`` written as ``\\u003c``,
``\\u003e``, ``\\u0026`` so no string can close the element; trace names are HTML-escaped because
plotly renders a subset of HTML in legends.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cliptrack.compare.result import ComparisonResult
from cliptrack.compare.views.panels import SERIES_PANELS as PANELS
from cliptrack.compare.views.series import AXIS_TITLES, all_series
from cliptrack.store.frame import RunSet

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _xs(values: Any) -> list[float | None]:
    return [float(v) if math.isfinite(v) else None for v in values]  # NaN, inf -> null (a gap)


def figures(runset: RunSet, result: ComparisonResult) -> dict[str, Any]:
    """Plotly figures (as plain dicts) keyed by panel id, one per entry of ``panels.PANELS``."""
    import plotly.graph_objects as go

    series = all_series(runset, result.runs, result.align, result.window)
    x_title = AXIS_TITLES[result.align]
    out = {}
    for panel in PANELS:
        fig = go.Figure()
        for i, (label, s) in enumerate(series.items()):
            color = PALETTE[i % len(PALETTE)]
            name = html.escape(f"{label} [{result.backends.get(label, '')}]")
            x = _xs(s["x"])
            if panel.band:
                fig.add_trace(
                    go.Scatter(
                        x=x + x[::-1],
                        y=_xs(s["band_high"]) + _xs(s["band_low"])[::-1],
                        fill="toself",
                        fillcolor=_rgba(color, 0.18),
                        line={"width": 0},
                        hoverinfo="skip",
                        legendgroup=name,
                        showlegend=False,
                        name=f"{name} band",
                    )
                )
                fig.add_trace(
                    go.Scatter(
                        x=x,
                        y=_xs(s["clip_fraction"]),
                        mode="markers",
                        marker={"size": 4, "color": color, "opacity": 0.45},
                        legendgroup=name,
                        showlegend=False,
                        name=f"{name} per step",
                    )
                )
            for line in panel.lines:
                fig.add_trace(
                    go.Scatter(
                        x=x,
                        y=_xs(s[line.column]),
                        mode="lines",
                        legendgroup=name,
                        name=f"{name} {line.label}".strip(),
                        line={"color": color, "dash": line.dash, "width": 2 if panel.band else 1.5},
                    )
                )
        fig.update_layout(
            title={"text": panel.title},
            xaxis_title=x_title,
            yaxis_title=panel.y_title,
            template="plotly_white",
            margin={"l": 60, "r": 20, "t": 50, "b": 50},
            height=360,
            legend={"orientation": "h", "y": -0.25},
        )
        if panel.percent:
            fig.update_yaxes(tickformat=".1%")
        out[panel.id] = fig.to_plotly_json()
    return out


def _safe_json(obj: Any) -> str:
    import plotly.utils

    text = json.dumps(obj, cls=plotly.utils.PlotlyJSONEncoder, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _runs_table(runset: RunSet, labels: Sequence[str]) -> str:
    rows = []
    for label in labels:
        info = runset.info(label)
        config = "; ".join(f"{k}={v}" for k, v in sorted(info.run.config.items(), key=lambda kv: str(kv[0])))
        cells = [
            info.display,
            info.run.backend_label or "",
            info.run.run_id,
            f"{info.source}: {info.location}",
            config,
        ]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("run", "backend", "run id", "source", "config"))
    return f'<table class="runs"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1400px}
h1{font-size:1.5em;margin-bottom:4px} h2{font-size:1.15em;margin-top:28px}
.summary{white-space:pre-wrap;background:#f6f8fa;border-left:4px solid #888;padding:10px 14px}
.summary.equivalent{border-color:#2ca02c} .summary.different{border-color:#d62728}
.summary.inconclusive{border-color:#ff7f0e} .summary.insufficient-data{border-color:#7f7f7f}
table{border-collapse:collapse;font-size:0.9em;margin:8px 0} th,td{border:1px solid #ddd;padding:4px 8px;
text-align:left;vertical-align:top} th{background:#f0f0f0}
td.verdict.equivalent{background:#e6f4ea} td.verdict.different{background:#fce8e6}
td.verdict.inconclusive{background:#fff4e5} td.verdict.insufficient-data{background:#eeeeee}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:12px}
.plot{min-height:360px;border:1px solid #eee}
"""


def render_dashboard(runset: RunSet, result: ComparisonResult, title: str = "cliptrack comparison") -> str:
    """The dashboard as one HTML string (plotly.js inline, ~5 MB)."""
    import plotly.offline

    figs = figures(runset, result)
    divs = "".join(f'<div class="plot" id="plot-{key}" data-panel="{key}"></div>' for key in figs)
    verdict = result.on_policy_verdict.replace(" ", "-")
    plotly_js = plotly.offline.get_plotlyjs().replace("</script", "<\\/script")
    script = (
        "(function(){var figs=JSON.parse(document.getElementById('cliptrack-figures').textContent);"
        "var keys=Object.keys(figs),done=0;keys.forEach(function(k){var f=figs[k];"
        "Plotly.newPlot('plot-'+k,f.data,f.layout,{responsive:true,displaylogo:false}).then(function(){"
        "done+=1;document.body.setAttribute('data-rendered',String(done));});});})();"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style>"
        f'<script>{plotly_js}</script></head>\n<body data-rendered="0">'
        f"<h1>{html.escape(title)}</h1>"
        f'<p class="summary {verdict}" id="summary">{html.escape(result.summary())}</p>'
        f"<h2>Verdict table</h2>{result.to_html_table()}"
        f'<h2>Plots</h2><div class="grid">{divs}</div>'
        f"<h2>Runs</h2>{_runs_table(runset, result.runs)}"
        f'<script type="application/json" id="cliptrack-figures">{_safe_json(figs)}</script>'
        f"<script>{script}</script></body></html>\n"
    )


def write_dashboard(
    path: str | Path, runset: RunSet, result: ComparisonResult, title: str = "cliptrack comparison"
) -> Path:
    """Write ``render_dashboard`` to ``path`` (UTF-8) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_dashboard(runset, result, title), encoding="utf-8")
    return path
