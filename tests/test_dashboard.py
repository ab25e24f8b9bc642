"""The HTML dashboard: self-contained, escaped, rendered by headless Chromium without errors, and
laid out at 1400 px with nothing running off the page or covering a title."""

from __future__ import annotations

import html
import json
import math
import os
import re
import subprocess
from pathlib import Path

import pytest
from cliptrack.compare import LoadedRun, RunSet, compare
from cliptrack.compare.views.dashboard import render_dashboard, write_dashboard
from cliptrack.compare.views.panels import PANELS
from cliptrack.store.records import RunInfo

from tests._compare_fixtures import megatron_vs_miles
from tests._tools import CHROMIUM, needs_chromium

EVIL = "<script>alert(1)</script>"


LONG_CONFIG = "ckpt=/checkpoints/" + "x" * 400
"""A config value with no space to wrap at: the runs table must still fit the page."""


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    megatron, miles = megatron_vs_miles(miles_clip_p=0.15, miles_name=EVIL, miles_missing=(3,))
    miles.config["note"] = "</script><img src=x onerror=alert(2)>"
    megatron.config["path"] = LONG_CONFIG
    rs = RunSet.from_points(
        [
            (LoadedRun(RunInfo(r.run_id, r.run_name, r.backend, r.config), "test"), r.points)
            for r in (megatron, miles)
        ]
    )
    result = compare(rs)
    path = write_dashboard(tmp_path_factory.mktemp("dash") / "dashboard.html", rs, result)
    return path, result


def test_self_contained_and_escaped(dashboard):
    path, result = dashboard
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"""<script[^>]+src=|<link[^>]+href=["']?https?:""", text)
    # plotly.js is inline: the only raw <script> tags are ours (plotly, JSON data, boot script)
    assert text.count("<script") == 3
    assert EVIL not in text and "<img src=x" not in text
    assert html.escape(EVIL) in text
    assert "\\u0026lt;script\\u0026gt;alert(1)" in text  # trace names inside the figure JSON
    assert f'class="summary {result.on_policy_verdict}"' in text
    drawn = _drawn(text)
    assert set(drawn) <= {panel.id for panel in PANELS} and "clip" in drawn  # the one panel list


def _drawn(page: str) -> list[str]:
    """The panel ids a dashboard page draws, in page order."""
    return re.findall(r'data-panel="([^"]+)"', page)


OPENING = {
    "equivalent": "Equally on-policy:",
    "different": "Not equally on-policy:",
    "inconclusive": "Inconclusive:",
    "insufficient data": "Insufficient data:",
}


def test_opens_with_the_answer_then_the_curves_then_the_differences(dashboard):
    """The headline (three lines: verdict, figure, what would change it), then the runs' curves,
    then the differences table and the plots over training; the long text and the full verdict
    table folded in a <details> below them."""
    path, result = dashboard
    text = path.read_text(encoding="utf-8")
    body = text[text.index("<body") :]
    headline = re.search(r'<p class="headline ([^"]*)" id="headline">(.*?)</p>', body, re.S)
    assert headline and headline.group(1) == result.on_policy_verdict.replace(" ", "-")
    lines = html.unescape(headline.group(2)).split("\n")
    assert len(lines) == 3, lines
    assert lines[0].startswith(OPENING[result.on_policy_verdict])
    assert lines[1].startswith("The figure: clip fraction, ") and "90 % interval" in lines[1]
    assert lines[2].startswith("What would change it: ")
    assert 'id="control"' not in body  # no control comparison was given
    panels = _drawn(body)
    curves = [p for p in panels if not p.endswith("_difference")]
    over_training = [p for p in panels if p.endswith("_difference")]
    assert panels == curves + over_training and over_training  # this pair has segments
    at = body.index
    assert at('id="headline"') < at(f'data-panel="{curves[0]}"') < at('id="differences-table"')
    assert at('id="differences-table"') < at(f'data-panel="{over_training[0]}"') < at("<details")
    details = body[at("<details") : at("</details>")]
    assert 'id="summary"' in details and "<summary>" in details and 'class="verdict-table"' in details


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    base = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=15000",
    ]
    return subprocess.run(
        base + args, capture_output=True, text=True, timeout=120, env={**os.environ, "TZ": "UTC"}
    )


