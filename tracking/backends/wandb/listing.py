"""W&B run files as ``cliptrack runs`` lists them (``RunEntry``): start time and status from each
run's file (``reader.run_status``), as the MLflow listing shows them."""

from __future__ import annotations

from pathlib import Path

from cliptrack.backends.catalog import RunEntry
from cliptrack.backends.wandb.reader import read


def wandb_entries(directory: str | Path) -> list[RunEntry]:
    """Every run found in W&B run files under ``directory``: status, start time (unix seconds) and
    steps (distinct steps logged) of each."""
    runset = read([], wandb_dir=directory)
    frame = runset.frame
    entries = []
    for info in runset.runs:
        run = info.run
        steps = int(frame.loc[frame["run_id"] == run.run_id, "step"].nunique())
        entries.append(
            RunEntry(
                cliptrack_id=run.run_id,
                store_id=run.run_id,
                name=run.run_name,
                backend=run.backend_label or "",
                status=run.status,
                started=run.started,
                steps=steps,
            )
        )
    return entries


def list_runs(
    *, include_comparisons: bool = False, wandb_dir: str | Path | None = None, **_: object
) -> list[RunEntry]:
    """The registry's listing: ``wandb_entries`` of ``wandb_dir`` (the public API is not listed)."""
    if wandb_dir is None:
        raise ValueError("cliptrack runs lists W&B run files: name their directory (--wandb-dir DIR)")
    return wandb_entries(wandb_dir)
