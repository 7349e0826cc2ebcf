"""`sepp.Limit` on a Worker's handlers, against the real server (trio and asyncio Workers):
a local limit is never exceeded while other job types run past it, every job runs once at
attempt 1 however often it was deferred, a shutdown defers the jobs still waiting, and what
waits shows in the log, `/metrics` and the handler's `ctx.limits`. Outcomes are counted from
what the handlers recorded (entry and exit on the run's clock, in the order they happened),
never bounded by the clock."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
from fixtures.fake_client import RecordingLogger

import sepp
from sepp.testing import SeppServer, sepp_server

pytestmark = [pytest.mark.real_server]

QUEUE = "work"
HANG_GUARD_S = 300.0  # a hung run fails; nothing is asserted about how long it took


@dataclass
class Record:
    """What the handlers saw: one (event, type, origin id, attempt, logical attempt) per
    entry and exit, in the order they happened."""

    events: list[tuple[str, str, str, int, int]] = field(default_factory=list)
    limits_seen: list[tuple[sepp.LimitStats, ...]] = field(default_factory=list)

    def enter(self, ctx: sepp.JobContext) -> None:
        origin = str(ctx.custom.get("sepp.deferred.of", ctx.id))
        self.events.append(("in", ctx.job_type, origin, ctx.attempt, ctx.logical_attempt))

    def leave(self, ctx: sepp.JobContext) -> None:
        origin = str(ctx.custom.get("sepp.deferred.of", ctx.id))
        self.events.append(("out", ctx.job_type, origin, ctx.attempt, ctx.logical_attempt))

    def most_at_once(self, job_type: str) -> int:
        running = most = 0
        for event, kind, *_ in self.events:
            if kind == job_type:
                running += 1 if event == "in" else -1
                most = max(most, running)
        return most

    def runs(self, job_type: str) -> Counter[str]:
        return Counter(o for e, kind, o, *_ in self.events if e == "in" and kind == job_type)

    def done(self, job_type: str) -> int:
        return sum(1 for e, kind, *_ in self.events if e == "out" and kind == job_type)


SLOW, QUICK = 200, 8


def check_local_limit(record: Record) -> None:
    assert record.most_at_once("slow") <= 2
    assert record.most_at_once("slow") == 2  # the limit was reached, not merely respected
    slow_runs, quick_runs = record.runs("slow"), record.runs("quick")
    assert len(slow_runs) == SLOW and set(slow_runs.values()) == {1}  # each job once
    assert len(quick_runs) == QUICK and set(quick_runs.values()) == {1}
    # Every run is attempt 1, of the delivery and across the deferrals' copies.
    assert {(attempt, logical) for *_, attempt, logical in record.events} == {(1, 1)}
    # Not delayed behind the limited type: every quick job ended before the slow ones did.
    outs = [kind for event, kind, *_ in record.events if event == "out"]
    last_quick = max(i for i, kind in enumerate(outs) if kind == "quick")
    assert outs[last_quick + 1 :].count("slow") > 0
    slow_stats = [stats for seen in record.limits_seen for stats in seen]
    assert {(s.name, s.scope, s.concurrency) for s in slow_stats} == {("slow", "worker", 2)}
    assert all(1 <= s.running <= 2 for s in slow_stats)


async def test_a_local_limit_holds_and_other_types_run_past_it(sepp_server: SeppServer) -> None:
    record = Record()
    logger = RecordingLogger()
    monitor = await run_on_trio(sepp_server.address, record, logger)
    check_local_limit(record)
    text = monitor.prometheus_text()
    assert 'sepp_worker_limit_running{limit="slow",scope="worker"} 0' in text
    assert 'sepp_worker_limit_admitted_total{limit="slow",scope="worker"} 200' in text
    deferred = metric(text, 'sepp_worker_limit_deferred_total{limit="slow",scope="worker"}')
    assert deferred == metric(text, 'sepp_worker_jobs_deferred_total{queue="work",job_type="slow"}')
    assert deferred == len(logger.matching(" deferred: "))
    print(f"[limit figures] deferred {deferred:g}")
    assert deferred > 0  # 16 held at once, of which 8 may wait: the rest were deferred
    assert logger.matching("waits for limit 'slow'")


def metric(text: str, name: str) -> float:
    (line,) = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.split()[-1])


async def run_on_trio(address: str, record: Record, logger: RecordingLogger) -> sepp.WorkerMonitor:
    with trio.fail_after(HANG_GUARD_S):
        async with sepp.open(address) as client:
            worker, all_done, monitor = await prepare(
                client, record, trio.sleep, trio.Event, logger
            )
            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await all_done.wait()
                worker.shutdown()
            assert await client.reserve(QUEUE, wait_timeout=0) is None  # nothing left
    return monitor


async def prepare(
    client: sepp.Client,
    record: Record,
    sleep: Callable[[float], Awaitable[None]],
    make_event: Callable[[], Any],
    logger: RecordingLogger,
) -> tuple[sepp.Worker, Any, sepp.WorkerMonitor]:
    all_done = make_event()
    monitor = sepp.WorkerMonitor()
    requests = [sepp.EnqueueRequest(QUEUE, "slow", max_attempts=5) for _ in range(SLOW)]
    requests += [sepp.EnqueueRequest(QUEUE, "quick") for _ in range(QUICK)]
    assert all(isinstance(a, sepp.EnqueueAck) for a in await client.enqueue_batch(requests))
    worker = sepp.Worker(
        client, QUEUE, max_in_flight=16, wait_timeout=1, logger=logger, monitor=monitor
    )

    def finished() -> None:
        if record.done("slow") + record.done("quick") == SLOW + QUICK:
            all_done.set()

    @worker.handler("slow", limit=sepp.Limit(concurrency=2))
    async def slow(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        record.enter(ctx)
        record.limits_seen.append(ctx.limits)
        await sleep(0.005)
        record.leave(ctx)
        finished()

    @worker.handler("quick")
    async def quick(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        record.enter(ctx)
        assert ctx.limits == ()
        await sleep(0)
        record.leave(ctx)
        finished()

    return worker, all_done, monitor


async def test_a_local_limit_holds_on_an_asyncio_worker(sepp_server: SeppServer) -> None:
    record = Record()
    logger = RecordingLogger()

    async def main() -> None:
        async with sepp.open(sepp_server.address) as client:
            worker, all_done, _ = await prepare(
                client, record, asyncio.sleep, asyncio.Event, logger
            )
            task = asyncio.create_task(worker.run())
            await asyncio.wait_for(all_done.wait(), HANG_GUARD_S)
            worker.shutdown()
            await task
            assert await client.reserve(QUEUE, wait_timeout=0) is None

    await trio.to_thread.run_sync(asyncio.run, main())
    check_local_limit(record)


async def test_a_lost_global_permit_cancels_its_handler_and_the_job_is_deferred() -> None:
    """The server stops answering (SIGSTOP) while a handler holds a global permit: the holder
    fences itself within the permit's lease, cancelling its handler before the permit could
    go to anyone else, and the job is deferred, to run again at its same attempt."""
    config = {"admin": {"enabled": False}, "storage": {"persist_mode": "sync_data"}}
    logger = RecordingLogger()
    monitor = sepp.WorkerMonitor()
    runs: list[tuple[int, int, str]] = []  # (attempt, logical attempt, how it ended)
    started, cancelled, finished = trio.Event(), trio.Event(), trio.Event()
    with trio.fail_after(HANG_GUARD_S):
        async with sepp_server(config) as server, sepp.open(server.address) as client:
            await client.enqueue(QUEUE, "fenced")
            worker = sepp.Worker(client, QUEUE, wait_timeout=1, logger=logger, monitor=monitor)
            limit = sepp.Limit(concurrency=1, scope="global", name="fenced", lease=1.5)

            @worker.handler("fenced", limit=limit)
            async def fenced(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
                ending = "cancelled"
                try:
                    if not runs:
                        started.set()
                        await trio.sleep_forever()
                    ending = "returned"
                finally:
                    runs.append((ctx.attempt, ctx.logical_attempt, ending))
                    (cancelled if ending == "cancelled" else finished).set()

            async with trio.open_nursery() as nursery:
                await nursery.start(worker.run)
                await started.wait()
                assert server.pid is not None
                os.kill(server.pid, signal.SIGSTOP)
                try:
                    await cancelled.wait()  # by the holder's own clock: the server is stopped
                finally:
                    os.kill(server.pid, signal.SIGCONT)
                await finished.wait()
                worker.shutdown()
    assert runs == [(1, 1, "cancelled"), (1, 1, "returned")]
    assert logger.matching("could not keep its permit")
    text = monitor.prometheus_text()
    assert 'sepp_worker_limit_lost_total{limit="fenced",scope="global"} 1' in text
    assert 'sepp_worker_jobs_deferred_total{queue="work",job_type="fenced"} 1' in text


async def test_at_shutdown_the_waiting_jobs_are_deferred_and_run_elsewhere_at_attempt_1(
    sepp_server: SeppServer,
) -> None:
    seen: list[tuple[str, int, int]] = []
    started = trio.Event()
    limit = sepp.Limit(concurrency=1, name="single")
    with trio.fail_after(HANG_GUARD_S):
        async with sepp.open(sepp_server.address) as client:
            ids = {
                a.job_id
                for a in await client.enqueue_batch(
                    [sepp.EnqueueRequest(QUEUE, "single", max_attempts=1) for _ in range(4)]
                )
                if isinstance(a, sepp.EnqueueAck)
            }
            first = sepp.Worker(client, QUEUE, wait_timeout=1, limit_patience=None)

            @first.handler("single", limit=limit)
            async def hold(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
                seen.append((ctx.id, ctx.attempt, ctx.logical_attempt))
                started.set()
                await trio.sleep(0.5)

            async with trio.open_nursery() as nursery:
                await nursery.start(first.run)
                await started.wait()
                while first.in_flight < 4:  # noqa: ASYNC110 - one runs, three wait for it
                    await trio.sleep(0.01)
                first.shutdown()
            assert len(seen) == 1  # the others were given back, not run, and not nacked
            second = sepp.Worker(client, QUEUE, wait_timeout=1)
            done = trio.Event()

            @second.handler("single", limit=limit)
            async def run(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
                seen.append((str(ctx.custom["sepp.deferred.of"]), ctx.attempt, ctx.logical_attempt))
                if len(seen) == 4:
                    done.set()

            async with trio.open_nursery() as nursery:
                await nursery.start(second.run)
                await done.wait()
                second.shutdown()
    # max_attempts=1: a nack would have dead-lettered them; a deferral costs no attempt.
    assert {origin for origin, *_ in seen} == ids
    assert {(attempt, logical) for _, attempt, logical in seen} == {(1, 1)}
