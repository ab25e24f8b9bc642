"""A self-contained HTML dashboard: the answer, the evidence, the differences, then the rest.

It opens with the headline (three lines: the verdict, the figure with its interval, what would
change it; ``headline``) and, when a control comparison was run, the control's verdict; then the
runs' curves per stack (each stack's mean over seeds at every step with a band of ± one standard
deviation across seeds: the evidence), the machine-dependent ones (throughput, step time) apart;
then the differences as ratios (``×7.76 (+676 %)``, ``differences``) with the "over training"
plots of the quantities judged over two or more segments; the audit and the worst sequences; the
long text and the full verdict table folded; the runs.

plotly.js is embedded inline (its *basic* bundle, vendored in ``_vendor/``: scatter traces are all
the panels use), so the file opens with no network. Every run name and config value is escaped:
HTML text goes through ``cliptrack.core.text.html_text`` (control characters written visibly, so a
newline in a run name cannot start a line of the summary); the figure data is embedded as JSON in a
``<script type="application/json">`` element with ``<``, ``>`` and ``&`` written as ``\\u003c``,
``\\u003e``, ``\\u0026`` so no string can close the element; trace names, titles and notes are
HTML-escaped too because plotly renders a subset of HTML (and a newline as a line break) in them.

It reads well at 1400 px and scales: the tables wrap (long config values break anywhere), the
figures' toolbar shows only on hover and sits above the title's line (title padded below it),
every panel has the same x range and ticks, and lines are downsampled for drawing beyond a few
thousand points per run (``plots``, ``downsample``; the tables keep the exact numbers), so the
150-step demo's dashboard is about 1.3 MB and two runs of a million steps stay a few MB.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from cliptrack.compare.result import ComparisonResult
from cliptrack.compare.views import differences as shown
from cliptrack.compare.views.headline import Control, control_line, headline_lines
from cliptrack.compare.views.panels import SECTIONS
from cliptrack.compare.views.plots import (
    BAND,
    HLINE,
    LINE,
    MARKERS,
    PALETTE,
    SPAN,
    PanelFigure,
    Trace,
    nice_ticks,
    ratio_ticks,
    stacks,
    worst_spread,
)
from cliptrack.compare.views.plots import panel_figures as _panel_figures
from cliptrack.compare.worst import CRITERION_WORDS, IDS_CAVEAT, WorstSequences
from cliptrack.core.secrets import redact, redact_value
from cliptrack.core.text import html_lines, html_text
from cliptrack.core.worst import COLUMNS, CRITERIA
from cliptrack.store.frame import RunSet

__all__ = ["PALETTE", "Control", "figures", "render_dashboard", "write_dashboard"]

PLOTLY_JS = Path(__file__).with_name("_vendor") / "plotly-basic.min.js"
"""The plotly.js basic bundle (scatter, bar, pie), MIT licence beside it."""
PANEL_HEIGHT = 380
"""Height of one panel in pixels."""
LEGEND_WIDTH = 600
"""Pixels of legend row assumed when counting legend rows (a half-width panel at 1400 px)."""
LEGEND_ROW = 20
"""Pixels per legend row."""
WORST_PANEL = "worst-spread"
"""The figure id of the worst sequences' per-sequence spread."""
RECURRING_SHOWN = 5
"""Recurring sequences shown per run (by summed ``|l|``); the rest are folded."""
RECURRING_ROWS = 10
"""Recurring sequences listed per run and criterion in the folded table."""


def _title(text: str) -> dict[str, Any]:
    """A figure's title on its own line, below the (hover-only) toolbar's strip at the top."""
    return {
        "text": text,
        "x": 0.01,
        "xanchor": "left",
        "xref": "container",
        "y": 1,
        "yanchor": "top",
        "yref": "container",
        "pad": {"t": 34},
        "font": {"size": 14},
    }


def _legend_rows(names: list[str]) -> int:
    """Rows a horizontal legend of ``names`` takes at ``LEGEND_WIDTH`` (about 6 px a character
    at 11 px, 46 px of symbol and gap per entry), for the bottom margin."""
    rows, used = 0, LEGEND_WIDTH
    for name in names:
        width = 46 + 6 * len(name)
        if used + width > LEGEND_WIDTH:
            rows, used = rows + 1, 0
        used += width
    return rows


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _xs(values: Any, digits: int = 7) -> list[float | None]:
    """Finite values rounded to ``digits`` significant digits (plenty for a plot); NaN, inf -> null (a gap)."""
    arr = np.asarray(values, dtype=float)
    return [float(f"{v:.{digits}g}") if math.isfinite(v) else None for v in arr.tolist()]


