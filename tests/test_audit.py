"""Exact beside theirs: a run holding a framework's own number and cliptrack's exact counts.

TRL's ``clip_ratio/region_mean`` (exact within a micro-step, averaged over micro-steps by
``log()``), logged through transformers' own MLflow and W&B callbacks beside cliptrack's counts;
verl's ``actor/pg_clipfrac`` (a mean of micro-batch means) logged as verl's tracker logs it; Miles'
``train/pg_clipfrac`` (per-sample means) through Miles' ``train/*`` against ``train/step``. The
comparison uses the exact fraction (the ratio of the logged token sums) and shows both, with the
gap, in its text, its JSON, the dashboard (checked in headless Chromium) and the clip panel.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from cliptrack.backends import load_runs
from cliptrack.compare import compare
from cliptrack.core import keys

from tests._tools import needs_chromium
from tests.test_frameworks import _wandb, batches, mean_of_means, ratio_of_sums, write_trl

pytest.importorskip("mlflow")
pytest.importorskip("wandb")

STEPS = 8


def _counts(mbs) -> dict[str, float]:
    return {
        keys.CLIPPED_TOKENS: float(sum(mb[1] for mb in mbs)),
        keys.LOSS_TOKENS: float(sum(mb[0] for mb in mbs)),
    }


def trl_rows(seed: int) -> list[dict[str, float]]:
    return [
        {"clip_ratio/region_mean": mean_of_means(batches(seed, s)), **_counts(batches(seed, s))}
        for s in range(STEPS)
    ]


def verl_rows(seed: int) -> list[dict[str, float]]:
    return [
        {"actor/pg_clipfrac": mean_of_means(batches(seed, s)), **_counts(batches(seed, s))}
        for s in range(STEPS)
    ]


def miles_rows(seed: int) -> list[dict[str, float]]:
    rows = []
    for s in range(STEPS):
        mbs = batches(seed, s)
        ours = {f"train/{k}": v for k, v in _counts(mbs).items()}
        rows.append({"train/pg_clipfrac": mean_of_means(mbs), **ours})
    return rows


def theirs_and_exact(seed: int) -> tuple[float, float]:
    """The framework's number as a window mean over steps, and the exact ratio of token sums."""
    per_step = [mean_of_means(batches(seed, s)) for s in range(STEPS)]
    every = [mb for s in range(STEPS) for mb in batches(seed, s)]
    return float(np.mean(per_step)), ratio_of_sums(every)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    os.environ.setdefault("WANDB_SILENT", "true")
    root = tmp_path_factory.mktemp("audit")
    here = os.getcwd()
    os.chdir(root)
    try:
        uri = f"sqlite:///{root / 'mlflow.db'}"
        for seed, name in enumerate(("trl-a", "trl-b")):
            write_trl(root / "wandb-trl", name, uri, trl_rows(seed))
        for seed, name in enumerate(("verl-a", "verl-b")):
            rows = verl_rows(seed)
            _wandb(root / "wandb-verl", name, lambda run, step, row: run.log(row, step=step), rows)
        for seed, name in enumerate(("miles-a", "miles-b")):
            rows = miles_rows(seed)
            _wandb(
                root / "wandb-miles", name, lambda run, step, row: run.log({**row, "train/step": step}), rows
            )
    finally:
        os.chdir(here)
    return root, uri


def _check_audits(result, framework: str, name: str, why: str) -> None:
    assert len(result.audits) == 2
    for seed, a in enumerate(sorted(result.audits, key=lambda a: a.run)):
        theirs, exact = theirs_and_exact(seed)
        assert (a.framework, a.name, a.metric, a.why) == (framework, name, "clip_fraction", why)
        assert a.theirs == pytest.approx(theirs, rel=1e-9) and a.exact == pytest.approx(exact, rel=1e-12)
        assert a.steps == STEPS and a.theirs != pytest.approx(a.exact, rel=1e-3)  # a gap to show
        used = result.run_estimate("clip_fraction", a.run)
        assert not used.approximate and used.estimate.value == pytest.approx(exact, rel=1e-12)


