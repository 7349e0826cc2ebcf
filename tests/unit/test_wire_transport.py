"""The trio Channel over real loopback sockets, against the scriptable h2 fixture server."""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from fixtures.h2_server import H2Server, ServerCall, frame_message
from h2.errors import ErrorCodes
from trio.testing import wait_all_tasks_blocked

from sepp.wire._constants import MAX_QUEUED_CONTROL_REPLY_BYTES
from sepp.wire._failure import FailureKind
from sepp.wire._status import StatusCode
from sepp.wire.drivers._trio import Channel, Endpoint, RpcError

pytestmark = [pytest.mark.fixture, pytest.mark.both_engines]

GUARD_S = 10.0  # no test may take longer than this


@asynccontextmanager
async def serving(
    handler: Any, *, channel_kwargs: dict[str, Any] | None = None, **server_kwargs: Any
) -> AsyncIterator[tuple[H2Server, Channel]]:
    """A fixture server and a Channel to it, both in a nursery this test owns."""
    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            server = await H2Server(handler, **server_kwargs).start(nursery)
            channel = Channel(
                Endpoint("127.0.0.1", server.port),
                nursery,
                user_agent="t",
                **(channel_kwargs or {}),
            )
            try:
                yield server, channel
            finally:
                await channel.aclose()
                nursery.cancel_scope.cancel()
    assert not server.errors, server.errors
    assert not server.protocol_errors, server.protocol_errors


async def echo(call: ServerCall) -> None:
    await call.respond(b"echo:" + call.message)


async def note_arrival(server: H2Server, seen_at: list[float]) -> None:
    """Record when the test first sees the server's first call (after it arrived)."""
    await server.wait_until(lambda: bool(server.calls))
    seen_at.append(trio.current_time())


def timeout_seconds(value: bytes | None) -> float:
    assert value is not None
    match = re.fullmatch(rb"(\d{1,8})([HMSmun])", value)
    assert match, value
    unit = {b"H": 3600, b"M": 60, b"S": 1, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}[match[2]]
    return int(match[1]) * unit


# -- multiplexing and stream limits ---------------------------------------------------------------


async def test_64_concurrent_calls_share_one_connection() -> None:
    async def handler(call: ServerCall) -> None:
        # Answered once another call is in too: they overlap, whatever the machine's speed.
        server = call.conn.server
        await server.wait_until(lambda: server.active > 1 or len(server.calls) == 64)
        await call.respond(call.message[::-1])

    async with serving(handler) as (server, channel):
        results: dict[int, bytes] = {}

        async def one(i: int) -> None:
            results[i] = await channel.call("Ack", b"req-%d" % i, timeout=5)

        async with trio.open_nursery() as calls:
            for i in range(64):
                calls.start_soon(one, i)
        assert results == {i: (b"req-%d" % i)[::-1] for i in range(64)}
        assert channel.connections_opened == 1
        assert len(server.connections) == 1
        assert len(server.calls) == 64
        assert server.max_active > 1  # really concurrent, not one after another
        call = server.calls[0]
        assert call.header(b":path") == b"/sepp.v1.QueueService/Ack"
        assert call.header(b"te") == b"trailers"
        assert call.header(b"user-agent") == b"t"
        assert call.header(b":authority") == b"127.0.0.1:%d" % server.port


async def test_max_concurrent_streams_queues_excess_calls() -> None:
    async def handler(call: ServerCall) -> None:
        # Held until both streams the limit allows are open (or the last call is in): the
        # client fills the limit, however fast the calls are answered.
        server = call.conn.server
        await server.wait_until(lambda: server.active >= 2 or len(server.calls) == 10)
        await call.respond(b"ok")

    # The late SETTINGS makes the limit unknown while the calls queue up: the client must not
    # open more than one stream before it knows (the server's h2 treats excess as an error).
    async with serving(handler, max_concurrent_streams=2, settings_delay=0.1) as (
        server,
        channel,
    ):
        results: list[bytes] = []

        async def one() -> None:
            results.append(await channel.call("Ack", b"x", timeout=5))

        async with trio.open_nursery() as calls:
            for _ in range(10):
                calls.start_soon(one)
        assert results == [b"ok"] * 10  # none failed (a server refuses streams over its limit)
        assert len(server.calls) == 10
        assert server.max_active == 2
        assert channel.connections_opened == 1


# -- cancellation and deadlines -------------------------------------------------------------------


