"""The client written as an asyncio application writes it, on the default loop and on uvloop,
against the real server: every call, auto-batching, no task left behind, cancelling a caller
(task.cancel, asyncio.timeout, wait_for) resets its stream and leaves the client usable, a
call's deadline (its timeout, rpc_timeout, an enclosing anyio cancel scope) becomes its
grpc-timeout, and a client used from another event loop says so. (The hostile-server, client
and proxy suites run on this front end too, from their trio bodies: fixtures/asyncio_front.)"""

from __future__ import annotations

import asyncio
import math
import threading
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from fixtures.asyncio_front import new_loop, server_in_thread

import sepp
from sepp.wire.drivers._core import ConnectionCore

T = TypeVar("T")

LOOPS = [
    pytest.param("asyncio", id="asyncio"),
    pytest.param("uvloop", id="uvloop", marks=pytest.mark.needs("uvloop")),
]
CONFIG = {
    "admin": {"enabled": False},
    "storage": {"persist_mode": "buffer", "dead_letter_retention_ms": 60_000},
}


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    with server_in_thread(CONFIG) as addr:
        yield addr


@pytest.fixture(params=LOOPS)
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, T]], T]:
    """Run a coroutine to its end in a new event loop of the parametrized kind, and check
    that no task outlives it (asyncio.run would cancel a leftover quietly)."""
    loop_name = request.param

    def run_in_loop(coro: Coroutine[Any, Any, T]) -> T:
        loop = new_loop(loop_name)
        try:
            result = loop.run_until_complete(_no_task_left(coro))
        finally:
            loop.close()
        return result

    return run_in_loop


async def _no_task_left(coro: Awaitable[T]) -> T:
    result = await coro
    await asyncio.sleep(0)  # a task the block left behind would be listed now
    me = asyncio.current_task()
    left = [task for task in asyncio.all_tasks() if task is not me]
    assert left == [], f"tasks outlived the client: {left}"
    return result


def test_every_call_works_and_the_client_leaves_no_task_behind(
    run: Callable[..., Any], address: str
) -> None:
    async def main() -> None:
        async with sepp.open(address) as client:
            assert (await client.get_server_info()).server_version == "0.1.1"
            ack = await client.enqueue("aio", "one", payload=sepp.Payload.json({"n": 1}))
            batch = await client.enqueue_batch([sepp.EnqueueRequest("aio", "b")] * 2)
            atomic = await client.enqueue_atomic([sepp.EnqueueRequest("aio", "a")] * 2)
            assert all(isinstance(r, sepp.EnqueueAck) for r in [*batch, *atomic])
            jobs = await client.reserve("aio", max_jobs=5, wait_timeout=2)
            assert jobs is not None and len(jobs) == 5
            assert {job.id for job in jobs} >= {ack.job_id}
            first, second, *rest = jobs
            await client.extend(first.ctx, timedelta(seconds=40))
            await client.ack(first.ctx)
            assert await client.nack(second.ctx, retry=sepp.Retry.DEAD_LETTER) is True
            for job in rest:
                await client.ack(job.ctx)
            with pytest.raises(sepp.JobNotFoundError):
                await client.ack(first.ctx)
            records = await client.drain_dead_letters("aio")
            assert [r.job_id for r in records] == [second.id]
            with pytest.raises(sepp.ValidationError):  # refused before anything is sent
                await client.enqueue("", "t")

    run(main())


def test_auto_batched_enqueues_from_many_tasks_each_land_once(
    run: Callable[..., Any], address: str
) -> None:
    async def main() -> None:
        batching = sepp.Batching(max_delay=timedelta(milliseconds=2))
        run_id = uuid.uuid4().hex  # each loop's run enqueues its own jobs
        async with sepp.open(address, enqueue_batching=batching) as client:
            acks = await asyncio.gather(
                *(
                    client.enqueue("aio-batch", "t", idempotency_key=f"{run_id}-{i}")
                    for i in range(300)
                )
            )
            assert len({ack.job_id for ack in acks}) == 300
            got: list[sepp.Job] = []
            while len(got) < 300:
                jobs = await client.reserve("aio-batch", max_jobs=256, wait_timeout=2)
                assert jobs is not None
                got.extend(jobs)
            assert {job.id for job in got} == {ack.job_id for ack in acks}
            await asyncio.gather(*(client.ack(job.ctx) for job in got))

    run(main())


