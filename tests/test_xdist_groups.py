"""The suite's grouping reaches pytest-xdist: a test of a group runs under a node id that names it.

``make test`` runs ``--dist loadgroup``: every test that shares a session or module fixture is
marked with an ``xdist_group`` (tests/conftest.py), and xdist sends a group to one worker by
appending ``@<group>`` to each test's node id. Where that append is lost (pytest 9.2 with
pytest-xdist 3.8), every worker builds every shared fixture itself: the demo run, the servers and
the multi-process launches twice.
"""

from __future__ import annotations

import os

import pytest


@pytest.mark.xdist_group("grouping-check")
def test_a_grouped_test_runs_under_its_groups_node_id(request: pytest.FixtureRequest) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER") or not request.config.getvalue("loadgroup"):
        pytest.skip("not a pytest-xdist worker with --dist loadgroup")
    assert request.node.nodeid.endswith("@grouping-check"), request.node.nodeid
