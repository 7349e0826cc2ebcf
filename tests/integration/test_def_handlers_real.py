"""`def` handlers against the real server, on trio and on asyncio: `ctx.client` is a blocking
client whose calls run in the worker's own run, so a follow-up enqueued from a worker thread
reaches the server; the async client called there fails the job loudly instead of making a
coroutine that never runs; and a call in flight when the worker gives the handler up ends.

Each scenario is written once on anyio and run by the trio test itself, or by asyncio in a
thread of its own, as an application would run its worker."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

import anyio
import pytest
import trio
from fixtures.fake_client import RecordingLogger

import sepp
from sepp.testing import SeppServer

GUARD_S = 30  # bounds a hung test only; never part of an assertion
FRONTS = ["trio", "asyncio"]


async def on(front: str, scenario: Callable[[], Awaitable[None]]) -> None:
    if front == "trio":
        await scenario()
    else:
        await trio.to_thread.run_sync(asyncio.run, scenario())


async def settled(event: threading.Event) -> None:
    assert await anyio.to_thread.run_sync(event.wait, GUARD_S)


async def run_worker_until(worker: sepp.Worker, done: threading.Event) -> None:
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(worker.run)
        await worker.wait_until_reserving()
        await settled(done)
        worker.shutdown()


@pytest.mark.parametrize("front", FRONTS)
async def test_a_def_handler_enqueues_a_follow_up_through_its_blocking_ctx_client(
    sepp_server: SeppServer, front: str
) -> None:
    seen: dict[str, object] = {}
    done = threading.Event()

    def order(payload: sepp.Payload | None, ctx: sepp.SyncJobContext) -> None:
        try:
            assert isinstance(ctx, sepp.SyncJobContext) and isinstance(ctx.client, sepp.SyncClient)
            seen["ack"] = ctx.client.enqueue("shipping", "ship", payload=payload)
            before = ctx.lease_expires_at
            seen["extended"] = ctx.client.extend(ctx, 120) == ctx.lease_expires_at > before
            seen["server"] = ctx.client.get_server_info().server_version
        finally:
            done.set()

    async def scenario() -> None:
        async with sepp.open(sepp_server.address) as client:
            worker = sepp.Worker(client, "orders", wait_timeout=1)
            worker.handle("order", order)
            await client.enqueue("orders", "order", payload=sepp.Payload.json({"order": 7}))
            await run_worker_until(worker, done)
            (job,) = await client.reserve("shipping", wait_timeout=0) or []  # on the server
            assert job.ctx.job_type == "ship" and job.payload == sepp.Payload.json({"order": 7})
            assert await client.reserve("orders", wait_timeout=0) is None  # the order: acked

    await on(front, scenario)
    ack = seen["ack"]
    assert isinstance(ack, sepp.EnqueueAck) and ack.job_id
    assert seen["extended"] is True and seen["server"]


@pytest.mark.parametrize("front", FRONTS)
async def test_the_async_client_called_in_a_def_handler_fails_its_job_loudly(
    sepp_server: SeppServer, front: str
) -> None:
    raised: list[BaseException] = []
    done = threading.Event()
    log = RecordingLogger()

    async def scenario() -> None:
        async with sepp.open(sepp_server.address) as client:
            worker = sepp.Worker(client, "orders", wait_timeout=1, logger=log)

            @worker.handler("order")
            def order(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
                try:
                    client.enqueue("shipping", "ship")  # the async client: nothing awaits here
                except BaseException as exc:
                    raised.append(exc)
                    raise
                finally:
                    done.set()

            await client.enqueue("orders", "order", max_attempts=1)
            await run_worker_until(worker, done)
            assert await client.reserve("shipping", wait_timeout=0) is None  # never sent
            # Not acked: nacked as any failure is, which on its only attempt dead-letters it.
            (record,) = await client.drain_dead_letters("orders")
            assert record.job_type == "order" and record.last_reason is not None
            assert "`def` handler's thread" in record.last_reason

    await on(front, scenario)
    assert len(raised) == 1 and isinstance(raised[0], sepp.ClientError)
    assert "sepp.Client.enqueue was called in a `def` handler's thread" in str(raised[0])
    assert "use ctx.client" in str(raised[0]).lower()
    assert any("dead-lettered" in line for line in log.at("error"))


@pytest.mark.parametrize("front", FRONTS)
async def test_a_call_in_flight_when_the_worker_gives_the_handler_up_ends_at_once(
    sepp_server: SeppServer, front: str
) -> None:
    raised: list[BaseException] = []
    done = threading.Event()

    def slow(payload: sepp.Payload | None, ctx: sepp.SyncJobContext) -> None:
        try:
            ctx.client.reserve("idle", wait_timeout=GUARD_S)  # a long poll: the timeout ends it
        except sepp.ClientError as exc:
            raised.append(exc)
        try:
            ctx.client.enqueue("shipping", "ship")  # after the handler ended
        except sepp.ClientError as exc:
            raised.append(exc)
        done.set()

    async def scenario() -> None:
        async with sepp.open(sepp_server.address) as client:
            worker = sepp.Worker(client, "orders", wait_timeout=1)
            worker.handle("slow", slow, timeout=2)
            await client.enqueue("orders", "slow", max_attempts=1)
            await run_worker_until(worker, done)
            assert await client.reserve("shipping", wait_timeout=0) is None
            (record,) = await client.drain_dead_letters("orders")  # nacked: timed out
            assert record.last_reason is not None and "timeout" in record.last_reason

    await on(front, scenario)
    # The long poll was cancelled (or, on a machine too loaded to start the thread within the
    # timeout, refused): either way it ended, and so did the call after it, at once.
    assert [type(exc) for exc in raised] == [sepp.ClientError, sepp.ClientError]
    assert all("gave this job's handler up" in str(exc) for exc in raised)
    assert "takes no more calls" in str(raised[1])
