"""`Worker.pause()` and `resume()` against the real server, on trio and on asyncio: a paused
worker sends no reserve, the jobs it holds run and are acked (their leases kept), a job
enqueued meanwhile stays in the queue for after `resume()`, and the monitor says so.

Each scenario is written once on anyio and run by the trio test itself, or by asyncio in a
thread of its own, as an application would run its worker."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from fixtures.fake_client import RecordingLogger

import sepp
from sepp.testing import SeppServer
from tests.integration.test_def_handlers_real import on

GUARD_S = 30  # bounds a hung test only; never part of an assertion
QUEUE = "reports"
FRONTS = ["trio", "asyncio"]


class CountingClient:
    """The real client, counting the reserves the worker sends and the acks."""

    def __init__(self, client: sepp.Client) -> None:
        self.client = client
        self.reserves = 0
        self.pending = 0
        self.polling = 0  # pending reserves that wait (long polls; the first after work is not)
        self.cancelled = 0  # reserves that ended cancelled (a long poll a pause cut short)
        self.acked: list[str] = []

    async def reserve(self, *args: Any, **kwargs: Any) -> list[sepp.Job] | None:
        waits = kwargs.get("wait_timeout", 0) > 0
        self.reserves += 1
        self.pending += 1
        self.polling += waits
        try:
            return await self.client.reserve(*args, **kwargs)
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        finally:
            self.pending -= 1
            self.polling -= waits

    async def ack(self, ctx: sepp.JobContext, **kwargs: Any) -> None:
        await self.client.ack(ctx, **kwargs)
        self.acked.append(ctx.id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


async def until(predicate: Callable[[], bool]) -> None:
    with anyio.fail_after(GUARD_S):
        while not predicate():  # noqa: ASYNC110
            await anyio.sleep(0.01)


@pytest.mark.parametrize("front", FRONTS)
async def test_a_paused_worker_finishes_what_it_holds_and_reserves_nothing_more(
    sepp_server: SeppServer, front: str
) -> None:
    started: list[tuple[str, int]] = []
    seen: dict[str, object] = {}

    async def scenario() -> None:
        gate = anyio.Event()

        async def build(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            started.append((ctx.id, ctx.attempt))
            await gate.wait()

        async with sepp.open(sepp_server.address) as real:
            client = CountingClient(real)
            monitor = sepp.WorkerMonitor()
            worker = sepp.Worker(
                client,  # type: ignore[arg-type]
                QUEUE,
                max_in_flight=4,
                wait_timeout=5,
                lease_duration=2,  # kept by auto-extend while paused
                monitor=monitor,
                logger=RecordingLogger(),
            )
            worker.handle("build", build)
            ids = [(await real.enqueue(QUEUE, "build")).job_id for _ in range(6)]
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(worker.run)
                await until(lambda: len(started) == 4)  # four held and running, two ready
                worker.pause()
                assert worker.is_paused
                await until(lambda: monitor.status == "paused")
                seen["ready_while_paused"] = monitor.ready
                seen["metrics"] = monitor.prometheus_text()
                reserves = client.reserves
                ids.append((await real.enqueue(QUEUE, "build")).job_id)  # while paused
                await anyio.sleep(3)  # past a lease: the running jobs' leases are extended
                gate.set()
                await until(lambda: len(client.acked) == 4)
                await anyio.sleep(0.5)  # a paused worker that reserved would start one now
                seen["started_while_paused"] = len(started)
                seen["reserves_while_paused"] = client.reserves - reserves
                worker.pause()  # idempotent
                worker.resume()
                worker.resume()
                await until(lambda: len(client.acked) == 7)
                seen["ready_after"] = monitor.ready
                worker.shutdown()
            seen["ids"] = ids
            assert await real.reserve(QUEUE, wait_timeout=0) is None

    await on(front, scenario)
    assert seen["ready_while_paused"] is False
    assert "sepp_worker_paused 1" in str(seen["metrics"])
    assert "sepp_worker_ready 0" in str(seen["metrics"])
    assert seen["started_while_paused"] == 4
    assert seen["reserves_while_paused"] == 0
    assert seen["ready_after"] is True
    # Every job ran once, on its first attempt: none was reserved while paused and given back.
    assert Counter(job_id for job_id, _ in started) == Counter(seen["ids"])  # type: ignore[arg-type]
    assert {attempt for _, attempt in started} == {1}


@pytest.mark.parametrize("front", FRONTS)
async def test_a_worker_paused_before_it_runs_starts_paused_and_a_shutdown_ends_the_pause(
    sepp_server: SeppServer, front: str
) -> None:
    seen: dict[str, object] = {}

    async def scenario() -> None:
        handled: list[str] = []

        async def build(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            handled.append(ctx.id)

        async with sepp.open(sepp_server.address) as real:
            client = CountingClient(real)
            monitor = sepp.WorkerMonitor()
            worker = sepp.Worker(client, QUEUE, wait_timeout=5, monitor=monitor)  # type: ignore[arg-type]
            worker.handle("build", build)
            await real.enqueue(QUEUE, "build")
            worker.pause()
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(worker.run)
                await worker.wait_until_reserving()  # returns: the run started, paused
                await until(lambda: monitor.status == "paused")
                await anyio.sleep(0.5)
                seen["reserves"] = client.reserves
                worker.resume()
                await until(lambda: len(handled) == 1)
                # The long poll that follows (not the reserve that does not wait, sent first
                # after a job: a pause lets that one answer, and cancels nothing).
                await until(lambda: client.polling == 1)
                worker.pause()  # cancels it (a 5 s poll: it would have outlived the test)
                await until(lambda: monitor.status == "paused")
                seen["cancelled"] = client.cancelled
                worker.shutdown()  # ends the pause: run() returns
            seen["status"] = monitor.status

    await on(front, scenario)
    assert seen["reserves"] == 0
    assert seen["cancelled"] == 1
    assert seen["status"] == "stopped"