async def test_cancellation_sends_rst_cancel_and_the_connection_stays_healthy() -> None:
    async def handler(call: ServerCall) -> None:
        if call.index == 0:
            await call.stall()
        else:
            await echo(call)

    async with serving(handler) as (server, channel):
        with trio.move_on_after(0.2) as scope:
            await channel.call("Ack", b"slow", timeout=5)
        assert scope.cancelled_caught
        await server.wait_until(lambda: server.resets == {(0, 1): ErrorCodes.CANCEL})
        assert await channel.call("Ack", b"next", timeout=5) == b"echo:next"
        assert channel.connections_opened == 1
        assert server.calls[1].stream_id == 3


async def test_outer_deadline_shorter_than_timeout_is_sent_as_grpc_timeout() -> None:
    async def handler(call: ServerCall) -> None:
        await call.stall()

    async with serving(handler) as (server, channel):
        deadline = trio.current_time() + 0.5
        seen_at: list[float] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(note_arrival, server, seen_at)
            with trio.move_on_at(deadline) as scope:
                await channel.call("Ack", b"x", timeout=30)
        assert scope.cancelled_caught  # an outer cancel stays trio.Cancelled, no RpcError
        sent = timeout_seconds(server.calls[0].header(b"grpc-timeout"))
        # What was left of the outer deadline when the call went out, however long the
        # connect took: no earlier than now, no later than the server saw it (µs rounding up).
        assert deadline - seen_at[0] <= sent <= 0.5 + 1e-6
        await server.wait_until(lambda: server.resets == {(0, 1): ErrorCodes.CANCEL})


async def test_call_timeout_raises_deadline_exceeded_when_the_server_stalls() -> None:
    async def handler(call: ServerCall) -> None:
        if call.index == 0:
            await call.stall()
        else:
            await echo(call)

    async with serving(handler) as (server, channel):
        start = trio.current_time()
        seen_at: list[float] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(note_arrival, server, seen_at)
            with pytest.raises(RpcError) as info:
                await channel.call("Ack", b"x", timeout=0.3)
        elapsed = trio.current_time() - start
        assert (info.value.code, info.value.kind) == (
            StatusCode.DEADLINE_EXCEEDED,
            FailureKind.DEADLINE,
        )
        assert elapsed >= 0.3  # the stall ended by the timeout (DEADLINE), not a hang guard
        sent = timeout_seconds(server.calls[0].header(b"grpc-timeout"))
        assert start + 0.3 - seen_at[0] <= sent <= 0.3 + 1e-6
        await server.wait_until(lambda: (0, 1) in server.resets)
        assert server.resets[(0, 1)] == ErrorCodes.CANCEL
        assert await channel.call("Ack", b"y", timeout=5) == b"echo:y"
        assert channel.connections_opened == 1


async def test_stall_mid_response_with_a_deadline_ends_in_time() -> None:
    async def handler(call: ServerCall) -> None:
        await call.send_headers()
        await call.send_data(frame_message(b"half a message")[:9])
        await call.stall()

    async with serving(handler) as (_, channel):
        start = trio.current_time()
        with pytest.raises(RpcError) as info:
            await channel.call("Ack", b"x", timeout=0.25)
        assert info.value.code is StatusCode.DEADLINE_EXCEEDED  # not the GUARD_S hang guard
        assert trio.current_time() - start >= 0.25


async def test_without_a_timeout_the_enclosing_deadline_is_sent() -> None:
    async with serving(echo) as (server, channel):
        assert await channel.call("Ack", b"x", timeout=None) == b"echo:x"
        # serving() runs under a GUARD_S deadline: that is what bounds this call.
        assert 0 < timeout_seconds(server.calls[0].header(b"grpc-timeout")) <= GUARD_S


# -- broken connections and reconnects ------------------------------------------------------------


async def test_dropped_connection_mid_call_fails_unavailable_and_the_next_call_reconnects() -> None:
    async def handler(call: ServerCall) -> None:
        if call.conn.index == 0:
            await call.conn.close()
        else:
            await echo(call)

    async with serving(handler) as (server, channel):
        with pytest.raises(RpcError) as info:
            await channel.call("Ack", b"x", timeout=5)
        assert (info.value.code, info.value.kind) == (
            StatusCode.UNAVAILABLE,
            FailureKind.CONNECTION,
        )
        assert await channel.call("Ack", b"again", timeout=5) == b"echo:again"
        assert channel.connections_opened == 2
        assert len(server.connections) == 2


