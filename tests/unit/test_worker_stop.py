"""A graceful stop strands nothing (issue 42): every job the server leased to the worker is
handled, or nacked for immediate retry, before `run()` returns. Each way a job can be held
as the stop begins, on trio (MockClock) and asyncio, against the scripted FakeClient, whose
`answer_delay` / `answer_passes` lease the jobs at once and deliver the answer later: a
reserve cancelled meanwhile strands them, as with the real server."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import trio
from fixtures.fake_client import FakeClient, RecordingLogger
from trio.testing import MockClock

import sepp
from sepp import Retry
from sepp._worker import worker as worker_module
from sepp._worker.held_job import HeldJobs


def make_worker(fake: FakeClient, **options: Any) -> sepp.Worker:
    options.setdefault("queues", ["q"])
    options.setdefault("logger", RecordingLogger())
    options.setdefault("backoff", Retry.DEFAULT)
    return sepp.Worker(fake, _wall_clock=fake.now, **options)


def nothing_stranded(fake: FakeClient) -> None:
    assert [c.stranded for c in fake.reserve_calls if c.stranded] == []
    assert fake.leased == []  # nothing left for its lease to bring back


# -- a reserve whose answer is on its way -------------------------------------------------------


async def test_a_reserve_answer_on_its_way_at_shutdown_is_received_and_its_jobs_run(
    autojump_clock: MockClock,
) -> None:
    # The answer takes 2 s (a loop held by CPU-bound handlers reads it late): the shutdown
    # 0.6 s after it was sent must not cancel it, however long ago it was sent.
    fake = FakeClient()
    worker = make_worker(fake, max_in_flight=2, wait_timeout=30)
    sent: list[float] = []

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await trio.sleep(1)

    ids = [fake.add() for _ in range(4)]
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(1)
        fake.answer_delay = 2  # from the second reserve on
        while len(fake.reserve_calls) < 2:  # noqa: ASYNC110 - virtual time: nothing waits
            await trio.sleep(0.1)
        sent.append(fake.reserve_calls[1].at)
        await trio.sleep(0.6)
        worker.shutdown()
    first, second = fake.reserve_calls
    assert (first.returned, second.returned, second.cancelled) == (2, 2, False)
    assert second.ended_at == sent[0] + 2
    assert sorted(c.job_id for c in fake.acks) == sorted(ids)
    nothing_stranded(fake)


async def test_a_long_poll_at_shutdown_still_ends_at_once_with_nothing_held(
    autojump_clock: MockClock,
) -> None:
    # Not waiting out wait_timeout: an idle worker stops at once.
    fake = FakeClient()
    worker = make_worker(fake, wait_timeout=30)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(3)
        worker.shutdown()
    assert trio.current_time() == 3
    probe, call = fake.reserve_calls  # the first does not wait; empty, so a long poll
    assert (probe.wait_timeout, probe.returned, probe.cancelled) == (0, 0, False)
    assert call.cancelled and call.wait_timeout == 30


# -- a job arriving at an idle long poll as the stop begins -------------------------------------


@pytest.mark.parametrize("passes", [1, 2, 3])
async def test_a_job_arriving_at_an_idle_long_poll_as_the_stop_begins_is_handled(
    passes: int, autojump_clock: MockClock
) -> None:
    # The server answered the long poll just before the stop; the answer needs a few
    # scheduler passes to be read. The long poll is cancelled only after those.
    fake = FakeClient()
    fake.answer_passes = passes
    worker = make_worker(fake, wait_timeout=30)
    ran: list[str] = []

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        ran.append(ctx.id)

    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(5)
        job_id = fake.add()  # wakes the long poll, which leases it
        worker.shutdown()  # in the same instant
    assert ran == [job_id]
    assert [c.job_id for c in fake.acks] == [job_id]
    nothing_stranded(fake)


# -- jobs waiting for a slot --------------------------------------------------------------------


async def test_jobs_waiting_for_a_slot_at_shutdown_are_nacked_for_immediate_retry(
    autojump_clock: MockClock,
) -> None:
    await jobs_waiting_for_a_slot_at_shutdown("async")


async def test_jobs_waiting_for_a_def_handlers_slot_at_shutdown_are_nacked() -> None:
    # The real clock: a thread's run takes real time, in which autojump would end the grace.
    await jobs_waiting_for_a_slot_at_shutdown("def")


async def jobs_waiting_for_a_slot_at_shutdown(kind: str) -> None:
    fake = FakeClient()
    fake.over_deliver = 3  # three more than the one slot: they wait for it
    worker = make_worker(fake, max_in_flight=1, shutdown_timeout=30)
    started = trio.Event()
    nacked = trio.Event()
    release = threading.Event()

    async def count_nack(ctx: sepp.JobContext) -> None:
        if len(fake.nacks) == 3:
            nacked.set()

    fake.on_nack = count_nack

    if kind == "async":

        @worker.handler("work")
        async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            started.set()
            await trio.sleep(10)

    else:

        @worker.handler("work")
        def work_in_thread(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            trio.from_thread.run_sync(started.set)
            release.wait(10)

    first, *waiting = (fake.add() for _ in range(4))
    with trio.fail_after(60):  # a guard against a hang (jobs never nacked), not a bound
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await started.wait()
            worker.shutdown()
            await nacked.wait()  # the three waiting ones, while the first still runs
            release.set()
    assert sorted((c.job_id, c.retry, c.reason) for c in fake.nacks) == [
        (i, Retry.after(0), "worker shutdown") for i in sorted(waiting)
    ]
    assert [c.job_id for c in fake.acks] == [first]
    nothing_stranded(fake)


# -- asyncio ------------------------------------------------------------------------------------


async def _until(condition: Any) -> None:
    while not condition():  # noqa: ASYNC110 - each pass lets the loop run: no wall-clock window
        await asyncio.sleep(0)


def test_on_asyncio_a_reserve_answer_on_its_way_at_shutdown_is_received() -> None:
    fake = FakeClient()
    ran: list[str] = []

    async def main() -> None:
        worker = make_worker(fake, max_in_flight=2, wait_timeout=30)
        release = asyncio.Event()

        @worker.handler("work")
        async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            ran.append(ctx.id)
            await release.wait()

        for _ in range(4):
            fake.add()
        task = asyncio.create_task(worker.run())
        await _until(lambda: len(ran) == 2)
        fake.answer_delay = 0.7  # longer than any settle window the stop could allow
        release.set()
        await _until(lambda: len(fake.reserve_calls) == 2 and fake.reserve_calls[1].stranded)
        worker.shutdown()
        await task

    asyncio.run(asyncio.wait_for(main(), 60))  # a guard against a hang, not a bound
    assert len(ran) == 4 and len(fake.acks) == 4
    assert fake.reserve_calls[1].cancelled is False
    nothing_stranded(fake)


@pytest.mark.parametrize("passes", [1, 3])
def test_on_asyncio_a_job_arriving_at_an_idle_long_poll_as_the_stop_begins_is_handled(
    passes: int,
) -> None:
    fake = FakeClient()
    fake.answer_passes = passes
    ran: list[str] = []

    async def main() -> None:
        # The first long poll ends empty: the one pending at the stop is long-polling queues
        # found drained.
        worker = make_worker(fake, wait_timeout=0.05)

        @worker.handler("work")
        async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            ran.append(ctx.id)

        task = asyncio.create_task(worker.run())
        await _until(lambda: len(fake.reserve_calls) == 2)
        fake.add()
        worker.shutdown()
        await task

    asyncio.run(asyncio.wait_for(main(), 60))  # a guard against a hang, not a bound
    assert len(ran) == 1 and len(fake.acks) == 1
    nothing_stranded(fake)


def test_on_asyncio_jobs_waiting_for_a_slot_at_shutdown_are_nacked() -> None:
    fake = FakeClient()
    fake.over_deliver = 3
    ids = [fake.add() for _ in range(4)]

    async def main() -> None:
        worker = make_worker(fake, max_in_flight=1)
        started = asyncio.Event()
        release = asyncio.Event()

        @worker.handler("work")
        async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            started.set()
            await release.wait()

        task = asyncio.create_task(worker.run())
        await started.wait()
        worker.shutdown()
        await _until(lambda: len(fake.nacks) == 3)
        release.set()
        await task

    asyncio.run(asyncio.wait_for(main(), 60))  # a guard against a hang, not a bound
    assert sorted(c.job_id for c in fake.nacks) == sorted(ids[1:])
    assert {c.reason for c in fake.nacks} == {"worker shutdown"}
    assert [c.job_id for c in fake.acks] == ids[:1]
    nothing_stranded(fake)


# -- a slot freeing as the stop begins ----------------------------------------------------------


class SendsCounted(FakeClient):
    """Counts the reserves sent once the worker's shutdown began (at the call, before any
    await: the real client writes the request before it first waits)."""

    def __init__(self) -> None:
        super().__init__()
        self.worker: sepp.Worker | None = None
        self.sent_after_stop = 0

    async def reserve(self, *args: Any, **kwargs: Any) -> list[sepp.Job] | None:
        assert self.worker is not None
        self.sent_after_stop += self.worker.is_shutdown
        return await super().reserve(*args, **kwargs)


def stop_as_a_slot_frees(
    fake: SendsCounted, monkeypatch: pytest.MonkeyPatch, **options: Any
) -> sepp.Worker:
    """A worker whose shutdown begins in the instant a held job settles (the reserve loop,
    full until then, is woken but has not run yet)."""
    worker = make_worker(fake, max_in_flight=1, **options)
    fake.worker = worker

    class StopWhenEmptied(HeldJobs):
        __slots__ = ()

        def changed(self) -> None:
            super().changed()
            if len(self) == 0:
                worker.shutdown()

    monkeypatch.setattr(worker_module, "HeldJobs", StopWhenEmptied)  # what its run() holds
    return worker


async def test_no_reserve_is_sent_when_the_stop_begins_as_a_slot_frees(
    autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = SendsCounted()
    worker = stop_as_a_slot_frees(fake, monkeypatch)

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await trio.sleep(1)

    fake.add()
    fake.add()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.run)
    assert len(fake.acks) == 1
    assert fake.sent_after_stop == 0
    nothing_stranded(fake)


def test_on_asyncio_no_reserve_is_sent_when_the_stop_begins_as_a_slot_frees(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = SendsCounted()

    async def main() -> None:
        worker = stop_as_a_slot_frees(fake, monkeypatch)

        @worker.handler("work")
        async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            await asyncio.sleep(0)

        fake.add()
        fake.add()
        await worker.run()

    asyncio.run(asyncio.wait_for(main(), 60))  # a guard against a hang, not a bound
    assert len(fake.acks) == 1
    assert fake.sent_after_stop == 0
    nothing_stranded(fake)
