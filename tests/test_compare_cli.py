"""``cliptrack compare`` in the terminal, against runs written to JSONL and MLflow."""

from __future__ import annotations

import pytest

from tests._compare_fixtures import megatron_vs_miles, write_jsonl, write_mlflow
from tracking.cli import main


@pytest.fixture(scope="module")
def spool(tmp_path_factory):
    root = tmp_path_factory.mktemp("spool")
    megatron, miles = megatron_vs_miles(miles_clip_p=0.16, miles_missing=(2, 3))
    write_jsonl(root, megatron)
    write_jsonl(root, miles)
    return root


def test_compare_prints_table_and_verdict(spool, tmp_path, capsys):
    html = tmp_path / "out.html"
    md = tmp_path / "out.md"
    code = main(["compare", "megatron0001", "miles-run", "--jsonl", str(spool), "--html", str(html),
                 "--markdown", str(md)])
    out = capsys.readouterr().out
    assert code == 0
    assert "clip_fraction" in out and "different" in out and "Not equally on-policy" in out
    assert "58 paired units" in out
    assert html.exists() and html.stat().st_size > 1_000_000
    assert md.read_text().startswith("Not equally on-policy")


def test_compare_options(spool, capsys):
    code = main(["compare", "megatron-run", "miles-run", "--jsonl", str(spool), "--align", "tokens",
                 "--window", "0:100000", "--tolerance", "0.1", "--n-boot", "200"])
    out = capsys.readouterr().out
    assert code == 0
    assert "Aligned by tokens seen, window 0:100000" in out
    assert "Equally on-policy" in out  # 6 pp apart, within ±10 pp


def test_compare_against_mlflow(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for run in megatron_vs_miles():
        write_mlflow(uri, run)
    assert main(["compare", "megatron-run", "miles-run", "--tracking-uri", uri]) == 0
    assert "Equally on-policy" in capsys.readouterr().out


def test_compare_errors_are_clear(spool, capsys):
    assert main(["compare", "megatron-run", "ghost", "--jsonl", str(spool)]) == 2
    assert "no run with id or name 'ghost'" in capsys.readouterr().err
    assert main(["compare", "megatron-run", "miles-run", "--jsonl", str(spool), "--window", "9:1"]) == 2
    assert "window '9:1' is empty" in capsys.readouterr().err
    assert main(["compare", "megatron-run", "--jsonl", str(spool)]) == 2
    assert "at least two runs" in capsys.readouterr().err
