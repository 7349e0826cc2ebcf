"""Calls the server never processed go out again by themselves, and a connection that stops
taking calls (GOAWAY, stream ids spent, a lowered stream limit) hands over to one new one.

Against the scriptable h2 fixture server, on both wire engines.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
from fixtures.h2_server import H2Server, ServerCall
from h2.errors import ErrorCodes
from h2.settings import SettingCodes
from test_wire_transport import GUARD_S, echo, serving
from trio.testing import wait_all_tasks_blocked

import sepp
from sepp._client.otel import count_transparent_retry
from sepp.wire._failure import FailureKind
from sepp.wire._status import StatusCode
from sepp.wire.drivers._trio import MAX_TRANSPARENT_ATTEMPTS, Channel, RpcError

pytestmark = [pytest.mark.fixture, pytest.mark.both_engines]

LAST_STREAM_ID = 2**31 - 1


def on_first_connection(server: H2Server, held: list[ServerCall]) -> Any:
    """A handler holding every call on connection 0 in `held` (answered by the test), and
    echoing on any later connection."""

    async def handler(call: ServerCall) -> None:
        if call.conn.index == 0:
            held.append(call)
            server.changed()
            await call.stall()
        else:
            await echo(call)

    return handler


async def until(predicate: Any) -> None:
    """Wait (under the test's guard) for what the client side sees, e.g. its results: the
    client has no event to wait on for them, so poll."""
    while not predicate():  # noqa: ASYNC110
        await trio.sleep(0.005)


async def call_all(channel: Channel, count: int, results: dict[int, bytes | RpcError]) -> None:
    async def one(i: int) -> None:
        try:
            results[i] = await channel.call("Ack", b"%d" % i, timeout=5)
        except RpcError as exc:
            results[i] = exc

    async with trio.open_nursery() as nursery:
        for i in range(count):
            nursery.start_soon(one, i)


# -- GOAWAY ---------------------------------------------------------------------------------------


async def test_calls_above_goaway_last_stream_id_go_out_again_on_one_new_connection() -> None:
    held: list[ServerCall] = []
    results: dict[int, bytes | RpcError] = {}
    answers: dict[int, bytes] = {}

    async def handler(call: ServerCall) -> None:
        if call.conn.index == 0:
            held.append(call)
            call.conn.server.changed()
            await call.conn.server.wait_until(lambda: call.stream_id in answers)
            await call.respond(answers[call.stream_id])
        else:
            await echo(call)

    async with serving(handler) as (server, channel):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call_all, channel, 40, results)
            await server.wait_until(lambda: len(held) == 40)
            # nginx after keepalive_requests: the streams it accepted finish, the rest were
            # never processed and must not fail.
            await server.connections[0].goaway(39)
            # The 20 calls above it are done, on connection 1, while the rest still wait.
            await until(lambda: len(results) == 20)
            assert len(server.calls) == 60
            for call in held:
                answers[call.stream_id] = b"first:" + call.message
            server.changed()
        survivors = {int(c.message) for c in held if c.stream_id <= 39}
        assert len(survivors) == 20
        assert results == {
            i: (b"first:%d" % i if i in survivors else b"echo:%d" % i) for i in range(40)
        }
        # One new connection for all of them, not one per caller.
        assert len(server.connections) == 2
        assert channel.connections_opened == 2
        assert await channel.call("Ack", b"new", timeout=5) == b"echo:new"
        assert len(server.connections) == 2


async def test_callers_parked_for_a_stream_move_to_the_new_connection_at_once() -> None:
    held: list[ServerCall] = []
    results: dict[int, bytes | RpcError] = {}
    async with serving(None, max_concurrent_streams=2) as (server, channel):
        server.handler = on_first_connection(server, held)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call_all, channel, 6, results)
            await server.wait_until(lambda: len(held) == 2)
            await server.connections[0].goaway(3)  # both streams in flight may finish
            # The four parked callers go to connection 1 without waiting for the old calls.
            await until(lambda: len(results) == 4)
            assert all(r == b"echo:%d" % i for i, r in results.items())
            for call in held:
                await call.respond(b"old")
        assert sum(r == b"old" for r in results.values()) == 2
        assert sum(isinstance(r, bytes) and r.startswith(b"echo:") for r in results.values()) == 4
        assert len(server.connections) == 2


async def test_double_goaway_drains_then_resends_what_the_second_one_excludes() -> None:
    held: list[ServerCall] = []
    results: dict[int, bytes | RpcError] = {}
    async with serving(None) as (server, channel):
        server.handler = on_first_connection(server, held)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call_all, channel, 3, results)
            await server.wait_until(lambda: len(held) == 3)
            old = server.connections[0]
            draining = channel._current
            await old.goaway(LAST_STREAM_ID)  # "going away soon": nothing failed yet
            await until(lambda: channel._current is not draining)  # the client read it
            assert await channel.call("Ack", b"new", timeout=5) == b"echo:new"
            assert results == {}
            await old.goaway(1)  # the real last stream id: streams 3 and 5 go out again
            await until(lambda: len(results) == 2)
            survivor = next(c for c in held if c.stream_id == 1)
            await survivor.respond(b"long poll answered")  # at or below it: ends normally
        first = int(survivor.message)
        assert results[first] == b"long poll answered"
        assert all(results[i] == b"echo:%d" % i for i in range(3) if i != first)
        assert len(server.connections) == 2
        await server.wait_until(lambda: old.closed)  # drained, then closed by the client


# -- REFUSED_STREAM and lowered stream limits -----------------------------------------------------


async def test_refused_stream_before_any_response_headers_is_sent_again() -> None:
    async def handler(call: ServerCall) -> None:
        if call.index == 0:
            await call.reset(ErrorCodes.REFUSED_STREAM)
        else:
            await echo(call)

    async with serving(handler) as (server, channel):
        assert await channel.call("Ack", b"x", timeout=5) == b"echo:x"
        assert [c.stream_id for c in server.calls] == [1, 3]
        assert channel.connections_opened == 1


async def test_refused_stream_after_response_headers_is_not_sent_again() -> None:
    async def handler(call: ServerCall) -> None:
        await call.send_headers()  # the server started answering: it may have processed it
        await call.reset(ErrorCodes.REFUSED_STREAM)

    async with serving(handler) as (server, channel):
        with pytest.raises(RpcError) as info:
            await channel.call("Ack", b"x", timeout=5)
        assert (info.value.code, info.value.kind) == (StatusCode.UNAVAILABLE, FailureKind.RESET)
        assert len(server.calls) == 1


@pytest.mark.parametrize("how", ["refuse", "goaway"])
async def test_a_peer_that_never_processes_anything_ends_after_the_attempt_bound(how: str) -> None:
    async def handler(call: ServerCall) -> None:
        if how == "refuse":
            await call.reset(ErrorCodes.REFUSED_STREAM)
        else:
            await call.conn.goaway(0)  # every attempt is stream 1 of a new connection

    async with serving(handler) as (server, channel):
        with pytest.raises(RpcError) as info:
            await channel.call("EnqueueBatch", b"x", timeout=5)
        assert info.value.code is StatusCode.UNAVAILABLE
        assert info.value.kind in (FailureKind.REFUSED, FailureKind.GOAWAY)
        assert f"gave up after {MAX_TRANSPARENT_ATTEMPTS} attempts" in info.value.details
        assert len(server.calls) == MAX_TRANSPARENT_ATTEMPTS
        expected_connections = 1 if how == "refuse" else MAX_TRANSPARENT_ATTEMPTS
        assert len(server.connections) == expected_connections


async def test_a_deadline_passing_before_the_retry_is_sent_fails_it_as_unprocessed() -> None:
    async def handler(call: ServerCall) -> None:
        call.conn.server.silent = True  # the next connection never becomes usable
        await call.conn.goaway(0)

    async with serving(handler) as (server, channel):
        with pytest.raises(RpcError) as info:
            await channel.call("EnqueueBatch", b"x", timeout=0.5)
        # Not DEADLINE_EXCEEDED, which would read as "may have been committed".
        assert (info.value.code, info.value.kind) == (StatusCode.UNAVAILABLE, FailureKind.GOAWAY)
        assert len(server.calls) == 1
        assert len(server.connections) == 2


async def test_calls_refused_when_the_server_lowers_its_stream_limit_go_out_again() -> None:
    held: list[ServerCall] = []
    results: dict[int, bytes | RpcError] = {}
    lowered = False
    active_when_lowered: list[int] = []

    async def handler(call: ServerCall) -> None:
        if lowered:
            active_when_lowered.append(call.conn.server.active)
            await echo(call)
            return
        held.append(call)
        call.conn.server.changed()
        await call.stall()

    async with serving(handler, max_concurrent_streams=10) as (server, channel):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call_all, channel, 6, results)
            await server.wait_until(lambda: len(held) == 6)
            conn = server.connections[0]
            # The server lowers its limit to 2 and refuses what it will not serve (as nginx
            # does with streams over http2_max_concurrent_streams).
            conn.h2.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: 2})
            await conn.flush()
            lowered = True
            for call in held[2:]:
                await call.reset(ErrorCodes.REFUSED_STREAM)
            await wait_all_tasks_blocked()  # the client has taken in the resets
            assert results == {}  # the refused calls wait for one of the two streams
            for call in held[:2]:
                await call.respond(b"kept")
        assert sum(r == b"kept" for r in results.values()) == 2
        assert sum(isinstance(r, bytes) and r.startswith(b"echo:") for r in results.values()) == 4
        assert active_when_lowered and max(active_when_lowered) <= 2
        assert len(server.connections) == 1


# -- stream ids running out -----------------------------------------------------------------------


async def test_stream_ids_running_out_hands_over_to_one_new_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held: list[ServerCall] = []
    results: dict[int, bytes | RpcError] = {}
    async with serving(None, max_concurrent_streams=2) as (server, channel):
        server.handler = on_first_connection(server, held)
        engine = channel._connection_class

        def near_the_end(**kwargs: Any) -> Any:
            proto = engine(**kwargs)
            if channel.connections_opened == 0:
                proto._set_next_stream_id(LAST_STREAM_ID - 4)  # type: ignore[attr-defined]
            return proto

        monkeypatch.setattr(channel, "_connection_class", near_the_end)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call_all, channel, 6, results)
            await server.wait_until(lambda: len(held) == 2)
            await held[0].respond(b"old")
            # The next call takes the last stream id; the three still parked move at once.
            await until(lambda: len(held) == 3 and len(results) == 4)
            for call in held[1:]:
                await call.respond(b"old")
        assert sorted(c.stream_id for c in held) == [
            LAST_STREAM_ID - 4,
            LAST_STREAM_ID - 2,
            LAST_STREAM_ID,
        ]
        assert sum(r == b"old" for r in results.values()) == 3
        assert len(server.connections) == 2
        await server.wait_until(lambda: server.connections[0].closed)


# -- requests that never left ---------------------------------------------------------------------


class _DeadSocket:
    """The socket of a connection the server already closed: every send fails."""

    def send(self, data: bytes) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def close(self) -> None:
        pass


async def test_a_request_never_written_before_its_connection_died_is_sent_again() -> None:
    async with serving(echo) as (server, channel):
        assert await channel.call("Ack", b"a", timeout=5) == b"echo:a"
        conn = channel._current
        assert conn is not None
        conn._raw = _DeadSocket()  # type: ignore[assignment]
        assert await channel.call("EnqueueBatch", b"b", timeout=5) == b"echo:b"
        assert [(c.conn.index, c.message) for c in server.calls] == [(0, b"a"), (1, b"b")]


async def test_a_request_written_before_its_connection_died_is_not_sent_again() -> None:
    async def handler(call: ServerCall) -> None:
        await call.conn.close()

    async with serving(handler) as (server, channel):
        with pytest.raises(RpcError) as info:
            await channel.call("EnqueueBatch", b"x", timeout=5)
        assert info.value.kind is FailureKind.CONNECTION
        assert len(server.calls) == 1


# -- keepalive ------------------------------------------------------------------------------------


async def test_too_many_pings_doubles_the_keepalive_interval_of_later_connections(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def handler(call: ServerCall) -> None:
        if call.conn.index < 2:
            # grpc servers' answer to pings above their policy: GOAWAY, then close.
            await call.conn.goaway(0, ErrorCodes.ENHANCE_YOUR_CALM, debug_data=b"too_many_pings")
        else:
            await echo(call)

    kwargs = {"keepalive_interval": 7.0}
    caplog.set_level(logging.DEBUG, logger="sepp.wire")
    async with serving(handler, channel_kwargs=kwargs) as (server, channel):
        assert await channel.call("Ack", b"x", timeout=5) == b"echo:x"
        assert channel.keepalive_interval == 28.0  # doubled once per such GOAWAY
        assert len(server.connections) == 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # logged once
    assert "too many pings" in warnings[0].getMessage()
    assert "14s" in warnings[0].getMessage()
    retries = [r for r in caplog.records if "sending it again" in r.getMessage()]
    assert len(retries) == 2 and all(r.levelno == logging.DEBUG for r in retries)


async def test_enhance_your_calm_without_too_many_pings_keeps_the_interval() -> None:
    async def handler(call: ServerCall) -> None:
        if call.conn.index == 0:
            await call.conn.goaway(0, ErrorCodes.ENHANCE_YOUR_CALM)
        else:
            await echo(call)

    async with serving(handler, channel_kwargs={"keepalive_interval": 7.0}) as (_, channel):
        assert await channel.call("Ack", b"x", timeout=5) == b"echo:x"
        assert channel.keepalive_interval == 7.0


# -- through the Client ---------------------------------------------------------------------------


async def test_a_reserve_above_the_goaway_goes_out_again_with_its_remaining_wait() -> None:
    from sepp._pb import queue_pb2 as pb

    async def handler(call: ServerCall) -> None:
        if call.conn.index == 0:
            await call.conn.goaway(0)  # nginx reloading: the long poll was never processed
        else:
            await call.respond(pb.ReserveResponse().SerializeToString())

    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            server = await H2Server(handler).start(nursery)
            address = f"127.0.0.1:{server.port}"
            async with sepp.open(address, validate_locally=False) as client:
                began = trio.current_time()
                assert await client.reserve("q", wait_timeout=5) is None
                took = trio.current_time() - began
            nursery.cancel_scope.cancel()
    waits = [
        pb.ReserveRequest.FromString(c.message).wait_timeout.ToTimedelta().total_seconds()
        for c in server.calls
    ]
    assert [c.conn.index for c in server.calls] == [0, 1]
    assert waits[0] == 5.0
    # What is left of the caller's wait, not the whole of it: no less than what was left when
    # the call returned (the Duration counts whole nanoseconds).
    assert 5.0 - took - 1e-6 <= waits[1] < 5.0
    assert not server.errors


async def test_transparent_retries_are_counted_in_the_otel_metrics() -> None:
    from otel_support import install

    _, reader = install()

    def retries() -> dict[tuple[str, str], int]:
        data = reader.get_metrics_data()
        counts: dict[tuple[str, str], int] = {}
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == "sepp.client.transparent_retries":
                        for point in metric.data.data_points:
                            key = (point.attributes["rpc.method"], point.attributes["sepp.reason"])
                            counts[key] = point.value
        return counts

    before = retries()

    async def handler(call: ServerCall) -> None:
        if call.index < 2:
            await call.reset(ErrorCodes.REFUSED_STREAM)
        else:
            await echo(call)

    kwargs = {"on_transparent_retry": count_transparent_retry}
    async with serving(handler, channel_kwargs=kwargs) as (_, channel):
        assert await channel.call("Ack", b"x", timeout=5) == b"echo:x"
    after = retries()
    key = ("Ack", "refused")
    assert after[key] - before.get(key, 0) == 2