def _console(stderr: str) -> list[str]:
    """The page's console lines, less those Chromium writes of itself whatever the page does (its
    network interventions on a busy machine: "Slow network is detected ...")."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line and not _chromium_own(line)]


CHROMIUM_OWN = ("Slow network is detected",)
"""Console messages Chromium writes of itself (interventions), not the page."""


def _chromium_own(line: str) -> bool:
    return any(text in line for text in CHROMIUM_OWN)


def test_console_filter_keeps_the_pages_lines_and_drops_chromiums_own():
    page = '[1:2:INFO:CONSOLE(1)] "Uncaught ReferenceError: x is not defined", source: file:///a.html (1)'
    own = '[1:2:INFO:CONSOLE(0)] "[Intervention] Slow network is detected. See https://x", source:  (0)'
    assert _console("\n".join([page, own, "[1:2:INFO:other] not a console line"])) == [page]


@needs_chromium
@pytest.mark.slow
def test_console_capture_sees_errors(tmp_path):
    """Control: the console capture below does report a page's errors."""
    page = tmp_path / "bad.html"
    page.write_text("<html><body><script>undefinedFunction();</script></body></html>")
    proc = _chromium(["--dump-dom", page.as_uri()], tmp_path / "profile")
    assert any("undefinedFunction is not defined" in line for line in _console(proc.stderr))


@needs_chromium
@pytest.mark.slow
def test_renders_in_headless_chromium(dashboard, tmp_path):
    path, result = dashboard
    dom = _chromium(["--dump-dom", path.as_uri()], tmp_path / "profile")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert _console(dom.stderr) == [], _console(dom.stderr)
    out = dom.stdout
    drawn = _drawn(path.read_text(encoding="utf-8"))
    assert f'data-rendered="{len(drawn)}"' in out  # every panel drawn by plotly
    assert out.count("js-plotly-plot") >= len(drawn)
    assert "megatron-run" in out and html.escape(EVIL) in out
    assert EVIL not in out  # shown as text, never as an element
    assert '<img src="x"' not in out and "<img src=x" not in out
    legend = re.findall(r'class="legendtext"[^>]*>([^<]*)<', out)
    assert any("megatron-run" in t for t in legend) and any("&lt;script&gt;alert(1)" in t for t in legend)

    shot = tmp_path / "dashboard.png"
    proc = _chromium(
        ["--window-size=1400,1800", f"--screenshot={shot}", path.as_uri()], tmp_path / "profile2"
    )
    assert _console(proc.stderr) == []
    assert shot.exists() and shot.stat().st_size > 50_000
    print(f"\ndashboard screenshot: {shot}")


def test_render_is_deterministic(dashboard):
    path, result = dashboard
    megatron, miles = megatron_vs_miles(miles_clip_p=0.15, miles_name=EVIL, miles_missing=(3,))
    miles.config["note"] = "</script><img src=x onerror=alert(2)>"
    megatron.config["path"] = LONG_CONFIG
    rs = RunSet.from_points(
        [
            (LoadedRun(RunInfo(r.run_id, r.run_name, r.backend, r.config), "test"), r.points)
            for r in (megatron, miles)
        ]
    )
    assert render_dashboard(rs, compare(rs)) == path.read_text(encoding="utf-8")


def test_insufficient_data_is_shown(tmp_path):
    from tests._compare_fixtures import synthetic_run

    a = synthetic_run("a", "a", "megatron", seed=1, n_steps=30)
    b = synthetic_run("b", "b", "miles", seed=2, n_steps=30, clip_p=0.3)
    a.points[10].metrics["reward:mean"] = float("nan")
    rs = RunSet.from_points(
        [(LoadedRun(RunInfo(r.run_id, r.run_name, r.backend), "test"), r.points) for r in (a, b)]
    )
    result = compare(rs)
    assert result.on_policy_verdict == "insufficient data"
    text = render_dashboard(rs, result)
    assert 'class="summary insufficient-data"' in text
    assert '<td class="verdict insufficient-data">insufficient data</td>' in text
    assert "only 30 paired units (minimum 100)" in text
    assert "Warning: a: reward:mean is NaN or infinite at 1 of 30 steps (first at step 10)" in text


