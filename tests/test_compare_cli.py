"""``cliptrack compare`` in the terminal, against runs written to JSONL and MLflow."""

from __future__ import annotations

import pytest
from cliptrack.cli.main import main

from tests._compare_fixtures import megatron_vs_miles, write_jsonl, write_mlflow


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
    code = main(
        [
            "compare",
            "megatron0001",
            "miles-run",
            "--jsonl",
            str(spool),
            "--html",
            str(html),
            "--markdown",
            str(md),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "clip_fraction" in out and "different" in out and "Not equally on-policy" in out
    assert "198 paired units" in out
    assert html.exists() and html.stat().st_size > 1_000_000
    assert md.read_text().startswith("Not equally on-policy")


def test_compare_options(spool, capsys):
    code = main(
        [
            "compare",
            "megatron-run",
            "miles-run",
            "--jsonl",
            str(spool),
            "--align",
            "tokens",
            "--window",
            "0:1000000",
            "--tolerance",
            "0.1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "Aligned by tokens seen, window 0:1e+06" in out
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


def test_compare_json_has_every_number(spool, tmp_path, capsys):
    import json

    assert main(["compare", "megatron-run", "miles-run", "--jsonl", str(spool), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)  # stdout is the JSON alone
    assert data["verdict"] == "different" and data["minimum"] == {"units": 100, "ess": 10.0}
    by_metric = {d["metric"]: d for d in data["differences"]}
    assert set(by_metric) == {
        "clip_fraction",
        "clip_low_fraction",
        "clip_high_fraction",
        "reward",
        "throughput",
    }
    clip = by_metric["clip_fraction"]
    assert clip["verdict"] == "different" and clip["difference"]["units"] == 198
    for key in ("value", "ci_low", "ci_high", "lag1", "ess"):
        assert isinstance(clip["difference"][key], float)
    assert clip["reference_paired"]["units"] == 198 and len(data["estimates"]) == 10
    assert any("left out of the paired comparison" in n["text"] for n in data["notes"])
    out = tmp_path / "c.json"
    assert main(["compare", "megatron-run", "miles-run", "--jsonl", str(spool), "--json", str(out)]) == 0
    assert "Not equally on-policy" in capsys.readouterr().out
    assert json.loads(out.read_text()) == data


def test_json_alone_before_the_run_ids_prints_to_stdout(spool, capsys):
    """``--json`` takes no value: the run id after it is a run, not the JSON file's name."""
    import json

    assert main(["compare", "--json", "megatron-run", "miles-run", "--jsonl", str(spool)]) == 0
    data = json.loads(capsys.readouterr().out)  # stdout is the JSON alone
    assert data["verdict"] == "different" and len(data["runs"]) == 2
    assert not (spool / "megatron-run").exists()


def test_json_to_a_file_is_json_file_or_json_equals(spool, tmp_path, capsys, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    base = ["compare", "megatron-run", "miles-run", "--jsonl", str(spool)]
    assert main([*base, "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)
    for argv, name in (
        (["--json-file", "a"], "a"),  # any name: the flag says it is a file
        (["--json=b.out"], "b.out"),
        (["--json", "c.json"], "c.json"),  # the older spelling, kept
    ):
        assert main([*base[:1], *argv, *base[1:]]) == 0, argv
        out = capsys.readouterr().out
        assert "Not equally on-policy" in out and f"json: {name}" in out, argv  # the table on stdout
        assert json.loads((tmp_path / name).read_text()) == expected, argv
    for argv in (["--json=-"], ["--json", "-"]):  # stdout, spelled as before
        assert main([*base, *argv]) == 0
        assert json.loads(capsys.readouterr().out) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b.out", "c.json"]


def test_json_on_stdout_still_writes_the_files_asked_for(spool, tmp_path, capsys):
    import json

    md, js = tmp_path / "c.md", tmp_path / "c.json"
    argv = ["compare", "--json", "megatron-run", "miles-run", "--jsonl", str(spool)]
    assert main([*argv, "--markdown", str(md), "--json-file", str(js)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == json.loads(js.read_text())  # stdout stays the JSON alone
    assert md.read_text().startswith("Not equally on-policy")
    assert f"markdown: {md}" in captured.err and f"json: {js}" in captured.err


def test_rewrite_argv_spells_json_as_the_parser_takes_it():
    from cliptrack.cli.compare import rewrite_argv

    assert rewrite_argv(["--json", "A", "B"]) == ["--json", "A", "B"]
    assert rewrite_argv(["A", "B", "--json=out.txt"]) == ["A", "B", "--json-file", "out.txt"]
    assert rewrite_argv(["A", "B", "--json=-"]) == ["A", "B", "--json"]
    assert rewrite_argv(["A", "B", "--json", "-"]) == ["A", "B", "--json"]
    assert rewrite_argv(["--json", "cmp.JSON", "A", "B"]) == ["--json-file", "cmp.JSON", "A", "B"]
    assert rewrite_argv(["--jsonl", "d.json", "A", "B"]) == ["--jsonl", "d.json", "A", "B"]
    assert rewrite_argv(["A", "--", "--json=x"]) == ["A", "--", "--json=x"]


def test_fail_on_is_a_ci_gate_with_documented_exit_codes(spool, capsys):
    base = ["compare", "megatron-run", "miles-run", "--jsonl", str(spool)]
    assert main([*base, "--fail-on", "different"]) == 1  # 16 % against 10 %: beyond ±25 %
    err = capsys.readouterr().err
    assert "gate --fail-on different tripped" in err and "'different'" in err
    assert main([*base, "--fail-on", "not-equivalent"]) == 1
    capsys.readouterr()
    assert main([*base, "--tolerance", "0.1", "--fail-on", "not-equivalent"]) == 0
    assert "Equally on-policy" in capsys.readouterr().out
    assert main([*base, "--json", "--fail-on", "different"]) == 1
    import json

    assert json.loads(capsys.readouterr().out)["verdict"] == "different"  # stdout stays the JSON alone
    with pytest.raises(SystemExit) as exc:
        main([*base, "--fail-on", "sometimes"])
    assert exc.value.code == 2


def test_help_states_the_exit_codes():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "cliptrack.cli.main", "compare", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--fail-on" in out and "--group" in out and "--margin" in out
    assert "--json-file FILE" in out and "--json=FILE" in out and "takes no value" in out
    assert "exit codes: 0 compared" in " ".join(out.split()) and "1 the --fail-on gate tripped" in " ".join(
        out.split()
    )


def test_groups_on_the_command_line(tmp_path, capsys):
    from tests._compare_fixtures import synthetic_run

    names = {"megatron": [], "miles": []}
    for i in range(3):
        for backend, clip in (("megatron", 0.10), ("miles", 0.16)):
            run = synthetic_run(
                f"{backend}{i:04d}", f"{backend}-s{i}", backend, seed=10 * i + len(backend), clip_p=clip
            )
            write_jsonl(tmp_path, run)
            names[backend].append(run.run_name)
    args = ["compare", "--jsonl", str(tmp_path), "--json"]
    for backend, runs in names.items():
        args += ["--group", f"{backend}={','.join(runs)}"]
    assert main(args) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    assert data["seeds_covered"] and data["groups"] == names
    clip = next(d for d in data["group_differences"] if d["metric"] == "clip_fraction")
    assert clip["verdict"] == "different" and clip["difference"]["seeds_reference"] == 3
    assert main(["compare", "--jsonl", str(tmp_path), "--group", "megatron"]) == 2
    assert "must be NAME=RUN,RUN" in capsys.readouterr().err
    # the same groups from a run parameter: every run of the store grouped by its "stack"
    assert main(["compare", "--jsonl", str(tmp_path), "--json", "--group-by", "stack"]) == 0
    by = json.loads(capsys.readouterr().out)
    assert {g: sorted(r) for g, r in by["groups"].items()} == {g: sorted(r) for g, r in names.items()}
    assert (
        next(d for d in by["group_differences"] if d["metric"] == "clip_fraction")["verdict"] == "different"
    )
    assert main(["compare", "--jsonl", str(tmp_path), "--group-by", "no_such_param"]) == 2
    assert "no_such_param" in capsys.readouterr().err
    assert main(["compare", "--jsonl", str(tmp_path), "--group-by", "seed", "--group", "x=a,b"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["compare", "a", "b", "--jsonl", str(tmp_path), "--margin", "clip_fraction=x"]) == 2
    assert "QUANTITY=NUMBER" in capsys.readouterr().err


def test_margins_on_the_command_line_relative_absolute_and_floor(spool, capsys):
    import json

    base = ["compare", "megatron-run", "miles-run", "--jsonl", str(spool), "--json"]

    def clip(*extra: str) -> dict:
        assert main([*base, *extra]) == 0
        data = json.loads(capsys.readouterr().out)
        [q] = [q for q in data["quantities"] if q["metric"] == "clip_fraction"]
        [d] = [d for d in data["differences"] if d["metric"] == "clip_fraction"]
        return {"q": q, "d": d}

    default = clip()
    assert (default["q"]["scale"], default["q"]["margin"], default["q"]["abs_margin"]) == ("auto", 0.25, 1e-4)
    assert default["d"]["scale"] == "log-ratio" and default["d"]["verdict"] == "different"
    wide = clip("--margin", "clip_fraction=80%", "--margin-floor", "clip_fraction=0.001")
    assert (wide["q"]["margin"], wide["q"]["abs_margin"]) == (0.8, 0.001)
    assert wide["d"]["verdict"] == "equivalent"
    assert clip("--margin", "clip_fraction=80%,0.001")["q"] == wide["q"]  # as cliptrack probe writes it
    absolute = clip("--margin", "clip_fraction=0.1")
    assert absolute["q"]["scale"] == "absolute" and absolute["d"]["scale"] == "absolute"
    assert absolute["d"]["verdict"] == "equivalent"
    assert main([*base, "--margin", "throughput=0.1"]) == 0  # a plain number: absolute, tokens/s
    [q] = [q for q in json.loads(capsys.readouterr().out)["quantities"] if q["metric"] == "throughput"]
    assert (q["scale"], q["margin"]) == ("absolute", 0.1)
    assert main([*base, "--margin", "throughput=10%"]) == 0
    [q] = [q for q in json.loads(capsys.readouterr().out)["quantities"] if q["metric"] == "throughput"]
    assert (q["scale"], q["margin"]) == ("log-ratio", 0.1)
    assert main([*base, "--margin", "clip_fraction=0.1", "--margin-floor", "clip_fraction=0.001"]) == 2
    assert "has no floor" in capsys.readouterr().err
    assert main([*base, "--margin", "nope=5%"]) == 2
    assert "unknown quantity 'nope'" in capsys.readouterr().err
