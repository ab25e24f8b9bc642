"""What cliptrack's verl losses log, read back without verl: the entries' spelling
(:mod:`cliptrack.core.verl_keys`), verl's file and console log formats (the ``--jsonl`` reader), and
the adapter module importing where verl is not installed. The lines below are written in verl
0.9.1's formats (``verl/utils/tracking.py::FileLogger``, ``verl/utils/logger/aggregate_logger.py``)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from cliptrack.backends.load import load_runs
from cliptrack.core import keys, verl_keys
from cliptrack.core.recipe import recipe_from_config

# one step of a cliptrack_vanilla run as verl's trainer logs it: two optimizer steps averaged
# (clipped 3 and 4 of 20 and 21 tokens: 3.5 / 20.5), verl's own mean of micro-batch means beside
STEP = {
    "actor/pg_clipfrac": 0.2333333,
    "actor/pg_clipfrac_lower": 0.05,
    "actor/cliptrack/loss_tokens": 20.5,
    "actor/cliptrack/clipped_tokens": 3.5,
    "actor/cliptrack/clipped_low_tokens": 1.0,
    "actor/cliptrack/clipped_high_tokens": 2.5,
    "actor/cliptrack/dual_clipped_tokens": 1.0,
    "actor/cliptrack/drift_abs_log_ratio": 7.75,
    "actor/cliptrack/clip_low": 0.8000000000000002,
    "actor/cliptrack/clip_high": 1.28,
    "actor/cliptrack/dual_clip": 3.0,
    "actor/cliptrack/loss/cliptrack_vanilla": 1.0,
    "actor/cliptrack/aggregation/seq-mean-token-mean": 1.0,
    "actor/cliptrack/clip_reference/old": 1.0,
    "actor/cliptrack/engine_gauge": 0.0,
    "timing_s/step": 2.0,
}


def test_entries_read_as_our_sums() -> None:
    ours = verl_keys.as_ours(STEP)
    assert ours[keys.LOSS_TOKENS] == 20.5 and ours[keys.CLIPPED_TOKENS] == 3.5
    assert ours["drift_abs_log_ratio:sum"] == 7.75
    assert not [k for k in ours if verl_keys.is_entry(k)]
    assert ours["actor/pg_clipfrac"] == STEP["actor/pg_clipfrac"]
    # the engine part was not measured: absent, not zero
    assert "engine_abs_log_ratio:sum" not in ours and "kl_k3:sum" not in ours


def test_a_count_off_by_verls_last_bit_is_whole_again() -> None:
    sums = verl_keys.logged_sums(
        {"actor/cliptrack/loss_tokens": 38.99999999999999, "actor/cliptrack/clipped_tokens": 13.0}
    )
    assert sums == {keys.LOSS_TOKENS: 39.0, keys.CLIPPED_TOKENS: 13.0}


def test_recipe_from_the_entries() -> None:
    assert verl_keys.logged_recipe(STEP) == {
        "clip_low": 0.8,
        "clip_high": 1.28,
        "dual_clip": 3.0,
        "loss": "cliptrack_vanilla",
        "aggregation": "seq-mean-token-mean",
        "clip_reference": "old",
    }


def test_an_entry_verl_would_reduce_by_max_or_min_is_refused() -> None:
    with pytest.raises(ValueError, match="np.max"):
        verl_keys.entry("log_ratio_max")
    with pytest.raises(ValueError, match="recipe field"):
        verl_keys.marker("band", "x")


def _write_logs(root: Path) -> None:
    project = root / "proj"
    project.mkdir()
    lines = [{"step": s, "data": {**STEP, "actor/cliptrack/clipped_tokens": 3.5 + s}} for s in (1, 2)]
    (project / "run-a.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    console = "Creating file logger at x\n" + "".join(
        f"step:{s} - " + " - ".join(f"{k}:np.float64({v!r})" for k, v in line["data"].items()) + "\n"
        for s, line in ((line["step"], line) for line in lines)
    )
    (project / "run-b.log").write_text(console)


def test_verls_file_and_console_logs_load_exact(tmp_path: Path) -> None:
    _write_logs(tmp_path)
    runs = load_runs(jsonl_dir=str(tmp_path))
    assert sorted(runs.labels) == ["proj/run-a", "proj/run-b"]
    for label in runs.labels:
        info = runs.info(label)
        wide = runs.wide(label)
        assert wide[keys.CLIP_FRACTION].tolist() == [4.5 / 20.5, 5.5 / 20.5]
        assert keys.CLIP_FRACTION not in info.approximate
        assert wide["actor/pg_clipfrac"].tolist() == [0.2333333, 0.2333333]
        assert info.run.backend_label == "verl"
        recipe = recipe_from_config(info.run.config)
        assert recipe is not None
        assert (recipe.loss, recipe.clip_low, recipe.dual_clip, recipe.aggregation) == (
            "cliptrack_vanilla",
            0.8,
            3.0,
            "seq-mean-token-mean",
        )


def test_a_damaged_file_log_line_is_named(tmp_path: Path) -> None:
    _write_logs(tmp_path)
    with (tmp_path / "proj" / "run-a.jsonl").open("a") as f:
        f.write('{"step": 3}\n')
    with pytest.raises(ValueError, match=r"run-a.jsonl:3: not a line of verl's file logger"):
        load_runs(jsonl_dir=str(tmp_path))


@pytest.mark.skipif(importlib.util.find_spec("verl") is not None, reason="verl is installed here")
def test_the_adapter_imports_without_verl_and_names_the_extra() -> None:
    pytest.importorskip("torch")
    import cliptrack.adapters.verl as adapter

    assert adapter.REGISTERED == {}
    with pytest.raises(ImportError, match=r"cliptrack\[verl\]"):
        adapter.register()


def test_a_run_of_verls_own_mode_loads_approximate(tmp_path: Path) -> None:
    own = {k: v for k, v in STEP.items() if not verl_keys.is_entry(k)}
    (tmp_path / "plain.jsonl").write_text(json.dumps({"step": 1, "data": own}) + "\n")
    runs = load_runs(jsonl_dir=str(tmp_path))
    (label,) = runs.labels
    assert keys.CLIP_FRACTION in runs.info(label).approximate
    assert runs.wide(label)[keys.CLIP_FRACTION].tolist() == [0.2333333]
    assert recipe_from_config(runs.info(label).run.config) is None