def _scatter(t: Trace, **extra: Any) -> dict[str, Any]:
    name = html_text(t.name)
    group = html_text(t.group)
    return {
        "type": "scatter",
        "name": name or group,
        "legendgroup": group,
        "showlegend": bool(t.name),
        **extra,
    }


def _plotly_trace(t: Trace) -> dict[str, Any] | None:
    """The plotly trace of ``t`` (None for a span, drawn as a layout shape)."""
    if t.kind == BAND:
        assert t.y2 is not None
        x = _xs(t.x)
        return _scatter(
            t,
            x=x + x[::-1],
            y=_xs(t.y) + _xs(t.y2)[::-1],
            fill="toself",
            fillcolor=_rgba(t.color, t.opacity),
            line={"width": 0},
            mode="lines",
            hoverinfo="skip",
        )
    if t.kind == MARKERS:
        return _scatter(
            t,
            x=_xs(t.x),
            y=_xs(t.y),
            mode="markers",
            marker={"size": t.width, "color": t.color, "opacity": t.opacity},
        )
    if t.kind in (LINE, HLINE):
        y = _xs(t.y) if t.kind == LINE else _xs(np.repeat(t.y[:1], len(t.x)))
        return _scatter(
            t,
            x=_xs(t.x),
            y=y,
            mode="lines",
            opacity=t.opacity,
            line={"color": t.color, "dash": t.dash, "width": t.width},
        )
    return None


def _shape(t: Trace) -> dict[str, Any]:
    return {
        "type": "rect",
        "xref": "x",
        "yref": "paper",
        "x0": float(t.x[0]),
        "x1": float(t.x[1]),
        "y0": 0,
        "y1": 1,
        "fillcolor": _rgba(t.color, t.opacity),
        "line": {"width": 0},
        "layer": "below",
    }


def _ratio_axis(fig: PanelFigure) -> dict[str, Any]:
    """A ratio panel's y axis settings: log scale, ticks read as ×2 or +25 % (``plots.ratio_ticks``)."""
    values = [v for t in fig.traces if t.kind != SPAN for v in (t.y, t.y2) if v is not None]
    ticks = ratio_ticks(
        np.concatenate([np.asarray(v, dtype=float) for v in values]) if values else np.ones(1)
    )
    return {
        "type": "log",
        "tickmode": "array",
        "tickvals": [t for t, _ in ticks],
        "ticktext": [lb for _, lb in ticks],
    }


