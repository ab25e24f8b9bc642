"""The outside programs some tests need, and one guard for each: a test that needs one is skipped,
with the reason and how to install it, where it is missing. ``.ci/run`` installs all of them, so CI
skips none. Python packages are not guarded here: the ``dev`` extra installs them."""

from __future__ import annotations

import os
import shutil

import pytest

from tests import _postgres

CHROMIUM = "/usr/bin/chromium"
"""The headless browser of the UI and dashboard tests."""

needs_mlflow_command = pytest.mark.skipif(
    shutil.which("mlflow") is None, reason="the mlflow command is not installed (pip install mlflow)"
)
"""For a test that starts ``mlflow server`` (or ``mlflow ui``) as a user does."""
needs_chromium = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed (Debian: apt-get install chromium)"
)
"""For a test that renders a page in headless Chromium."""
needs_tmux = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (Debian: apt-get install tmux)"
)
"""For a test that reads what a real terminal shows."""
needs_postgres = pytest.mark.skipif(_postgres.unavailable() is not None, reason=str(_postgres.unavailable()))
"""For a test that starts a PostgreSQL cluster of its own."""
