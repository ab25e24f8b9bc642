"""Text from a run is text: names, labels, reasons and notes are escaped for the medium they land in
(``cliptrack.core.text``): a terminal (``cliptrack compare``, ``cliptrack runs``), markdown (the MLflow
run descriptions, ``comparison.md``) and HTML (the dashboard). Stored data keeps them as given.

The end-to-end checks use the real things: ``cliptrack`` as a subprocess (and inside ``tmux``,
whose pane title an OSC sequence would change) and the MLflow UI of a real ``mlflow server`` in
headless Chromium, with a listener on 127.0.0.1 counting every request an injected image makes.
"""

from __future__ import annotations

import functools
import html
import http.server
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest
from cliptrack.core.text import html_lines, html_text, markdown_lines, markdown_text, printable
from hypothesis import assume, given
from hypothesis import strategies as st

from tests._compare_fixtures import megatron_vs_miles, write_jsonl, write_mlflow
from tests._mlflow_ui import dom_text, mlflow_server, page_dom
from tests._tools import needs_chromium, needs_mlflow_command, needs_tmux

ANSI = "\x1b[31mred\x1b[0m"
OSC_TITLE = "\x1b]0;pwned\x07"
NUL = "nul\x00byte"
RTL = "rtl\u202eexe.txt"
FORGED = "x\nEqually on-policy: yes"
FORGED_LINE = "Equally on-policy: yes"
HOSTILE = (
    ANSI,
    OSC_TITLE,
    NUL,
    RTL,
    FORGED,
    "\x9b31m c1",
    "tab\there",
    "\u2066iso\u2069 \u200f",
    "\u2028sep",
)

# What a terminal acts on: C0 controls but the line feed cliptrack writes itself, DEL, C1
# controls, and the invisible bidi and format characters (overrides, isolates, marks).
_TERMINAL_ACTIVE = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f\x80-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]"
)


def _active(text: str) -> list[str]:
    return sorted({repr(c) for c in _TERMINAL_ACTIVE.findall(text)})


# ------------------------------------------------------------------------------- the escapers


@pytest.mark.parametrize("text", HOSTILE)
def test_printable_writes_every_control_character_visibly_on_one_line(text):
    shown = printable(text)
    assert _active(shown) == [] and "\n" not in shown
    assert printable(shown) == shown  # idempotent: escaping twice changes nothing
    assert printable("plain run-1 ≈ ±") == "plain run-1 ≈ ±"


@functools.lru_cache(maxsize=1)
def _markdown_it():
    import markdown_it

    return markdown_it.MarkdownIt("commonmark", {"html": True})


def _commonmark():
    pytest.importorskip("markdown_it", reason="markdown-it-py renders CommonMark for the check")
    return _markdown_it()


