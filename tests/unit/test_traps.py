"""Misuses that used to fail with an error about our internals now say what to do."""

from __future__ import annotations

import asyncio
import inspect
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import trio

import sepp
from sepp._client.client import Client
from sepp._client.handler_threads import HANDLER_THREAD
from sepp._client.retry import NO_RETRY
from sepp._runtime.asyncio_runtime import ASYNCIO
from sepp._runtime.protocol import Runtime
from sepp._runtime.trio_runtime import TRIO
from sepp._util.log import Log
from sepp.testing import job_context
from sepp.wire._status import StatusCode
from sepp.wire.drivers._trio import RpcError
from tests.fixtures.scripted_channel import ScriptedChannel, connected


class Unreachable:
    """A channel no call may reach: the check under test must come first."""

    async def call(self, *args: Any, **kwargs: Any) -> bytes:
        raise AssertionError("the call reached the channel")


def unreachable_client(runtime: Runtime = TRIO) -> Client:
    return Client(
        Unreachable(),  # type: ignore[arg-type]
        address="x",
        rpc_timeout=1,
        retry_policy=NO_RETRY,
        log=Log(None),
        runtime=runtime,
        validate_locally=False,
    )


@pytest.mark.parametrize("name", [" emails", "emails ", "emails\n", "\temails", "\u00a0emails"])
async def test_queue_names_with_outer_whitespace_are_refused_everywhere(name: str) -> None:
    client = unreachable_client()
    with pytest.raises(sepp.ValidationError, match="whitespace") as info:
        sepp.EnqueueRequest(name, "t")
    assert info.value.field == "queue"
    with pytest.raises(sepp.ValidationError, match="whitespace"):
        await client.enqueue(name, "t")
    with pytest.raises(sepp.ValidationError, match="whitespace") as info:
        await client.reserve(["ok", name])
    assert info.value.field == "queues[1]"
    with pytest.raises(sepp.ValidationError, match="whitespace"):
        await client.drain_dead_letters(name)
    with pytest.raises(sepp.ValidationError, match="whitespace"):
        sepp.Worker(client, [name])
    with pytest.raises(sepp.ValidationError, match="whitespace"):
        job_context("t", queue=name)
    sepp.EnqueueRequest("inner space ok", "t")  # only the ends are refused


def test_open_used_as_a_client_says_to_use_async_with() -> None:
    opening: Any = sepp.open("127.0.0.1:1")
    with pytest.raises(AttributeError, match=r"async with sepp\.open\(\.\.\.\) as client"):
        opening.enqueue  # noqa: B018
    with pytest.raises(TypeError, match=r"async with sepp\.open"):
        opening.__await__()
    with pytest.raises(TypeError, match=r"async with sepp\.open"), opening:
        pass


def test_open_under_asyncio_connects_on_asyncio() -> None:
    async def main() -> None:
        async with sepp.open("127.0.0.1:1"):
            pass

    # Refused by the OS, worded as on trio: the asyncio driver tried to connect.
    with pytest.raises(sepp.ConnectError, match=r"\[Errno 111\] Connection refused$"):
        asyncio.run(main())


def test_open_outside_any_run_says_where_it_must_be_called() -> None:
    opening = sepp.open("127.0.0.1:1")
    coro = opening.__aenter__()
    with pytest.raises(RuntimeError, match=r"from trio \(inside trio.run\(\)\) or asyncio"):
        coro.send(None)


def test_a_client_used_from_another_event_loop_says_so() -> None:
    clients: list[Client] = []

    async def first() -> None:
        clients.append(unreachable_client(ASYNCIO))

    async def second() -> None:
        with pytest.raises(sepp.ClientError, match=r"or asyncio event loop") as info:
            await clients[0].enqueue("q", "t")
        assert isinstance(info.value, RuntimeError)  # as it was before it was a ClientError
        with pytest.raises(sepp.ClientError, match=r"opened in another"):
            await clients[0].ack(job_context("t"))

    asyncio.run(first())
    asyncio.run(second())


def test_a_client_used_from_another_trio_run_says_so() -> None:
    clients: list[Client] = []

    async def first() -> None:
        clients.append(unreachable_client())

    async def second() -> None:
        with pytest.raises(RuntimeError, match=r"opened in another trio\.run\(\)"):
            await clients[0].enqueue("q", "t")
        with pytest.raises(RuntimeError, match=r"opened in another trio\.run\(\)"):
            await clients[0].ack(job_context("t"))

    trio.run(first)
    trio.run(second)