LAYOUT_CHECK = r"""
<script>
(function(){
  function box(el){var r=el.getBoundingClientRect();return {l:r.left,r:r.right,t:r.top,b:r.bottom,w:r.width,h:r.height};}
  function meets(a,b){return a.w>0&&b.w>0&&a.l<b.r-0.5&&b.l<a.r-0.5&&a.t<b.b-0.5&&b.t<a.b-0.5;}
  function name(el){return el.tagName.toLowerCase()+(el.id?'#'+el.id:'')+
    (typeof el.className==='string'&&el.className?'.'+el.className.trim().split(/\s+/).join('.'):'');}
  function check(){
    var want=Number(document.body.getAttribute('data-expect')||'0');
    if(Number(document.body.getAttribute('data-rendered')||'0')<want){setTimeout(check,50);return;}
    var vw=window.innerWidth,out={viewport:vw,scrollWidth:document.documentElement.scrollWidth,
      overflow:[],overlaps:[],xticks:{}};
    document.querySelectorAll('body *').forEach(function(el){
      if(el.closest('#js-plotly-tester')||el.tagName==='SCRIPT')return;
      var b=box(el);
      if(b.w>0&&(b.r>vw+0.5||b.l<-0.5))out.overflow.push(name(el)+' ['+b.l.toFixed(0)+', '+b.r.toFixed(0)+']');
    });
    document.querySelectorAll('.js-plotly-plot').forEach(function(plot){
      var id=plot.id,title=plot.querySelector('.gtitle'),bar=plot.querySelector('.modebar');
      var pb=box(plot),parts=[['title',title],['x title',plot.querySelector('.g-xtitle')],
        ['legend',plot.querySelector('.legend')]];
      if(title&&bar&&meets(box(title),box(bar)))out.overlaps.push(id+': toolbar covers the title');
      parts.forEach(function(p){if(p[1]){var b=box(p[1]);
        if(b.w>0&&(b.r>pb.r+0.5||b.l<pb.l-0.5||b.b>pb.b+0.5))out.overflow.push(id+': '+p[0]+' outside its panel');}});
      var xt=plot.querySelector('.g-xtitle'),lg=plot.querySelector('.legend');
      if(xt&&lg&&meets(box(xt),box(lg)))out.overlaps.push(id+': legend covers the x axis title');
      var ticks=[].map.call(plot.querySelectorAll('.xtick text'),function(t){return t.textContent;});
      plot.querySelectorAll('.xtick text').forEach(function(t){
        if(xt&&meets(box(t),box(xt)))out.overlaps.push(id+': x axis title covers tick '+t.textContent);});
      out.xticks[id]=ticks.join(' ');
    });
    document.body.setAttribute('data-layout-check',JSON.stringify(out));
  }
  window.addEventListener('load',function(){setTimeout(check,0);});
})();
</script>
"""
"""Injected into a copy of a page: once ``data-rendered`` reaches ``data-expect``, records into
``data-layout-check`` the viewport width, the document's scroll width, every element whose box
leaves the viewport (plotly's off-screen text-measuring element excepted), every panel part
outside its panel, toolbars over titles, legends over x axis titles, axis titles over ticks, and
each panel's x tick labels."""


def _layout(page: Path, expect: int, tmp_path: Path) -> dict:
    """Open ``page`` at 1400 px in headless Chromium with ``LAYOUT_CHECK`` and return its record."""
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"<body([^>]*)>", rf'<body\1 data-expect="{expect}">', text, count=1)
    checked = tmp_path / f"checked-{page.name}"
    checked.write_text(text.replace("</body>", LAYOUT_CHECK + "</body>"), encoding="utf-8")
    proc = _chromium(
        ["--hide-scrollbars", "--window-size=1400,1000", "--dump-dom", checked.as_uri()],
        tmp_path / f"profile-{page.stem}",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r'data-layout-check="([^"]*)"', proc.stdout)
    assert found, "the layout check did not run: " + proc.stderr[-2000:]
    return json.loads(html.unescape(found.group(1)))


CONTROL = """<!DOCTYPE html><html><head><meta charset="utf-8"><style>body{margin:24px;max-width:1400px}
td{white-space:nowrap}</style><script>PLOTLY</script></head><body data-rendered="0">
<table><tr><td>WIDE</td></tr></table><div id="plot-a"></div><div id="plot-b"></div><script>
var done=0;function mark(){done+=1;document.body.setAttribute('data-rendered',String(done));}
Plotly.newPlot('plot-a',[{x:[0,199],y:[0,1]}],{title:{text:'A long centred title that runs under the toolbar on the right'},
width:640,height:300,margin:{t:40}},{displayModeBar:true}).then(mark);
Plotly.newPlot('plot-b',[{x:[0,149],y:[0,1]}],{width:640,height:300},{displayModeBar:true}).then(mark);
</script></body></html>"""


