"""MLflow experiments as cliptrack makes them: a training experiment (``mlflow ui`` shows its runs'
metrics as training charts, not as a GenAI experiment) with its artifacts where the caller says."""

from __future__ import annotations

from cliptrack.backends.mlflow._compat import EXPERIMENT_KIND_TAG, TRAINING_EXPERIMENT_KIND
from mlflow.tracking import MlflowClient


def training_experiment(tracking_uri: str, name: str, artifact_location: str) -> str:
    """The id of experiment ``name`` in the store at ``tracking_uri``: the existing one, else one
    created as a training experiment with its artifacts at ``artifact_location`` (a URI)."""
    client = MlflowClient(tracking_uri=tracking_uri)
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    return str(
        client.create_experiment(
            name, artifact_location=artifact_location, tags={EXPERIMENT_KIND_TAG: TRAINING_EXPERIMENT_KIND}
        )
    )
