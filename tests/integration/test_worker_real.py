"""The Worker against the real sepp server (launched per test by sepp.testing).

Tests that measure something print a one-line `[worker figures]` summary (jobs, seconds,
redeliveries); run with `-s` to see them. A missing server binary makes these FAIL, never skip.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import trio
from fixtures.fake_client import RecordingLogger

import sepp
from sepp import HandlerError
from sepp.testing import SeppServer, sepp_server

# In the smoke selection of the emulated architectures' parts (tests/conftest.py).
pytestmark = pytest.mark.arch_smoke

QUEUE = "work"


def config(**limits: int) -> dict[str, object]:
    return {
        "admin": {"enabled": False},
        "storage": {"persist_mode": "buffer", "dead_letter_retention_ms": 600_000},
        "limits": dict(limits),
    }


@asynccontextmanager
async def server_and_client(cfg: Mapping[str, object]) -> AsyncIterator[tuple[SeppServer, Any]]:
    async with sepp_server(cfg) as server, sepp.open(server.address) as client:
        yield server, client


class Spy:
    """Wraps a real client and records what the worker did with it (duck-typed Client)."""

    def __init__(self, client: sepp.Client) -> None:
        self.client = client
        self.delivered: list[tuple[str, int]] = []  # (job id, attempt) per reserved job
        self.acked: list[str] = []
        self.ack_errors: list[tuple[str, int, BaseException]] = []
        self.nacks: list[tuple[str, str | None, sepp.Retry]] = []
        self.nack_sent_at: list[float] = []  # trio.current_time() as each nack was sent
        self.extends = 0
        self.reserve_errors: list[BaseException] = []
        self.ack_failed = trio.Event()

    async def reserve(self, *args: Any, **kwargs: Any) -> list[sepp.Job] | None:
        try:
            jobs = await self.client.reserve(*args, **kwargs)
        except Exception as exc:
            self.reserve_errors.append(exc)
            raise
        self.delivered += [(j.id, j.ctx.attempt) for j in jobs or ()]
        return jobs

    async def ack(self, ctx: sepp.JobContext, **kwargs: Any) -> None:
        try:
            await self.client.ack(ctx, **kwargs)
        except Exception as exc:
            self.ack_errors.append((ctx.id, ctx.attempt, exc))
            self.ack_failed.set()
            raise
        self.acked.append(ctx.id)

    async def nack(self, ctx: sepp.JobContext, **kwargs: Any) -> bool:
        self.nack_sent_at.append(trio.current_time())
        dead = await self.client.nack(ctx, **kwargs)
        self.nacks.append((ctx.id, kwargs.get("reason"), kwargs.get("retry", sepp.Retry.DEFAULT)))
        return dead

    async def get_server_info(self, **kwargs: Any) -> sepp.ServerInfo:
        return await self.client.get_server_info(**kwargs)

    async def extend(self, ctx: sepp.JobContext, lease_duration: Any, **kwargs: Any) -> datetime:
        expiry = await self.client.extend(ctx, lease_duration, **kwargs)
        self.extends += 1
        return expiry


def worker_for(spy: Spy, **options: Any) -> sepp.Worker:
    options.setdefault("queues", [QUEUE])
    options.setdefault("logger", RecordingLogger())
    return sepp.Worker(spy, **options)  # type: ignore[arg-type]


async def enqueue(client: sepp.Client, count: int, job_type: str = "task") -> list[str]:
    ids: list[str] = []
    for start in range(0, count, 250):
        batch = [
            sepp.EnqueueRequest(QUEUE, job_type, payload=sepp.Payload.json({"n": n}))
            for n in range(start, min(start + 250, count))
        ]
        for result in await client.enqueue_batch(batch):
            assert isinstance(result, sepp.EnqueueAck), result
            ids.append(result.job_id)
    return ids


async def queue_is_empty(client: sepp.Client) -> bool:
    return await client.reserve(QUEUE, lease_duration=1, wait_timeout=0, max_jobs=10) is None


async def wait_until(predicate: Any, timeout: float, poll: float = 0.01) -> None:
    # Polling keeps the handlers and the spy free of test plumbing.
    with trio.fail_after(timeout):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(poll)


def figures(name: str, **values: object) -> None:
    print(f"\n[worker figures] {name}: " + ", ".join(f"{k}={v}" for k, v in values.items()))


# -- tests -----------------------------------------------------------------------------------


async def test_thousand_jobs_through_32_slots_are_each_acked_exactly_once() -> None:
    async with server_and_client(config()) as (_, client):
        ids = await enqueue(client, 1000)
        spy = Spy(client)
        worker = worker_for(spy, max_in_flight=32, lease_duration=30)
        running = most = 0

        @worker.handler("task")
        async def task(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            nonlocal running, most
            assert payload is not None and isinstance(payload.json()["n"], int)
            running += 1
            most = max(most, running)
            await trio.sleep(0.002)  # long enough that slots fill up
            running -= 1

        began = time.monotonic()
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await wait_until(lambda: len(spy.acked) >= 1000, timeout=120)
            elapsed = time.monotonic() - began
            worker.shutdown()
        assert sorted(spy.acked) == sorted(ids)  # every job, exactly once
        assert spy.ack_errors == [] and spy.nacks == [] and spy.reserve_errors == []
        assert all(attempt == 1 for _, attempt in spy.delivered)
        assert len(spy.delivered) == 1000  # no redelivery
        assert 1 < most <= 32
        assert await queue_is_empty(client)
        figures(
            "1000 jobs",
            seconds=f"{elapsed:.2f}",
            jobs_per_s=f"{1000 / elapsed:.0f}",
            max_concurrent=most,
            redeliveries=len(spy.delivered) - 1000,
        )


async def test_retry_after_delay_is_observed() -> None:
    async with server_and_client(config()) as (_, client):
        (job_id,) = await enqueue(client, 1)
        spy = Spy(client)
        worker = worker_for(spy)
        seen: list[tuple[int, float]] = []

        @worker.handler("task")
        async def task(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            seen.append((ctx.attempt, trio.current_time()))
            if ctx.attempt == 1:
                raise HandlerError.retry_after("backend busy", 1.5)

        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await wait_until(lambda: len(spy.acked) == 1, timeout=15)
            worker.shutdown()
        assert [a for a, _ in seen] == [1, 2]
        gap = seen[1][1] - seen[0][1]
        assert gap >= 1.45  # not before its delay (no upper bound: a loaded machine is slow)
        # Back by the nack's delay, not by its lease's end: the nack said 1.5 s.
        assert spy.nacks == [(job_id, "backend busy", sepp.Retry.after(1.5))]
        figures("retry_after 1.5s", observed_delay=f"{gap:.2f}s", redeliveries=1)


async def test_permanent_failure_is_dead_lettered_with_its_reason() -> None:
    async with server_and_client(config()) as (_, client):
        (job_id,) = await enqueue(client, 1)
        spy = Spy(client)
        worker = worker_for(spy)

        @worker.handler("task")
        async def task(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            raise HandlerError.permanent("malformed address: n=0")

        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await wait_until(lambda: len(spy.nacks) == 1, timeout=10)
            worker.shutdown()
        (record,) = await client.drain_dead_letters(QUEUE)
        assert record.job_id == job_id
        assert record.cause is sepp.DeadLetterCause.REJECTED
        assert record.last_reason == "malformed address: n=0"
        assert record.final_attempt == 1
        assert len(spy.delivered) == 1


async def test_unknown_type_comes_back_later_for_a_worker_that_knows_it() -> None:
    async with server_and_client(config()) as (_, client):
        (job_id,) = await enqueue(client, 1, job_type="added_in_v2")
        old = Spy(client)
        old_worker = worker_for(old, unknown_types=sepp.Backoff(2, jitter=0))

        @old_worker.handler("task")
        async def task(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None: ...

        async with trio.open_nursery() as nursery:
            await nursery.start(old_worker.run)
            await wait_until(lambda: len(old.nacks) == 1, timeout=10)
            nacked_at = trio.current_time()
            old_worker.shutdown()
        assert old.nacks[0][1:] == (
            "no handler registered for job type 'added_in_v2' on this worker",
            sepp.Retry.after(2),
        )

        new = Spy(client)
        new_worker = worker_for(new)
        taken: list[tuple[int, float]] = []

        @new_worker.handler("added_in_v2")
        async def added(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            taken.append((ctx.attempt, trio.current_time()))

        async with trio.open_nursery() as nursery:
            await nursery.start(new_worker.run)
            await wait_until(lambda: len(new.acked) == 1, timeout=10)
            new_worker.shutdown()
        assert new.acked == [job_id]
        assert taken[0][0] == 2
        # 2 s from the server's nack; we stamped ours a moment after it answered
        assert taken[0][1] - nacked_at >= 1.9


async def test_unknown_types_can_be_dead_lettered_at_once() -> None:
    async with server_and_client(config()) as (_, client):
        (job_id,) = await enqueue(client, 1, job_type="nobody_knows")
        spy = Spy(client)
        log = RecordingLogger()
        worker = worker_for(spy, unknown_types="dead_letter", logger=log)

        @worker.handler("task")
        async def task(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None: ...

        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await wait_until(lambda: len(spy.nacks) == 1, timeout=10)
            worker.shutdown()
        (record,) = await client.drain_dead_letters(QUEUE)
        assert (record.job_id, record.cause) == (job_id, sepp.DeadLetterCause.REJECTED)
        assert (
            record.last_reason == "no handler registered for job type 'nobody_knows' on this worker"
        )
        errors = log.at("error")
        assert len(errors) == 2  # the unknown type (with what this worker handles), the loss
        assert "this worker handles: task" in errors[0]
        assert "dead-lettered: no handler for its type" in errors[1]
        assert "keeps no dead letters" not in errors[1]  # this server keeps them


async def test_auto_extend_keeps_a_slow_handler_past_its_lease() -> None:
    # The queue clamps leases to 1 s; the handler takes 3.5 s.
    async with server_and_client(config(max_lease_duration_ms=1000)) as (_, client):
        (job_id,) = await enqueue(client, 1)
        spy = Spy(client)
        worker = worker_for(spy, lease_duration=30, auto_extend=True, max_in_flight=4)

        @worker.handler("task")
        async def task(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            await trio.sleep(3.5)

        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await wait_until(lambda: len(spy.acked) == 1, timeout=15)
            worker.shutdown()
        assert spy.acked == [job_id]
        # Acked without error by its first and only delivery: the lease held throughout (a
        # lost one makes the ack fail), so the job is gone and cannot come back.
        assert spy.delivered == [(job_id, 1)]
        assert spy.ack_errors == []
        assert spy.extends >= 6  # about every third of a second
        assert await queue_is_empty(client)
        figures(
            "auto_extend", lease="1s clamped", handler="3.5s", extends=spy.extends, redeliveries=0
        )


async def test_without_auto_extend_the_handler_is_cut_off_at_its_lease_and_never_overlaps() -> None:
    async with server_and_client(config(max_lease_duration_ms=1000)) as (_, client):
        (job_id,) = await enqueue(client, 1)
        spy = Spy(client)
        log = RecordingLogger()
        worker = worker_for(spy, lease_duration=1, auto_extend=False, max_in_flight=4, logger=log)
        runs: list[tuple[int, float, float]] = []
        running: set[int] = set()
        overlapped = False
        cut_off: list[int] = []  # attempts whose handler was cancelled
        cut_before_expiry_s: list[float] = []  # how long before its lease's expiry, each

        @worker.handler("task")
        async def task(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            nonlocal overlapped
            overlapped = overlapped or bool(running)
            running.add(ctx.attempt)
            began = trio.current_time()
            try:
                if ctx.attempt == 1:
                    await trio.sleep(12)  # far past its 1 s lease
            except trio.Cancelled:
                cut_off.append(ctx.attempt)
                now = datetime.now(timezone.utc)
                cut_before_expiry_s.append((ctx.lease_expires_at - now).total_seconds())
                raise
            finally:
                running.discard(ctx.attempt)
                runs.append((ctx.attempt, began, trio.current_time()))

        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await wait_until(lambda: len(spy.acked) == 1, timeout=15)
            worker.shutdown()
        (first, second) = runs
        # Cancelled (its 12 s never ran out), once its lease ended (the worker's own deadline,
        # from the lease the server granted: not from the handler's start, which comes later
        # by what reserving and dispatching took, over 0.1 s on riscv64 under qemu; no upper
        # bound on the seconds: a loaded machine is slow).
        assert first[0] == 1 and cut_off == [1] and cut_before_expiry_s[0] <= 0.1
        assert second[0] == 2 and second[1] >= first[2] and not overlapped
        assert spy.delivered == [(job_id, 1), (job_id, 2)]
        assert spy.acked == [job_id] and spy.ack_errors == [] and spy.nacks == []
        assert any("the lease ran out (auto_extend is off)" in m for m in log.at("error"))
        figures("no auto_extend", handler_cut_after=f"{first[2] - first[1]:.2f}s", redeliveries=1)


async def test_a_failed_job_comes_back_only_after_its_backoff_delay() -> None:
    async with server_and_client(config()) as (_, client):
        (job_id,) = await enqueue(client, 1)
        spy = Spy(client)
        worker = worker_for(spy, backoff=sepp.Backoff(2, jitter=0))

        @worker.handler("task")
        async def task(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            raise ConnectionError("upstream down")

        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await wait_until(lambda: len(spy.nacks) == 1, timeout=10)
            worker.shutdown()
        # From the moment the nack was sent: the server cannot start the delay earlier (the
        # poll above sees the nack late under load, which once made the delay look 1.8 s).
        (nacked_at,) = spy.nack_sent_at
        assert spy.nacks == [
            (job_id, "handler raised ConnectionError: upstream down", sepp.Retry.after(2))
        ]
        # Not ready before the delay: an immediate reserve finds nothing ...
        assert await queue_is_empty(client)
        # ... and a long-poll gets it once the delay passed (the sweep promotes ≤ ~1 s late).
        jobs = await client.reserve(QUEUE, lease_duration=5, wait_timeout=10)
        came_back = trio.current_time() - nacked_at
        # Within the long poll's 10 s, far below the worker's 30 s lease: back by the nack's
        # delay (the server's wait bounds it, not a wall-clock assertion here).
        assert jobs is not None and [(j.id, j.ctx.attempt) for j in jobs] == [(job_id, 2)]
        assert came_back >= 1.9
        figures("backoff 2s", observed_delay=f"{came_back:.2f}s")


async def test_a_handler_past_its_timeout_is_cancelled_and_its_job_nacked() -> None:
    async with server_and_client(config()) as (_, client):
        ack = await client.enqueue(QUEUE, "task", max_attempts=1)
        spy = Spy(client)
        log = RecordingLogger()
        worker = worker_for(spy, timeout=0.5, logger=log)
        ended: list[float] = []
        cancelled: list[bool] = []

        @worker.handler("task")
        async def task(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            began = trio.current_time()
            try:
                await trio.sleep(30)
            except trio.Cancelled:
                cancelled.append(True)
                raise
            finally:
                ended.append(trio.current_time() - began)

        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await wait_until(lambda: len(spy.nacks) == 1, timeout=10)
            worker.shutdown()
        # Cancelled (its 30 s never ran out), not before its timeout.
        assert cancelled == [True] and len(ended) == 1 and ended[0] >= 0.5
        (record,) = await client.drain_dead_letters(QUEUE)  # its only attempt
        assert record.job_id == ack.job_id
        assert "ran past its 0.5s timeout" in (record.last_reason or "")
        (error,) = log.at("error")
        assert "dead-lettered: timed out on its final attempt" in error


async def test_handlers_share_the_lifespans_state_and_enqueue_follow_ups_with_ctx_client() -> None:
    async with server_and_client(config()) as (_, client):
        await client.enqueue(QUEUE, "order", payload=sepp.Payload.json({"id": 7}))
        spy = Spy(client)
        events: list[str] = []

        @asynccontextmanager
        async def lifespan(worker: sepp.Worker) -> AsyncIterator[dict[str, list[str]]]:
            events.append("open pool")
            yield {"sent": []}
            events.append("close pool")

        async def middleware(job: sepp.Job, call_next: sepp.CallNext) -> None:
            events.append(f"before {job.ctx.job_type}")
            await call_next()
            events.append(f"after {job.ctx.job_type}")

        router = sepp.Router(lifespan=lifespan, middleware=[middleware])

        @router.handler("order")
        async def order(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            assert payload is not None
            # The worker's client (here the spy), which reserved this job: enqueue with it.
            await ctx.client.client.enqueue(QUEUE, "receipt", payload=payload)

        @router.handler("receipt")
        async def receipt(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            assert payload is not None
            ctx.state["sent"].append(payload.json()["id"])
            events.append("receipt sent")

        async def outermost(job: sepp.Job, call_next: sepp.CallNext) -> None:
            events.append("worker in")
            await call_next()
            events.append("worker out")

        # One job at a time: with more, the receipt may start before the order's middleware
        # is done, and the order of the events below would depend on the scheduler.
        worker = worker_for(spy, handlers=router, middleware=[outermost], max_in_flight=1)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await wait_until(lambda: len(spy.acked) == 2, timeout=10)
            worker.shutdown()
        assert events == [
            *("open pool", "worker in", "before order", "after order", "worker out"),
            *("worker in", "before receipt", "receipt sent", "after receipt", "worker out"),
            "close pool",
        ]


async def test_dead_letters_are_logged_once_saying_when_the_server_keeps_none() -> None:
    # The real server's default; a test server keeps them unless told not to.
    cfg = {
        "admin": {"enabled": False},
        "storage": {"persist_mode": "buffer", "dead_letter_retention_ms": 0},
    }
    async with server_and_client(cfg) as (_, client):
        await client.enqueue(QUEUE, "task", max_attempts=2)
        spy = Spy(client)
        log = RecordingLogger()
        worker = worker_for(spy, backoff=sepp.Backoff(0.1, jitter=0), logger=log)

        @worker.handler("task")
        async def task(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            raise ValueError("bad row")

        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await wait_until(lambda: len(spy.nacks) == 2, timeout=10)
            worker.shutdown()
        (warning,) = log.at("warning")
        assert "(1/2) failed: the handler raised ValueError: bad row; retrying in 0.1s" in warning
        (error,) = log.at("error")
        assert "(2/2) dead-lettered: failed: the handler raised ValueError: bad row" in error
        assert "this server keeps no dead letters" in error


async def test_sigterm_shutdown_mid_run_leaves_no_job_in_flight() -> None:
    async with server_and_client(config()) as (_, client):
        ids = await enqueue(client, 200)
        spy = Spy(client)
        worker = worker_for(spy, max_in_flight=16, lease_duration=30, shutdown_timeout=0.3)

        @worker.handler("task")
        async def task(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            assert payload is not None
            n = payload.json()["n"]
            await trio.sleep(10 if n % 10 == 9 else 0.05 * (n % 10))  # some outlast the grace

        async def stop_on_sigterm(task_status: trio.TaskStatus[None]) -> None:
            with trio.open_signal_receiver(signal.SIGTERM) as signals:
                task_status.started()
                async for _ in signals:
                    worker.shutdown()
                    return

        acked_at_signal = 0
        async with trio.open_nursery() as nursery:
            await nursery.start(stop_on_sigterm)
            await nursery.start(worker.run)
            await wait_until(lambda: len(spy.acked) >= 40, timeout=30)
            acked_at_signal = len(spy.acked)
            os.kill(os.getpid(), signal.SIGTERM)
            signalled = trio.current_time()
        shutdown_s = trio.current_time() - signalled
        assert worker.in_flight == 0
        shutdown_nacks = [n for n in spy.nacks if n[1] == "worker shutdown"]
        assert spy.nacks == shutdown_nacks  # the only nacks were the shutdown's
        assert shutdown_nacks, "no handler outlasted the grace: the test proved less than it says"
        assert all(retry == sepp.Retry.after(0) for _, _, retry in shutdown_nacks)
        # The shutdown did not wait for the 10 s handlers (counted, not timed): none running
        # at the signal was acked after it; they were cancelled at the grace's end and nacked.
        sleepers = {job_id for n, job_id in enumerate(ids) if n % 10 == 9}
        assert not sleepers & set(spy.acked[acked_at_signal:])
        assert sleepers & {job_id for job_id, _, _ in shutdown_nacks}  # some were running

        # Every job that was not acked is reservable at once (no wait): none is stuck in a
        # lease (30 s), whatever the time this took.
        expected = set(ids) - set(spy.acked)
        back: list[str] = []
        while jobs := await client.reserve(QUEUE, lease_duration=60, wait_timeout=0, max_jobs=64):
            back.extend(job.ctx.id for job in jobs)
        assert Counter(spy.acked).most_common(1)[0][1] == 1
        assert sorted(back) == sorted(expected)  # acked or back in the queue; none lost
        figures(
            "SIGTERM mid-run",
            jobs=200,
            acked_before=len(spy.acked),
            returned_by_shutdown=len(shutdown_nacks),
            never_reserved=len(expected) - len(shutdown_nacks),
            shutdown_s=f"{shutdown_s:.2f}",
        )


async def test_worker_rides_out_a_server_restart_and_finishes_on_its_own() -> None:
    async with server_and_client(config(max_lease_duration_ms=2000)) as (server, client):
        ids = await enqueue(client, 300)
        spy = Spy(client)
        log = RecordingLogger()
        worker = worker_for(
            spy, max_in_flight=8, lease_duration=2, reserve_error_backoff=0.2, logger=log
        )
        handled: Counter[str] = Counter()

        @worker.handler("task")
        async def task(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            handled[ctx.id] += 1
            await trio.sleep(0.04)

        began = time.monotonic()
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await wait_until(lambda: len(spy.acked) >= 60, timeout=30)
            await server.stop()
            down_at = len(spy.acked)
            await trio.sleep(1.5)
            await server.start()
            await wait_until(lambda: set(spy.acked) >= set(ids), timeout=90)
            elapsed = time.monotonic() - began
            worker.shutdown()
        assert set(spy.acked) == set(ids)  # every job done, without restarting the worker
        assert spy.reserve_errors, "the outage was not noticed: the test proved nothing"
        assert len(spy.acked) - down_at > 200
        assert log.matching("reserve works again after")  # it noticed, and recovered by itself
        redelivered = sum(1 for _, attempt in spy.delivered if attempt > 1)
        assert await queue_is_empty(client)
        figures(
            "server restart",
            jobs=300,
            seconds=f"{elapsed:.2f}",
            reserve_failures=len(spy.reserve_errors),
            failed_acks=len(spy.ack_errors),
            redeliveries=redelivered,
            handled_twice=sum(1 for n in handled.values() if n > 1),
            warnings=len(log.at("warning")),
        )


async def test_burst_mode_works_every_ready_job_then_returns_by_itself() -> None:
    async with server_and_client(config()) as (_, client):
        ids = await enqueue(client, 40)
        info = await client.get_server_info()
        later = info.server_time + timedelta(hours=1)
        await client.enqueue(sepp.EnqueueRequest(QUEUE, "task", scheduled_at=later))
        spy = Spy(client)
        worker = worker_for(spy, max_in_flight=8)
        attempts: Counter[str] = Counter()

        @worker.handler("task")
        async def task(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            attempts[ctx.id] += 1
            await trio.sleep(0.01)
            if ctx.attempt == 1 and payload is not None and payload.json()["n"] % 10 == 0:
                raise HandlerError.retry_after("once more", 0)  # comes back at once

        with trio.fail_after(60):
            await worker.run(until_idle=True)
        assert sorted(spy.acked) == sorted(ids)  # the retried ones too, on their second try
        assert sum(attempts.values()) == 44
        assert worker.in_flight == 0
        # The scheduled job was not waited for, and no long poll was sent.
        assert len(spy.delivered) == 44
        assert await queue_is_empty(client)


async def test_burst_mode_on_empty_queues_returns_at_once() -> None:
    async with server_and_client(config()) as (_, client):
        spy = Spy(client)
        worker = worker_for(spy)
        reserves: list[float] = []
        original = spy.reserve

        async def reserve(*args: Any, **kwargs: Any) -> list[sepp.Job] | None:
            reserves.append(kwargs["wait_timeout"])
            return await original(*args, **kwargs)

        spy.reserve = reserve  # type: ignore[method-assign]

        @worker.handler("task")
        async def task(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            pass

        with trio.fail_after(60):
            await worker.run(until_idle=True)
        assert spy.delivered == [] and reserves == [0.0]  # one reserve, which did not wait