async def test_the_async_client_refuses_a_def_handlers_thread_at_once() -> None:
    # Built in this run: its calls belong here. In a `def` handler's thread (the Worker marks
    # it) a call would make a coroutine nothing there awaits; it raises instead, at the call.
    client = unreachable_client()
    send = sepp.Task("q", "t", dict)

    def in_a_handler_thread() -> list[str]:
        HANDLER_THREAD.active = True
        try:
            refused = []
            for call in (
                lambda: client.enqueue("q", "t"),
                lambda: client.enqueue_batch([]),
                lambda: client.nack(job_context("t")),
                lambda: send.enqueue(client, {}),  # a Task's helper calls the client's enqueue
            ):
                with pytest.raises(sepp.ClientError, match="`def` handler's thread") as info:
                    call()
                assert isinstance(info.value, RuntimeError)
                refused.append(str(info.value).split(" was called")[0])
            return refused
        finally:
            HANDLER_THREAD.active = False

    assert await trio.to_thread.run_sync(in_a_handler_thread) == [
        "sepp.Client.enqueue",
        "sepp.Client.enqueue_batch",
        "sepp.Client.nack",
        "sepp.Client.enqueue",
    ]
    # Any other thread may still make the coroutine, to hand it to the client's loop itself
    # (asyncio.run_coroutine_threadsafe); and the methods stay coroutine functions.
    (coro,) = await trio.to_thread.run_sync(lambda: [client.enqueue("q", "t")])
    assert inspect.iscoroutine(coro)
    coro.close()
    assert inspect.iscoroutinefunction(client.enqueue)
    assert inspect.iscoroutinefunction(sepp.Client.enqueue)


def test_a_def_handler_may_run_a_client_of_its_own_run() -> None:
    # A handler's thread running trio.run of its own, with a client opened in that run.
    async def own_run() -> None:
        client = unreachable_client()
        with pytest.raises(AssertionError, match="reached the channel"):
            await client.enqueue("q", "t")  # not refused: this thread runs its run

    HANDLER_THREAD.active = True
    try:
        trio.run(own_run)
    finally:
        HANDLER_THREAD.active = False


async def test_services_refuse_the_other_kind_of_client_before_anything_is_sent(
    tmp_path: Path,
) -> None:
    blocking = sepp.SyncClient("127.0.0.1:1")  # never connects: refused before any call
    schedule = sepp.Schedule().every("tick", timedelta(minutes=1), queue="q", job_type="t")
    for build in (
        lambda: sepp.Worker(blocking, "q"),  # type: ignore[arg-type]
        lambda: sepp.Scheduler(blocking, schedule),  # type: ignore[arg-type]
    ):
        with pytest.raises(sepp.ValidationError, match=r"not a sepp\.SyncClient") as info:
            build()
        assert info.value.field == "client"
    relay = sepp.OutboxRelay(f"sqlite:///{tmp_path}/outbox.db")
    with pytest.raises(sepp.ValidationError, match=r"not a sepp\.SyncClient"):
        await relay.run(blocking)  # type: ignore[arg-type]
    with pytest.raises(sepp.ValidationError, match="coroutines nothing awaits"):
        relay.run_sync(unreachable_client())  # type: ignore[arg-type]
    assert repr(blocking).endswith("not connected>")


async def test_a_single_enqueue_names_enqueue_in_its_errors() -> None:
    channel = ScriptedChannel()

    async def fail(call: object, jobs: object) -> None:
        raise RpcError(StatusCode.RESOURCE_EXHAUSTED, "busy")

    channel.on_enqueue = fail
    async with connected(channel) as client:
        with pytest.raises(sepp.OverloadedError) as info:
            await client.enqueue("q", "t")
    assert str(info.value) == "Enqueue: RESOURCE_EXHAUSTED: busy"


def test_status_codes_print_the_same_on_every_python() -> None:
    # Python 3.11 changed str() and format() of IntEnum members to the bare number.
    code = StatusCode.NOT_FOUND
    assert str(code) == f"{code}" == "StatusCode.NOT_FOUND"
    assert f"{code:d}" == "5" and int(code) == 5 and code == 5
    # The version matrix of `make test` runs this on 3.11 to 3.15.
