"""Jobs that lead to jobs on sepp.testing's memory server, as a user's tests run them: a chain,
a group, follow-ups and awaited results under trio's MockClock (virtual time), and a result's
ttl passing in it (for the awaiting client and for the worker: one wall clock)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import trio
import trio.testing
from fixtures.pipeline_tasks import CountingReplies

import sepp
from sepp.testing import MemoryServer, QueueDepths

pytestmark = pytest.mark.memory_server

double = sepp.Task("nums", "double", int, result=int)
as_text = sepp.Task("nums", "as_text", int, result=str)
noted = sepp.Task("notes", "noted", str)


def worker_for(client: sepp.Client) -> sepp.Worker:
    worker = sepp.Worker(client, "nums", wait_timeout=1)

    @worker.task(double)
    async def do_double(n: int, ctx: sepp.JobContext) -> int:
        ctx.then(noted.job(f"doubled {n}"))
        return 2 * n

    @worker.task(as_text)
    async def do_as_text(n: int, ctx: sepp.JobContext) -> str:
        return f"<{n}>"

    return worker


async def test_chains_groups_follow_ups_and_results_in_virtual_time(
    memory_server: MemoryServer, autojump_clock: trio.testing.MockClock
) -> None:
    async with sepp.open(memory_server.address) as client:
        worker = worker_for(client)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            chained = await sepp.chain(double.job(1), double, as_text).submit(client)
            assert await chained.result(timeout=60) == "<4>"
            both = await sepp.group(double.job(5), as_text.job(6)).submit(client)
            assert await both.result(timeout=60) == (10, "<6>")
            worker.shutdown()
        notes = []
        while jobs := await client.reserve("notes", wait_timeout=0, max_jobs=10):
            notes += [job.payload.json() for job in jobs if job.payload]
            for job in jobs:
                await client.ack(job.ctx)
        assert sorted(notes) == ["doubled 1", "doubled 2", "doubled 5"]


async def test_a_result_nobody_ran_in_time_is_unavailable_past_its_ttl(
    memory_server: MemoryServer, autojump_clock: trio.testing.MockClock
) -> None:
    async with sepp.open(memory_server.address) as client:
        handle = await double.submit(client, 3, result_ttl=timedelta(minutes=5))
        with pytest.raises(sepp.ResultTimeoutError):
            await handle.result(timeout=60)  # a minute of virtual time, no worker
        with pytest.raises(sepp.ResultUnavailableError, match="result_ttl"):
            await handle.result()  # until the ttl: no worker ran in time


async def test_a_worker_sends_no_result_once_its_ttl_passed_in_virtual_time(
    memory_server: MemoryServer, autojump_clock: trio.testing.MockClock
) -> None:
    """The ttl a handle stamps and the one a worker reads are on the same clock as the
    server's (virtual here): a worker that runs the job after it passed sends no result."""
    async with sepp.open(memory_server.address) as client:
        handle = await double.submit(client, 3, result_ttl=timedelta(minutes=5))
        await memory_server.advance(timedelta(minutes=6))
        with pytest.raises(sepp.ResultUnavailableError, match="result_ttl"):
            await handle.result(timeout=0)
        counting = CountingReplies(client)
        await worker_for(counting).run(until_idle=True)  # type: ignore[arg-type]
        assert memory_server.depths("nums") == QueueDepths()  # the job ran and was acked
        assert counting.replies == []
