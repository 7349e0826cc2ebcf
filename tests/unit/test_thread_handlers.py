"""`def` handlers: a Router or Worker runs them in worker threads, bounded by max_in_flight, with
ctx and HandlerError as for async handlers; lease loss and forced shutdown abandon the thread
and discard its result (the job is not acked).

These run on trio's real clock (a thread's progress is invisible to MockClock's autojump, which
would race virtual time ahead of it); threads are paced by events, never by sleeps.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import pytest
import trio
from fixtures.fake_client import FakeClient, RecordingLogger

import sepp
from sepp import HandlerError, Retry
from sepp.testing import job_context

BOUND_S = 30  # only a bound on a hung test; never part of an assertion


def make_worker(fake: FakeClient, **options: Any) -> sepp.Worker:
    options.setdefault("queues", ["q"])
    options.setdefault("logger", RecordingLogger())
    options.setdefault("wait_timeout", 0.2)
    options.setdefault("backoff", Retry.DEFAULT)  # exact nacks: the queue's policy, no delay
    return sepp.Worker(fake, _wall_clock=fake.now, **options)


async def wait_until(condition: Callable[[], bool]) -> None:
    with trio.fail_after(BOUND_S):
        while not condition():  # noqa: ASYNC110 - state other threads change
            await trio.sleep(0.01)


async def wait_event(event: threading.Event) -> None:
    assert await trio.to_thread.run_sync(event.wait, BOUND_S)


def test_router_and_worker_accept_def_handlers() -> None:
    def plain(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None: ...

    router = sepp.Router().handle("a", plain)
    assert router.catch_all(plain) is plain  # the decorator gives the function back
    handler = router.lookup("a")
    assert handler is not None and handler is not plain
    assert handler.__wrapped__ is plain  # type: ignore[attr-defined]
    worker = make_worker(FakeClient())
    assert worker.handler("b")(plain) is plain
    with pytest.raises(sepp.ValidationError):
        worker.handle("c", 42)  # type: ignore[arg-type]


async def test_a_def_handler_runs_in_a_thread_with_ctx_and_its_return_acks() -> None:
    fake = FakeClient()
    worker = make_worker(fake)
    seen: list[tuple[str, bool]] = []

    @worker.handler("work")
    def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        assert payload is not None and payload.json() == {"n": 1}
        seen.append((ctx.job_type, threading.current_thread() is threading.main_thread()))

    job_id = fake.add("work", payload=sepp.Payload.json({"n": 1}))
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_until(lambda: bool(fake.acks))
        worker.shutdown()
    assert seen == [("work", False)]
    assert [(c.job_id, c.error) for c in fake.acks] == [(job_id, None)]
    assert fake.nacks == []


async def test_handler_error_and_other_exceptions_from_a_def_handler_nack() -> None:
    fake = FakeClient()
    worker = make_worker(fake)

    @worker.handler("later")
    def later(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        raise HandlerError.retry_after("busy", 7)

    @worker.handler("broken")
    def broken(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        raise KeyError("missing")

    later_id, broken_id = fake.add("later"), fake.add("broken")
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_until(lambda: len({c.job_id for c in fake.nacks}) == 2)
        worker.shutdown()
    by_id = {c.job_id: c for c in reversed(fake.nacks)}  # each job's first nack
    assert by_id[later_id].retry == Retry.after(7) and by_id[later_id].reason == "busy"
    assert by_id[broken_id].retry == Retry.DEFAULT and "KeyError" in str(by_id[broken_id].reason)
    assert fake.acks == []


async def test_a_blocked_def_handler_does_not_stall_the_others() -> None:
    fake = FakeClient()
    worker = make_worker(fake)
    release = threading.Event()

    @worker.handler("blocking")
    def blocking(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        release.wait(BOUND_S)

    @worker.handler("quick")
    async def quick(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        pass

    slow_id, quick_id = fake.add("blocking"), fake.add("quick")
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_until(lambda: bool(fake.acks))
        release.set()
        await wait_until(lambda: len(fake.acks) == 2)
        worker.shutdown()
    assert [c.job_id for c in fake.acks] == [quick_id, slow_id]


async def test_every_slot_of_max_in_flight_can_hold_a_running_thread() -> None:
    # 50 handlers must all be inside at once to pass the barrier: more threads than trio's
    # default limiter (40) allows, so only the worker's max_in_flight may bound them.
    fake = FakeClient()
    worker = make_worker(fake, max_in_flight=50, max_jobs=50)
    barrier = threading.Barrier(50, timeout=BOUND_S)
    running = 0
    most = 0
    lock = threading.Lock()

    @worker.handler("work")
    def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        barrier.wait()
        with lock:
            running -= 1

    for _ in range(50):
        fake.add("work")
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_until(lambda: len(fake.acks) == 50)
        worker.shutdown()
    assert most == 50  # all of them at once, never more than max_in_flight
    assert fake.nacks == []


async def test_lease_loss_abandons_the_thread_and_discards_its_result() -> None:
    fake = FakeClient()
    worker = make_worker(fake, lease_duration=0.3)
    release, finished = threading.Event(), threading.Event()

    async def lose(ctx: sepp.JobContext) -> None:
        raise sepp.JobNotFoundError("lease gone")

    fake.on_extend = lose

    @worker.handler("work")
    def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        release.wait(BOUND_S)
        finished.set()  # then returns normally: that would ack, were it not discarded

    fake.add("work")
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        log = worker._log._target
        assert isinstance(log, RecordingLogger)
        await wait_until(lambda: any("lost the lease" in m for m in log.at("error")))
        # The handler was given up, and its slot freed, while its thread still runs.
        await wait_until(lambda: worker.in_flight == 0)
        assert not finished.is_set()
        release.set()
        await wait_event(finished)
        worker.shutdown()
    assert fake.acks == [] and fake.nacks == []


async def test_forced_shutdown_nacks_for_retry_and_the_threads_result_is_discarded() -> None:
    fake = FakeClient()
    worker = make_worker(fake, shutdown_timeout=0)
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    @worker.handler("work")
    def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        started.set()
        release.wait(BOUND_S)
        finished.set()

    job_id = fake.add("work")
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_event(started)
        worker.shutdown()  # no grace: the handler is cancelled at once
    # run() returned while the thread still runs; its job went back for immediate retry.
    assert not finished.is_set()
    assert [(c.job_id, c.retry, c.reason) for c in fake.nacks] == [
        (job_id, Retry.after(0), "worker shutdown")
    ]
    release.set()
    await wait_event(finished)
    await trio.sleep(0.05)  # let anything the finished thread could trigger run: nothing does
    assert fake.acks == []


@dataclasses.dataclass
class Welcome:
    user: int


async def test_a_typed_def_handler_gets_its_payload_decoded_in_a_thread() -> None:
    fake = FakeClient()
    worker = make_worker(fake)
    seen: list[tuple[Welcome, bool]] = []
    trio_thread = threading.get_ident()

    @worker.handler("welcome")
    def welcome(job: Welcome, ctx: sepp.JobContext) -> None:
        seen.append((job, threading.get_ident() != trio_thread))

    done = fake.add("welcome", sepp.Payload.json({"user": 7}))
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_until(lambda: len(fake.acks) == 1)
        worker.shutdown()
    assert seen == [(Welcome(7), True)] and [c.job_id for c in fake.acks] == [done]


async def test_a_def_handlers_ctx_is_a_sync_job_context_sharing_the_jobs_lease() -> None:
    fake = FakeClient()
    worker = make_worker(fake)
    seen: dict[str, object] = {}

    @worker.handler("work")
    def work(payload: sepp.Payload | None, ctx: sepp.SyncJobContext) -> None:
        seen["types"] = (type(ctx), type(ctx.client))
        before = ctx.lease_expires_at
        granted = ctx.client.extend(ctx, 60)  # blocks; the fake's extend ran in the run
        seen["moved"] = granted == ctx.lease_expires_at and granted != before
        seen["str"] = str(ctx)

    job_id = fake.add("work")
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_until(lambda: bool(fake.acks))
        worker.shutdown()
    assert seen["types"] == (sepp.SyncJobContext, sepp.SyncClient)
    assert seen["moved"] is True and job_id in str(seen["str"])
    assert [c.job_id for c in fake.extends] == [job_id]


async def test_a_def_handler_returning_a_coroutine_fails_its_job_and_nothing_is_left_unawaited(
    recwarn: pytest.WarningsRecorder,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake)
    ran: list[str] = []

    async def the_real_work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        ran.append(ctx.id)

    def not_async_aware(payload: sepp.Payload | None, ctx: sepp.JobContext) -> Any:
        return the_real_work(payload, ctx)  # a decorator written for plain functions

    worker.handle("work", not_async_aware)
    job_id = fake.add("work")
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_until(lambda: bool(fake.nacks))
        worker.shutdown()
    assert fake.acks == [] and ran == []
    (nack, *_) = fake.nacks
    assert nack.job_id == job_id and "TypeError" in str(nack.reason)
    assert "returned coroutine, which nothing awaits" in str(nack.reason)
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


async def test_a_def_handlers_client_refuses_the_event_loops_thread_and_calls_after_it_ended() -> (
    None
):
    fake = FakeClient()
    worker = make_worker(fake)
    kept: list[sepp.SyncJobContext] = []
    release = threading.Event()
    errors: list[BaseException] = []

    @worker.handler("blocking")
    def blocking(payload: sepp.Payload | None, ctx: sepp.SyncJobContext) -> None:
        kept.append(ctx)
        release.wait(BOUND_S)

    @worker.handler("async")
    async def from_the_loop(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        try:  # in the loop's own thread a blocking call would wait for itself forever
            kept[0].client.extend(kept[0], 60)
        except sepp.ClientError as exc:
            errors.append(exc)
        release.set()

    fake.add("blocking")
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await wait_until(lambda: bool(kept))
        fake.add("async")
        await wait_until(lambda: len(fake.acks) == 2)
        worker.shutdown()
    with pytest.raises(sepp.ClientError, match="has ended"):  # the handler returned
        await trio.to_thread.run_sync(lambda: kept[0].client.extend(kept[0], 60))
    assert len(errors) == 1 and "would wait forever" in str(errors[0])
    assert fake.extends == []


def test_a_sync_job_context_without_a_client_says_so() -> None:
    from sepp._worker.thread_handlers import sync_job_context

    ctx = sync_job_context(job_context("t"), None)
    with pytest.raises(RuntimeError, match="no client"):
        ctx.client  # noqa: B018