def test_trl_clip_ratio_beside_the_exact_one_in_text_and_json(stores):
    from cliptrack.cli.compare import format_result

    _, uri = stores
    runs = load_runs(["trl-a", "trl-b"], tracking_uri=uri)
    assert {info.framework for info in runs.runs} == {"trl"}
    result = compare(runs, ["trl-a", "trl-b"])
    _check_audits(result, "TRL", "clip_ratio/region_mean", "TRL averages micro-steps")
    theirs, exact = theirs_and_exact(0)
    line = (
        f"Audit: trl-a: TRL's clip_ratio/region_mean {theirs * 100:.3g} % vs exact {exact * 100:.3g} % "
        f"({(theirs - exact) * 100:+.2g} pp): TRL averages micro-steps"
    )
    assert line in format_result(result, width=200)
    assert line in result.summary()
    data = json.loads(result.to_json())
    row = next(a for a in data["audits"] if a["run"] == "trl-a")
    assert row["theirs"] == pytest.approx(theirs) and row["exact"] == pytest.approx(exact)
    assert row["gap"] == pytest.approx(theirs - exact) and row["framework"] == "TRL"


def test_trl_wandb_callback_run_is_audited_the_same(stores):
    root, _ = stores
    result = compare(load_runs(wandb_dir=root / "wandb-trl"), ["trl-a", "trl-b"])
    _check_audits(result, "TRL", "train/clip_ratio/region_mean", "TRL averages micro-steps")


def test_verl_and_miles_own_numbers_beside_the_exact_ones(stores):
    root, _ = stores
    verl = compare(load_runs(wandb_dir=root / "wandb-verl"), ["verl-a", "verl-b"])
    _check_audits(verl, "verl", "actor/pg_clipfrac", "verl averages micro-batch means")
    miles = compare(load_runs(wandb_dir=root / "wandb-miles"), ["miles-a", "miles-b"])
    _check_audits(miles, "slime/Miles", "train/pg_clipfrac", "Miles averages per-sample means")


def test_the_clip_panel_draws_their_number_dashed(stores):
    from cliptrack.compare.views.panels import panel
    from cliptrack.compare.views.plots import panel_figures

    _, uri = stores
    runs = load_runs(["trl-a", "trl-b"], tracking_uri=uri)
    result = compare(runs, ["trl-a", "trl-b"])
    (clip,) = panel_figures(runs, result, [panel("clip")])
    dashed = [t for t in clip.traces if t.name == "trl-a: TRL's clip_ratio/region_mean"]
    assert len(dashed) == 1 and dashed[0].dash == "dash"
    per_step = [mean_of_means(batches(0, s)) for s in range(STEPS)]
    assert list(dashed[0].y) == pytest.approx(per_step, rel=1e-9)


@needs_chromium
def test_the_dashboard_shows_the_audit_row_in_chromium(stores, tmp_path):
    from cliptrack.compare.views.dashboard import write_dashboard

    from tests.test_dashboard import _chromium

    _, uri = stores
    runs = load_runs(["trl-a", "trl-b"], tracking_uri=uri)
    result = compare(runs, ["trl-a", "trl-b"])
    path = write_dashboard(tmp_path / "dash.html", runs, result)
    dom = _chromium(["--dump-dom", path.as_uri()], tmp_path / "profile").stdout
    start = dom.index('<table class="audit" id="audit">')
    table = dom[start : dom.index("</table>", start)]
    theirs, exact = theirs_and_exact(0)
    row = next(r for r in table.split("<tr>") if "<td>trl-a</td>" in r)
    for cell in (
        "<td>clip_fraction</td>",
        "<td>TRL's clip_ratio/region_mean</td>",
        f"<td>{theirs * 100:.4g} %</td>",
        f"<td>{exact * 100:.4g} %</td>",
        f"<td>{(theirs - exact) * 100:+.3g} pp</td>",
    ):
        assert cell.replace("'", "&#x27;") in row or cell in row, cell
    assert "TRL averages micro-steps" in row
    assert 'data-rendered="0"' not in dom  # the figures drew
