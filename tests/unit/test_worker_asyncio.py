"""The Worker and the Scheduler under asyncio and uvloop (through anyio), against the same
scripted fakes as the trio tests. asyncio has no MockClock: these tests wait for events (a
handler started, a call recorded), never for a window of wall-clock time."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import itertools
import signal
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from fixtures.fake_client import FakeClient, RecordingLogger
from fixtures.fake_scheduler_server import FakeServer

import sepp
from sepp import Retry
from sepp._runtime import asyncio_runtime, concurrency

LOOPS = ["asyncio", pytest.param("uvloop", marks=pytest.mark.needs("uvloop"))]


def run_on(loop: str, main: Callable[[], Awaitable[None]]) -> None:
    """Run `main` on a fresh loop of that kind, the way an application does."""
    if loop == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def make_worker(fake: FakeClient, **options: Any) -> sepp.Worker:
    options.setdefault("queues", ["q"])
    options.setdefault("logger", RecordingLogger())
    options.setdefault("backoff", Retry.DEFAULT)
    return sepp.Worker(fake, _wall_clock=fake.now, **options)


async def wait_for(condition: Callable[[], bool]) -> None:
    """Until the fake has recorded what `condition` checks (it has no hooks to signal it)."""
    while not condition():  # noqa: ASYNC110 - each pass lets the loop run: no wall-clock window
        await asyncio.sleep(0)


@asynccontextmanager
async def running(worker: sepp.Worker) -> AsyncIterator[None]:
    """The worker runs in a plain asyncio task for the block, then shuts down gracefully."""
    task = asyncio.create_task(worker.run())
    await worker.wait_until_reserving()
    yield
    worker.shutdown()
    await task


@pytest.mark.parametrize("loop", LOOPS)
def test_jobs_are_handled_once_each_and_the_worker_leaves_no_task_behind(loop: str) -> None:
    fake = FakeClient()
    ids = [fake.add("work") for _ in range(20)]
    seen: list[str] = []

    async def main() -> None:
        worker = make_worker(fake, max_in_flight=4)

        @worker.handler("work")
        async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            await asyncio.sleep(0)  # a native asyncio await inside the handler
            seen.append(ctx.id)

        async with running(worker):
            await wait_for(lambda: len(fake.acks) == len(ids))
        assert worker.in_flight == 0
        assert asyncio.all_tasks() == {asyncio.current_task()}

    run_on(loop, main)
    assert sorted(seen) == sorted(ids)
    assert sorted(call.job_id for call in fake.acks) == sorted(ids)
    assert fake.nacks == []


def test_an_anyio_task_group_starts_the_worker_once_it_is_reserving() -> None:
    fake = FakeClient()

    async def main() -> None:
        worker = make_worker(fake)
        async with anyio.create_task_group() as group:
            await group.start(worker.run)
            assert len(fake.reserve_calls) == 1  # start returned with the reserve sent
            worker.shutdown()

    asyncio.run(main())
    # The first reserve does not wait: the shutdown let it finish, and no long poll followed.
    assert [(c.wait_timeout, c.cancelled) for c in fake.reserve_calls] == [(0, False)]


def test_wait_until_reserving_returns_when_the_worker_ends_before_it_reserved() -> None:
    @asynccontextmanager
    async def failing_lifespan() -> AsyncIterator[None]:
        raise RuntimeError("no database")
        yield

    async def main() -> None:
        worker = make_worker(FakeClient())
        worker.shutdown()
        task = asyncio.create_task(worker.run())
        await worker.wait_until_reserving()
        await task
        await worker.wait_until_reserving()  # at once, afterwards too

        broken = make_worker(FakeClient(), lifespan=failing_lifespan)
        task = asyncio.create_task(broken.run())
        await broken.wait_until_reserving()  # returns: the run ended before reserving
        with pytest.raises(RuntimeError, match="no database"):
            await task

    asyncio.run(main())


@pytest.mark.parametrize("from_thread", [False, True])
def test_shutdown_now_cancels_a_running_handler_and_returns_its_job(from_thread: bool) -> None:
    fake = FakeClient()
    job_id = fake.add("work")
    outcome: list[str] = []

    async def main() -> None:
        worker = make_worker(fake)
        started = asyncio.Event()

        @worker.handler("work")
        async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                outcome.append("cancelled")
                raise

        task = asyncio.create_task(worker.run())
        await started.wait()
        if from_thread:
            thread = threading.Thread(target=worker.shutdown, kwargs={"now": True})
            thread.start()
            await asyncio.to_thread(thread.join)
        else:
            worker.shutdown(now=True)
        await task

    asyncio.run(main())
    assert outcome == ["cancelled"]
    assert [(c.job_id, c.retry, c.reason) for c in fake.nacks] == [
        (job_id, Retry.after(0), "worker shutdown")
    ]
    assert fake.acks == []


def test_a_graceful_shutdown_from_another_thread_waits_for_the_running_handler() -> None:
    fake = FakeClient()
    job_id = fake.add("work")

    async def main() -> None:
        worker = make_worker(fake)
        started, release = asyncio.Event(), asyncio.Event()

        @worker.handler("work")
        async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            started.set()
            await release.wait()

        task = asyncio.create_task(worker.run())
        await started.wait()
        handle = worker.shutdown_handle()
        await asyncio.to_thread(handle.shutdown)
        await wait_for(lambda: worker.is_shutdown)
        assert not task.done()
        release.set()
        await task

    asyncio.run(main())
    assert [call.job_id for call in fake.acks] == [job_id]


def test_handler_timeout_nacks_the_job_as_timed_out() -> None:
    fake = FakeClient()
    fake.add("slow")

    async def main() -> None:
        worker = make_worker(fake, timeout=0.001)

        @worker.handler("slow")
        async def slow(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            await asyncio.Event().wait()

        async with running(worker):
            await wait_for(lambda: bool(fake.nacks))

    asyncio.run(main())
    assert fake.nacks[0].reason is not None and "timeout" in fake.nacks[0].reason


class _RefusingExecutor(concurrent.futures.ThreadPoolExecutor):
    def submit(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the loop's default executor was used")


def test_def_handlers_run_in_threads_bounded_by_max_in_flight_not_the_default_executor() -> None:
    fake = FakeClient()
    for _ in range(9):
        fake.add("blocking")
    lock = threading.Lock()
    running_now = 0
    most = 0
    threads: set[int] = set()
    three_at_once = threading.Barrier(3, timeout=30)

    def blocking(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        nonlocal running_now, most
        with lock:
            running_now += 1
            most = max(most, running_now)
            threads.add(threading.get_ident())
        try:
            three_at_once.wait()  # each round of three runs together, or this raises
        finally:
            with lock:
                running_now -= 1

    async def main() -> None:
        asyncio.get_running_loop().set_default_executor(_RefusingExecutor())
        worker = make_worker(fake, max_in_flight=3)
        worker.handle("blocking", blocking)
        async with running(worker):
            await wait_for(lambda: len(fake.acks) + len(fake.nacks) == 9)

    main_thread = threading.get_ident()
    asyncio.run(main())
    assert most == 3
    assert main_thread not in threads
    assert fake.nacks == []


REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id")


def test_context_variables_reach_async_and_def_handlers() -> None:
    fake = FakeClient()
    fake.add("async")
    fake.add("def")
    seen: dict[str, tuple[str, str]] = {}
    TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("tenant")

    async def with_request_id(job: sepp.Job, call_next: Callable[[], Awaitable[None]]) -> None:
        REQUEST_ID.set(f"req-{job.ctx.job_type}")
        await call_next()

    @asynccontextmanager
    async def lifespan() -> AsyncIterator[None]:
        TENANT.set("acme")  # set in the run's own task: every job's task inherits it
        yield

    async def in_loop(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        seen["async"] = (REQUEST_ID.get(), TENANT.get())

    def in_thread(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        seen["def"] = (REQUEST_ID.get(), TENANT.get())

    async def main() -> None:
        worker = make_worker(fake, middleware=[with_request_id], lifespan=lifespan)
        worker.handle("async", in_loop)
        worker.handle("def", in_thread)
        async with running(worker):
            await wait_for(lambda: len(fake.acks) == 2)

    asyncio.run(main())
    assert seen == {"async": ("req-async", "acme"), "def": ("req-def", "acme")}


def test_the_worker_installs_no_signal_handler_and_leaves_the_loop_open() -> None:
    fake = FakeClient()
    fake.add("work")
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    during: dict[signal.Signals, Any] = {}
    loop = asyncio.new_event_loop()

    async def main() -> None:
        worker = make_worker(fake)

        @worker.handler("work")
        async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            during.update({sig: signal.getsignal(sig) for sig in before})

        async with running(worker):
            await wait_for(lambda: bool(fake.acks))

    try:
        loop.run_until_complete(main())
        assert not loop.is_closed()
        assert loop.run_until_complete(asyncio.sleep(0, "still usable")) == "still usable"
    finally:
        loop.close()
    assert during == before


def test_a_worker_under_asyncio_without_anyio_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "anyio", None)
    # A runtime that has not loaded anyio's members yet, as in a fresh process.
    monkeypatch.setattr(asyncio_runtime, "ASYNCIO", asyncio_runtime.AsyncioRuntime())
    worker = make_worker(FakeClient())

    async def main() -> None:
        with pytest.raises(
            sepp.SeppError, match=r"needs anyio: pip install 'sepp-trio\[asyncio\]'"
        ):
            await worker.run()

    asyncio.run(main())


def test_the_runtime_is_chosen_by_the_running_library() -> None:
    async def on_asyncio() -> concurrency.ServiceRuntime:
        return concurrency.current()

    assert asyncio.run(on_asyncio()) is asyncio_runtime.ASYNCIO
    assert asyncio_runtime.ASYNCIO.name == "asyncio"

    import trio

    async def on_trio() -> concurrency.ServiceRuntime:
        return concurrency.current()

    assert trio.run(on_trio) is concurrency.TRIO


@pytest.mark.parametrize("loop", LOOPS)
def test_the_scheduler_enqueues_consecutive_occurrences_under_asyncio(loop: str) -> None:
    fake = FakeServer()
    schedule = sepp.Schedule().every("tick", 1, "q", "t")

    async def main() -> None:
        scheduler = sepp.Scheduler(fake, schedule, lookahead=5, missed="skip", grace=0)
        async with anyio.create_task_group() as group:
            await group.start(scheduler.run)
            await wait_for(lambda: len(fake.calls) >= 3)
            scheduler.shutdown()

    run_on(loop, main)
    keys = [call.request.idempotency_key for call in fake.calls]
    assert len(keys) == len(set(keys))  # each occurrence once
    times = [call.request.scheduled_at for call in fake.calls]
    assert times == sorted(times)
    assert all((b - a).total_seconds() == 1 for a, b in itertools.pairwise(times))


async def http_get(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    answer = await reader.read()  # the responder closes after its answer
    writer.close()
    await writer.wait_closed()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_the_monitor_serves_probes_and_metrics_under_asyncio() -> None:
    fake = FakeClient()
    fake.add("work")
    answers: dict[str, tuple[int, bytes]] = {}

    async def main() -> None:
        monitor = sepp.WorkerMonitor()
        worker = make_worker(fake, monitor=monitor)

        @worker.handler("work")
        async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None: ...

        async with anyio.create_task_group() as group:
            port = await group.start(functools.partial(monitor.serve, 0, host="127.0.0.1"))
            async with running(worker):
                await wait_for(lambda: bool(fake.acks))
                for path in ("/healthz", "/readyz", "/metrics", "/nope"):
                    answers[path] = await http_get(port, path)
            group.cancel_scope.cancel()

    asyncio.run(main())
    assert answers["/healthz"][0] == answers["/readyz"][0] == 200
    assert (
        answers["/metrics"][0] == 200
        and b'sepp_worker_jobs_succeeded_total{queue="q",job_type="work"} 1'
        in answers["/metrics"][1]
    )
    assert answers["/nope"][0] == 404


TRIO_WORKER = """
import sys
import trio
import sepp