async def test_connection_closed_mid_message() -> None:
    async def handler(call: ServerCall) -> None:
        if call.conn.index == 0:
            await call.send_headers()
            await call.send_data(frame_message(b"a message cut short")[:12])
            await call.conn.close()
        else:
            await echo(call)

    async with serving(handler) as (_, channel):
        with pytest.raises(RpcError) as info:
            await channel.call("Ack", b"x", timeout=5)
        assert (info.value.code, info.value.kind) == (
            StatusCode.UNAVAILABLE,
            FailureKind.CONNECTION,
        )
        assert await channel.call("Ack", b"y", timeout=5) == b"echo:y"
        assert channel.connections_opened == 2


async def test_every_in_flight_call_fails_when_the_connection_drops() -> None:
    async def handler(call: ServerCall) -> None:
        if call.conn.index == 0:
            if call.index == 4:
                await call.conn.close()
            else:
                await call.stall()
        else:
            await echo(call)

    async with serving(handler) as (_, channel):
        outcomes: list[BaseException] = []

        async def one() -> None:
            try:
                await channel.call("Ack", b"x", timeout=5)
            except RpcError as exc:
                outcomes.append(exc)

        async with trio.open_nursery() as calls:
            for _ in range(5):
                calls.start_soon(one)
        assert len(outcomes) == 5
        assert all(isinstance(e, RpcError) and e.code is StatusCode.UNAVAILABLE for e in outcomes)
        assert await channel.call("Ack", b"z", timeout=5) == b"echo:z"


async def test_connection_refused_is_a_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the call: nothing listens
    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            channel = Channel(Endpoint("127.0.0.1", port), nursery, user_agent="t")
            with pytest.raises(RpcError) as info:
                await channel.call("Ack", b"x", timeout=5)
            assert (info.value.code, info.value.kind) == (
                StatusCode.UNAVAILABLE,
                FailureKind.CONNECT,
            )
            await channel.aclose()


async def test_server_that_never_sends_settings_is_a_connect_error() -> None:
    async with serving(echo, silent=True, channel_kwargs={"connect_timeout": 0.3}) as (
        server,
        channel,
    ):
        start = trio.current_time()
        with pytest.raises(RpcError) as info:
            await channel.call("Ack", b"x", timeout=5)
        assert (info.value.code, info.value.kind) == (StatusCode.UNAVAILABLE, FailureKind.CONNECT)
        assert "SETTINGS" in info.value.details  # its connect timeout, not the call's (DEADLINE)
        assert trio.current_time() - start >= 0.3
        assert channel.connections_opened == 0
        # The half-open connection was closed, not leaked.
        await server.wait_until(lambda: all(c.closed for c in server.connections))


async def test_call_deadline_while_waiting_for_settings_closes_the_socket() -> None:
    async with serving(echo, silent=True) as (server, channel):
        with pytest.raises(RpcError) as info:
            await channel.call("Ack", b"x", timeout=0.2)
        assert (info.value.code, info.value.kind) == (
            StatusCode.DEADLINE_EXCEEDED,
            FailureKind.DEADLINE,
        )
        await server.wait_until(lambda: len(server.connections) == 1)
        await server.wait_until(lambda: server.connections[0].closed)


# -- GOAWAY ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("same_write", [False, True])
async def test_goaway_with_calls_above_and_below_last_stream_id(same_write: bool) -> None:
    release = trio.Event()

    async def handler(call: ServerCall) -> None:
        if call.conn.index == 0:
            await release.wait()
            if call.stream_id <= 3:
                await call.respond(b"done-%d" % call.stream_id)
        else:
            await echo(call)

    async with serving(handler) as (server, channel):
        results: dict[int, bytes | RpcError] = {}
        third_done = trio.Event()

        async def one(i: int) -> None:
            try:
                results[i] = await channel.call("Ack", b"%d" % i, timeout=5)
            except RpcError as exc:
                results[i] = exc
            if i == 2:
                third_done.set()

        async with trio.open_nursery() as calls:
            for i in range(3):
                calls.start_soon(one, i)
                await server.wait_until(lambda i=i: len(server.calls) == i + 1)
            conn = server.connections[0]
            if same_write:
                # The GOAWAY and the surviving streams' responses in a single write.
                for call in server.calls:
                    if call.stream_id <= 3:
                        call.queue_response(b"done-%d" % call.stream_id)
                await conn.goaway(3, before_queued=True)
            else:
                await conn.goaway(3)
                # Stream 5 was never processed: sent again on a new connection at once,
                # while streams 1 and 3 wait on the draining one.
                await third_done.wait()
                assert 0 not in results
                assert 1 not in results
                release.set()
        assert results[0] == b"done-1"
        assert results[1] == b"done-3"
        assert results[2] == b"echo:2"
        placed = [(c.conn.index, c.stream_id) for c in server.calls]
        assert placed == [(0, 1), (0, 3), (0, 5), (1, 1)]
        # New calls go to the new connection; the drained one is closed by the client.
        assert await channel.call("Ack", b"new", timeout=5) == b"echo:new"
        assert channel.connections_opened == 2
        await server.wait_until(lambda: server.connections[0].closed)


