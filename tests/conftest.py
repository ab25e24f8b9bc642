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
    pytest-xdist worker, so that the fixture (the demo run, a server, a launch of several
    processes, a compiled kernel) is built once per test session rather than once per worker: an
    ``xdist_group`` named after the session fixture (the same group across modules, e.g. every
    reader of the demo run), else after the module, unless the test names its group. Tests of the
    same module that use no shared fixture stay free for any worker. pytest's built-in fixtures are
    defined nowhere in the suite (no ``baseid``) and group nothing. Runs before xdist's own hook
    reads the groups. Every reader of the session's demo run is marked ``slow`` (the demo is a
    subprocess training nine runs): ``make test-fast`` never waits for it."""
    for item in items:
        if "demo_run" in getattr(item, "fixturenames", ()) and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("xdist_group") is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        defs = [f[-1] for f in info.name2fixturedefs.values()] if info is not None else []
        shared = [f for f in defs if f.scope in ("module", "session") and f.baseid]
        session = sorted(f.argname for f in shared if f.scope == "session")
        if session:
            item.add_marker(pytest.mark.xdist_group(session[0]))
        elif shared:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ if item.module else item.nodeid))


REQUIRE_STACK = "CLIPTRACK_REQUIRE_STACK"
"""Set (to the stack's name) where a stack's tests run in the environment built for them (``make
test-stacks``): there a test module skipped for a missing package fails instead, so that the stack's
tests can never pass by not running."""


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    stack = os.environ.get(REQUIRE_STACK)
    if stack and report.skipped:
        report.outcome = "failed"
        report.longrepr = (
            f"{collector.nodeid} was skipped in the {stack} environment, where it must run: {report.longrepr}"
        )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Where the collected tests imported MLflow, a new sqlite store of this process is a copy of one
    MLflow initialised (``tests/_mlflow_store.py``): its migrations run once per process, not once
    per store. The migrated one lives in the session's base temporary directory."""
    import sys

    if "mlflow" in sys.modules:
        from tests import _mlflow_store

        basetemp = session.config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
        _mlflow_store.install(basetemp / "mlflow-template")


# the README's test command: hypothesis's own number of examples per property (a property that needs
# more, or fewer, says so in its own settings)
settings.register_profile(
    "default", deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow]
)
# a deeper search on demand (--hypothesis-profile thorough)
settings.register_profile(
    "thorough", deadline=None, max_examples=500, suppress_health_check=[HealthCheck.too_slow]
)
# make test-fast (--hypothesis-profile fast): the everyday loop, fewer examples per property
settings.register_profile(
    "fast", deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("default")


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
