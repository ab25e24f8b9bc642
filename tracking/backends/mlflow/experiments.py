"""MLflow experiments as cliptrack makes them: a training experiment (``mlflow ui`` shows its runs'
metrics as training charts, not as a GenAI experiment) with its artifacts where the caller says, and
the UI view that opens on the clip fraction, the mismatch KL, reward and throughput
(``charts_view_tags``, opened by an address carrying ``CHARTS_VIEW_QUERY``). The experiment-kind tag
and ``artifacts_beside`` (a directory beside a sqlite store) are the names others (the comparison's
MLflow run) make experiments with."""

from __future__ import annotations

import re

from cliptrack.backends.mlflow._compat import (
    EXPERIMENT_DESCRIPTION_TAG,
    EXPERIMENT_KIND_TAG,
    SHARED_VIEW_PARAM,
    SHARED_VIEW_TAG_PREFIX,
    TRAINING_EXPERIMENT_KIND,
    artifacts_beside,
    grouped_view_state,
    shared_view_state,
)
from cliptrack.core import keys

__all__ = [
    "CHARTS_FIRST",
    "CHARTS_VIEW_KEY",
    "CHARTS_VIEW_QUERY",
    "EXPERIMENT_KIND_TAG",
    "TRAINING_EXPERIMENT_KIND",
    "artifacts_beside",
    "charts_view_tags",
    "describe_experiment",
    "group_charts_view",
    "training_experiment",
]

CHARTS_VIEW_KEY = "cliptrack-charts"
"""The share key of the view cliptrack writes for its training experiments (``charts_view_tags``)."""
CHARTS_VIEW_QUERY = f"{SHARED_VIEW_PARAM}={CHARTS_VIEW_KEY}"
"""The URL parameter that opens that view (after ``workflowType=machine_learning&compareRunsMode=CHART``)."""
CHARTS_FIRST = (keys.CLIP_FRACTION, keys.KL_K3_MEAN, keys.REWARD, keys.THROUGHPUT)
"""The charts the view shows: the clip fraction, the mismatch KL, the reward and the throughput."""


def charts_view_tags() -> dict[str, str]:
    """The experiment tag of the MLflow UI view that opens on ``CHARTS_FIRST`` alone: the charts'
    search box set to a regular expression matching those keys, the run list folded so that the
    charts get the width for their titles (the UI's arrow unfolds it; clearing the search box shows
    every chart; "Exit shared view" returns to the browser's own layout)."""
    pattern = "^(" + "|".join(re.escape(key) for key in CHARTS_FIRST) + ")$"
    return {SHARED_VIEW_TAG_PREFIX + CHARTS_VIEW_KEY: shared_view_state(pattern, run_list_hidden=True)}


def training_experiment(tracking_uri: str, name: str, artifact_location: str) -> str:
    """The id of experiment ``name`` in the store at ``tracking_uri``: the existing one, else one
    created as a training experiment with its artifacts at ``artifact_location`` (a URI). Either way
    it holds the charts view (``charts_view_tags``; written again where an older one differs)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    view = charts_view_tags()
    found = client.get_experiment_by_name(name)
    if found is not None:
        for key, value in view.items():
            if found.tags.get(key) != value:
                client.set_experiment_tag(found.experiment_id, key, value)
        return str(found.experiment_id)
    tags = {EXPERIMENT_KIND_TAG: TRAINING_EXPERIMENT_KIND, **view}
    return str(client.create_experiment(name, artifact_location=artifact_location, tags=tags))


def group_charts_view(tracking_uri: str, experiment_id: str, param: str) -> None:
    """Make experiment ``experiment_id``'s charts view (``charts_view_tags``, what the address
    carrying ``CHARTS_VIEW_QUERY`` opens) group its runs by their param ``param``: the run list one
    row per value with its runs under it, the charts each group's mean over its runs with their
    range (``_compat.grouped_view_state``)."""
    from mlflow.tracking import MlflowClient

    tag = SHARED_VIEW_TAG_PREFIX + CHARTS_VIEW_KEY
    grouped = grouped_view_state(charts_view_tags()[tag], param)
    MlflowClient(tracking_uri=tracking_uri).set_experiment_tag(experiment_id, tag, grouped)


def describe_experiment(tracking_uri: str, experiment_id: str, text: str) -> None:
    """Set experiment ``experiment_id``'s description to ``text`` (markdown): the MLflow UI shows
    it at the top of the experiment's page. The caller escapes run-provided text in it."""
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=tracking_uri).set_experiment_tag(
        experiment_id, EXPERIMENT_DESCRIPTION_TAG, text
    )