@needs_chromium
@pytest.mark.slow
def test_layout_check_sees_overflow_covered_titles_and_differing_ticks(tmp_path):
    """Control: the layout check reports what the dashboard must not do."""
    from cliptrack.compare.views.dashboard import PLOTLY_JS

    page = tmp_path / "control.html"
    js = PLOTLY_JS.read_text(encoding="utf-8").replace("</script", "<\\/script")
    page.write_text(CONTROL.replace("PLOTLY", js).replace("WIDE", "x" * 600), encoding="utf-8")
    found = _layout(page, 2, tmp_path)
    assert found["viewport"] == 1400
    assert found["scrollWidth"] > 1400
    assert any(entry.startswith("td ") for entry in found["overflow"]), found["overflow"]
    assert "plot-a: toolbar covers the title" in found["overlaps"]
    assert found["xticks"]["plot-a"] != found["xticks"]["plot-b"]


@needs_chromium
@pytest.mark.slow
def test_layout_at_1400px(dashboard, tmp_path):
    """At 1400 px nothing leaves the page (the runs table wraps a 400-character config value), no
    toolbar covers a title, no legend covers an axis title, and every panel has the same x ticks."""
    path, _ = dashboard
    drawn = _drawn(path.read_text(encoding="utf-8"))
    found = _layout(path, len(drawn), tmp_path)
    assert found["viewport"] == 1400
    assert found["scrollWidth"] <= 1400
    assert found["overflow"] == []
    assert found["overlaps"] == []
    ticks = found["xticks"]
    assert sorted(ticks) == sorted(f"plot-{panel}" for panel in drawn)
    assert len(set(ticks.values())) == 1 and next(iter(ticks.values())), ticks
    shot = tmp_path / "dashboard-1400.png"
    proc = _chromium(
        ["--hide-scrollbars", "--window-size=1400,2400", f"--screenshot={shot}", path.as_uri()],
        tmp_path / "profile-shot",
    )
    assert proc.returncode == 0 and shot.stat().st_size > 50_000
    print(f"\ndashboard screenshot at 1400 px: {shot}")


def _groups(n_steps: int, miles_clip: float = 0.14, seeds: int = 2, throughput: float = 1000.0):
    """Seed groups of synthetic runs: megatron and miles (clip ``miles_clip``, throughput
    ``throughput``), ``seeds`` seeds each, ``n_steps`` steps; the run set and the group names."""
    from tests._compare_fixtures import synthetic_run

    runs = [synthetic_run(f"m{i}", f"m{i}", "megatron", seed=i, n_steps=n_steps) for i in range(seeds)]
    runs += [
        synthetic_run(
            f"l{i}", f"l{i}", "miles", seed=5 + i, n_steps=n_steps, clip_p=miles_clip, throughput=throughput
        )
        for i in range(seeds)
    ]
    rs = RunSet.from_points(
        [(LoadedRun(RunInfo(r.run_id, r.run_name, r.backend, r.config), "test"), r.points) for r in runs]
    )
    groups = {"megatron": [f"m{i}" for i in range(seeds)], "miles": [f"l{i}" for i in range(seeds)]}
    return rs, groups, runs


def _figures(text: str) -> dict:
    return json.loads(
        re.search(r'id="cliptrack-figures">(.*?)</script>', text, re.S).group(1).replace("\\u0026", "&")
    )


