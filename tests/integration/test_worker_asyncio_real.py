"""The Worker and the Scheduler on asyncio and uvloop against the real server, through the
asyncio client: each run in its own thread's loop, as an application would run them."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

import pytest
import trio

import sepp
from sepp.testing import SeppServer

JOBS = 200


def run_loop(loop: str, main: Callable[[], Awaitable[None]]) -> None:
    if loop == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


@pytest.mark.parametrize(
    "loop", ["asyncio", pytest.param("uvloop", marks=pytest.mark.needs("uvloop"))]
)
async def test_an_asyncio_worker_processes_every_job_once(
    sepp_server: SeppServer, loop: str
) -> None:
    handled: list[str] = []
    threads: set[int] = set()

    async def main() -> None:
        async with sepp.open(sepp_server.address) as client:
            acks = await client.enqueue_batch(
                [
                    sepp.EnqueueRequest("work", "double", payload=sepp.Payload.json({"n": n}))
                    for n in range(JOBS)
                ]
            )
            assert all(isinstance(ack, sepp.EnqueueAck) for ack in acks)
            worker = sepp.Worker(client, "work", max_in_flight=32, wait_timeout=1)
            all_done = asyncio.Event()

            @worker.handler("double")
            async def double(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
                await asyncio.sleep(0)
                handled.append(ctx.id)
                if len(handled) == JOBS:
                    all_done.set()

            thread_ran = asyncio.Event()
            loop = asyncio.get_running_loop()

            def in_thread(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
                threads.add(threading.get_ident())
                loop.call_soon_threadsafe(thread_ran.set)

            worker.handle("sync", in_thread)
            await client.enqueue("work", "sync")
            task = asyncio.create_task(worker.run())
            await worker.wait_until_reserving()
            await all_done.wait()
            await thread_ran.wait()
            worker.shutdown()
            await task
            assert await client.reserve("work", wait_timeout=0) is None  # every job acked
        assert asyncio.all_tasks() == {asyncio.current_task()}

    await trio.to_thread.run_sync(run_loop, loop, main)
    assert len(handled) == len(set(handled)) == JOBS
    assert len(threads) == 1 and threading.get_ident() not in threads