def _layout(fig: PanelFigure) -> dict[str, Any]:
    lo, hi = fig.x_range
    tick0, dtick = nice_ticks(lo, hi)
    rows = _legend_rows([t.name for t in fig.traces if t.name])
    yaxis: dict[str, Any] = {
        "title": {"text": html_text(fig.y_title)},
        "gridcolor": "#eeeeee",
        "automargin": True,
    }
    if fig.percent:
        yaxis["tickformat"] = ".3~%"  # 0.15%, 12.5%, 10%: enough digits near zero, none wasted
    if fig.ratio:
        yaxis.update(_ratio_axis(fig))
    return {
        "title": _title(html_text(fig.title or fig.panel.title)),
        "xaxis": {
            "title": {"text": html_text(fig.x_title), "standoff": 6},
            "automargin": True,
            "range": [lo, hi],
            "autorange": False,
            "tickmode": "linear",
            "tick0": tick0,
            "dtick": dtick,
            "gridcolor": "#eeeeee",
            "zeroline": False,
        },
        "yaxis": yaxis,
        "shapes": [_shape(t) for t in fig.traces if t.kind == SPAN],
        "margin": {"l": 64, "r": 16, "t": 64, "b": 44 + LEGEND_ROW * rows},
        "height": PANEL_HEIGHT,
        "paper_bgcolor": "white",
        "plot_bgcolor": "white",
        # the legend at the figure's foot, below the x axis title, its rows counted into the margin
        "legend": {
            "orientation": "h",
            "x": 0,
            "y": 0,
            "yref": "container",
            "yanchor": "bottom",
            "font": {"size": 11},
        },
        "annotations": [
            {"text": html_text(n), "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5, "showarrow": False}
            for n in fig.notes
        ],
    }


def _plotly(fig: PanelFigure) -> dict[str, Any]:
    data = [d for d in (_plotly_trace(t) for t in fig.traces) if d is not None]
    return {"data": data, "layout": _layout(fig)}


def figures(runset: RunSet, result: ComparisonResult) -> dict[str, Any]:
    """Plotly figures (as plain dicts) keyed by panel id, one per entry of ``panels.PANELS``."""
    return {fig.panel.id: _plotly(fig) for fig in _panel_figures(runset, result)}


MACHINE_SECTIONS = frozenset(SECTIONS.get(q, "") for q in shown.MACHINE_DEPENDENT)
"""Panel sections of the machine-dependent quantities (throughput and step time)."""


def _sections(drawn: Sequence[PanelFigure]) -> tuple[list[str], list[str], list[str]]:
    """The panels the dashboard draws, by place: the on-policy curves, the machine-dependent
    curves, and the difference plots over training (two or more segments only); curves no
    compared run logged are left out (the notes say so)."""
    curves = [f for f in drawn if not f.panel.quantity and not f.notes]
    machine = [f.panel.id for f in curves if f.panel.section in MACHINE_SECTIONS]
    policy = [f.panel.id for f in curves if f.panel.section not in MACHINE_SECTIONS]
    over_training = [f.panel.id for f in drawn if f.panel.quantity and f.segmented and not f.notes]
    return policy, machine, over_training


def _worst_figure(worst: WorstSequences, runs: Sequence[str]) -> dict[str, Any]:
    """The per-sequence spread (``plots.worst_spread``): per step, the summed ``|l|`` of each of
    a run's worst sequences, one marker each (hover: the datum id), a colour per run."""
    data = []
    for run, points in worst_spread(worst).items():
        color = PALETTE[runs.index(run) % len(PALETTE)] if run in runs else PALETTE[-1]
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": html_text(run),
                "x": points.step,
                "y": _xs(points.value),
                "customdata": points.datum,
                "hovertemplate": "step %{x}<br>datum %{customdata}<br>%{y:.4g} nats<extra></extra>",
                "marker": {"size": 6, "color": color, "opacity": 0.6},
            }
        )
    words = CRITERION_WORDS[CRITERIA[0]]
    rows = _legend_rows([str(run) for run in worst.tables])
    return {
        "data": data,
        "layout": {
            "title": _title(f"The worst sequences' {words}, per step (hover: the datum id)"),
            "xaxis": {"title": {"text": "step"}, "gridcolor": "#eeeeee", "zeroline": False},
            "yaxis": {"title": {"text": f"{words} of a sequence (nats)"}, "gridcolor": "#eeeeee"},
            "margin": {"l": 64, "r": 16, "t": 64, "b": 44 + LEGEND_ROW * rows},
            "height": PANEL_HEIGHT,
            "paper_bgcolor": "white",
            "plot_bgcolor": "white",
            "legend": {"orientation": "h", "x": 0, "y": 0, "yref": "container", "yanchor": "bottom"},
        },
    }


def _cells(values: Sequence[Any], tag: str = "td") -> str:
    return "<tr>" + "".join(f"<{tag}>{html_text(str(v))}</{tag}>" for v in values) + "</tr>"


def _number(x: float) -> str:
    return f"{x:.4g}"


def _recurring_table(worst: WorstSequences, criteria: Sequence[str], most: int) -> str:
    """Per run and criterion of ``criteria``, the ``most`` datums among the worst in the most steps."""
    head = (
        "run",
        "ranked by",
        "datum",
        "steps among the worst",
        "share",
        "first-last step",
        "largest",
        "best rank",
    )
    rows = [
        (
            r.run,
            CRITERION_WORDS[r.criterion],
            r.datum,
            f"{r.steps} of {r.tables}",
            f"{r.share:.0%}",
            f"{r.first_step}-{r.last_step}",
            _number(r.largest),
            r.rank,
        )
        for run in worst.tables
        for c in criteria
        for r in worst.recurring_in(run, c)[:most]
    ]
    if not rows:
        return f"<p>No datum is among the worst in {worst.min_steps} or more steps of a run.</p>"
    body = "".join(_cells(row) for row in rows)
    return f'<table class="worst recurring"><thead>{_cells(head, "th")}</thead><tbody>{body}</tbody></table>'


