"""W&B's command-line options: the run files to read (``--wandb-dir``; ``entity/project/run_id``
refs with no store named go through the public API) and where replay delivers instead of the
recorded project, entity, directory or mode. Imports nothing heavy (``--help`` reads it)."""

from __future__ import annotations

from collections.abc import Sequence

from cliptrack.backends.options import EXTRA, StoreOption, absolute_dir

STORE_OPTIONS = (
    StoreOption(
        "wandb_dir", "--wandb-dir", metavar="DIR", help="directory holding W&B run files (offline runs)"
    ),
    StoreOption("wandb_api", None, role=EXTRA),
)

TARGET_OPTIONS = (
    StoreOption(
        "project",
        "--wandb-project",
        dest="wandb_project",
        help="W&B project to deliver to instead of the recorded one",
    ),
    StoreOption(
        "entity",
        "--wandb-entity",
        dest="wandb_entity",
        help="W&B entity to deliver to instead of the recorded one",
    ),
    StoreOption(
        "dir",
        "--wandb-dir",
        dest="wandb_dir",
        convert=absolute_dir,
        help="W&B directory to deliver to instead of the recorded one",
    ),
    StoreOption(
        "mode",
        "--wandb-mode",
        dest="wandb_mode",
        help="W&B mode (online, offline) instead of the recorded one",
    ),
)


def claims(refs: Sequence[str]) -> bool:
    """Refs that are all W&B run paths (``entity/project/run_id``) name runs of the public API."""
    return all(ref.count("/") == 2 for ref in refs)
