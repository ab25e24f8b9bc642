"""MLflow's command-line options: the store to read (``--tracking-uri``, ``--experiment``) and the
store replay delivers to instead of the recorded one. Imports nothing heavy (``--help`` reads it)."""

from __future__ import annotations

from cliptrack.backends.options import SCOPE, StoreOption

DEFAULT = True
"""MLflow is the store read when none is named (``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``)."""

STORE_OPTIONS = (
    StoreOption(
        "tracking_uri",
        "--tracking-uri",
        help="MLflow tracking URI: sqlite:///PATH/mlflow.db (a plain PATH to a database file is read "
        "as that, with a note) or http://HOST:PORT; a sqlite file that is not an MLflow store is "
        "refused untouched (default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db if that file exists)",
    ),
    StoreOption(
        "experiment", "--experiment", help="MLflow experiment (name or id) to look runs up in", role=SCOPE
    ),
)

TARGET_OPTIONS = (
    StoreOption(
        "tracking_uri",
        "--tracking-uri",
        help="MLflow tracking URI to deliver to instead of the recorded one (a new or emptied store: "
        "the run is created there and the mapping recorded in run.json)",
    ),
)