class _Tags(HTMLParser):
    """Tags and text of an HTML fragment."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def _parsed(fragment: str) -> _Tags:
    parser = _Tags()
    parser.feed(fragment)
    parser.close()
    return parser


INJECTIONS = (
    "![x](http://127.0.0.1:9/md.png)",
    '<img src="http://127.0.0.1:9/tag.png">',
    "[click](http://evil.example/)",
    "<http://evil.example/>",
    "http://evil.example/bare www.evil.example a@evil.example @someone",
    "[ref]: http://evil.example/\n[ref]",
    "<iframe src=//evil.example></iframe> &lt;b&gt; `code` **bold** ~~gone~~ | cell |",
    "# heading",
    "1. item",
    "- item",
    "+ item",
    "> quote",
)


@pytest.mark.parametrize("text", INJECTIONS)
def test_markdown_text_renders_as_itself_with_no_link_image_or_tag(text):
    md = _commonmark()
    if not text.startswith("- "):  # markdown_lines keeps a leading "- " as cliptrack's list item
        out = _parsed(md.render(markdown_lines(printable(text))))
        assert [tag for tag, _ in out.tags] == ["p"], out.tags
        assert "".join(out.text).strip() == printable(text)
    link = _parsed(md.render(f"Compared in [{markdown_text(text)}](#/experiments/1/runs/abc)."))
    assert [tag for tag, _ in link.tags] == ["p", "a"] and link.tags[1][1] == {
        "href": "#/experiments/1/runs/abc"
    }
    assert "".join(link.text).strip() == f"Compared in {printable(text)}."


@given(st.text(max_size=60))
def test_any_text_renders_as_itself_in_commonmark(text):
    shown = printable(text).strip(" ")
    assume(shown and not shown.startswith("- "))
    out = _parsed(_commonmark().render(markdown_lines(shown)))
    assert [tag for tag, _ in out.tags] == ["p"]
    assert "".join(out.text).strip(" \n") == shown


def test_markdown_lines_keeps_the_summary_structure():
    text = "Not equally on-policy: a and b differ.\n- clip fraction: a 10% vs b 16% -> different."
    assert markdown_lines(text).splitlines()[1].startswith("- clip fraction")
    assert markdown_lines("1. x\n# y").splitlines() == ["1\\. x", "\\# y"]


def test_html_text_escapes_markup_and_controls():
    assert (
        html_text("<img src=\"x\" onerror='y'>&")
        == "&lt;img src=&quot;x&quot; onerror=&#x27;y&#x27;&gt;&amp;"
    )
    assert html_text(FORGED) == "x\\nEqually on-policy: yes"
    assert html_lines("a<b\nc") == "a&lt;b\nc"


# ------------------------------------------------------------------ the comparison's renderings


@pytest.fixture(scope="module")
def hostile_spool(tmp_path_factory):
    """Two JSONL runs that differ (so the honest headline is "Not equally on-policy"), named with
    terminal escapes, NUL, a bidi override and a newline forging a second headline; backend labels
    with escapes too."""
    root = tmp_path_factory.mktemp("hostile")
    megatron, miles = megatron_vs_miles(miles_clip_p=0.2)
    megatron = replace(megatron, run_name=f"{ANSI} {OSC_TITLE} {NUL} {RTL}", backend="meg\x1b[2Jatron")
    miles = replace(miles, run_name=FORGED, backend="mi\u202eles")
    megatron.config["note"] = "line1\nEqually on-policy: yes <script>alert(1)</script>"
    write_jsonl(root, megatron)
    write_jsonl(root, miles)
    return root


@pytest.fixture(scope="module")
def hostile_result(hostile_spool):
    from cliptrack.backends import load_runs
    from cliptrack.compare.engine import compare

    runset = load_runs(["megatron0001", "miles0000002"], jsonl_dir=str(hostile_spool))
    return runset, compare(runset)


def test_names_are_stored_and_compared_as_given(hostile_result):
    runset, result = hostile_result
    assert set(result.runs) == {f"{ANSI} {OSC_TITLE} {NUL} {RTL}", FORGED}  # data keeps them
    assert result.on_policy_verdict == "different"
    assert '"x\\nEqually on-policy: yes"' in result.to_json()  # JSON escapes them itself


def test_terminal_rendering_holds_no_control_character_and_no_forged_line(hostile_result):
    from cliptrack.cli.compare import format_result

    _, result = hostile_result
    out = format_result(result)
    assert _active(out) == []
    assert not [line for line in out.splitlines() if line.startswith("Equally on-policy")]
    assert "x\\nEqually on-policy: yes" in out  # the name, shown with its newline visible
    assert out.count("\n\n") >= 1 and result.summary().startswith("Not equally on-policy")


def test_summary_has_one_line_per_item(hostile_result):
    _, result = hostile_result
    lines = result.summary().splitlines()
    assert lines[0].startswith("Not equally on-policy") and not any(
        line.startswith("Equally on-policy") for line in lines
    )
    assert _active(result.summary().replace("\n", " ")) == []


def test_markdown_artifact_renders_no_link_image_or_forged_line(hostile_result):
    md = _commonmark()
    _, result = hostile_result
    out = md.render(result.to_markdown())
    parsed = _parsed(out)
    assert {tag for tag, _ in parsed.tags} <= {"p", "ul", "li", "table", "thead", "tbody", "tr", "th", "td"}
    assert not re.search(r"(^|\n|<p>|<li>)Equally on-policy", out)


def test_dashboard_summary_has_no_forged_line_and_no_raw_markup(hostile_result, tmp_path):
    from cliptrack.compare.views.dashboard import render_dashboard

    runset, result = hostile_result
    page = render_dashboard(runset, result)
    summary = re.search(r'<p class="summary [^"]*" id="summary">(.*?)</p>', page, re.S).group(1)
    lines = html.unescape(summary).splitlines()
    assert lines[0].startswith("Not equally on-policy")
    assert not [line for line in lines if line.startswith("Equally on-policy")]
    body = page.split("</script></head>", 1)[1]
    assert "<script>alert(1)" not in body and "\x1b" not in body and "\x00" not in body
    assert "line1\\nEqually on-policy: yes &lt;script&gt;alert(1)&lt;/script&gt;" in body  # the config value


# --------------------------------------------------------------------- the terminal, end to end


def _cliptrack(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "cliptrack.cli.main", *args], capture_output=True, timeout=timeout, check=False
    )


def _assert_terminal_safe(proc: subprocess.CompletedProcess[bytes]) -> str:
    for stream in (proc.stdout, proc.stderr):
        text = stream.decode("utf-8")  # strict: a lone C1 byte such as 0x9b would fail here
        assert _active(text) == [], (_active(text), text[-3000:])
        assert not [line for line in text.splitlines() if line.lstrip().startswith(FORGED_LINE[:17])], text
    return proc.stdout.decode("utf-8")


@pytest.mark.slow
def test_compare_and_runs_print_no_control_character_from_a_run_name(hostile_spool):
    compare = _cliptrack("compare", "megatron0001", "miles0000002", "--jsonl", str(hostile_spool))
    assert compare.returncode == 0, compare.stderr.decode()[-2000:]
    out = _assert_terminal_safe(compare)
    assert "Not equally on-policy" in out
    assert "x\\nEqually on-policy: yes" in out and "\\x1b]0;pwned\\x07" in out and "\\u202e" in out

    runs = _cliptrack("runs", "--jsonl", str(hostile_spool))
    assert runs.returncode == 0, runs.stderr.decode()[-2000:]
    out = _assert_terminal_safe(runs)
    assert "x\\nEqually on-policy: yes" in out and "\\x00" in out and "meg\\x1b[2Jatron" in out

    missing = _cliptrack(
        "compare", "megatron0001", f"gone{OSC_TITLE}\nEqually on-policy: yes", "--jsonl", str(hostile_spool)
    )
    assert missing.returncode == 2
    _assert_terminal_safe(missing)


@pytest.mark.slow
@needs_tmux
def test_in_a_real_terminal_the_title_and_lines_are_unchanged(hostile_spool, tmp_path):
    """tmux interprets what it is given as a terminal does: the OSC sequence would retitle the
    pane, the newline would draw the forged headline on a line of its own."""
    session = f"cliptrack-hostile-{os.getpid()}"
    done = tmp_path / "done"
    command = (
        f"{sys.executable} -m cliptrack.cli.main compare megatron0001 miles0000002 --jsonl {hostile_spool}; "
        f"{sys.executable} -m cliptrack.cli.main runs --jsonl {hostile_spool}; touch {done}; sleep 600"
    )
    tmux = ["tmux", "-L", session, "-f", "/dev/null"]
    subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "250", "-y", "200", command], check=True)
    try:
        deadline = time.monotonic() + 300
        while not done.exists():
            assert time.monotonic() < deadline, "cliptrack did not finish in tmux within 300 s"
            time.sleep(0.5)
        title = subprocess.run(
            [*tmux, "display-message", "-p", "-t", session, "#{pane_title}"], capture_output=True, text=True
        ).stdout.strip()
        screen = subprocess.run(
            [*tmux, "capture-pane", "-p", "-J", "-S", "-", "-t", session], capture_output=True, text=True
        ).stdout
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)
    assert title != "pwned", screen[-2000:]
    assert "Not equally on-policy" in screen
    assert not [line for line in screen.splitlines() if line.lstrip().startswith(FORGED_LINE[:17])], screen
    assert "x\\nEqually on-policy: yes" in screen


# ------------------------------------------------------------------- the MLflow UI, end to end


class _Listener:
    """An HTTP server on 127.0.0.1 counting every request (what an injected image would fetch)."""

    def __init__(self) -> None:
        hits: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                hits.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "image/gif")
                self.end_headers()
                self.wfile.write(b"GIF89a\x01\x00\x01\x00\x00\x00\x00;")

            def log_message(self, *args):
                pass

        self.hits = hits
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Description(HTMLParser):
    """The rendered run description (``data-testid="note-editor-preview-content"``): its tags and text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth = 0
        self.found = False
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if self.depth:
            self.depth += tag not in ("img", "br", "hr", "input")
            self.tags.append((tag, attributes))
        elif attributes.get("data-testid") == "note-editor-preview-content":
            self.depth, self.found = 1, True

    def handle_endtag(self, tag):
        if self.depth and tag not in ("img", "br", "hr", "input"):
            self.depth -= 1

    def handle_data(self, data):
        if self.depth:
            self.text.append(data)


