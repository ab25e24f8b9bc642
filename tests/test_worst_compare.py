"""``cliptrack compare`` reads the runs' worst sequences: the sequences that recur as worst across
steps, counted against a plain count, in the JSON, the text report and the dashboard (a table and
the per-sequence spread, drawn in headless Chromium); the verdicts are the same with them or not."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from cliptrack.cli.main import main
from cliptrack.compare.worst import IDS_CAVEAT, worst_sequences
from cliptrack.core.worst import CRITERIA, SequenceGauge, Worst, worst_of
from cliptrack.store import worst as worst_store

from tests._compare_fixtures import megatron_vs_miles, write_jsonl
from tests._tools import CHROMIUM, needs_chromium

K = 5
HOT = (7, 13, 21)
"""Datums the sampler and trainer disagree on more than the others (in the second run)."""


def _step_sequences(rng: random.Random, step: int, hot: tuple[int, ...]) -> list[SequenceGauge]:
    out = []
    others = [d for d in range(60) if d not in hot]
    for datum in [*hot, *rng.sample(others, 27)]:
        tokens = rng.randint(1, 40)
        scale = 6.0 if datum in hot and rng.random() < 0.8 else 1.0
        abs_l = rng.random() * tokens * 0.05 * scale
        out.append(
            SequenceGauge(
                datum, tokens, abs_l * 0.3, abs_l, abs_l * abs_l / tokens, min(rng.random() * scale, abs_l), 0
            )
        )
    return out


def _tables(seed: int, steps: range, hot: tuple[int, ...]) -> list[Worst]:
    rng = random.Random(seed)
    return [Worst(step, K, worst_of(_step_sequences(rng, step, hot), K)) for step in steps]


def _plain_counts(tables: list[Worst], criterion: str) -> dict[int, int]:
    """Per datum, the steps whose worst ``K`` by ``criterion`` list it (2+ only)."""
    counts = Counter(s.datum for w in tables for s in w.by[criterion])
    return {datum: n for datum, n in counts.items() if n >= 2}


@pytest.fixture(scope="module")
def spool(tmp_path_factory):
    root = tmp_path_factory.mktemp("spool")
    megatron, miles = megatron_vs_miles(n_megatron=60, n_miles=60)
    tables = {"megatron-run": _tables(1, range(0, 60, 3), ()), "miles-run": _tables(2, range(0, 60, 2), HOT)}
    tables["miles-run"].append(
        Worst(4, K, worst_of(_step_sequences(random.Random(9), 4, ()), K))
    )  # re-logged
    for run in (megatron, miles):
        run_dir = write_jsonl(root, run)
        with open(run_dir / worst_store.WORST_FILE, "wb") as fh:
            for worst in tables[run.run_name]:
                fh.write(worst_store.encode(worst))
    latest = {name: worst_store.latest_per_step(t) for name, t in tables.items()}
    return root, latest


def test_recurring_sequences_equal_a_plain_count(spool, capsys) -> None:
    root, tables = spool
    assert main(["compare", "megatron-run", "miles-run", "--jsonl", str(root), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    worst = out["worst_sequences"]
    assert worst["note"] == IDS_CAVEAT
    for entry in worst["runs"]:
        run_tables = tables[entry["run"]]
        assert entry["steps"] == [w.step for w in run_tables] and entry["k"] == K
        assert entry["last"] == run_tables[-1].records()
        for criterion in CRITERIA:
            got = {r["datum"]: r["steps"] for r in entry["recurring"] if r["criterion"] == criterion}
            assert got == _plain_counts(run_tables, criterion)
            listed = [r for r in entry["recurring"] if r["criterion"] == criterion]
            assert [(-r["steps"], r["datum"]) for r in listed] == sorted(
                (-r["steps"], r["datum"]) for r in listed
            )
            for r in listed:
                assert r["share"] == r["steps"] / len(run_tables)
    miles = next(e for e in worst["runs"] if e["run"] == "miles-run")
    top = [r["datum"] for r in miles["recurring"] if r["criterion"] == "abs_log_ratio"][:3]
    assert sorted(top) == sorted(HOT)  # the planted datums recur most


def test_the_verdicts_are_the_same_with_the_worst_sequences(spool, tmp_path, capsys) -> None:
    root, _ = spool
    bare = tmp_path / "bare"
    for run_dir in root.iterdir():
        target = bare / run_dir.name
        target.mkdir(parents=True)
        for name in ("run.json", "points.jsonl"):
            (target / name).write_bytes((run_dir / name).read_bytes())
    assert main(["compare", "megatron-run", "miles-run", "--jsonl", str(bare), "--json"]) == 0
    without = json.loads(capsys.readouterr().out)
    assert main(["compare", "megatron-run", "miles-run", "--jsonl", str(root), "--json"]) == 0
    with_worst = json.loads(capsys.readouterr().out)
    assert "worst_sequences" not in without
    assert with_worst.pop("worst_sequences")
    assert with_worst == without


def test_the_text_report_says_which_sequences_recur(spool, capsys) -> None:
    root, tables = spool
    assert main(["compare", "megatron-run", "miles-run", "--jsonl", str(root)]) == 0
    text = capsys.readouterr().out
    counts = _plain_counts(tables["miles-run"], "abs_log_ratio")
    first = min(counts, key=lambda d: (-counts[d], d))
    n = len(tables["miles-run"])
    assert (
        f"worst sequences of miles-run: recurring among the {K} worst by summed |log ratio| of its {n} steps: "
        in text
    )
    assert f"datum {first} in {counts[first]} ({counts[first] / n:.0%})" in text
    assert IDS_CAVEAT in text


def test_a_step_window_limits_the_tables(spool, capsys) -> None:
    root, tables = spool
    args = ["compare", "megatron-run", "miles-run", "--jsonl", str(root), "--json", "--window", "10:30"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    for entry in out["worst_sequences"]["runs"]:
        assert entry["steps"] == [w.step for w in tables[entry["run"]] if 10 <= w.step < 30]


def test_no_tables_no_diagnostic() -> None:
    assert worst_sequences({"a": [], "b": []}) is None
    assert worst_sequences({"a": _tables(1, range(5), ())}, steps=(10, None)) is None
    with pytest.raises(ValueError, match="min_steps"):
        worst_sequences({}, min_steps=0)


def _dashboard(spool, tmp_path: Path, capsys) -> tuple[Path, str]:
    root, _ = spool
    path = tmp_path / "dash.html"
    assert main(["compare", "megatron-run", "miles-run", "--jsonl", str(root), "--html", str(path)]) == 0
    capsys.readouterr()
    return path, path.read_text(encoding="utf-8")


def test_the_dashboard_shows_the_table_and_the_spread(spool, tmp_path, capsys) -> None:
    _, tables = spool
    _, text = _dashboard(spool, tmp_path, capsys)
    body = text[text.index("<body") :]
    assert '<h2 id="worst">Worst sequences</h2>' in body
    assert 'data-panel="worst-spread"' in body
    assert body.index('id="curves"') < body.index('id="worst"') < body.index('id="details"')
    recurring = body[body.index('<table class="worst recurring">') :]
    recurring = recurring[: recurring.index("</table>")]
    counts = _plain_counts(tables["miles-run"], "abs_log_ratio")
    first = min(counts, key=lambda d: (-counts[d], d))
    n = len(tables["miles-run"])
    assert (
        f"<td>miles-run</td><td>summed |log ratio|</td><td>{first}</td><td>{counts[first]} of {n}</td>"
        in recurring
    )
    last = tables["miles-run"][-1]
    assert f"miles-run: step {last.step} (k = {K})" in body
    figures = json.loads(
        body[
            body.index('id="cliptrack-figures">') + 23 : body.index(
                "</script>", body.index("cliptrack-figures")
            )
        ]
    )
    spread = {t["name"]: t for t in figures["worst-spread"]["data"]}
    miles = spread["miles-run"]
    assert miles["x"] == [w.step for w in tables["miles-run"] for _ in w.by["abs_log_ratio"]]
    assert miles["customdata"] == [s.datum for w in tables["miles-run"] for s in w.by["abs_log_ratio"]]


@needs_chromium
@pytest.mark.slow  # a browser
def test_the_dashboard_draws_the_spread_in_chromium(spool, tmp_path, capsys) -> None:
    import subprocess

    path, _ = _dashboard(spool, tmp_path, capsys)
    base = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=15000",
    ]
    dom = subprocess.run([*base, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    at = dom.stdout.index('id="plot-worst-spread"')
    plot = dom.stdout[dom.stdout.rindex("<div", 0, at) :]
    assert "js-plotly-plot" in plot[: plot.index(">")]  # plotly drew the spread
    plot = plot[: plot.index("<h3>")]  # the spread's own figure, up to the table below it
    assert plot.count('class="point') >= sum(len(w.by["abs_log_ratio"]) for w in spool[1]["miles-run"])
    shot = tmp_path / "worst.png"
    subprocess.run(
        [*base, "--window-size=1400,5200", f"--screenshot={shot}", path.as_uri()],  # down to the worst
        capture_output=True,
        timeout=120,
    )
    assert shot.exists() and shot.stat().st_size > 100_000
    print(f"\nworst sequences screenshot: {shot}")