async def _cancelled_three_ways(client: sepp.Client) -> list[str]:
    """A long poll cancelled by task.cancel(), wait_for and asyncio.timeout (3.11+); returns
    how each ended."""
    seen = []
    task = asyncio.ensure_future(client.reserve("aio-empty", wait_timeout=30))
    await asyncio.sleep(0.05)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        seen.append("task.cancel")
    try:
        await asyncio.wait_for(client.reserve("aio-empty", wait_timeout=30), 0.05)
    except TimeoutError:
        seen.append("wait_for")
    try:
        async with asyncio.timeout(0.05):
            await client.reserve("aio-empty", wait_timeout=30)
    except TimeoutError:
        seen.append("asyncio.timeout")
    return seen


def test_a_cancelled_caller_resets_its_stream_and_the_client_goes_on(
    run: Callable[..., Any], address: str
) -> None:
    async def main() -> None:
        async with sepp.open(address) as client:
            await client.get_server_info()
            seen = await _cancelled_three_ways(client)
            expected = ["task.cancel", "wait_for"]
            assert seen == [*expected, "asyncio.timeout"]
            conn = client._channel._current  # type: ignore[attr-defined]
            assert conn is not None and conn.waiters == {}
            assert conn.proto.active_calls == 0  # every stream was reset, none left open
            # Still usable, on the same connection: cancelling never kills it.
            await client.enqueue("aio-after", "t")
            jobs = await client.reserve("aio-after", wait_timeout=2)
            assert jobs is not None and len(jobs) == 1
            await client.ack(jobs[0].ctx)
            assert client._channel._current is conn  # type: ignore[attr-defined]

    run(main())


@pytest.fixture
def sent_timeouts(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The grpc-timeout (in seconds, inf: none) of every call started from here on."""
    sent: list[float] = []
    original = ConnectionCore.open_stream

    def spy(self: ConnectionCore[Any], call: Any, deadline: float, now: float) -> int:
        sent.append(deadline - now)
        return original(self, call, deadline, now)

    monkeypatch.setattr(ConnectionCore, "open_stream", spy)
    return sent


def test_a_calls_deadline_becomes_its_grpc_timeout(
    run: Callable[..., Any], address: str, sent_timeouts: list[float]
) -> None:
    import anyio

    async def main() -> None:
        async with sepp.open(address, rpc_timeout=11, validate_locally=False) as client:
            await client.get_server_info()  # rpc_timeout
            await client.get_server_info(timeout=7)  # its own
            with anyio.CancelScope(deadline=anyio.current_time() + 3):  # an enclosing scope
                await client.get_server_info()
            with anyio.move_on_after(0.2) as scope:  # which also cancels it when it passes
                await client.reserve("aio-deadline", wait_timeout=20)
            assert scope.cancelled_caught
        async with sepp.open(address, rpc_timeout=None, validate_locally=False) as client:
            await client.get_server_info()  # no deadline at all

    run(main())
    rpc, own, scoped, reserve, none = sent_timeouts
    assert 10 < rpc <= 11 and 6 < own <= 7 and 2 < scoped <= 3
    # The scope's deadline, not the long poll's own. uvloop's clock is libuv's cached
    # millisecond time, so deadline - now can be 0.2 plus the float error of the addition.
    assert 0 < reserve <= 0.2 + 1e-9
    assert none == math.inf


def test_a_client_used_from_another_event_loop_says_so(
    run: Callable[..., Any], address: str
) -> None:
    failures: list[BaseException] = []

    async def main() -> None:
        async with sepp.open(address) as client:
            loop = asyncio.get_running_loop()
            done = asyncio.Event()

            def elsewhere() -> None:
                try:
                    asyncio.run(client.get_server_info())
                except BaseException as exc:
                    failures.append(exc)
                finally:
                    loop.call_soon_threadsafe(done.set)

            threading.Thread(target=elsewhere).start()
            await done.wait()
            await client.get_server_info()  # its own loop still may

    run(main())
    (failure,) = failures
    assert isinstance(failure, sepp.ClientError)
    assert "opened in another trio.run() or asyncio event loop" in str(failure)
