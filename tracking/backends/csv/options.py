"""The CSV backend's command-line options: the directory to read (``--csv DIR``) and the one
replay delivers to instead of the recorded one (``--csv-dir DIR``). Imports nothing heavy."""

from __future__ import annotations

from cliptrack.backends.options import StoreOption, absolute_dir

STORE_OPTIONS = (
    StoreOption(
        "csv_dir", "--csv", metavar="DIR", dest="csv", help="CSV backend directory (<DIR>/<run_id>.csv)"
    ),
)

TARGET_OPTIONS = (
    StoreOption(
        "dir",
        "--csv-dir",
        dest="csv_dir",
        metavar="DIR",
        convert=absolute_dir,
        help="CSV directory to deliver to instead of the recorded one",
    ),
)
