"""The channels (the blocking one of SyncClient, and for dialling the trio one too) against
what nginx workers do to connections when nginx reloads (seen through nginx with TLS reloaded
under load, in tests/proxies/test_proxies_sync_real.py):

- An exiting worker takes a new connection and ends it before any call went on it (closed
  before its SETTINGS, reset, or GOAWAY straight after them): the call dials again instead of
  failing with ConnectError. A server that is not HTTP/2 still fails the call at once.
- A worker answers, sends GOAWAY and resets the connection while our next request is on its
  way: the send fails, and what the server sent before is read all the same.
"""

from __future__ import annotations

import math
import socket
import struct
from typing import Any

import pytest
import trio
from fixtures.h2_server import H2Server, ServerCall, ServerConnection

from sepp._runtime.blocking_runtime import run_blocking
from sepp.wire._failure import FailureKind
from sepp.wire.drivers._base import Attempt, Endpoint, RpcError
from sepp.wire.drivers._blocking import BlockingChannel
from sepp.wire.drivers._trio import Channel

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


async def first_call(driver: str, server: H2Server, nursery: trio.Nursery) -> bytes:
    """One call on a new channel of `driver` ("trio" or "blocking") to `server`."""
    endpoint = Endpoint("127.0.0.1", server.port)
    if driver == "trio":
        channel = Channel(endpoint, nursery, user_agent="t")
        try:
            return await channel.call("GetServerInfo", b"hi", timeout=GUARD_S / 2)
        finally:
            await channel.aclose()
    blocking = BlockingChannel(endpoint, user_agent="t")
    try:
        return await trio.to_thread.run_sync(call_blocking, blocking)
    finally:
        blocking.close()


@pytest.mark.parametrize("driver", ["trio", "blocking"])
@pytest.mark.parametrize("how", ["goaway", "closed", "reset"])
async def test_connection_ended_before_any_call_is_dialed_again(how: str, driver: str) -> None:
    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            server = await EndsFirstConnections(how, ended=2).start(nursery)
            answer = await first_call(driver, server, nursery)
            nursery.cancel_scope.cancel()
    assert answer == b"echo:hi"
    assert len(server.connections) == 3
    assert len(server.calls) == 1


@pytest.mark.parametrize("driver", ["trio", "blocking"])
async def test_a_server_that_is_not_http2_fails_the_call_at_once(driver: str) -> None:
    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            server = await EndsFirstConnections("not-http2", ended=1000).start(nursery)
            with pytest.raises(RpcError) as caught:
                await first_call(driver, server, nursery)
            nursery.cancel_scope.cancel()
    assert caught.value.kind is FailureKind.CONNECT
    assert len(server.connections) == 1


def send(conn: Any, message: bytes) -> Any:
    """Start a call on `conn` and write its request (what a caller's wait() does first)."""
    waiter = conn.start(Attempt("GetServerInfo", message, (), math.inf, None))
    conn.flush()
    return waiter


async def test_calls_answered_before_a_reset_succeed_and_those_above_its_goaway_go_again() -> None:
    # nginx ending a TLS connection on reload: it answers the calls it took, sends GOAWAY,
    # and resets the connection while our next request is on its way. The send fails, but
    # the answer and the GOAWAY are still in our receive buffer.
    async def answer_then_reset(call: ServerCall) -> None:
        await call.respond(b"answered")
        await call.conn.goaway(1)
        sock = call.conn.stream.socket  # type: ignore[attr-defined]
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await call.conn.close()

    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            server = await H2Server(answer_then_reset).start(nursery)
            channel = BlockingChannel(Endpoint("127.0.0.1", server.port), user_agent="t")
            try:
                conn = await trio.to_thread.run_sync(
                    run_blocking, channel._ready_connection(math.inf, None)
                )
                # The first call's thread holds the reader's role but has not read yet.
                first = await trio.to_thread.run_sync(send, conn, b"a")
                await server.wait_until(lambda: server.connections[0].closed)
                second = await trio.to_thread.run_sync(send, conn, b"b")  # the send fails
                assert first is not None and second is not None
                results = [await trio.to_thread.run_sync(conn.wait, w) for w in (first, second)]
            finally:
                channel.close()
                nursery.cancel_scope.cancel()
    first_result, second_result = results
    assert conn.dead  # and its socket closed: the reader met the reset after the GOAWAY
    assert first_result is not None and first_result.body == b"answered"
    assert second_result is not None and second_result.error_kind is FailureKind.GOAWAY