def _last_tables(worst: WorstSequences) -> str:
    """Each run's table of its last step: every criterion's worst, in rank order."""
    parts = []
    for run in worst.tables:
        last = worst.last(run)
        if last is None:
            continue
        head = ("ranked by", "rank", *COLUMNS)
        body = "".join(
            _cells(
                [
                    CRITERION_WORDS[r["criterion"]],
                    r["rank"],
                    *(_number(r[c]) if isinstance(r[c], float) else r[c] for c in COLUMNS),
                ]
            )
            for r in last.records()
        )
        parts.append(
            f"<h3>{html_text(run)}: step {last.step} (k = {last.k})</h3>"
            f'<div class="table-wrap"><table class="worst last"><thead>{_cells(head, "th")}</thead>'
            f"<tbody>{body}</tbody></table></div>"
        )
    return "".join(parts)


def _worst_section(worst: WorstSequences | None) -> str:
    """The worst sequences (a diagnostic, no verdict): the per-sequence spread, the datums that
    recur, and each run's last table folded."""
    if worst is None:
        return ""
    return (
        '<h2 id="worst">Worst sequences</h2>'
        f'<p class="note">The sequences carrying the most sampler-trainer mismatch, per step (a diagnostic, '
        f"no verdict); {html_text(IDS_CAVEAT)}.</p>"
        f"{_plots([WORST_PANEL])}"
        "<h3>Sequences that recur as worst (by summed |log ratio|)</h3>"
        f'<div class="table-wrap">{_recurring_table(worst, CRITERIA[:1], RECURRING_SHOWN)}</div>'
        '<details id="worst-recurring"><summary>Every criterion: summed |log ratio|, summed k3, largest '
        "token |log ratio|</summary>"
        f'<div class="table-wrap">{_recurring_table(worst, CRITERIA, RECURRING_ROWS)}</div></details>'
        '<details id="worst-last"><summary>The last step\'s worst sequences, per run</summary>'
        f"{_last_tables(worst)}</details>"
    )


