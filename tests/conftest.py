"""Shared test settings and session fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests._demo import DemoRun, run_demo


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that share one of the suite's own module- or session-scoped fixtures run on one
    pytest-xdist worker (an ``xdist_group`` per module, unless the test names its group), so that
    the fixture (a server, a launch of several processes, a compiled kernel) is built once per test
    session rather than once per worker. pytest's built-in fixtures are defined nowhere in the suite
    (no ``baseid``) and group nothing. Runs before xdist's own hook reads the groups."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if any(fixture[-1].scope in ("module", "session") and fixture[-1].baseid for fixture in defs):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module else item.nodeid))


settings.register_profile(
    "default", deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("ci", deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else "default")


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """The demo, run once per test session for every test that reads its output (``tests._demo.DemoRun``)."""
    return run_demo(tmp_path_factory.mktemp("newcomer"))


@pytest.fixture(scope="session")
def demo_ui(demo_run: DemoRun, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``mlflow ui`` on the session demo's store, as the demo prints it, started once for every test
    that browses it: its address (``http://127.0.0.1:PORT``)."""
    from tests._mlflow_ui import mlflow_server

    log = tmp_path_factory.mktemp("mlflow-ui") / "mlflow-ui.log"
    with mlflow_server(f"sqlite:///{demo_run.out / 'mlflow.db'}", log, command="ui") as port:
        yield f"http://127.0.0.1:{port}"
