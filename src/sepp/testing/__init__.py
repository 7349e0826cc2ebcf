"""Helpers for testing code that uses sepp: a sepp server in memory, the real server, and
reserved jobs built by hand.

Run the pure-Python server in memory (no binary, virtual time under trio's ``MockClock``),
from trio or asyncio code::

    from sepp.testing import memory_server

    async def test_something() -> None:
        async with memory_server({"storage": {"dead_letter_retention_ms": 600_000}}) as server:
            ...  # connect a client to server.address ("127.0.0.1:PORT")

(or the ``memory_server`` pytest fixture; ``MemoryServer(config).start()`` from blocking
code). Run a throw-away real server on loopback from trio code::

    from sepp.testing import sepp_server

    async def test_something() -> None:
        async with sepp_server({"storage": {"persist_mode": "buffer"}}) as server:
            ...  # connect a client to server.address ("127.0.0.1:PORT")
            await server.restart()  # same port, same data dir

or enable the pytest plugin (``pytest_plugins = ["sepp.testing.pytest_plugin"]``)
and take the ``sepp_server`` fixture.

The server binary is found by :func:`find_sepp_binary` (``SEPP_BIN``, then
the cache, :func:`sepp_cache_binary_path`, then ``PATH``).  The pinned release
is :data:`SEPP_SERVER_VERSION`; install it with
``cargo install sepp --version 0.1.1 --locked`` (``--root`` the cache's, or onto
``PATH``), or point ``SEPP_BIN`` at a binary.

Unit-test a handler without a server by calling it with a context built by
:func:`job_context` (a fake client's ``extend`` can move its lease with
:func:`set_lease_expires_at`)::

    from sepp.testing import job_context

    async def test_send_welcome() -> None:
        await send_welcome(sepp.Payload.json({"user": 42}), job_context("send_welcome"))

A `def` handler takes :func:`sync_job_context` of one (its ``ctx.client`` blocks).
:func:`follow_ups` lists what a handler asked to enqueue with ``ctx.then``.
"""

from ._jobs import follow_ups, job_context, set_lease_expires_at, sync_job_context
from ._memory.clock import ManualClock
from ._memory.config import ConfigError
from ._memory.server import MemoryServer, memory_server
from ._memory.state import QueueDepths
from ._server import (
    DEAD_LETTER_RETENTION_MS,
    INSTALL_COMMAND,
    SEPP_SERVER_VERSION,
    ExternalSeppServer,
    SeppServer,
    SeppServerNotFound,
    SeppServerStartError,
    find_sepp_binary,
    sepp_cache_binary_path,
    sepp_server,
)
from ._toml import dumps as toml_dumps

__all__ = [
    "DEAD_LETTER_RETENTION_MS",
    "INSTALL_COMMAND",
    "SEPP_SERVER_VERSION",
    "ConfigError",
    "ExternalSeppServer",
    "ManualClock",
    "MemoryServer",
    "QueueDepths",
    "SeppServer",
    "SeppServerNotFound",
    "SeppServerStartError",
    "find_sepp_binary",
    "follow_ups",
    "job_context",
    "memory_server",
    "sepp_cache_binary_path",
    "sepp_server",
    "set_lease_expires_at",
    "sync_job_context",
    "toml_dumps",
]
