"""``cliptrack.cli.progress``: a bar only on a terminal, plain complete lines anywhere else."""

from __future__ import annotations

import io

import pytest
from cliptrack.cli.progress import Progress, progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_redirected_output_gets_one_plain_line_per_quarter():
    stream = io.StringIO()
    with Progress(100, "megatron", stream=stream, every_s=1e9) as bar:
        for _ in range(100):
            bar.advance(clip=0.03125, reward=0.5)
    text = stream.getvalue()
    assert "\r" not in text and "\x1b" not in text
    lines = text.splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "megatron: step 25/100 (25%)",
        "megatron: step 50/100 (50%)",
        "megatron: step 75/100 (75%)",
        "megatron: step 100/100 (100%)",
    ]
    assert lines[-1].endswith("clip=0.031 reward=0.500")


def test_a_short_loop_still_ends_with_its_last_step():
    stream = io.StringIO()
    list(progress(range(3), 3, "miles", stream=stream, every_s=1e9))
    assert stream.getvalue().splitlines()[-1].startswith("miles: step 3/3 (100%)")


def test_periodic_lines_between_the_quarters():
    stream = io.StringIO()
    bar = Progress(1000, "x", stream=stream, every_s=0.0)  # every advance is past the interval
    for _ in range(10):
        bar.advance()
    assert len(stream.getvalue().splitlines()) == 10


def test_a_terminal_gets_a_live_bar_and_disabled_gets_nothing():
    pytest.importorskip("tqdm")
    terminal = Terminal()
    with Progress(4, "megatron", stream=terminal) as bar:
        for _ in range(4):
            bar.advance()
    assert "\r" in terminal.getvalue() and "4/4" in terminal.getvalue()
    quiet = Terminal()
    with Progress(4, "megatron", stream=quiet, enabled=False) as bar:
        bar.advance(4)
    assert quiet.getvalue() == ""


def test_bad_total_is_named():
    with pytest.raises(ValueError, match="total must be >= 0"):
        Progress(-1, "x")


def test_several_runs_count_the_steps_of_the_run_being_trained():
    out = io.StringIO()
    with Progress(60, "megatron", stream=out, bar=False, run_steps=20) as p:
        for _ in range(35):
            p.advance()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("megatron: run 1/3, step 15/20 (25%)"), lines
    assert lines[1].startswith("megatron: run 2/3, step 10/20 (50%)"), lines
    with pytest.raises(ValueError, match="run_steps must be >= 1 and divide the total 60, got 7"):
        Progress(60, "x", run_steps=7)
