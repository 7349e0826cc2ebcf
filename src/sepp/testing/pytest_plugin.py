"""pytest plugin providing a ``memory_server`` fixture (a sepp server in memory, no binary)
and a ``sepp_server`` fixture backed by a real server.

Enable it in a ``conftest.py``::

    pytest_plugins = ["sepp.testing.pytest_plugin"]

and use it from trio tests (pytest-trio is required; with ``trio_mode = true``
in the pytest config every ``async def`` test is a trio test, otherwise mark
the tests with ``@pytest.mark.trio``)::

    async def test_enqueue(sepp_server: SeppServer) -> None:
        client = ...connect to sepp_server.address...

The fixture is function-scoped: every test gets a fresh server (fresh data
dir, OS-assigned port) started with :data:`DEFAULT_TEST_CONFIG`.  To change
the config, override the ``sepp_server_config`` fixture::

    @pytest.fixture
    def sepp_server_config() -> dict[str, object]:
        return {**DEFAULT_TEST_CONFIG, "server": {"strict_queues": True}}

The ``memory_server`` fixture is the same for a :class:`~sepp.testing.MemoryServer`, with
its config in the ``memory_server_config`` fixture; ask for pytest-trio's
``autojump_clock`` fixture too and its leases, schedules and retry delays elapse in the
test's virtual time::

    async def test_reminder(memory_server: MemoryServer, autojump_clock: MockClock) -> None:
        ...

If the ``SEPP_TEST_ADDR`` environment variable is set (``host:port``), no
process is launched: the fixture yields an
:class:`~sepp.testing.ExternalSeppServer` with that ``address``/``host``/``port``.
Its ``start()``, ``stop()``, ``restart()`` and ``update_config()`` raise
``NotImplementedError``, and the config fixture is ignored, so tests that
restart the server or need a particular config cannot run against it.
"""

from __future__ import annotations

import copy
import os
from collections.abc import AsyncIterator

import pytest

from ._memory.server import MemoryServer
from ._memory.server import memory_server as _memory_server
from ._server import DEAD_LETTER_RETENTION_MS, ExternalSeppServer, SeppServer
from ._server import sepp_server as _launch_sepp_server

__all__ = [
    "DEFAULT_MEMORY_SERVER_CONFIG",
    "DEFAULT_TEST_CONFIG",
    "memory_server",
    "memory_server_config",
    "sepp_server",
    "sepp_server_config",
]

DEFAULT_TEST_CONFIG: dict[str, object] = {
    "admin": {"enabled": False},
    "storage": {
        "dead_letter_retention_ms": DEAD_LETTER_RETENTION_MS,
        "persist_mode": "buffer",
    },
}
"""Config used by the ``sepp_server`` fixture: admin UI off, dead letters kept
for 10 minutes (so DrainDeadLetters returns records; ``sepp_server()`` keeps
them as long without a config, and so does an override of the config fixture
that does not set the key), and the fast but not crash-safe ``buffer``
persist mode."""


@pytest.fixture
def sepp_server_config() -> dict[str, object]:
    """The config the ``sepp_server`` fixture starts its server with (override me)."""
    return copy.deepcopy(DEFAULT_TEST_CONFIG)


@pytest.fixture
async def sepp_server(
    sepp_server_config: dict[str, object],
) -> AsyncIterator[SeppServer | ExternalSeppServer]:
    """A fresh sepp server for one test, or the server named by ``SEPP_TEST_ADDR``."""
    external = os.environ.get("SEPP_TEST_ADDR")
    if external:
        yield ExternalSeppServer(external)
        return
    async with _launch_sepp_server(sepp_server_config) as server:
        yield server


DEFAULT_MEMORY_SERVER_CONFIG: dict[str, object] = {
    "storage": {"dead_letter_retention_ms": DEAD_LETTER_RETENTION_MS},
}
"""Config used by the ``memory_server`` fixture: dead letters kept for 10 minutes (so
DrainDeadLetters returns records; ``memory_server()`` keeps them so too unless a config says
otherwise), everything else the real server's defaults."""


@pytest.fixture
def memory_server_config() -> dict[str, object]:
    """The config the ``memory_server`` fixture starts its server with (override me)."""
    return copy.deepcopy(DEFAULT_MEMORY_SERVER_CONFIG)


@pytest.fixture
async def memory_server(memory_server_config: dict[str, object]) -> AsyncIterator[MemoryServer]:
    """A fresh :class:`~sepp.testing.MemoryServer` for one test, in the test's trio run: under
    pytest-trio's ``autojump_clock`` (or ``mock_clock``) fixture its time is the run's
    virtual time, and the client and the Worker in the test read the same clock."""
    async with _memory_server(memory_server_config) as server:
        yield server
