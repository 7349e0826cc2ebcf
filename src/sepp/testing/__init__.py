"""Helpers for testing code against a real ``sepp`` server.

Run a throw-away server on loopback from trio code::

    from sepp.testing import sepp_server

    async def test_something() -> None:
        async with sepp_server({"storage": {"persist_mode": "buffer"}}) as server:
            ...  # connect a client to server.address ("127.0.0.1:PORT")
            await server.restart()  # same port, same data dir

or enable the pytest plugin (``pytest_plugins = ["sepp.testing.pytest_plugin"]``)
and take the ``sepp_server`` fixture.

The server binary is found by :func:`find_sepp_binary` (``SEPP_BIN``, then
the cache filled by ``scripts/ensure-sepp-server.sh``, then ``PATH``).  The
pinned release is :data:`SEPP_SERVER_VERSION`; install it with
``cargo install sepp --version 0.1.1 --locked``.

This module needs only the standard library and trio.
"""

from ._server import (
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
    "INSTALL_COMMAND",
    "SEPP_SERVER_VERSION",
    "ExternalSeppServer",
    "SeppServer",
    "SeppServerNotFound",
    "SeppServerStartError",
    "find_sepp_binary",
    "sepp_cache_binary_path",
    "sepp_server",
    "toml_dumps",
]