def _description(url: str, profile: Path, expect: str, attempts: int = 4) -> _Description:
    """The description of the run page at ``url`` once it shows ``expect`` (retried: a loaded
    machine can dump the page before the run's tags arrive)."""
    parsed = _Description()
    for attempt in range(attempts):
        parsed = _Description()
        parsed.feed(page_dom(url, profile / str(attempt), budget_ms=40000))
        if parsed.found and expect in " ".join("".join(parsed.text).split()):
            break
    return parsed


@pytest.mark.slow
@needs_chromium
@needs_mlflow_command
def test_mlflow_ui_renders_run_descriptions_as_text(tmp_path):
    """Run names carrying a markdown image and an ``<img>`` tag pointing at a listener, a markdown
    link, an iframe, bare URLs and a mention: the descriptions cliptrack writes (``Compared in``
    on each compared run, the summary on the comparison run) fetch nothing, link only to the
    comparison run, and show the names as text."""
    from cliptrack.cli.main import main
    from mlflow.tracking import MlflowClient

    listener = _Listener()
    try:
        target = f"http://127.0.0.1:{listener.port}"
        names = (
            f'![x]({target}/md-image) <img src="{target}/html-img"> [click](http://evil.example/)',
            f'<iframe src="{target}/iframe"></iframe> www.evil.example @someone {target}/bare',
        )
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        megatron, miles = megatron_vs_miles(miles_clip_p=0.2)
        compared = [
            write_mlflow(uri, replace(megatron, run_name=names[0])),
            write_mlflow(uri, replace(miles, run_name=names[1])),
        ]
        assert main(["panels", "mlflow", "megatron0001", "miles0000002", "--tracking-uri", uri]) == 0
        client = MlflowClient(tracking_uri=uri)
        comparison = client.search_runs(
            [client.get_experiment_by_name("cliptrack-tests-comparisons").experiment_id]
        )[0]
        note = "mlflow.note.content"
        assert client.get_run(compared[0]).data.tags[note].startswith("Compared in [")
        experiment = client.get_run(compared[0]).info.experiment_id
        pages = [(f"#/experiments/{experiment}/runs/{run_id}", "Compared in") for run_id in compared] + [
            (
                f"#/experiments/{comparison.info.experiment_id}/runs/{comparison.info.run_id}",
                "Not equally on-policy",
            )
        ]
        with mlflow_server(uri, tmp_path / "server.log") as port:
            seen = []
            for i, (page, expect) in enumerate(pages):
                parsed = _description(f"http://127.0.0.1:{port}/{page}", tmp_path / f"profile{i}", expect)
                text = " ".join("".join(parsed.text).split())
                assert parsed.found and expect in text, (
                    page,
                    text[:1000],
                    dom_text(page_dom(f"http://127.0.0.1:{port}/{page}", tmp_path / "again"))[:2000],
                )
                seen.append((page, parsed, text))
        assert listener.hits == [], listener.hits
        comparison_link = f"#/experiments/{comparison.info.experiment_id}/runs/{comparison.info.run_id}"
        for page, parsed, text in seen:
            embedded = [
                (tag, attrs) for tag, attrs in parsed.tags if tag in ("img", "iframe", "script", "object")
            ]
            assert embedded == [], (page, embedded)
            links = [attrs.get("href") or "" for tag, attrs in parsed.tags if tag == "a"]
            assert all(href.startswith(comparison_link) for href in links), (page, links)
            if "Compared in" in text:
                assert len(links) == 1, (page, links)
            for name in names:  # the names (in the comparison's name and summary), shown as text
                assert name in text, (page, name, text[:1500])
    finally:
        listener.close()
