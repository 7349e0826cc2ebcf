"""The blocking channel (SyncClient's) against what an nginx worker exiting on reload does to a
connection it has just accepted: end it before any call went on it.

Closed before its SETTINGS, reset, or GOAWAY straight after them: no call was sent on that
connection, so the call dials again instead of failing with ConnectError (seen through nginx
with TLS reloaded under load, tests/proxies/test_proxies_sync_real.py). A server that is not
HTTP/2 still fails the call at once.
"""

from __future__ import annotations

import socket
import struct

import pytest
import trio
from fixtures.h2_server import H2Server, ServerCall, ServerConnection

from sepp._runtime import run_blocking
from sepp.wire._blocking import BlockingChannel
from sepp.wire._channel_base import Endpoint, RpcError
from sepp.wire._failure import FailureKind

pytestmark = pytest.mark.fixture

GUARD_S = 10.0  # no test may take longer than this


async def echo(call: ServerCall) -> None:
    await call.respond(b"echo:" + call.message)


class EndsFirstConnections(H2Server):
    """Ends its first `ended` connections as an exiting proxy worker does, then serves."""

    def __init__(self, how: str, ended: int) -> None:
        super().__init__(echo)
        self.how = how
        self.ended = ended

    async def _accept(self, stream: trio.abc.Stream) -> None:
        index = len(self.connections)
        if index >= self.ended:
            await super()._accept(stream)
            return
        conn = ServerConnection(self, stream, index)
        self.connections.append(conn)
        if self.how == "goaway":
            conn.h2.initiate_connection()
            await conn.goaway(0)  # in one write with the SETTINGS
        elif self.how == "reset":
            sock = stream.socket  # type: ignore[attr-defined]
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif self.how == "not-http2":
            await stream.send_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        await conn.close()


def call_blocking(channel: BlockingChannel) -> bytes:
    return run_blocking(channel.call("GetServerInfo", b"hi", timeout=GUARD_S / 2))


@pytest.mark.parametrize("how", ["goaway", "closed", "reset"])
async def test_connection_ended_before_any_call_is_dialed_again(how: str) -> None:
    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            server = await EndsFirstConnections(how, ended=2).start(nursery)
            channel = BlockingChannel(Endpoint("127.0.0.1", server.port), user_agent="t")
            try:
                answer = await trio.to_thread.run_sync(call_blocking, channel)
            finally:
                channel.close()
                nursery.cancel_scope.cancel()
    assert answer == b"echo:hi"
    assert len(server.connections) == 3
    assert len(server.calls) == 1


async def test_a_server_that_is_not_http2_fails_the_call_at_once() -> None:
    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            server = await EndsFirstConnections("not-http2", ended=1000).start(nursery)
            channel = BlockingChannel(Endpoint("127.0.0.1", server.port), user_agent="t")
            try:
                with pytest.raises(RpcError) as caught:
                    await trio.to_thread.run_sync(call_blocking, channel)
            finally:
                channel.close()
                nursery.cancel_scope.cancel()
    assert caught.value.kind is FailureKind.CONNECT
    assert len(server.connections) == 1
