"""The JSONL spool's command-line option: the spool directory to read (``--jsonl DIR``). The spool
is not a sink (it is the journal every sink is fed from), so replay has nothing to re-target."""

from __future__ import annotations

from cliptrack.backends.options import StoreOption

STORE_OPTIONS = (
    StoreOption(
        "jsonl_dir",
        "--jsonl",
        metavar="DIR",
        dest="jsonl",
        help="JSONL spool directory (<DIR>/<run_id>/points.jsonl)",
    ),
)

TARGET_OPTIONS: tuple[StoreOption, ...] = ()
