"""The one place that touches ``wandb-workspaces`` internals (private or version-sensitive names).

``panels_wandb`` builds workspaces and reports with the library's public classes, but two things
have no public API:

- the saved-view / report *model* that ``save()`` would upload (``Workspace._to_model()``,
  ``Report._to_model()``), which is what specs written offline contain;
- answering the report runset's project-id lookup without the W&B API (``interface._get_api`` and
  ``interface.execute_graphql`` replaced for the duration of a ``with`` block).

Both are checked against ``SUPPORTED`` (the versions this was written and tested against):
``check_version`` raises with a clear message on any other version, before anything is patched.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from cliptrack.core import versions
from cliptrack.core.versions import UnsupportedVersionError

SUPPORTED = ((0, 1, 10), (0, 5, 0))
"""Supported ``wandb-workspaces`` versions: at least the first, below the second."""
OFFLINE_PROJECT_ID = "offline-unresolved"
"""Placeholder project id written into specs built without the W&B API."""


USES = (
    "Workspace._to_model / Report._to_model and reports.v2.interface._get_api / execute_graphql "
    "(cliptrack's W&B panels)"
)


def installed_version() -> str:
    """The installed wandb-workspaces version; UnsupportedVersionError when it is not installed."""
    try:
        return version("wandb-workspaces")
    except PackageNotFoundError as exc:
        raise UnsupportedVersionError(
            "wandb-workspaces is not installed: pip install 'cliptrack[wandb]'"
        ) from exc


def check_version(found: str | None = None) -> str:
    """Return the installed (or given) version; raise ``UnsupportedVersionError`` outside ``SUPPORTED``."""
    return versions.check_version(
        "wandb-workspaces",
        found or installed_version(),
        *SUPPORTED,
        USES,
        seam="tracking/compare/views/_wandb_workspaces.py",
    )


def model_json(obj: Any) -> dict[str, Any]:
    """The view model of a ``Workspace`` or ``Report`` as JSON-ready data (what ``save()`` uploads)."""
    check_version()
    return json.loads(obj._to_model().model_dump_json(by_alias=True, exclude_none=True))


@contextlib.contextmanager
def offline_project_ids(project_id: str = OFFLINE_PROJECT_ID) -> Iterator[None]:
    """Answer the report runset's project-id lookup without the W&B API (nothing else is replaced)."""
    check_version()
    from wandb_workspaces.reports.v2 import gql
    from wandb_workspaces.reports.v2 import interface as wri

    real = wri.execute_graphql

    def lookup(api: Any, query: Any, variables: Any) -> Any:
        if query is gql.projectInternalId:
            return {"project": {"internalId": project_id}}
        return real(api, query, variables)

    saved_api, saved_exec = wri._get_api, wri.execute_graphql
    wri._get_api = lambda: None  # type: ignore[assignment]
    wri.execute_graphql = lookup  # type: ignore[assignment]
    try:
        yield
    finally:
        wri._get_api, wri.execute_graphql = saved_api, saved_exec  # type: ignore[assignment]