def _audit_table(result: ComparisonResult) -> str:
    """Where a run logged a framework's own number beside our exact one: both, the gap and why
    (``result.audits``); empty when none did."""
    if not result.audits:
        return ""
    rows = []
    for a in result.audits:
        scale, unit = (100.0, " %") if a.percent else (1.0, "")
        cells = [
            a.run,
            a.metric,
            f"{a.framework}'s {a.name}",
            f"{a.theirs * scale:.4g}{unit}",
            f"{a.exact * scale:.4g}{unit}",
            f"{a.gap * scale:+.3g}{' pp' if a.percent else ''}",
            a.sentence(),
        ]
        rows.append("<tr>" + "".join(f"<td>{html_text(redact(str(c)))}</td>" for c in cells) + "</tr>")
    head = "".join(
        f"<th>{h}</th>" for h in ("run", "quantity", "their metric", "theirs", "exact", "gap", "audit")
    )
    return (
        "<h2>Their number beside the exact one</h2>"
        '<p class="note">The comparison uses the exact one (a ratio of token sums); the framework\'s own '
        "number is its mean over the same steps.</p>"
        f'<div class="table-wrap"><table class="audit" id="audit"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def _safe_json(obj: Any) -> str:
    text = json.dumps(redact_value(obj), allow_nan=False, separators=(",", ":"))
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
        rows.append("<tr>" + "".join(f"<td>{html_text(redact(str(c)))}</td>" for c in cells) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in ("run", "backend", "run id", "source", "config"))
    cols = "".join(f'<col style="width:{w}">' for w in ("14%", "8%", "14%", "24%", "40%"))
    return (
        f'<table class="runs"><colgroup>{cols}</colgroup><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


_STYLE = """
*,*::before,*::after{box-sizing:border-box}
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;padding:20px 24px;
color:#222;max-width:1400px}
h1{font-size:1.5em;margin:0 0 4px} h2{font-size:1.15em;margin-top:28px}
.summary,.headline,.control{white-space:pre-wrap;overflow-wrap:anywhere;background:#f6f8fa;border-left:6px solid #888;
padding:10px 14px;margin:6px 0}
.headline{font-size:1.08em;line-height:1.5} .headline::first-line{font-weight:650;font-size:1.1em}
.control{font-size:1em}
p.equivalent{border-color:#2ca02c} p.different{border-color:#d62728}
p.inconclusive{border-color:#ff7f0e} p.insufficient-data{border-color:#7f7f7f}
p.note.machine,h3.machine{color:#555}
table.differences td.judged{font-weight:600}
table.differences tr.machine td{color:#555;background:#f4f6f8}
table.differences td.verdict.machine{background:#e8edf3;color:#333;font-style:italic}
details{margin-top:28px} details>summary{cursor:pointer;font-weight:600;font-size:1.05em}
.table-wrap{max-width:100%;overflow-x:auto}
table{border-collapse:collapse;font-size:0.9em;margin:8px 0;max-width:100%}
table.runs{width:100%;table-layout:fixed}
th,td{border:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top;overflow-wrap:break-word}
table.runs td{overflow-wrap:anywhere}
th{background:#f0f0f0}
td.verdict.equivalent{background:#e6f4ea} td.verdict.different{background:#fce8e6}
td.verdict.inconclusive{background:#fff4e5} td.verdict.insufficient-data{background:#eeeeee}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(560px,100%),1fr));gap:12px}
.plot{min-height:380px;min-width:0;border:1px solid #eee}
h3{font-size:1em;margin-top:18px} p.note{color:#444}
table.worst td{font-variant-numeric:tabular-nums}
"""


@lru_cache(maxsize=1)
def _plotly_js() -> str:
    return PLOTLY_JS.read_text(encoding="utf-8").replace("</script", "<\\/script")


_BOOT = (
    "(function(){var figs=JSON.parse(document.getElementById('cliptrack-figures').textContent);"
    "var keys=Object.keys(figs),done=0;keys.forEach(function(k){var f=figs[k];"
    "Plotly.newPlot('plot-'+k,f.data,f.layout,{responsive:true,displaylogo:false,"
    "displayModeBar:'hover',modeBarButtonsToRemove:['select2d','lasso2d']}).then(function(){"
    "done+=1;document.body.setAttribute('data-rendered',String(done));});});})();"
)


def _plots(keys: Sequence[str]) -> str:
    return (
        '<div class="grid">'
        + "".join(f'<div class="plot" id="plot-{key}" data-panel="{key}"></div>' for key in keys)
        + "</div>"
    )


def _differences_table(result: ComparisonResult) -> str:
    """The differences as read (``differences.rows``): the on-policy quantities first (in bold),
    the machine-dependent last, their verdict in a neutral style, never a verdict's colour."""
    pct = int(round(result.confidence * 100))
    found = sorted(shown.rows(result), key=lambda r: (r.machine, not r.on_policy))
    body = []
    for r in found:
        if r.machine:
            verdict = f'<td class="verdict machine">{html_text(r.verdict)} on these machines</td>'
        else:
            verdict = (
                f'<td class="verdict {html_text(r.verdict.replace(" ", "-"))}">{html_text(r.verdict)}</td>'
            )
        label = f"{r.label} (machine-dependent)" if r.machine else r.label
        cells = [label, r.compared, r.values, r.difference, r.interval, r.margin]
        first = "judged" if r.on_policy else ""
        tds = "".join(
            f'<td class="{first}">{html_text(c)}</td>' if i == 0 and first else f"<td>{html_text(c)}</td>"
            for i, c in enumerate(cells)
        )
        body.append(
            f'<tr class="{"machine" if r.machine else "policy"}" data-metric="{html_text(r.metric)}">{tds}{verdict}</tr>'
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("quantity", "compared", "values", "difference", f"{pct} % interval", "margin", "verdict")
    )
    table = (
        f'<table class="differences" id="differences-table"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )
    note = ""
    if any(r.machine for r in found):
        note = (
            '<p class="note machine">Throughput depends on the machine each run ran on and its load, '
            "not on the stack: its verdict says how these runs' machines compared, nothing about the "
            "stacks, and no on-policy answer reads it.</p>"
        )
    return f'<div class="table-wrap">{table}</div>{note}'


def _curves_note(result: ComparisonResult) -> str:
    if result.groups:
        return (
            "Each stack's mean over its seeds at every step (thick), with a band of ± one standard "
            "deviation across its seeds at that step (the spread the verdict's interval includes); "
            "each seed thin."
        )
    return "Each run as logged; the clip fraction with its rolling 90 % band and the per-step points."


def render_dashboard(
    runset: RunSet,
    result: ComparisonResult,
    title: str = "cliptrack comparison",
    control: Control | None = None,
) -> str:
    """The dashboard as one HTML string (plotly.js basic inline, ~1.2 MB, plus the figures' data).

    It opens with the answer: the headline (three lines: verdict, figure, what would change it)
    and, with ``control``, the control's verdict; then the runs' curves per stack, the
    machine-dependent ones apart; then the differences as ratios with the plots over training;
    the long text (every row and note) is folded below, then the runs."""
    drawn = _panel_figures(runset, result)
    policy, machine, over_training = _sections(drawn)
    figs = {f.panel.id: _plotly(f) for f in drawn if f.panel.id in {*policy, *machine, *over_training}}
    if result.worst is not None:
        figs[WORST_PANEL] = _worst_figure(result.worst, result.runs)
    verdict = result.on_policy_verdict.replace(" ", "-")
    members = [m for group in stacks(result).values() for m in group]
    control_html = ""
    if control is not None:
        line = control_line(control, result.on_policy_verdict)
        cls = control.result.on_policy_verdict.replace(" ", "-")
        control_html = f'<p class="control {cls}" id="control">{html_text(line)}</p>'
    machine_html = ""
    if machine:
        machine_html = (
            '<h3 class="machine" id="machine-curves">Machine-dependent: throughput and step time</h3>'
            '<p class="note machine">These depend on the machine each run ran on and its load, not on '
            f"the stack.</p>{_plots(machine)}"
        )
    over_html = (
        f"<h3>Over training (per segment)</h3>{_plots(over_training)}"
        if over_training
        else '<p class="note">Judged over the whole window: no quantity was compared over two or more '
        "segments, so there is no difference over training to draw.</p>"
    )
    prose = html_lines("\n".join(result.headline_lines()))
    # what comes from the runs (names, config, store addresses) has no credential (cliptrack.core.secrets);
    # the vendored and static scripts are left as they are
    content = redact(
        f"<h1>{html_text(title)}</h1>"
        f'<p class="headline {verdict}" id="headline">{html_lines(chr(10).join(headline_lines(result)))}</p>'
        f"{control_html}"
        f'<h2 id="curves">The curves, per stack</h2><p class="note">{_curves_note(result)}</p>'
        f"{_plots(policy)}{machine_html}"
        f'<h2 id="differences">The differences (run / reference)</h2>{_differences_table(result)}'
        f"{over_html}"
        f"{_audit_table(result)}"
        f"{_worst_section(result.worst)}"
        '<details id="details"><summary>How they were compared: the full verdict table, every row and '
        "note</summary>"
        f'<p class="summary {verdict}" id="prose">{prose}</p>'
        f'<div class="table-wrap">{result.to_html_table()}</div>'
        f'<p class="summary {verdict}" id="summary">{html_lines(result.summary())}</p></details>'
        f'<h2>Runs</h2><div class="table-wrap">{_runs_table(runset, members)}</div>'
        f'<script type="application/json" id="cliptrack-figures">{_safe_json(figs)}</script>'
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{redact(html_text(title))}</title><style>{_STYLE}</style>"
        f'<script>{_plotly_js()}</script></head>\n<body data-rendered="0">'
        f"{content}<script>{_BOOT}</script></body></html>\n"
    )


def write_dashboard(
    path: str | Path,
    runset: RunSet,
    result: ComparisonResult,
    title: str = "cliptrack comparison",
    control: Control | None = None,
) -> Path:
    """Write ``render_dashboard`` to ``path`` (UTF-8) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_dashboard(runset, result, title, control), encoding="utf-8")
    return path
