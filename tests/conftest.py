"""Shared test setup: the real-server fixture, and a summary of what ran where.

Tests are counted by where they run: `unit` (no sockets), `fixture` (our misbehaving h2
server or scripted fakes), `real_server` (the real sepp binary). The summary line at the end
of a run shows the counts, so a green run that quietly skipped the server is visible.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import settings

import sepp
from sepp.testing import ExternalSeppServer, SeppServer
from sepp.wire import WIRE_ENGINES, _engine

pytest_plugins = ["sepp.testing.pytest_plugin"]

# Fuzzing in CI: a bounded number of examples, no per-example deadline on a shared 2-core
# machine, and the reproduction blob printed on failure (pytest also prints the seed).
settings.register_profile(
    "sepp",
    max_examples=int(os.environ.get("SEPP_FUZZ_EXAMPLES", "100")),
    deadline=None,
    print_blob=True,
)
settings.load_profile("sepp")

_TESTS = Path(__file__).parent
_CATEGORY_BY_DIR = {
    "unit": "unit",
    "integration": "real_server",
    "interop": "real_server",
    "hostile": "fixture",
    "chaos": "real_server",
    "proxies": "real_server",
}
# Tests that talk to our misbehaving h2 server or to a scripted fake client.
_FIXTURE_FILES = {
    "test_wire_transport.py",
    "test_wire_handover.py",
    "test_wire_blocking.py",
    "test_worker.py",
}
_passed: Counter[str] = Counter()
# The suites that run once per wire engine (our codec and the h2 reference): the sans-IO
# engine tests, the transport and hostile-server suites, the real-server client tests and
# the proxy tests.
_BOTH_ENGINES = {
    "test_wire_connection.py",
    "test_wire_limits.py",
    "test_wire_transport.py",
    "test_wire_handover.py",
    "test_wire_blocking.py",
    "test_hostile_server.py",
    "test_client_real.py",
    "test_proxies_real.py",
    "test_sync_client_real.py",
    "test_sync_threads_real.py",
    "test_proxies_sync_real.py",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in (
        ("unit", "no sockets"),
        ("fixture", "against a fixture server or a scripted fake"),
        ("real_server", "against the real sepp server"),
    ):
        config.addinivalue_line("markers", f"{name}: {doc}")


def _category(item: pytest.Item) -> str:
    for marker in ("real_server", "fixture", "unit"):
        if item.get_closest_marker(marker) is not None:
            return marker
    rel = Path(str(item.fspath)).resolve().relative_to(_TESTS.resolve())
    if rel.name in _FIXTURE_FILES:
        return "fixture"
    return _CATEGORY_BY_DIR.get(rel.parts[0], "unit")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if Path(str(metafunc.definition.fspath)).name in _BOTH_ENGINES:
        metafunc.parametrize("wire_engine", WIRE_ENGINES, indirect=True)


@pytest.fixture
def wire_engine(request: pytest.FixtureRequest) -> str:
    """The engine this test runs on: both, in the suites above; else the default."""
    return str(getattr(request, "param", _engine.DEFAULT_WIRE_ENGINE))


@pytest.fixture(autouse=True)
def _run_on_wire_engine(wire_engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every sepp.open()/Channel made without wire_engine= uses the package default.
    monkeypatch.setattr(_engine, "DEFAULT_WIRE_ENGINE", wire_engine)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker(_category(item)) is None:
            item.add_marker(_category(item))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.passed:
        _passed[next(m for m in ("real_server", "fixture", "unit") if m in report.keywords)] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(
        "sepp-trio tests passed by kind: "
        f"unit={_passed['unit']} fixture={_passed['fixture']} "
        f"real_server={_passed['real_server']}"
    )


@pytest.fixture
async def client(sepp_server: SeppServer | ExternalSeppServer) -> AsyncIterator[sepp.Client]:
    async with sepp.open(sepp_server.address) as c:
        yield c