async def test_goaway_while_idle_then_close_reconnects_quietly() -> None:
    async with serving(echo) as (server, channel):
        assert await channel.call("Ack", b"a", timeout=5) == b"echo:a"
        conn = server.connections[0]
        await conn.goaway(1)
        await conn.close()
        await server.wait_until(lambda: conn.closed)
        await wait_all_tasks_blocked()  # the client has read the GOAWAY and the close
        assert await channel.call("Ack", b"b", timeout=5) == b"echo:b"
        assert channel.connections_opened == 2


async def test_goaway_then_close_before_answering_fails_the_survivors() -> None:
    async def handler(call: ServerCall) -> None:
        if call.conn.index == 0:
            await call.conn.goaway(call.stream_id)
            await wait_all_tasks_blocked()  # the client has read the GOAWAY
            await call.conn.close()
        else:
            await echo(call)

    async with serving(handler) as (_, channel):
        with pytest.raises(RpcError) as info:
            await channel.call("Ack", b"x", timeout=5)
        assert (info.value.code, info.value.kind) == (
            StatusCode.UNAVAILABLE,
            FailureKind.CONNECTION,
        )
        assert await channel.call("Ack", b"y", timeout=5) == b"echo:y"


# -- keepalive and pings --------------------------------------------------------------------------


async def test_keepalive_timeout_kills_a_silent_connection() -> None:
    async def handler(call: ServerCall) -> None:
        if call.conn.index == 0:
            call.conn.stop_reading()  # a dead peer: PINGs go unanswered
            await call.stall()
        else:
            await echo(call)

    kwargs = {"keepalive_interval": 0.1, "keepalive_timeout": 0.2}
    async with serving(handler, channel_kwargs=kwargs) as (server, channel):
        start = trio.current_time()
        with pytest.raises(RpcError) as info:
            await channel.call("Ack", b"x", timeout=5)
        assert (info.value.code, info.value.kind) == (
            StatusCode.UNAVAILABLE,
            FailureKind.CONNECTION,
        )
        assert "keepalive" in info.value.details  # not the call's timeout (DEADLINE)
        assert trio.current_time() - start >= 0.2  # at least the keepalive timeout
        assert await channel.call("Ack", b"y", timeout=5) == b"echo:y"
        assert channel.connections_opened == 2
        server.connections[0].resume_reading()


async def test_keepalive_pings_are_sent_and_answered() -> None:
    async def handler(call: ServerCall) -> None:
        await call.conn.server.wait_until(lambda: call.conn.pings_received >= 2)
        await echo(call)

    kwargs = {"keepalive_interval": 0.05, "keepalive_timeout": 1.0}
    async with serving(handler, channel_kwargs=kwargs) as (server, channel):
        assert await channel.call("Ack", b"x", timeout=5) == b"echo:x"
        assert server.connections[0].pings_received == 2  # each answered: none timed out
        assert channel.connections_opened == 1