class Idle:
    async def reserve(self, queues, **options):
        if options["wait_timeout"]:  # the long poll, after a first reserve that does not wait
            await trio.sleep_forever()

    async def ack(self, ctx, **options): ...
    async def nack(self, ctx, **options): ...
    async def extend(self, ctx, lease_duration, **options): ...


async def main():
    worker = sepp.Worker(Idle(), "q")
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        worker.shutdown()


trio.run(main)
print(sorted(m for m in sys.modules if m.split(".")[0] == "anyio" or "anyio" in m))
"""


def test_a_worker_on_trio_imports_no_anyio() -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", TRIO_WORKER], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


def hard_stop_while_handling(
    fake: FakeClient, after_cancel: Callable[[str], Awaitable[None]]
) -> None:
    """Run a worker on `fake` until its handler waits, cancel the task that runs it, and check
    that nothing is left; the handler, once cancelled, runs `after_cancel(job_id)`."""

    async def main() -> None:
        worker = make_worker(fake)
        started = asyncio.Event()

        @worker.handler("work")
        async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await after_cancel(ctx.id)

        task = asyncio.create_task(worker.run())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())


def test_cancelling_the_task_that_runs_the_worker_is_the_hard_stop() -> None:
    fake = FakeClient()
    job_id = fake.add("work")
    cancelled: list[str] = []

    async def reraise(job: str) -> None:
        cancelled.append(job)
        raise asyncio.CancelledError

    hard_stop_while_handling(fake, reraise)
    assert cancelled == [job_id]
    assert fake.acks == [] and fake.nacks == []  # its lease runs out on the server


def test_the_hard_stop_is_level_triggered_for_a_handler_that_swallows_it() -> None:
    fake = FakeClient()
    job_id = fake.add("work")
    seen: list[str] = []

    async def swallow_then_await(job: str) -> None:
        seen.append("swallowed")
        try:
            await asyncio.sleep(0)  # as trio and anyio do: every await raises until it ends
        except asyncio.CancelledError:
            seen.append(f"cancelled again {job}")
            raise
        seen.append("went on")

    hard_stop_while_handling(fake, swallow_then_await)
    assert seen == ["swallowed", f"cancelled again {job_id}"]


def test_a_base_exception_from_a_handler_ends_the_run_as_a_nursery_does() -> None:
    class Boom(BaseException):
        pass

    fake = FakeClient()
    fake.add("work")

    async def main() -> None:
        worker = make_worker(fake)

        @worker.handler("work")
        async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            raise Boom

        running = asyncio.create_task(worker.run())
        # Not a window on the time it takes (at once): a guard that keeps a regression, a run
        # that goes on reserving after the failure, from hanging the suite.
        done, _ = await asyncio.wait({running}, timeout=30)
        assert running in done, "the run went on after its job task failed"
        with pytest.raises(BaseExceptionGroup) as raised:
            running.result()
        assert raised.group_contains(Boom)
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())
