"""What a Worker does around each handler call: the handler's context (client, lifespan
state), middleware, retry backoff, dead-letter logs, unknown job types, time limits and
redeliveries of a job still running. Against the scripted FakeClient on trio's MockClock."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import itertools
import logging
import pickle
import traceback
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest
import trio
from fixtures.fake_client import FakeClient, RecordingLogger
from trio.testing import MockClock

import sepp
from sepp import HandlerError, Retry


def make_worker(fake: FakeClient, **options: Any) -> sepp.Worker:
    options.setdefault("queues", ["q"])
    options.setdefault("logger", RecordingLogger())
    return sepp.Worker(fake, _wall_clock=fake.now, **options)


def log_of(worker: sepp.Worker) -> RecordingLogger:
    target = worker._log._target
    assert isinstance(target, RecordingLogger)
    return target


@asynccontextmanager
async def running(worker: sepp.Worker) -> AsyncIterator[trio.Nursery]:
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        yield nursery
        worker.shutdown()


def delays(fake: FakeClient) -> list[float | None]:
    """Each nack's delay in seconds (None: the queue's policy or a dead letter)."""
    return [
        c.retry.delay.total_seconds() if c.retry and c.retry.delay else None for c in fake.nacks
    ]


# -- the handler's context and the worker's lifespan -----------------------------------------


async def test_handlers_get_the_workers_client_and_the_lifespans_state_in_order(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    events: list[str] = []

    @asynccontextmanager
    async def lifespan(worker: sepp.Worker) -> AsyncIterator[dict[str, str]]:
        assert worker.client is fake
        events.append(f"enter reserves={len(fake.reserve_calls)}")
        yield {"pool": "db"}
        events.append(f"exit settled={len(fake.acks)}")

    worker = make_worker(fake, lifespan=lifespan, shutdown_timeout=10)
    seen: list[tuple[object, object]] = []

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        seen.append((ctx.client, ctx.state))
        await trio.sleep(5)  # still running at shutdown: the lifespan waits for it
        events.append("handler done")

    fake.add()
    async with running(worker):
        await trio.sleep(1)
    assert seen == [(fake, {"pool": "db"})]
    assert events == ["enter reserves=0", "handler done", "exit settled=1"]


async def test_a_handler_enqueues_a_follow_up_with_ctx_client(autojump_clock: MockClock) -> None:
    fake = FakeClient()
    worker = make_worker(fake)
    followed: list[str] = []

    @worker.handler("first")
    async def first(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        ctx.client.add("second")  # the fake's enqueue

    @worker.handler("second")
    async def second(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        followed.append(ctx.job_type)

    fake.add("first")
    async with running(worker):
        await trio.sleep(1)
    assert followed == ["second"]


async def test_a_failing_lifespan_fails_run_before_any_reserve(autojump_clock: MockClock) -> None:
    fake = FakeClient()

    @asynccontextmanager
    async def lifespan(worker: sepp.Worker) -> AsyncIterator[None]:
        raise OSError("no database")
        yield

    worker = make_worker(fake, lifespan=lifespan)
    with pytest.raises(OSError, match="no database"):
        await worker.run()
    assert fake.reserve_calls == []


def test_a_routers_lifespan_is_the_workers_and_is_not_given_twice() -> None:
    @asynccontextmanager
    async def lifespan(worker: sepp.Worker) -> AsyncIterator[None]:
        yield

    router = sepp.Router(lifespan=lifespan)
    assert make_worker(FakeClient(), handlers=router)._settings.lifespan is lifespan
    with pytest.raises(sepp.ValidationError) as info:
        make_worker(FakeClient(), handlers=router, lifespan=lifespan)
    assert info.value.field == "lifespan"
    with pytest.raises(sepp.ValidationError, match="cannot be included"):
        sepp.Router().include(router)
    with pytest.raises(sepp.ValidationError):
        sepp.Router(lifespan=42)  # type: ignore[arg-type]


async def test_a_lifespan_without_arguments_is_called_without_the_worker(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()

    @asynccontextmanager
    async def lifespan() -> AsyncIterator[str]:
        yield "the-pool"

    states: list[object] = []
    for given in ({"lifespan": lifespan}, {"handlers": sepp.Router(lifespan=lifespan)}):
        worker = make_worker(fake, **given)

        @worker.handler("work")
        async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            states.append(ctx.state)

        fake.add()
        async with running(worker):
            await trio.sleep(1)
    assert states == ["the-pool", "the-pool"]


@asynccontextmanager
async def two_arguments(worker: Any, extra: Any) -> AsyncIterator[None]:
    yield


async def undecorated(worker: Any) -> AsyncIterator[None]:
    yield


async def coroutine_function(worker: Any) -> None: ...


@pytest.mark.parametrize(
    ("lifespan", "error"),
    [
        (two_arguments, r"cannot be called as lifespan\(worker\) or lifespan\(\)"),
        (undecorated, "decorate it with @contextlib.asynccontextmanager"),
        (coroutine_function, "decorate it with @contextlib.asynccontextmanager"),
    ],
)
def test_a_lifespan_of_the_wrong_shape_is_refused_when_the_worker_is_built(
    lifespan: Any, error: str
) -> None:
    with pytest.raises(TypeError, match=error):
        make_worker(FakeClient(), lifespan=lifespan)
    with pytest.raises(TypeError, match=error):
        sepp.Router(lifespan=lifespan)


def test_a_context_without_a_client_says_how_to_give_one() -> None:
    with pytest.raises(RuntimeError, match="pass client="):
        _ = sepp.testing.job_context().client
    fake = FakeClient()
    ctx = sepp.testing.job_context(client=fake, state={"x": 1})
    assert (ctx.client, ctx.state) == (fake, {"x": 1})
    assert sepp.testing.job_context().state is None


# -- middleware ------------------------------------------------------------------------------

current_job: contextvars.ContextVar[str] = contextvars.ContextVar("current_job")


def recording(name: str, calls: list[str]) -> sepp.Middleware:
    async def middleware(job: sepp.Job, call_next: sepp.CallNext) -> None:
        calls.append(f"{name} in")
        try:
            await call_next()
        finally:
            calls.append(f"{name} out")

    return middleware


async def test_middleware_runs_worker_then_outer_router_then_inner_router_around_the_handler(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    calls: list[str] = []
    inner = sepp.Router(middleware=[recording("inner", calls)])
    outer = sepp.Router(middleware=[recording("outer", calls)])

    @inner.handler("a")
    async def a(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        calls.append("handler a")

    @outer.handler("b")
    async def b(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        calls.append("handler b")

    outer.include(inner)
    worker = make_worker(
        fake, handlers=outer, middleware=[recording("w1", calls), recording("w2", calls)]
    )

    @worker.handler("c")
    async def c(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        calls.append("handler c")

    fake.add("a")
    async with running(worker):
        await trio.sleep(1)
        assert calls == [
            *("w1 in", "w2 in", "outer in", "inner in", "handler a"),
            *("inner out", "outer out", "w2 out", "w1 out"),
        ]
        calls.clear()
        fake.add("b")
        await trio.sleep(1)
        assert calls == [
            *("w1 in", "w2 in", "outer in", "handler b", "outer out", "w2 out", "w1 out")
        ]
        calls.clear()
        fake.add("c")
        await trio.sleep(1)
        assert calls == ["w1 in", "w2 in", "handler c", "w2 out", "w1 out"]
    assert len(fake.acks) == 3


@dataclasses.dataclass
class Refund:
    order: int


async def test_a_registrations_own_middleware_runs_inside_the_routers_and_the_workers() -> None:
    # On the real clock: one of the handlers is a `def` one, whose thread MockClock cannot see.
    fake = FakeClient()
    calls: list[str] = []
    inner = sepp.Router(middleware=[recording("inner", calls)])
    outer = sepp.Router(middleware=[recording("outer", calls)])

    @inner.handler("a", middleware=[recording("a1", calls), recording("a2", calls)])
    async def a(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        calls.append("handler a")

    async def b(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        calls.append("handler b")

    inner.handle("b", b)  # no middleware of its own: the others' only

    @inner.task(sepp.Task("q", "refund", Refund), middleware=[recording("task", calls)])
    def refund(job: Refund, ctx: sepp.SyncJobContext) -> None:  # a def handler, in a thread
        calls.append(f"refund {job.order}")

    outer.include(inner)
    worker = make_worker(fake, handlers=outer, middleware=[recording("w", calls)])
    worker.handle("c", b, middleware=[recording("c", calls)])

    @worker.task(sepp.Task("q", "d", Refund), middleware=[recording("d", calls)])
    async def d(job: Refund, ctx: sepp.JobContext) -> None:
        calls.append(f"handler d {job.order}")

    chains = {}
    async with running(worker):
        for job_type in ("a", "b", "c", "d", "refund"):
            fake.add(job_type, sepp.Payload.json({"order": 1}))
            with trio.fail_after(30):  # a hang guard
                while len(fake.acks) < len(chains) + 1:  # noqa: ASYNC110 - the fake has no event
                    await trio.sleep(0.001)
            chains[job_type], calls[:] = list(calls), []
    assert chains["a"] == [  # the Worker's, then each router's, then the handler's own
        *("w in", "outer in", "inner in", "a1 in", "a2 in", "handler a"),
        *("a2 out", "a1 out", "inner out", "outer out", "w out"),
    ]
    assert chains["b"] == [
        *("w in", "outer in", "inner in", "handler b", "inner out", "outer out", "w out")
    ]
    assert chains["c"] == ["w in", "c in", "handler b", "c out", "w out"]
    assert chains["d"] == ["w in", "d in", "handler d 1", "d out", "w out"]
    assert chains["refund"] == [
        *("w in", "outer in", "inner in", "task in", "refund 1"),
        *("task out", "inner out", "outer out", "w out"),
    ]
    assert fake.nacks == []


def test_a_registrations_middleware_is_checked_when_it_is_given() -> None:
    def plain(job: sepp.Job, call_next: sepp.CallNext) -> None: ...

    router = sepp.Router()
    worker = make_worker(FakeClient())
    task = sepp.Task("q", "t", Refund)
    for register in (
        lambda: router.handler("x", middleware=[plain]),  # refused before it decorates
        lambda: router.handle("x", recording("r", []), middleware=5),
        lambda: router.task(task, middleware=[42]),
        lambda: worker.handler("x", middleware=[plain]),
        lambda: worker.handle("x", recording("r", []), middleware=[plain]),
        lambda: worker.task(task, middleware=plain),
    ):
        with pytest.raises(sepp.ValidationError) as info:
            register()  # type: ignore[no-untyped-call]
        assert info.value.field.startswith("middleware")
    assert router.job_types == () and worker._router.job_types == ()


async def test_an_included_routers_settings_also_wrap_its_catch_all(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    calls: list[str] = []
    plugin = sepp.Router(middleware=[recording("plugin", calls)], timeout=2)

    @plugin.catch_all
    async def anything(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        calls.append(ctx.job_type)
        await trio.sleep(5)

    worker = make_worker(
        fake, handlers=sepp.Router().include(plugin), backoff=sepp.Backoff(1, jitter=0)
    )
    fake.add("whatever", max_attempts=1)
    async with running(worker):
        await trio.sleep(3)
    assert calls == ["plugin in", "whatever", "plugin out"]
    ((nack),) = fake.nacks
    assert nack.at == 2 and "ran past its 2s timeout" in (nack.reason or "")


async def test_middleware_sets_context_variables_and_turns_exceptions_into_outcomes(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    seen: list[str] = []

    async def tag_and_reject(job: sepp.Job, call_next: sepp.CallNext) -> None:
        token = current_job.set(job.ctx.id)
        try:
            await call_next()
        except ValueError as exc:
            raise HandlerError.permanent(f"bad payload: {exc}") from exc
        finally:
            current_job.reset(token)

    worker = make_worker(fake, middleware=[tag_and_reject])

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        seen.append(current_job.get())
        raise ValueError("not json")

    job_id = fake.add()
    async with running(worker):
        await trio.sleep(1)
    assert seen == [job_id]
    ((nack),) = fake.nacks
    assert (nack.retry, nack.reason) == (Retry.DEAD_LETTER, "bad payload: not json")


async def test_middleware_that_skips_call_next_acks_and_one_calling_it_twice_fails(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    ran: list[str] = []

    async def skip_b(job: sepp.Job, call_next: sepp.CallNext) -> None:
        if job.ctx.job_type == "b":
            return
        await call_next()
        if job.ctx.job_type == "twice":
            await call_next()

    worker = make_worker(fake, middleware=[skip_b], backoff=Retry.DEFAULT)

    @worker.handler("b")
    @worker.handler("twice")
    async def handler(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        ran.append(ctx.job_type)

    b = fake.add("b")
    twice = fake.add("twice", max_attempts=1)
    async with running(worker):
        await trio.sleep(1)
    assert ran == ["twice"]
    assert [c.job_id for c in fake.acks] == [b]
    ((nack),) = fake.nacks
    assert nack.job_id == twice and "awaited call_next() twice" in (nack.reason or "")


async def test_middleware_calling_call_next_without_awaiting_it_fails_the_job(
    autojump_clock: MockClock, recwarn: pytest.WarningsRecorder
) -> None:
    fake = FakeClient()
    ran: list[str] = []

    async def forgets_await(job: sepp.Job, call_next: sepp.CallNext) -> None:
        call_next()  # the handler would silently not run

    worker = make_worker(fake, middleware=[forgets_await], backoff=Retry.DEFAULT)

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        ran.append(ctx.id)

    job_id = fake.add("work", max_attempts=1)
    async with running(worker):
        await trio.sleep(1)
    assert ran == [] and fake.acks == []
    ((nack),) = fake.nacks
    assert nack.job_id == job_id
    assert "forgets_await called call_next() without awaiting it" in (nack.reason or "")
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


def test_a_plain_def_middleware_is_refused_where_it_is_given() -> None:
    def plain(job: sepp.Job, call_next: sepp.CallNext) -> None:
        call_next()

    for build in (
        lambda: sepp.Router(middleware=[plain]),  # type: ignore[list-item]
        lambda: make_worker(FakeClient(), middleware=[plain]),  # type: ignore[list-item]
    ):
        with pytest.raises(sepp.ValidationError, match="plain `def` function") as info:
            build()
        assert info.value.field == "middleware[0]"


async def test_a_lifespan_that_returns_a_coroutine_or_a_plain_context_manager_says_so(
    autojump_clock: MockClock, recwarn: pytest.WarningsRecorder
) -> None:
    async def open_pool() -> dict[str, str]:
        return {}

    @contextlib.contextmanager
    def blocking_pool() -> Iterator[None]:
        yield

    for lifespan, said in [
        (lambda: open_pool(), "<lambda>' returned coroutine,"),
        (blocking_pool, "blocking_pool' returned _GeneratorContextManager,"),
    ]:
        fake = FakeClient()
        worker = make_worker(fake, lifespan=lifespan)
        with pytest.raises(TypeError) as info:
            await worker.run()
        assert said in str(info.value) and "@contextlib.asynccontextmanager" in str(info.value)
        assert fake.reserve_calls == []  # before anything was reserved
    assert not [w for w in recwarn if "never awaited" in str(w.message)]


def test_middleware_must_be_a_list_of_callables() -> None:
    async def ok(job: sepp.Job, call_next: sepp.CallNext) -> None: ...

    for bad, field in [(ok, "middleware"), ([ok, 3], "middleware[1]"), (5, "middleware")]:
        with pytest.raises(sepp.ValidationError) as info:
            sepp.Router(middleware=bad)  # type: ignore[arg-type]
        assert info.value.field == field
        with pytest.raises(sepp.ValidationError):
            make_worker(FakeClient(), middleware=bad)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_the_job_line_says_how_long_the_handler_ran_and_how_long_it_waited(
    autojump_clock: MockClock,
) -> None:
    # One slot; the server sends two jobs at once. The middleware takes 2 s before the handler
    # (3 s) and 1 s after it: each job ran 3 + 1 s, from its handler's start to the chain's end;
    # the first waited 2 s (the middleware before the handler), the second 6 s more (the slot).
    fake = FakeClient()
    fake.over_deliver = 1
    logger = logging.getLogger("tests.sepp.job_lines")
    logger.setLevel(logging.INFO)
    records = Records()
    logger.addHandler(records)

    async def slow_around(job: sepp.Job, call_next: sepp.CallNext) -> None:
        await trio.sleep(2)
        if job.ctx.job_type == "skipped":
            return
        await call_next()
        await trio.sleep(1)

    worker = make_worker(fake, max_in_flight=1, middleware=[slow_around], logger=logger)

    @worker.handler("work")
    @worker.handler("skipped")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await trio.sleep(3)

    first, second = fake.add(), fake.add()
    try:
        async with running(worker):
            await trio.sleep(20)
            skipped = fake.add("skipped")
            await trio.sleep(5)
    finally:
        logger.removeHandler(records)
    lines = {r.args[0].id: r for r in records.records if " finished: " in r.msg}
    assert [lines[job].getMessage().split(" finished: ")[1] for job in (first, second)] == [
        "ack, ran 4.000s, waited 2.000s",
        "ack, ran 4.000s, waited 8.000s",
    ]
    assert (lines[second].sepp_duration_s, lines[second].sepp_wait_s) == (4.0, 8.0)
    assert lines[skipped].getMessage().endswith("finished: ack, did not run, waited 2.000s")
    assert (lines[skipped].sepp_duration_s, lines[skipped].sepp_wait_s) == (None, 2.0)


# -- backoff and what a failure logs ---------------------------------------------------------


def test_backoff_doubles_to_its_cap_and_jitter_only_shortens() -> None:
    exact = sepp.Backoff(1, max=300, jitter=0)
    assert [exact.delay(n) for n in (1, 2, 3, 9, 10, 5000)] == [1, 2, 4, 256, 300, 300]
    jittered = sepp.Backoff()
    samples = [jittered.delay(3) for _ in range(200)]
    assert all(2.0 < d <= 4.0 for d in samples) and len(set(samples)) > 1
    assert sepp.Backoff(timedelta(seconds=2), max=timedelta(minutes=1)).max == 60
    assert sepp.Backoff() == sepp.Backoff(1.0, multiplier=2, max=300, jitter=0.5)
    for kwargs, field in [
        ({"initial": -1}, "initial"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"initial": 5, "max": 1}, "max"),
        ({"jitter": 1.5}, "jitter"),
        ({"jitter": True}, "jitter"),
    ]:
        with pytest.raises(sepp.ValidationError) as info:
            sepp.Backoff(**kwargs)
        assert info.value.field == field
    with pytest.raises(AttributeError):
        exact.initial = 2  # type: ignore[misc]


async def test_a_failing_handler_is_retried_with_exponential_backoff_by_default(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake)  # the default: Backoff() (1 s doubling, jitter ≤ 50 %)
    runs: list[float] = []

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        runs.append(trio.current_time())
        raise ConnectionError("upstream down")

    fake.add(max_attempts=4)
    async with running(worker):
        await trio.sleep(30)
    first, second, third = delays(fake)[:3]
    assert first is not None and 0.5 < first <= 1.0
    assert second is not None and 1.0 < second <= 2.0
    assert third is not None and 2.0 < third <= 4.0
    # Each retry ran only once its delay had passed (plus the poll's own time, here 0).
    assert [b - a for a, b in itertools.pairwise(runs)] == pytest.approx([first, second, third])
    warnings = log_of(worker).at("warning")
    assert len(warnings) == 3
    assert "failed: the handler raised ConnectionError: upstream down; retrying in" in warnings[0]
    (error,) = log_of(worker).at("error")  # the fourth failure, once
    assert "(4/4) dead-lettered: failed: the handler raised ConnectionError" in error
    assert "on its final attempt" in error and "keeps no dead letters" in error


async def test_backoff_set_per_handler_router_and_worker_and_the_queue_policy_opt_out(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    router = sepp.Router(backoff=sepp.Backoff(7, jitter=0))

    async def fail(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        raise HandlerError.retry("again")  # a plain retry follows the backoff too

    router.handle("router", fail)
    router.handle("handler", fail, backoff=sepp.Backoff(3, jitter=0))
    router.handle("queue", fail, backoff=Retry.DEFAULT)
    worker = make_worker(fake, handlers=router, backoff=sepp.Backoff(11, jitter=0))
    worker.handle("worker", fail)
    ids = [fake.add(t, max_attempts=5) for t in ("router", "handler", "queue", "worker")]
    async with running(worker):
        await trio.sleep(1)
    first_nack = {}
    for call in fake.nacks:
        first_nack.setdefault(call.job_id, call.retry)
    assert [first_nack[job_id] for job_id in ids] == [
        Retry.after(7),
        Retry.after(3),
        Retry.DEFAULT,
        Retry.after(11),
    ]
    with pytest.raises(sepp.ValidationError):
        make_worker(FakeClient(), backoff=Retry.DEAD_LETTER)
    with pytest.raises(sepp.ValidationError):
        sepp.Router().handle("x", fail, backoff=5)  # type: ignore[arg-type]


async def test_retry_after_overrides_the_backoff_and_permanent_dead_letters_and_both_log(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, backoff=sepp.Backoff(100, jitter=0))

    @worker.handler("later")
    async def later(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        raise HandlerError.retry_after("rate limited", 42)

    @worker.handler("never")
    async def never(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        raise HandlerError.permanent("no such invoice")

    later_id = fake.add("later")
    never_id = fake.add("never")
    async with running(worker):
        await trio.sleep(1)
    nacks = {c.job_id: c.retry for c in fake.nacks}
    assert nacks == {later_id: Retry.after(42), never_id: Retry.DEAD_LETTER}
    (warning,) = log_of(worker).at("warning")
    assert "asked for a retry later: rate limited; retrying in 42s" in warning
    (error,) = log_of(worker).at("error")
    assert "dead-lettered: the handler gave up on it: no such invoice" in error
    assert "keeps no dead letters" in error


async def test_handler_errors_are_logged_without_a_traceback_other_exceptions_with_one(
    autojump_clock: MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeClient()
    worker = make_worker(
        fake, logger=logging.getLogger("test.outcomes"), backoff=sepp.Backoff(100, jitter=0)
    )
    raised = {
        "permanent": HandlerError.permanent("no such invoice"),
        "retry": HandlerError.retry("busy"),
        "later": HandlerError.retry_after("rate limited", 42),
        "group": ExceptionGroup("two", [HandlerError.permanent("a"), HandlerError.retry("b")]),
        "bug": ValueError("a bug"),
    }

    async def fail(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        raise raised[ctx.job_type]

    ids = {}
    for job_type in raised:
        worker.handle(job_type, fail)
        ids[job_type] = fake.add(job_type, max_attempts=1 if job_type == "bug" else 3)
    with caplog.at_level(logging.WARNING, logger="test.outcomes"):
        async with running(worker):
            await trio.sleep(1)
    by_job = {
        job_type: [r for r in caplog.records if job_id in r.getMessage()]
        for job_type, job_id in ids.items()
    }
    for job_type, records in by_job.items():
        assert len(records) == 1, (job_type, records)
        (record,) = records
        if job_type == "bug":
            assert record.exc_info is not None and record.exc_info[1] is raised["bug"]
        else:
            assert record.exc_info is None, job_type
    assert "dead-lettered: the handler gave up on it: no such invoice" in (
        by_job["permanent"][0].getMessage()
    )


def test_a_handler_error_is_named_by_its_public_name() -> None:
    assert HandlerError.__module__ == "sepp"
    assert traceback.format_exception_only(HandlerError.permanent("no such invoice")) == [
        "sepp.HandlerError: no such invoice\n"
    ]
    assert pickle.loads(pickle.dumps(HandlerError.permanent("x"))).reason == "x"


def test_a_handler_errors_outcome_is_public_and_read_only() -> None:
    later = HandlerError.retry_after("busy", 30)
    assert (later.directive.kind, later.directive.delay) == ("delay", timedelta(seconds=30))
    assert HandlerError.permanent("gone").directive == Retry.DEAD_LETTER
    assert HandlerError.retry("again").directive is Retry.DEFAULT
    again = pickle.loads(pickle.dumps(later))
    assert (again.reason, again.directive) == ("busy", later.directive)
    with pytest.raises(AttributeError):
        later.directive = Retry.DEFAULT  # type: ignore[misc]
    for name in ("directive", "reason"):
        assert isinstance(vars(HandlerError)[name], property) and vars(HandlerError)[name].__doc__


async def test_the_dead_letter_log_asks_the_server_once_and_is_quiet_when_it_keeps_them(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    asked = 0
    real_info = fake.get_server_info

    async def info(**kwargs: Any) -> sepp.ServerInfo:
        nonlocal asked
        asked += 1
        import dataclasses

        return dataclasses.replace(await real_info(), dead_letter_retention_enabled=True)

    fake.get_server_info = info  # type: ignore[method-assign]
    worker = make_worker(fake)

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        raise HandlerError.permanent("no")

    for _ in range(3):
        fake.add()
    async with running(worker):
        await trio.sleep(1)
    errors = log_of(worker).at("error")
    assert len(errors) == 3 and asked == 1
    assert all("dead-lettered" in e and "keeps no dead letters" not in e for e in errors)


# -- unknown job types -----------------------------------------------------------------------


async def test_unknown_types_return_much_later_than_failures_and_log_once_per_type(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake)  # the default: 60 s doubling to an hour, jitter ≤ 10 %

    @worker.handler("known")
    async def known(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None: ...

    for _ in range(3):
        fake.add("mystery", max_attempts=3)
    fake.add("other", max_attempts=3)
    async with running(worker):
        await trio.sleep(1)
    first = delays(fake)
    assert len(first) == 4 and all(d is not None and 54 <= d <= 60 for d in first)
    errors = log_of(worker).at("error")
    assert len(errors) == 2  # one per type, not one per job
    (mystery,) = [e for e in errors if "no handler for job type 'mystery'" in e]
    assert "returning it to the queue for" in mystery
    assert "this worker handles: known" in mystery


async def test_unknown_types_log_at_most_once_a_minute_per_type_and_each_loss(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, unknown_types=sepp.Backoff(60, jitter=0))
    for _ in range(3):
        fake.add("mystery", max_attempts=3)
    fake.add("other", max_attempts=3)
    async with running(worker):
        await trio.sleep(200)  # back at 60 and at 180, the last time dead-lettered
    assert [c.at for c in fake.nacks] == [0] * 4 + [60] * 4 + [180] * 4
    errors = log_of(worker).at("error")
    returned = [e for e in errors if "no handler for job type" in e]
    assert len(returned) == 6  # per type at 0, 60 and 180; not per job
    assert sum("its final attempt: it is dead-lettered" in e for e in returned) == 2
    dead = [e for e in errors if "dead-lettered: no handler for its type" in e]
    assert len(dead) == 4  # once per job lost


async def test_unknown_types_can_be_dead_lettered_at_once(autojump_clock: MockClock) -> None:
    fake = FakeClient()
    worker = make_worker(fake, unknown_types="dead_letter")
    fake.add("mystery", max_attempts=3)
    async with running(worker):
        await trio.sleep(1)
    ((nack),) = fake.nacks
    assert nack.retry == Retry.DEAD_LETTER
    assert any("dead-lettered: no handler" in e for e in log_of(worker).at("error"))
    with pytest.raises(sepp.ValidationError):
        make_worker(FakeClient(), unknown_types="drop")  # type: ignore[arg-type]


# -- time limits -----------------------------------------------------------------------------


async def test_a_handler_past_its_timeout_is_cancelled_and_nacked_with_the_backoff(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    seen: list[str] = []

    async def watch(job: sepp.Job, call_next: sepp.CallNext) -> None:
        try:
            await call_next()
        except trio.TooSlowError as exc:
            seen.append(str(exc))
            raise

    worker = make_worker(fake, timeout=10, middleware=[watch], backoff=sepp.Backoff(5, jitter=0))
    ended: list[tuple[str, float]] = []

    async def slow(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        try:
            await trio.sleep(100)
        finally:
            ended.append((ctx.job_type, trio.current_time()))

    worker.handle("default", slow)  # the worker's 10 s
    worker.handle("own", slow, timeout=timedelta(seconds=3))
    fake.add("default")
    fake.add("own")
    async with running(worker):
        await trio.sleep(12)
    assert sorted(ended) == [("default", 10.0), ("own", 3.0)]
    assert [(c.at, c.retry) for c in fake.nacks] == [(3, Retry.after(5)), (10, Retry.after(5))]
    assert seen == [
        "the handler ran past its 3s timeout and was cancelled",
        "the handler ran past its 10s timeout and was cancelled",
    ]
    assert all("timed out; retrying in 5s" in w for w in log_of(worker).at("warning"))


async def test_a_redelivery_of_a_job_still_running_waits_for_that_run(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, lease_duration=3, auto_extend=False, max_in_flight=4)
    running_now: set[str] = set()
    overlaps: list[str] = []
    runs: list[tuple[int, float, float]] = []

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        if ctx.id in running_now:
            overlaps.append(ctx.id)
        running_now.add(ctx.id)
        began = trio.current_time()
        try:
            with trio.CancelScope(shield=ctx.attempt == 1):  # ignores its lease's end
                await trio.sleep(5)
        finally:
            running_now.discard(ctx.id)
            runs.append((ctx.attempt, began, trio.current_time()))

    job_id = fake.add()
    async with running(worker):
        await trio.sleep(3.5)
        # The server took the job back when its lease ended, and redelivers it here.
        fake._jobs[job_id].lease_expiry = None
        fake._make_ready(job_id)
        await trio.sleep(10)
    assert overlaps == []
    assert runs == [(1, 0.0, 5.0), (2, 5.0, 6.5)]  # the second cut off by its own lease
    assert any("still runs in this worker" in w for w in log_of(worker).at("warning"))