def test_seed_groups_are_drawn_per_stack_as_the_mean_with_a_band_of_the_spread(tmp_path):
    """A comparison of seed groups: every seed is in the runs table; each group is one legend entry
    per line, its mean over seeds at each step with a band of ± one standard deviation across its
    seeds (numpy's, over the runs' own series), each seed thin."""
    import numpy as np
    from cliptrack.compare.views.series import run_series

    rs, groups, runs = _groups(120)
    result = compare(rs, groups=groups)
    text = render_dashboard(rs, result)
    table = text[text.index('<table class="runs">') :]
    assert all(f"<td>{r.run_name}</td>" in table for r in runs)
    figures = _figures(text)
    legend = [t["name"] for t in figures["clip"]["data"] if t["showlegend"]]
    assert legend == ["megatron (2 seeds): mean ± sd over seeds", "miles (2 seeds): mean ± sd over seeds"]
    seeds = np.column_stack([run_series(rs, r)["clip_rolling"].to_numpy() for r in groups["miles"]])
    [mean] = [t for t in figures["clip"]["data"] if t["name"].startswith("miles") and t["showlegend"]]
    finite = np.isfinite(seeds).all(axis=1)
    assert np.allclose(np.array(mean["y"], dtype=float)[finite], seeds.mean(axis=1)[finite], rtol=1e-6)
    [band] = [
        t
        for t in figures["clip"]["data"]
        if t.get("fill") == "toself" and t["legendgroup"].startswith("miles")
    ]
    n = len(band["x"]) // 2
    upper = np.array(band["y"][:n], dtype=float)
    sd = seeds.std(axis=1, ddof=1)
    assert np.allclose(upper[finite], (seeds.mean(axis=1) + sd)[finite], rtol=1e-6)
    thin = [
        t for t in figures["clip"]["data"] if t["legendgroup"].startswith("miles") and not t["showlegend"]
    ]
    assert sum(1 for t in thin if t.get("mode") == "lines" and t.get("fill") is None) == 2  # each seed


def test_a_difference_judged_over_one_window_has_no_plot_over_training(tmp_path):
    """Groups of short runs (no segments across seeds): the differences table holds the numbers,
    as ratios, and no panel says "over training"."""
    rs, groups, _ = _groups(24, seeds=3)
    result = compare(rs, groups=groups)
    assert all(len(d.segments) <= 1 for d in result.group_differences)
    text = render_dashboard(rs, result)
    assert not [p for p in _drawn(text) if p.endswith("_difference")]
    assert "over training" not in "".join(f["layout"]["title"]["text"] for f in _figures(text).values())
    assert "no difference over training to draw" in text
    row = re.search(r'<tr class="policy" data-metric="clip_fraction">(.*?)</tr>', text, re.S).group(1)
    clip = result.group_difference("clip_fraction")
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
    ratio = math.exp(clip.estimate.value)
    shown = f"×{ratio:.3g}" if ratio >= 2 else f"+{(ratio - 1) * 100:.3g} %"
    assert cells[3].startswith(shown), cells


def test_a_difference_over_segments_is_drawn_as_a_ratio(dashboard):
    """A pair with segments: the clip fraction's difference over training on a log axis of ratios
    (ticks ×2 or +25 %), its step line at exp(each segment's log-ratio difference)."""
    import numpy as np

    path, result = dashboard
    d = result.difference("clip_fraction")
    assert d.scale == "log-ratio" and len(d.segments) > 1
    figure = _figures(path.read_text(encoding="utf-8"))["clip_fraction_difference"]
    assert figure["layout"]["yaxis"]["type"] == "log"
    assert all(re.fullmatch(r"×[\d.]+|[+−][\d.]+ %", t) for t in figure["layout"]["yaxis"]["ticktext"])
    assert "over training" in figure["layout"]["title"]["text"]
    [step] = [t for t in figure["data"] if t["name"].endswith("per segment")]
    for seg in d.segments:
        assert np.isclose(step["y"], math.exp(seg.estimate.value), rtol=1e-6).any(), seg


def test_size_is_bounded_by_downsampling_not_by_run_length():
    """The 150-step demo's size stays within 1.5 MB, and past 4,000 steps a longer run adds almost
    nothing: lines are drawn from 2,000 buckets' extremes (the tables keep the exact numbers)."""
    from tests._compare_fixtures import synthetic_run

    def size(n_steps):
        runs = [
            synthetic_run("a", "a", "megatron", seed=1, n_steps=n_steps),
            synthetic_run("b", "b", "miles", seed=2, n_steps=n_steps, clip_p=0.15),
        ]
        rs = RunSet.from_points(
            [(LoadedRun(RunInfo(r.run_id, r.run_name, r.backend, r.config), "test"), r.points) for r in runs]
        )
        return len(render_dashboard(rs, compare(rs)).encode("utf-8"))

    demo, long, longer = size(150), size(6000), size(12000)
    assert demo <= 1_500_000
    assert longer <= 1.05 * long and longer <= 3_000_000