async def test_keepalive_never_trips_a_grpc_go_ping_policy_during_3_minute_calls(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """grpc-go allows one PING per 5 minutes while it sends nothing and ends the connection at
    the third early one: with the default keepalive (30 s) a call over ~2 minutes failed. On
    trio's MockClock the calls' minutes cost no real time."""

    async def three_minutes(call: ServerCall) -> None:
        await trio.sleep(180)
        await echo(call)

    async with trio.open_nursery() as nursery:
        server = await H2Server(three_minutes, ping_min_time=300).start(nursery)
        channel = Channel(Endpoint("127.0.0.1", server.port), nursery, user_agent="t")
        try:
            assert channel.keepalive_interval == 30.0  # the default
            assert await channel.call("Ack", b"one", timeout=600) == b"echo:one"
            conn = server.connections[0]
            assert (conn.pings_received, conn.too_many_pings) == (2, False)
            # The next call's HEADERS allow two more (and the answer forgave the first two).
            assert await channel.call("Ack", b"two", timeout=600) == b"echo:two"
            assert (conn.pings_received, conn.too_many_pings) == (4, False)
            assert conn.ping_strikes <= 1
            assert channel.connections_opened == 1
        finally:
            await channel.aclose()
            nursery.cancel_scope.cancel()
    assert not server.errors and not server.protocol_errors


async def test_ping_flood_is_answered_and_calls_still_work() -> None:
    async def handler(call: ServerCall) -> None:
        await call.conn.ping_flood(2000)
        await echo(call)

    async with serving(handler) as (server, channel):
        assert await channel.call("Ack", b"x", timeout=5) == b"echo:x"
        conn = server.connections[0]
        await server.wait_until(lambda: conn.ping_acks == 2000)
        assert await channel.call("Ack", b"y", timeout=5) == b"echo:y"


# -- responses over the wire ----------------------------------------------------------------------


async def test_server_reset_maps_to_a_status_and_keeps_the_connection() -> None:
    async def handler(call: ServerCall) -> None:
        if call.index == 0:
            await call.reset(ErrorCodes.ENHANCE_YOUR_CALM)
        else:
            await echo(call)

    async with serving(handler) as (_, channel):
        with pytest.raises(RpcError) as info:
            await channel.call("Ack", b"x", timeout=5)
        assert (info.value.code, info.value.kind) == (
            StatusCode.RESOURCE_EXHAUSTED,
            FailureKind.RESET,
        )
        assert await channel.call("Ack", b"y", timeout=5) == b"echo:y"
        assert channel.connections_opened == 1


@pytest.mark.parametrize("after_the_deadline", [True, False])
async def test_the_server_cancelling_at_our_deadline_is_deadline_exceeded(
    after_the_deadline: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server enforces the grpc-timeout it was sent (tonic answers CANCELLED "Timeout
    # expired"); when that answer beats our own deadline check, it is still our deadline.
    # Our check is switched off here, so only the server's answer can end the call.
    monkeypatch.setattr("sepp.wire.drivers._waiters.Deadlines.add", lambda self, waiter, live: None)

    async def handler(call: ServerCall) -> None:
        if after_the_deadline:
            await trio.sleep(timeout_seconds(call.header(b"grpc-timeout")) + 0.05)
        await call.trailers_only(StatusCode.CANCELLED, b"Timeout expired")

    async with serving(handler) as (_, channel):
        with pytest.raises(RpcError) as info:
            await channel.call("Ack", b"x", timeout=0.2)
    expected = StatusCode.DEADLINE_EXCEEDED if after_the_deadline else StatusCode.CANCELLED
    assert info.value.code is expected


async def test_trailers_only_error_is_raised_with_code_and_details() -> None:
    async def handler(call: ServerCall) -> None:
        await call.trailers_only(StatusCode.NOT_FOUND, b"no such job %E2%9C%97")

    async with serving(handler) as (_, channel):
        with pytest.raises(RpcError) as info:
            await channel.call("Ack", b"x", timeout=5)
        assert (info.value.code, info.value.details, info.value.kind) == (
            StatusCode.NOT_FOUND,
            "no such job ✗",
            None,
        )


async def test_large_response_over_real_sockets() -> None:
    big = bytes(range(256)) * (8 * 1024 * 1024 // 256)

    async def handler(call: ServerCall) -> None:
        await call.respond(big)

    async with serving(handler) as (_, channel):
        assert await channel.call("Reserve", b"x", timeout=5) == big


async def test_too_large_response_is_refused_and_the_stream_cancelled() -> None:
    async def handler(call: ServerCall) -> None:
        if call.index == 0:
            await call.send_headers()
            await call.send_data(frame_message(b"x" * 4096)[:5])  # the prefix alone
            await call.stall()
        else:
            await echo(call)

    kwargs = {"max_receive_message_bytes": 1024}
    async with serving(handler, channel_kwargs=kwargs) as (server, channel):
        with pytest.raises(RpcError) as info:
            await channel.call("Reserve", b"x", timeout=5)
        assert (info.value.code, info.value.kind) == (
            StatusCode.RESOURCE_EXHAUSTED,
            FailureKind.TOO_LARGE,
        )
        await server.wait_until(lambda: server.resets.get((0, 1)) == ErrorCodes.CANCEL)
        assert await channel.call("Ack", b"y", timeout=5) == b"echo:y"


async def test_large_request_is_sent_through_a_small_window() -> None:
    # Also needs the server's SETTINGS before the first call: the fixture's h2 enforces its
    # 16 KiB window at once, so default-window data sent before it would be an error.
    body = bytes(range(256)) * 4096  # 1 MiB against a 16 KiB stream window

    async def handler(call: ServerCall) -> None:
        await call.respond(b"%d" % len(call.message))

    async with serving(handler, initial_window_size=16 * 1024) as (server, channel):
        assert await channel.call("EnqueueBatch", body, timeout=5) == b"%d" % len(body)
        assert server.calls[0].message == body


async def test_aclose_fails_in_flight_calls_and_refuses_new_ones() -> None:
    async def handler(call: ServerCall) -> None:
        await call.stall()

    async with serving(handler) as (server, channel):
        failures: list[RpcError] = []

        async def one() -> None:
            try:
                await channel.call("Ack", b"x", timeout=5)
            except RpcError as exc:
                failures.append(exc)

        async with trio.open_nursery() as calls:
            calls.start_soon(one)
            await server.wait_until(lambda: len(server.calls) == 1)
            await channel.aclose()
        assert [f.code for f in failures] == [StatusCode.UNAVAILABLE]
        with pytest.raises(RpcError) as info:
            await channel.call("Ack", b"x", timeout=5)
        assert info.value.kind is FailureKind.CLOSED


async def failing_call(channel: Channel, failures: list[RpcError]) -> None:
    try:
        await channel.call("Ack", b"x", timeout=5)
    except RpcError as exc:
        failures.append(exc)


async def test_failed_connect_is_shared_by_the_calls_queued_behind_it() -> None:
    kwargs = {"connect_timeout": 0.3}
    async with serving(echo, silent=True, channel_kwargs=kwargs) as (server, channel):
        failures: list[RpcError] = []
        start = trio.current_time()
        async with trio.open_nursery() as calls:
            for _ in range(5):
                calls.start_soon(failing_call, channel, failures)
        assert [(f.code, f.kind) for f in failures] == [
            (StatusCode.UNAVAILABLE, FailureKind.CONNECT)
        ] * 5
        assert len(server.connections) == 1  # one connect attempt for all, not one per call
        assert trio.current_time() - start >= 0.3  # its connect timeout, shared
        # The next call tries again.
        with pytest.raises(RpcError):
            await channel.call("Ack", b"x", timeout=5)
        assert len(server.connections) == 2


async def test_a_call_that_comes_while_a_connect_is_under_way_shares_its_failure() -> None:
    # Not only the calls queued before the attempt began: one connect gate for both drivers.
    kwargs = {"connect_timeout": 0.3}
    async with serving(echo, silent=True, channel_kwargs=kwargs) as (server, channel):
        failures: list[RpcError] = []
        async with trio.open_nursery() as calls:
            calls.start_soon(failing_call, channel, failures)
            await server.wait_until(lambda: len(server.connections) == 1)  # connecting
            calls.start_soon(failing_call, channel, failures)
        assert [(f.code, f.kind) for f in failures] == [
            (StatusCode.UNAVAILABLE, FailureKind.CONNECT)
        ] * 2
        assert len(server.connections) == 1  # the second call paid no connect timeout of its own


# -- TLS ------------------------------------------------------------------------------------------


def tls_contexts(server_alpn: list[str]) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    from fixtures.certificates import CA

    ca = CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("sepp.test").configure_cert(server_ctx)
    server_ctx.set_alpn_protocols(server_alpn)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    client_ctx.set_alpn_protocols(["h2"])
    return server_ctx, client_ctx


@asynccontextmanager
async def serving_tls(
    handler: Any, server_alpn: list[str], **server_kwargs: Any
) -> AsyncIterator[tuple[H2Server, Channel]]:
    server_ctx, client_ctx = tls_contexts(server_alpn)
    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            server = await H2Server(handler, ssl_context=server_ctx, **server_kwargs).start(nursery)
            endpoint = Endpoint("127.0.0.1", server.port, client_ctx, server_hostname="sepp.test")
            channel = Channel(endpoint, nursery, user_agent="t", connect_timeout=2)
            try:
                yield server, channel
            finally:
                await channel.aclose()
                nursery.cancel_scope.cancel()
    assert not server.errors, server.errors


async def test_tls_round_trip_with_alpn_h2() -> None:
    async with serving_tls(echo, ["h2"]) as (server, channel):
        assert await channel.call("Ack", b"x", timeout=5) == b"echo:x"
        assert server.calls[0].header(b":scheme") == b"https"
        # The server-name override (tls_domain) is the :authority too, as in grpc.
        assert server.calls[0].header(b":authority") == b"sepp.test"


async def test_tls_without_alpn_h2_is_a_connect_error() -> None:
    async with serving_tls(echo, ["http/1.1"]) as (server, channel):
        with pytest.raises(RpcError) as info:
            await channel.call("Ack", b"x", timeout=5)
        assert (info.value.code, info.value.kind) == (StatusCode.UNAVAILABLE, FailureKind.CONNECT)
        assert "ALPN" in info.value.details
        assert not server.calls


async def test_tls_handshake_stall_with_a_deadline_closes_the_socket() -> None:
    _, client_ctx = tls_contexts(["h2"])
    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            server = await H2Server(echo, silent=True).start(nursery)  # TCP only, never TLS
            endpoint = Endpoint("127.0.0.1", server.port, client_ctx, server_hostname="sepp.test")
            channel = Channel(endpoint, nursery, user_agent="t", connect_timeout=5)
            with pytest.raises(RpcError) as info:
                await channel.call("Ack", b"x", timeout=0.2)
            assert info.value.code is StatusCode.DEADLINE_EXCEEDED
            # Cancelled mid-handshake, the socket is closed rather than leaked.
            await server.wait_until(lambda: len(server.connections) == 1)
            await server.wait_until(lambda: server.connections[0].closed)
            await channel.aclose()
            nursery.cancel_scope.cancel()


async def test_aclose_while_connecting_does_not_leave_a_live_connection() -> None:
    async with serving(echo, settings_delay=0.3) as (server, channel):
        failures: list[RpcError] = []

        async def one() -> None:
            try:
                await channel.call("Ack", b"x", timeout=5)
            except RpcError as exc:
                failures.append(exc)

        async with trio.open_nursery() as calls:
            calls.start_soon(one)
            await server.wait_until(lambda: len(server.connections) == 1)
            await channel.aclose()  # while the client waits for the server's SETTINGS
        assert [(f.code, f.kind) for f in failures] == [
            (StatusCode.UNAVAILABLE, FailureKind.CLOSED)
        ]
        assert not server.calls
        await server.wait_until(lambda: server.connections[0].closed)


# -- direct writes and the writer task ------------------------------------------------------------


class _QueuedBytes:
    """A stand-in for the sans-IO engine: just bytes queued for the socket."""

    def __init__(self) -> None:
        self.queued: list[bytes] = []
        self.usable = True

    def data_to_send(self) -> bytes:
        return b"".join(self.buffers_to_send())

    def buffers_to_send(self) -> list[bytes]:
        queued, self.queued = self.queued, []
        return queued

    def connection_lost(self, reason: str) -> list[object]:
        return []

    def close(self) -> None:
        pass


async def test_writes_the_socket_cannot_take_at_once_go_through_the_writer_in_order() -> None:
    from sepp.wire.drivers._trio import _Connection

    ours, theirs = socket.socketpair()
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
    proto = _QueuedBytes()
    channel = Channel(Endpoint("127.0.0.1", 1), None, user_agent="t", keepalive_interval=None)  # type: ignore[arg-type]
    conn = _Connection(stream, proto, channel)  # type: ignore[arg-type]
    assert conn._raw is not None  # plain TCP: the direct path is on
    chunks = [bytes([i]) * 1_000_000 for i in range(1, 13)]  # 12 MB: far over a socket buffer
    received = bytearray()
    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn._writer)
            for chunk in chunks:
                proto.queued.append(chunk)
                conn.flush()
            assert conn._writing  # the socket filled up: the writer task owns the rest
            peer = trio.SocketStream(trio.socket.from_stdlib_socket(theirs))
            while len(received) < sum(map(len, chunks)):
                received += await peer.receive_some(1 << 20)
            await trio.testing.wait_all_tasks_blocked()
            assert not conn._writing  # drained: the next flush writes directly again
            proto.queued.append(b"tail")
            conn.flush()
            assert await peer.receive_some(1 << 20) == b"tail"
            nursery.cancel_scope.cancel()
    assert bytes(received) == b"".join(chunks)
    conn._raw.close()
    await stream.aclose()


# -- limits against a server that floods or stalls (docs/wire-engines.md, "Resource limits") -----


def _raw_frame(frame_type: int, flags: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((frame_type, flags)) + bytes(4) + payload


async def _attach(nursery: trio.Nursery, stream: trio.abc.Stream) -> tuple[Channel, Any]:
    """A Channel whose current connection runs over `stream` (the server's preface is the
    test's to send); no keepalive, so nothing else ends the connection."""
    from sepp.wire import _engine
    from sepp.wire.drivers._trio import _Connection

    channel = Channel(Endpoint("test", 1), nursery, user_agent="t", keepalive_interval=None)
    proto = _engine.connection_class(_engine.DEFAULT_WIRE_ENGINE)(authority="test:1")
    proto.initiate()
    proto.data_to_send()  # the server side here does not check our preface
    conn = _Connection(stream, proto, channel)
    await nursery.start(conn.run)
    channel._current = conn
    channel._all.add(conn)
    return channel, conn


async def test_a_server_that_floods_pings_and_never_reads_is_cut_off(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Our PING ACKs cannot leave (the server never reads), so they would pile up without end;
    the engine's cap ends the connection, and the call on it fails like any lost connection."""
    ours, theirs = trio.testing.lockstep_stream_pair()  # a write blocks until the peer reads
    failures: list[RpcError] = []
    batch = _raw_frame(0x6, 0, b"floodme!") * 10_000
    sent = 0
    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            channel, conn = await _attach(nursery, ours)
            await theirs.send_all(_raw_frame(0x4, 0))

            async def caller() -> None:
                with pytest.raises(RpcError) as info:
                    await channel.call("Ack", b"x", timeout=None)
                failures.append(info.value)

            nursery.start_soon(caller)
            with contextlib.suppress(trio.BrokenResourceError):
                while not conn.dead and sent < 20:
                    await theirs.send_all(batch)
                    sent += 1
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert conn.dead and "did not read" in conn.reason
    # What the driver took before it blocked (one read), then the cap: a few batches, not all.
    assert sent * len(batch) <= 3 * MAX_QUEUED_CONTROL_REPLY_BYTES + len(batch)
    assert [(f.code, f.kind) for f in failures] == [(StatusCode.UNAVAILABLE, FailureKind.PROTOCOL)]


async def test_settings_wake_parked_callers_only_for_streams_they_can_have() -> None:
    """Callers parked for a stream wake when the server's stream limit lets some of them start,
    and only as many as it lets: not all of them on every SETTINGS frame."""

    class CountSteps(trio.abc.Instrument):
        steps = 0

        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            if task.name.endswith(".parked_caller"):
                self.steps += 1

    ours, theirs = trio.testing.memory_stream_pair()
    counter = CountSteps()
    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            channel, conn = await _attach(nursery, ours)
            await theirs.send_all(
                _raw_frame(0x4, 0, (3).to_bytes(2, "big") + (1).to_bytes(4, "big"))
            )
            await trio.testing.wait_all_tasks_blocked()

            async def parked_caller() -> None:
                await channel.call("Ack", b"x", timeout=None)

            for _ in range(30):
                nursery.start_soon(parked_caller)
            await trio.testing.wait_all_tasks_blocked()
            assert conn.proto.active_calls == 1  # the other 29 wait for a stream
            trio.lowlevel.add_instrument(counter)
            try:
                for _ in range(10):
                    await theirs.send_all(_raw_frame(0x4, 0))  # SETTINGS that change nothing
                    await trio.testing.wait_all_tasks_blocked()
                assert counter.steps == 0
                limit_3 = (3).to_bytes(2, "big") + (3).to_bytes(4, "big")
                await theirs.send_all(_raw_frame(0x4, 0, limit_3))
                await trio.testing.wait_all_tasks_blocked()
            finally:
                trio.lowlevel.remove_instrument(counter)
            assert conn.proto.active_calls == 3
            assert counter.steps == 2  # two callers woke, and both started their call
            nursery.cancel_scope.cancel()


async def test_a_write_failing_in_the_callers_own_task_sends_the_call_again() -> None:
    """The socket refuses the request as the caller writes it (the server closed an idle
    connection and the reader has not seen it yet): the connection dies inside the caller's
    own task, before it parks. The call finishes as never sent, and goes out again on a new
    connection, with trio's scheduler intact (this once rescheduled a running task)."""

    class Refusing:
        def __init__(self, real: socket.socket) -> None:
            self.real = real

        def send(self, data: bytes) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def close(self) -> None:
            self.real.close()

    async with serving(echo) as (server, channel):
        assert await channel.call("Ack", b"a", timeout=5) == b"echo:a"
        conn = channel._current
        assert conn is not None and conn._raw is not None
        conn._raw = Refusing(conn._raw)  # type: ignore[assignment]
        assert await channel.call("Ack", b"b", timeout=5) == b"echo:b"
        assert channel.connections_opened == 2
        assert [c.message for c in server.calls] == [b"a", b"b"]