READING_CHECK = r"""
<script>
(function(){
  function check(){
    var want=Number(document.body.getAttribute('data-expect')||'0');
    if(Number(document.body.getAttribute('data-rendered')||'0')<want){setTimeout(check,50);return;}
    function top(el){return el?el.getBoundingClientRect().top+window.scrollY:-1;}
    function bg(el){return el?getComputedStyle(el).backgroundColor:'';}
    var head=document.getElementById('headline'),control=document.getElementById('control');
    var table=document.getElementById('differences-table');
    var machine=document.querySelector('tr.machine td.verdict');
    var different=document.querySelector('tr.policy td.verdict.different');
    var out={
      headline:head.innerText.split('\n').filter(function(l){return l.trim();}),
      headlineBorder:getComputedStyle(head).borderLeftColor,
      control:control?control.innerText:null,
      controlBorder:control?getComputedStyle(control).borderLeftColor:null,
      curves:top(document.getElementById('curves')),
      firstCurve:top(document.querySelector('.plot')),
      table:top(table),
      tableText:table?table.innerText:'',
      machineText:machine?machine.innerText:null,
      machineBackground:bg(machine),
      machineColor:machine?getComputedStyle(machine).color:null,
      differentBackground:bg(different),
      titles:[].map.call(document.querySelectorAll('.gtitle'),function(t){return t.textContent;})
    };
    document.body.setAttribute('data-reading-check',JSON.stringify(out));
  }
  window.addEventListener('load',function(){setTimeout(check,0);});
})();
</script>
"""
"""Injected into a copy of a page: once every panel is drawn, records into ``data-reading-check``
what a reader sees: the headline's lines and colour, the control's line, where the curves and the
differences table sit, the table's text, the throughput row's verdict cell's text and colours
beside an on-policy *different* cell's, and every drawn panel's title."""


def _reading(page: Path, expect: int, tmp_path: Path) -> dict:
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"<body([^>]*)>", rf'<body\1 data-expect="{expect}">', text, count=1)
    checked = tmp_path / f"read-{page.name}"
    checked.write_text(text.replace("</body>", READING_CHECK + "</body>"), encoding="utf-8")
    proc = _chromium(["--window-size=1400,1000", "--dump-dom", checked.as_uri()], tmp_path / "profile-read")
    found = re.search(r'data-reading-check="([^"]*)"', proc.stdout)
    assert found, "the reading check did not run: " + proc.stderr[-2000:]
    return json.loads(html.unescape(found.group(1)))


@needs_chromium
@pytest.mark.slow
def test_the_page_reads_headline_control_curves_then_ratios_with_throughput_apart(tmp_path):
    """Rendered in headless Chromium, stacks over seeds with a control comparison: three headline
    lines, then the control's verdict line; the curves above the differences table; the table's
    differences as ratios; throughput's verdict cell neither red nor in the headline's colour, and
    said to be the machines'; no panel titled "over training" (no segments across seeds)."""
    from cliptrack.compare.views.dashboard import Control

    rs, groups, _ = _groups(24, seeds=3, miles_clip=0.3)
    result = compare(rs, groups=groups)
    assert result.on_policy_verdict == "different"
    assert result.group_difference("throughput").verdict == "different"
    twin, twin_groups, _ = _groups(24, seeds=3, miles_clip=0.10, throughput=2000.0)
    check = compare(twin, groups=twin_groups)
    control = Control(check, "megatron-stale (as stale as miles) vs miles", "staleness")
    path = write_dashboard(tmp_path / "dashboard.html", rs, result, control=control)
    found = _reading(path, len(_drawn(path.read_text(encoding="utf-8"))), tmp_path)
    assert len(found["headline"]) == 3, found["headline"]
    assert found["headline"][0].startswith("Not equally on-policy: miles vs megatron (3 seeds each)")
    assert found["control"].startswith(f"Control: {check.on_policy_verdict} — megatron-stale")
    if check.on_policy_verdict == "equivalent":
        assert found["control"].endswith("Staleness is the cause of the gap, not the stack.")
    assert 0 <= found["curves"] < found["firstCurve"] < found["table"]
    assert "×" in found["tableText"]
    assert found["machineText"] == "different on these machines"
    red = found["differentBackground"]
    assert red and found["machineBackground"] not in (red, found["headlineBorder"])
    assert found["machineColor"] != found["headlineBorder"]
    assert found["titles"] and not [t for t in found["titles"] if "over training" in t]


def test_without_a_control_there_is_no_control_line(dashboard):
    path, _ = dashboard
    assert 'id="control"' not in path.read_text(encoding="utf-8")
