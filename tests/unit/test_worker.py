"""Worker behaviour against the scripted FakeClient, on trio's MockClock (autojump), so every
time below is exact virtual seconds and nothing waits for real."""

from __future__ import annotations

import collections
import inspect
import itertools
import logging
import os
import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest
import trio
from fixtures.fake_client import FakeClient, RecordingLogger
from trio.testing import MockClock

import sepp
from sepp import HandlerError, Retry, StatusCode
from sepp._runtime.trio_runtime import TRIO
from sepp._util.log import Log
from sepp._worker import lease_keeper
from sepp._worker.held_job import HeldJob, HeldJobs, Phase

pytestmark = pytest.mark.fixture  # a scripted FakeClient


def make_worker(fake: FakeClient, **options: Any) -> sepp.Worker:
    options.setdefault("queues", ["q"])
    options.setdefault("logger", RecordingLogger())
    # Most tests here are about which nack a handler's end maps to: the queue's policy keeps
    # their nacks exact. The backoff tests give their own.
    options.setdefault("backoff", Retry.DEFAULT)
    return sepp.Worker(fake, _wall_clock=fake.now, **options)


def log_of(worker: sepp.Worker) -> RecordingLogger:
    target = worker._log._target
    assert isinstance(target, RecordingLogger)
    return target


@asynccontextmanager
async def running(worker: sepp.Worker) -> AsyncIterator[trio.Nursery]:
    """Run the worker for the block; shut it down gracefully at the end."""
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        yield nursery
        worker.shutdown()


def transport_error() -> sepp.TransportError:
    return sepp.TransportError("UNAVAILABLE: connection refused", code=StatusCode.UNAVAILABLE)


# -- construction and registration -----------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"queues": []}, "queues"),
        ({"queues": ""}, "queues[0]"),
        ({"queues": ["ok", ""]}, "queues[1]"),
        ({"lease_duration": 0}, "lease_duration"),
        ({"lease_duration": -1.5}, "lease_duration"),
        ({"lease_duration": timedelta(0)}, "lease_duration"),
        ({"lease_duration": "30"}, "lease_duration"),
        ({"wait_timeout": 0}, "wait_timeout"),
        ({"wait_timeout": -1}, "wait_timeout"),
        ({"max_in_flight": 0}, "max_in_flight"),
        ({"max_in_flight": 2.0}, "max_in_flight"),
        ({"max_jobs": 0}, "max_jobs"),
        ({"shutdown_timeout": -0.1}, "shutdown_timeout"),
        ({"reserve_error_backoff": 0}, "reserve_error_backoff"),
        ({"worker_id": ""}, "worker_id"),
        ({"auto_extend": 1}, "auto_extend"),
    ],
)
def test_constructor_rejects_bad_settings(options: dict[str, Any], field: str) -> None:
    options.setdefault("queues", ["q"])
    with pytest.raises(sepp.ValidationError) as info:
        sepp.Worker(FakeClient(), **options)
    assert info.value.field == field


def test_constructor_accepts_timedeltas_zero_grace_and_a_single_queue_name() -> None:
    worker = sepp.Worker(
        FakeClient(),
        "emails",  # queues may also be given positionally, as one name
        lease_duration=timedelta(seconds=45),
        wait_timeout=timedelta(milliseconds=500),
        shutdown_timeout=0,
        max_jobs=1,
    )
    s = worker._settings
    assert (list(s.queues), s.lease_s, s.wait_s, s.shutdown_timeout_s) == (
        ["emails"],
        45.0,
        0.5,
        0.0,
    )


def test_default_worker_id_is_host_pid_random() -> None:
    first = sepp.Worker(FakeClient(), queues=["q"])
    second = sepp.Worker(FakeClient(), queues=["q"])
    pattern = rf"{re.escape(socket.gethostname())}-{os.getpid()}-[0-9a-f]{{8}}"
    assert re.fullmatch(pattern, first.worker_id)
    assert first.worker_id != second.worker_id
    assert sepp.Worker(FakeClient(), queues=["q"], worker_id="w-1").worker_id == "w-1"


def test_registration_forms_and_duplicates() -> None:
    worker = make_worker(FakeClient())

    async def a(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None: ...
    async def b(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None: ...

    assert worker.handle("a", a).handle("b", b) is worker

    @worker.handler("c")
    async def c(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None: ...

    assert c.__name__ == "c"  # the decorator hands the function back
    assert worker.catch_all(a) is a
    assert set(worker._router._handlers) == {"a", "b", "c"}

    with pytest.raises(sepp.DuplicateHandlerError) as info:
        worker.handle("a", b)
    assert info.value.job_type == "a"
    assert worker._router._handlers["a"] is a  # the first registration stands
    with pytest.raises(sepp.DuplicateHandlerError):
        worker.handler("c")(b)
    with pytest.raises(sepp.DuplicateHandlerError) as info:
        worker.catch_all(b)
    assert info.value.job_type is None


def test_registration_refuses_non_callables() -> None:
    # (`def` handlers are accepted: tests/unit/test_thread_handlers.py)
    worker = make_worker(FakeClient())
    with pytest.raises(sepp.ValidationError):
        worker.handle("x", 42)  # type: ignore[arg-type]
    with pytest.raises(sepp.ValidationError):
        worker.handle("", worker.run)  # type: ignore[arg-type]
    assert worker._router._handlers == {}


def test_handler_error_constructors() -> None:
    assert HandlerError.retry("r").directive == Retry.DEFAULT
    assert HandlerError.retry_after("r", 2.5).directive == Retry.after(2.5)
    assert HandlerError.retry_after("r", timedelta(minutes=1)).directive == Retry.after(60)
    assert HandlerError.permanent("no").directive == Retry.DEAD_LETTER
    assert HandlerError.permanent("no").reason == "no"
    assert not isinstance(HandlerError.retry("r"), sepp.SeppError)
    with pytest.raises(sepp.ValidationError):
        HandlerError.retry_after("r", -1)


@pytest.mark.parametrize("method", ["reserve", "ack", "nack", "extend", "get_server_info"])
def test_the_fake_client_keeps_the_real_signatures(method: str) -> None:
    # The worker is tested against FakeClient; drift from sepp.Client would hide bugs.
    real = inspect.signature(getattr(sepp.Client, method))
    fake = inspect.signature(getattr(FakeClient, method))
    assert str(fake) == str(real)


# -- the reserve loop ------------------------------------------------------------------------


async def test_nursery_start_returns_once_the_first_reserve_is_pending(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, max_in_flight=7, lease_duration=12, wait_timeout=9)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        assert len(fake.reserve_calls) == 1
        call = fake.reserve_calls[0]
        assert call.ended_at is None  # sent, not answered yet
        # The first reserve does not wait (whether there is work is not known yet).
        assert (call.queues, call.max_jobs, call.lease_duration, call.wait_timeout) == (
            ["q"],
            7,
            12.0,
            0.0,
        )
        assert call.worker_id == worker.worker_id
        await trio.sleep(1)
        first, long_poll = fake.reserve_calls  # it found nothing: a long poll follows
        assert (long_poll.max_jobs, long_poll.wait_timeout, long_poll.ended_at) == (7, 9.0, None)
        worker.shutdown()
    assert long_poll.cancelled and not first.cancelled


async def test_reserve_asks_for_exactly_the_free_slots(autojump_clock: MockClock) -> None:
    fake = FakeClient()
    worker = make_worker(fake, max_in_flight=5, wait_timeout=30)
    release = trio.Event()

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await release.wait()

    for _ in range(3):
        fake.add()
    async with running(worker):
        await trio.sleep(1)
        assert worker.in_flight == 3
        # 3 of 5 (maybe a server's batch cap): asked again without waiting, then long-polled
        assert [(c.max_jobs, c.wait_timeout) for c in fake.reserve_calls] == [
            (5, 0),
            (2, 0),
            (2, 30),
        ]
        release.set()
        await trio.sleep(30)  # the pending poll (asking for 2) ends empty at t=30
        assert [c.max_jobs for c in fake.reserve_calls] == [5, 2, 2, 5]
    assert len(fake.acks) == 3


async def test_max_jobs_caps_each_reserve(autojump_clock: MockClock) -> None:
    fake = FakeClient()
    worker = make_worker(fake, max_in_flight=5, max_jobs=3)

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await trio.sleep_forever()

    for _ in range(4):
        fake.add()
    async with running(worker):
        await trio.sleep(1)
        # capped at 3, then 2 free (1 was there), then 1 free
        assert [(c.max_jobs, c.returned) for c in fake.reserve_calls] == [(3, 3), (2, 1), (1, None)]
        assert worker.in_flight == 4
        worker.shutdown()


async def test_concurrency_cap_holds_when_the_server_over_delivers(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    fake.over_deliver = 5
    worker = make_worker(fake, max_in_flight=3)
    running_now = 0
    most = 0
    acks_at_reserve: list[int] = []

    async def note_reserve(call: object) -> None:
        acks_at_reserve.append(len(fake.acks))

    fake.on_reserve = note_reserve

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        nonlocal running_now, most
        running_now += 1
        most = max(most, running_now)
        await trio.sleep(1)
        running_now -= 1

    ids = [fake.add() for _ in range(10)]
    async with running(worker):
        await trio.sleep(10)
    assert fake.reserve_calls[0].returned == 8  # asked for 3, got 3 + 5
    assert most == 3
    assert sorted(c.job_id for c in fake.acks) == sorted(ids)  # none dropped, each once
    assert fake.nacks == []
    # No reserve while holding max_in_flight or more: the second came after 6 of 8 settled.
    assert acks_at_reserve[1] >= 6


async def test_reserve_errors_back_off_exponentially_with_jitter_then_recover(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    fake.reserve_errors = [transport_error() for _ in range(7)]
    worker = make_worker(fake, reserve_error_backoff=1.0)
    handled = trio.Event()

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        handled.set()

    fake.add()
    async with running(worker):
        with trio.fail_after(200):
            await handled.wait()
    starts = [c.at for c in fake.reserve_calls]
    gaps = [b - a for a, b in itertools.pairwise(starts[:8])]
    steps = [1, 2, 4, 8, 10, 10, 10]  # doubling, capped at 10 s
    for gap, step in zip(gaps, steps, strict=True):
        assert 0.5 * step <= gap <= step, (gaps, steps)
    assert fake.reserve_calls[7].returned == 1  # the 8th reserve worked
    assert len(fake.acks) == 1
    logs = log_of(worker)
    assert len(logs.matching("reserve failed: TransportError")) == 7
    assert logs.matching("reserve works again after 7 failure(s)")


async def test_shutdown_during_reserve_backoff_ends_run_promptly(autojump_clock: MockClock) -> None:
    fake = FakeClient()
    fake.reserve_errors = [transport_error() for _ in range(100)]
    worker = make_worker(fake, reserve_error_backoff=20)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(5)  # inside the first 10-20 s backoff
        worker.shutdown()
        began = trio.current_time()
    assert trio.current_time() == began
    assert len(fake.reserve_calls) == 1


@pytest.mark.parametrize(
    "error",
    [
        sepp.UnauthenticatedError("UNAUTHENTICATED: bad key", code=StatusCode.UNAUTHENTICATED),
        sepp.UnknownQueuesError("FAILED_PRECONDITION: unknown queue q"),
    ],
)
async def test_permanent_reserve_errors_are_logged_as_errors_every_time(
    error: Exception, autojump_clock: MockClock
) -> None:
    fake = FakeClient()
    fake.reserve_errors = [error, error, error]
    worker = make_worker(fake, reserve_error_backoff=1)
    async with running(worker):
        await trio.sleep(20)
        # The loop survived: a reserve that does not wait, then it long-polls again.
        assert [c.wait_timeout for c in fake.reserve_calls[3:]] == [0, 30]
        assert fake.reserve_calls[4].ended_at is None
    errors = log_of(worker).at("error")
    assert len(errors) == 3
    assert all("cannot reserve from ['q']" in m and type(error).__name__ in m for m in errors)


async def test_an_unexpected_reserve_exception_is_logged_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture, autojump_clock: MockClock
) -> None:
    fake = FakeClient()
    fake.reserve_errors = [RuntimeError("bug in a proxy")]
    worker = make_worker(fake, logger=logging.getLogger("test.worker"))
    with caplog.at_level(logging.ERROR, logger="test.worker"):
        async with running(worker):
            await trio.sleep(3)
            assert len(fake.reserve_calls) == 3  # failed; then one without waiting, a long poll
    (record,) = caplog.records
    assert "RuntimeError: bug in a proxy" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError


async def test_early_empty_polls_pause_and_full_length_ones_do_not(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    fake.early_empty = True  # a draining server answers at once
    worker = make_worker(fake, wait_timeout=5)
    async with running(worker):
        await trio.sleep(1.1)
    early = [c.at for c in fake.reserve_calls]
    # The first does not wait (no pause after it): the long polls after it pause.
    assert [b - a for a, b in itertools.pairwise(early)] == [0, 0.25, 0.25, 0.25, 0.25]

    fake = FakeClient()
    worker = make_worker(fake, wait_timeout=5)
    async with running(worker):
        await trio.sleep(11)
    full = [c.at for c in fake.reserve_calls]
    assert [round(t - full[0], 9) for t in full] == [0, 0, 5, 10]


class StepCounter(trio.abc.Instrument):
    """Counts each task's steps (a step runs a task from one yield to the next)."""

    def __init__(self) -> None:
        self.steps: collections.Counter[trio.lowlevel.Task] = collections.Counter()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps[task] += 1


async def test_a_handler_with_a_free_slot_starts_in_its_tasks_first_step(
    autojump_clock: MockClock,
) -> None:
    # No scheduler round trip between a reserve's answer and the handlers it starts: each
    # starts in the first step its task takes after the answer (a task started for it, or a
    # job runner that ran earlier jobs and waited for the next one).
    fake = FakeClient()
    worker = make_worker(fake, max_in_flight=4)
    counter = StepCounter()
    steps_at_answer: collections.Counter[trio.lowlevel.Task] = collections.Counter()
    steps_at_start: list[int] = []
    reserve = fake.reserve

    async def reserve_and_count(*args: Any, **kwargs: Any) -> list[sepp.Job] | None:
        jobs = await reserve(*args, **kwargs)
        steps_at_answer.clear()
        steps_at_answer.update(counter.steps)
        return jobs

    fake.reserve = reserve_and_count  # type: ignore[method-assign]

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        task = trio.lowlevel.current_task()
        steps_at_start.append(counter.steps[task] - steps_at_answer[task])

    for _ in range(6):
        fake.add()
    trio.lowlevel.add_instrument(counter)
    try:
        async with running(worker):
            await trio.sleep(1)
    finally:
        trio.lowlevel.remove_instrument(counter)
    assert steps_at_start == [1] * 6
    assert len(fake.acks) == 6


async def test_after_a_short_batch_its_handlers_start_before_the_next_long_poll_is_sent(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, max_in_flight=16)
    reserves_at_start: list[int] = []

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        reserves_at_start.append(len(fake.reserve_calls))

    async with running(worker):
        for _ in range(20):  # trio orders each scheduler pass at random: try it many times
            fake.add()
            await trio.sleep(1)
    # Job i came alone (asking for 16) from reserve 2i + 1 (the first reserve, then long
    # polls, each after a reserve that found nothing): its handler ran before the next
    # reserve was sent.
    first, *rest = fake.reserve_calls
    assert first.returned == 1
    assert [(c.wait_timeout, c.returned) for c in rest[1:39:2]] == [(30, 1)] * 19
    assert reserves_at_start == list(range(1, 41, 2))


async def test_after_a_full_batch_the_next_reserve_goes_out_before_its_handlers_start(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, max_in_flight=64, max_jobs=1)
    reserves_at_start: dict[str, int] = {}

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        reserves_at_start[ctx.id] = len(fake.reserve_calls)

    ids = [fake.add() for _ in range(20)]
    async with running(worker):
        await trio.sleep(1)
    assert [c.returned for c in fake.reserve_calls[:20]] == [1] * 20
    # Job k came from reserve k, which got all it asked for: a backlog, so reserve k + 1 was
    # sent at once, before job k's handler ran.
    assert [reserves_at_start[job_id] > k for k, job_id in enumerate(ids, 1)] == [True] * 20


# -- outcomes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raised", "retry", "reason"),
    [
        (HandlerError.retry("flaky upstream"), Retry.DEFAULT, "flaky upstream"),
        (HandlerError.retry_after("rate limited", 5), Retry.after(5), "rate limited"),
        (
            HandlerError.retry_after("later", timedelta(minutes=2)),
            Retry.after(120),
            "later",
        ),
        (HandlerError.permanent("bad input"), Retry.DEAD_LETTER, "bad input"),
    ],
)
async def test_handler_errors_map_to_their_nack(
    raised: HandlerError, retry: Retry, reason: str, autojump_clock: MockClock
) -> None:
    fake = FakeClient()
    worker = make_worker(fake)
    seen: list[tuple[sepp.Payload | None, int]] = []

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        seen.append((payload, ctx.attempt))
        raise raised

    job_id = fake.add(payload=sepp.Payload.text("hi"), max_attempts=1)  # no redelivery
    async with running(worker):
        await trio.sleep(1)
    assert seen == [(sepp.Payload.text("hi"), 1)]
    assert fake.acks == []
    ((call),) = [c for c in fake.nacks if c.job_id == job_id]
    assert (call.retry, call.reason, call.attempt, call.error) == (retry, reason, 1, None)


async def _raise(error: BaseException) -> None:
    raise error


async def _raise_in_children(*errors: BaseException | tuple[BaseException, ...]) -> None:
    """Each error raised by its own child task, all at once (a tuple: a nested nursery)."""
    async with trio.open_nursery() as nursery:
        for error in errors:
            if isinstance(error, tuple):
                nursery.start_soon(_raise_in_children, *error)
            else:
                nursery.start_soon(_raise, error)


@pytest.mark.parametrize(
    ("raised", "retry", "reason"),
    [
        ((HandlerError.permanent("bad input"),), Retry.DEAD_LETTER, "bad input"),
        # Equally strong: either reason (a group's order is the order the children failed in).
        ((HandlerError.retry("one"), HandlerError.retry("two")), Retry.DEFAULT, {"one", "two"}),
        (
            (
                HandlerError.retry_after("short", 1),
                HandlerError.retry_after("long", timedelta(minutes=1)),
                HandlerError.retry("plain"),
            ),
            Retry.after(60),
            "long",
        ),
        (
            (HandlerError.retry_after("later", 3), HandlerError.permanent("never")),
            Retry.DEAD_LETTER,
            "never",
        ),
        (
            ((HandlerError.permanent("deep"),), HandlerError.retry_after("outer", 9)),
            Retry.DEAD_LETTER,
            "deep",
        ),
    ],
)
async def test_handler_errors_from_a_handlers_nursery_take_the_strongest_outcome(
    raised: tuple[BaseException | tuple[BaseException, ...], ...],
    retry: Retry,
    reason: str | set[str],
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake)

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await _raise_in_children(*raised)

    fake.add(max_attempts=1)  # a nack on the final attempt is not redelivered
    async with running(worker):
        await trio.sleep(1)
    assert fake.acks == []
    ((call),) = fake.nacks
    assert (call.retry, call.error) == (retry, None)
    assert call.reason in reason if isinstance(reason, set) else call.reason == reason
    # A HandlerError is a choice, not a crash: the only error is the job's end, on its final
    # attempt, said once.
    (error,) = log_of(worker).at("error")
    assert "dead-lettered" in error and "Traceback" not in error


async def test_a_group_with_another_exception_is_a_failure_naming_every_leaf(
    caplog: pytest.LogCaptureFixture, autojump_clock: MockClock
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, logger=logging.getLogger("test.worker"))

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await _raise_in_children(HandlerError.permanent("p"), (ValueError("boom"),))

    fake.add(max_attempts=1)  # a nack on the final attempt is not redelivered
    with caplog.at_level(logging.ERROR, logger="test.worker"):
        async with running(worker):
            await trio.sleep(1)
    ((call),) = fake.nacks
    leaves = {"HandlerError: p; ValueError: boom", "ValueError: boom; HandlerError: p"}
    assert call.retry == Retry.DEFAULT
    assert call.reason in {f"handler raised ExceptionGroup ({names})" for names in leaves}
    (record,) = caplog.records
    assert record.exc_info is not None
    assert type(record.exc_info[1]).__name__ == "ExceptionGroup"
    assert any(names in record.getMessage() for names in leaves)


async def test_return_acks_once(autojump_clock: MockClock) -> None:
    fake = FakeClient()
    worker = make_worker(fake)

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        assert ctx.job_type == "work"

    job_id = fake.add()
    async with running(worker):
        await trio.sleep(1)
    assert [(c.job_id, c.attempt, c.error) for c in fake.acks] == [(job_id, 1, None)]
    assert fake.nacks == []


async def test_other_exceptions_nack_with_the_default_policy_and_log_a_traceback(
    caplog: pytest.LogCaptureFixture, autojump_clock: MockClock
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, logger=logging.getLogger("test.worker"))

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        raise ValueError("boom")

    fake.add(max_attempts=1)  # a nack on the final attempt is not redelivered
    with caplog.at_level(logging.ERROR, logger="test.worker"):
        async with running(worker):
            await trio.sleep(1)
    ((call),) = fake.nacks
    assert (call.retry, call.reason) == (Retry.DEFAULT, "handler raised ValueError: boom")
    (record,) = caplog.records
    assert record.exc_info is not None and record.exc_info[0] is ValueError
    assert "ValueError: boom" in record.getMessage()


async def test_long_exception_messages_are_clipped_in_the_reason(autojump_clock: MockClock) -> None:
    fake = FakeClient()
    worker = make_worker(fake)

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        raise HandlerError.retry("x" * 5000 + "\udc80")

    fake.add(max_attempts=1)  # a nack on the final attempt is not redelivered
    async with running(worker):
        await trio.sleep(1)
    ((call),) = fake.nacks
    assert call.reason is not None and len(call.reason) == 1000
    assert call.reason.endswith("…")


@pytest.mark.parametrize(("previous_attempts", "delay"), [(0, 2), (2, 8), (5, 60), (9, 60)])
async def test_unknown_job_type_is_nacked_with_a_growing_delay(
    previous_attempts: int, delay: float, autojump_clock: MockClock
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, unknown_types=sepp.Backoff(2, max=60, jitter=0))
    called = False

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        nonlocal called
        called = True

    fake.add("mystery", attempt=previous_attempts, max_attempts=20)
    async with running(worker):
        await trio.sleep(1)
    ((call),) = fake.nacks
    assert call.retry == Retry.after(delay)
    assert call.reason == "no handler registered for job type 'mystery' on this worker"
    assert not called and fake.acks == []
    (error,) = log_of(worker).at("error")
    assert "'mystery'" in error and "this worker handles: work" in error


async def test_catch_all_takes_unregistered_types_only(autojump_clock: MockClock) -> None:
    fake = FakeClient()
    worker = make_worker(fake)
    calls: list[tuple[str, str]] = []

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        calls.append(("work", ctx.job_type))

    @worker.catch_all
    async def fallback(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        calls.append(("catch_all", ctx.job_type))

    fake.add("work")
    fake.add("other")
    async with running(worker):
        await trio.sleep(1)
    assert sorted(calls) == [("catch_all", "other"), ("work", "work")]
    assert len(fake.acks) == 2 and fake.nacks == []


async def test_failed_ack_is_logged_with_its_meaning_and_the_worker_goes_on(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake)

    async def refuse_first(ctx: sepp.JobContext) -> None:
        if len(fake.acks) == 1:
            raise sepp.AttemptMismatchError("FAILED_PRECONDITION: stale attempt")

    fake.on_ack = refuse_first

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await trio.sleep(1)

    fake.add()
    async with running(worker):
        await trio.sleep(2)
        fake.add()
        await trio.sleep(2)
    assert [type(c.error) for c in fake.acks] == [sepp.AttemptMismatchError, type(None)]
    (warning,) = log_of(worker).at("warning")
    assert "refused" in warning and "redelivered as a newer attempt" in warning


async def test_failed_nack_is_logged_and_the_worker_goes_on(autojump_clock: MockClock) -> None:
    fake = FakeClient()
    worker = make_worker(fake)

    async def unavailable(ctx: sepp.JobContext) -> None:
        raise transport_error()

    fake.on_nack = unavailable

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        raise HandlerError.retry("again")

    fake.add()
    fake.add()
    async with running(worker):
        await trio.sleep(1)
    assert [type(c.error) for c in fake.nacks] == [sepp.TransportError] * 2
    warnings = log_of(worker).at("warning")
    assert len(warnings) == 2  # a HandlerError.retry is not logged again beside its nack
    assert all("nack of work[" in w and "redelivered when its lease expires" in w for w in warnings)


# -- lease keeping ---------------------------------------------------------------------------


async def test_extends_follow_the_granted_lease_when_the_server_clamps_it(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient(max_lease_s=6)  # we ask for 30, the queue grants 6
    worker = make_worker(fake, lease_duration=30)

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await trio.sleep(7)

    fake.add()
    async with running(worker):
        await trio.sleep(8)
    # Each extend comes when a third of the granted 6 s has passed, and asks for 30 again.
    assert [(c.at, c.lease_duration, c.error) for c in fake.extends] == [
        (2, 30, None),
        (4, 30, None),
        (6, 30, None),
    ]
    assert [(c.at, c.error) for c in fake.acks] == [(7, None)]


async def test_a_handler_that_returns_without_waiting_is_never_watched(
    autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing else runs while it does, so its lease needs no keeping; one that waits is kept.
    fake = FakeClient()
    worker = make_worker(fake, lease_duration=3)
    watched: list[str] = []
    watch = lease_keeper.LeaseKeeper.watch

    def recording(keeper: lease_keeper.LeaseKeeper, held: HeldJob, *args: Any) -> None:
        watched.append(held.job.ctx.job_type)
        watch(keeper, held, *args)

    monkeypatch.setattr(lease_keeper.LeaseKeeper, "watch", recording)

    @worker.handler("quick")
    async def quick(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        pass

    @worker.handler("slow")
    async def slow(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await trio.sleep(2.5)

    for job_type in ("quick", "slow", "quick"):
        fake.add(job_type)
    async with running(worker):
        await trio.sleep(5)
    assert watched == ["slow"]
    assert [c.at for c in fake.extends] == [1, 2]  # a third of each 3 s lease
    assert len(fake.acks) == 3


async def test_a_job_due_before_the_keeper_would_wake_is_extended_in_time(
    autojump_clock: MockClock,
) -> None:
    # The keeper sleeps until the first job's extend (10 s in); a job granted a shorter lease
    # later (the queue's maximum was lowered) falls due before that, and must wake it.
    fake = FakeClient()
    worker = make_worker(fake, lease_duration=30)
    ran: dict[str, float] = {}

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await trio.sleep(5)
        ran[ctx.id] = trio.current_time()

    first = fake.add()
    async with running(worker):
        await trio.sleep(1)
        fake.max_lease_s = 3
        second = fake.add()
        await trio.sleep(9)
    assert ran == {first: 5, second: 6}
    # Every third of the granted 3 s from its start at 1 s (the first job needed none).
    assert [(c.job_id, c.at) for c in fake.extends][:4] == [(second, t) for t in (2, 3, 4, 5)]
    assert [c.job_id for c in fake.acks if c.error is None] == [first, second]


async def test_jobs_waiting_for_a_slot_keep_their_leases(autojump_clock: MockClock) -> None:
    fake = FakeClient()
    fake.over_deliver = 1
    worker = make_worker(fake, max_in_flight=1, lease_duration=3)
    started: dict[str, float] = {}

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        started[ctx.id] = trio.current_time()
        await trio.sleep(5)

    first, second = fake.add(), fake.add()
    async with running(worker):
        await trio.sleep(11)
    assert started == {first: 0, second: 5}
    assert [c.job_id for c in fake.acks if c.error is None] == [first, second]
    assert any(c.job_id == second and c.at < 5 for c in fake.extends)


@pytest.mark.parametrize("error_type", [sepp.JobNotFoundError, sepp.AttemptMismatchError])
@pytest.mark.parametrize("swallow", [False, True])
async def test_lease_loss_cancels_the_handler_and_suppresses_ack_and_nack(
    error_type: type[sepp.LeaseError], swallow: bool, autojump_clock: MockClock
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, lease_duration=3)
    cancelled_at: list[float] = []

    async def lose(ctx: sepp.JobContext) -> None:
        raise error_type("lease gone")

    fake.on_extend = lose

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            cancelled_at.append(trio.current_time())
            if not swallow:
                raise
        # A handler that swallows the cancellation and returns must still not be acked.

    fake.add()
    async with running(worker):
        await trio.sleep(5)
    assert cancelled_at == [1]  # the first extend, a third into the 3 s lease
    assert fake.acks == [] and fake.nacks == []
    (error,) = log_of(worker).at("error")
    assert "lost the lease" in error and error_type.__name__ in error


async def test_transient_extend_failures_are_retried_while_the_lease_lasts(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, lease_duration=3)

    async def fail_first(ctx: sepp.JobContext) -> None:
        if len(fake.extends) == 1:
            raise transport_error()

    fake.on_extend = fail_first

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await trio.sleep(5)

    fake.add()
    async with running(worker):
        await trio.sleep(6)
    outcomes = [(round(c.at, 3), c.error is None) for c in fake.extends]
    # fails at 1 (2 s left), retried a third of that later, then back to the normal rhythm
    assert outcomes == [(1, False), (1.667, True), (2.667, True), (3.667, True), (4.667, True)]
    assert [c.error for c in fake.acks] == [None]
    assert log_of(worker).at("error") == []


async def test_lease_expiry_with_only_failed_extends_cancels_the_handler(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, lease_duration=3)
    cancelled_at: list[float] = []

    async def down(ctx: sepp.JobContext) -> None:
        raise transport_error()

    fake.on_extend = down

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            cancelled_at.append(trio.current_time())
            raise

    fake.add()
    async with running(worker):
        await trio.sleep(5)
    assert cancelled_at == [pytest.approx(3)]
    tries = [c.at for c in fake.extends]
    assert 4 <= len(tries) <= 8 and all(t < 3 for t in tries)
    assert all(b - a >= 0.09 for a, b in itertools.pairwise(tries))  # retries are not a spin
    assert fake.acks == [] and fake.nacks == []
    (error,) = log_of(worker).at("error")
    assert "the lease expired (last extend failed: TransportError" in error


async def test_an_extend_still_pending_at_expiry_loses_the_lease(autojump_clock: MockClock) -> None:
    fake = FakeClient()
    worker = make_worker(fake, lease_duration=3)
    cancelled_at: list[float] = []

    async def hang(ctx: sepp.JobContext) -> None:
        await trio.sleep_forever()

    fake.on_extend = hang

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            cancelled_at.append(trio.current_time())
            raise

    fake.add()
    async with running(worker):
        await trio.sleep(5)
    assert cancelled_at == [3]
    assert [(c.at, c.ended_at) for c in fake.extends] == [(1, 3)]
    assert fake.acks == [] and fake.nacks == []
    assert "while an extend was pending" in log_of(worker).at("error")[0]


async def test_without_auto_extend_the_handler_is_cancelled_when_its_lease_ends(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, lease_duration=3, auto_extend=False)
    ran: list[tuple[int, float]] = []

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        try:
            await trio.sleep(5)
        finally:
            ran.append((ctx.attempt, trio.current_time()))

    fake.add(max_attempts=1)
    async with running(worker):
        await trio.sleep(6)
    # Cut off at the lease's end, neither acked nor nacked (the server takes the job back).
    assert ran == [(1, 3.0)]
    assert fake.extends == [] and fake.acks == [] and fake.nacks == []
    (error,) = log_of(worker).at("error")
    assert "the lease ran out (auto_extend is off)" in error


async def test_without_auto_extend_an_extend_by_the_handler_moves_the_cutoff(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, lease_duration=3, auto_extend=False)

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await trio.sleep(2)
        await fake.extend(ctx, 3)  # now until 5
        await trio.sleep(2.5)

    fake.add()
    async with running(worker):
        await trio.sleep(6)
    assert [(c.at, c.error) for c in fake.acks] == [(4.5, None)]


async def test_the_lease_keeper_lets_go_of_settled_jobs(autojump_clock: MockClock) -> None:
    # Keeping is deferred to a job's first extend; a job settled before then must not stay
    # referenced (with its payload) until that time, nor leave the keeper's heap growing.
    fake = FakeClient()
    worker = make_worker(fake, max_in_flight=8, lease_duration=300)

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await trio.sleep(0.01)

    for _ in range(500):
        fake.add()
    async with running(worker):
        await trio.sleep(10)
        assert len(fake.acks) == 500
        assert worker._parts is not None
        keeper = worker._parts.leases
        assert keeper._watched == {}
        assert len(keeper._due) <= lease_keeper.REBUILD_SLACK
    assert fake.extends == []


async def test_a_change_wakes_every_waiter_still_parked_when_one_was_cancelled() -> None:
    # The held set counts its waiters instead of asking its parking lot: a waiter cancelled
    # while parked must leave the count right for the others, before and after a wake-up.
    held = HeldJobs(TRIO)
    woken: list[str] = []

    async def wait(name: str, scope: trio.CancelScope) -> None:
        with scope:
            await held.wait_for_change()
            woken.append(name)

    scopes = {name: trio.CancelScope() for name in ("a", "b", "c")}
    async with trio.open_nursery() as nursery:
        for name, scope in scopes.items():
            nursery.start_soon(wait, name, scope)
        await trio.testing.wait_all_tasks_blocked()
        scopes["a"].cancel()
        await trio.testing.wait_all_tasks_blocked()
        held.changed()
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(woken) == ["b", "c"]
        nursery.start_soon(wait, "d", trio.CancelScope())
        await trio.testing.wait_all_tasks_blocked()
        held.changed()
    assert sorted(woken) == ["b", "c", "d"]


async def test_a_keeper_for_a_job_that_settled_before_it_started_does_not_extend(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    fake.add()
    jobs = await fake.reserve("q", lease_duration=3, max_jobs=1)
    assert jobs is not None
    keeper = lease_keeper.LeaseKeeper(
        fake, lease_s=3, now_utc=fake.now, log=Log(RecordingLogger()), cc=TRIO
    )
    held = HeldJob(jobs[0], TRIO)
    held.phase = Phase.RUNNING
    with trio.fail_after(10):  # a keeper that did start would extend until cancelled
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keeper.run, nursery)
            keeper.watch(held)
            # As when the job settles after its keeper task was started but before it ran.
            held.phase = Phase.SETTLING
            await trio.sleep(2)  # its first extend fell due at 1 s
            keeper.stop()
    assert fake.extends == []
    assert held.keeper_scope is None


# -- shutdown --------------------------------------------------------------------------------


async def test_shutdown_while_a_reserve_is_pending_returns_at_once(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, wait_timeout=30)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(3)
        worker.shutdown()
        worker.shutdown()  # idempotent
    assert trio.current_time() == 3
    first, call = fake.reserve_calls  # the first found nothing: a long poll followed
    assert not first.cancelled
    assert call.cancelled and call.ended_at == 3
    assert worker.is_shutdown


async def test_a_reserve_sent_just_before_shutdown_may_finish_and_its_jobs_are_run(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake)

    async def network_delay(call: object) -> None:
        await trio.sleep(0.1)  # the server has leased the jobs; the answer is on its way

    fake.on_reserve = network_delay
    ids = [fake.add(), fake.add()]

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None: ...

    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(0.05)
        worker.shutdown()
    call = fake.reserve_calls[0]
    assert (call.cancelled, call.returned, call.ended_at) == (False, 2, 0.1)
    assert sorted(c.job_id for c in fake.acks) == ids  # not stranded in a lease
    assert len(fake.reserve_calls) == 1


async def test_a_fresh_long_poll_is_cancelled_at_shutdown_without_a_settle_window(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, wait_timeout=30)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(0.1)
        worker.shutdown()
    first, call = fake.reserve_calls
    assert (first.wait_timeout, first.returned) == (0, 0)
    assert (call.at, call.wait_timeout, call.cancelled, call.ended_at) == (0, 30, True, 0.1)


async def test_shutdown_cancels_a_long_poll_sent_after_the_queues_were_found_drained(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, max_in_flight=5, wait_timeout=30)

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None: ...

    for _ in range(3):
        fake.add()
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(0.05)
        fake.add()
        await trio.sleep(0.05)
        worker.shutdown()
    first, second, third, fourth = fake.reserve_calls
    # 3 of 5 (maybe a server's batch cap): not known to be drained, so asked again without
    # waiting; nothing: drained, so a long poll.
    assert (first.max_jobs, first.wait_timeout, first.returned) == (5, 0, 3)
    assert (second.wait_timeout, second.returned) == (0, 0)
    # One, fewer than the server sent at once before: drained, so a long poll again.
    assert (third.wait_timeout, third.returned, third.ended_at) == (30, 1, 0.05)
    assert (fourth.at, fourth.wait_timeout, fourth.cancelled, fourth.ended_at) == (
        0.05,
        30,
        True,
        0.1,
    )
    assert len(fake.acks) == 4


@pytest.mark.parametrize("max_batch", [None, 2])
async def test_after_a_full_batch_the_next_reserve_does_not_wait(
    max_batch: int | None, autojump_clock: MockClock
) -> None:
    # Full: all it asked for, or (max_batch) as many as the server ever sends at once. The
    # server answers the next reserve at once, so the shutdown never has to cancel it.
    fake = FakeClient()
    fake.max_batch = max_batch
    worker = make_worker(fake, max_in_flight=5, max_jobs=None if max_batch else 2)

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None: ...

    for _ in range(4):
        fake.add()
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(0.1)
        worker.shutdown()
    first, second, third, fourth = fake.reserve_calls
    assert [(c.wait_timeout, c.returned) for c in (first, second, third)] == [
        (0, 2),
        (0, 2),
        (0, 0),
    ]
    if max_batch is not None:
        assert second.max_jobs is not None and second.max_jobs > 2  # more than the server sends
    assert (fourth.wait_timeout, fourth.cancelled, fourth.ended_at) == (30, True, 0.1)


async def test_shutdown_grace_then_cancel_and_nack_for_immediate_retry(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, shutdown_timeout=5)
    quick, slow = fake.add("quick"), fake.add("slow")
    cancelled: list[float] = []

    @worker.handler("quick")
    async def handle_quick(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await trio.sleep(3)

    @worker.handler("slow")
    async def handle_slow(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            cancelled.append(trio.current_time())
            raise

    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(1)
        worker.shutdown()
    assert trio.current_time() == 6  # run() returned at the end of the 5 s grace
    assert [(c.job_id, c.at) for c in fake.acks] == [(quick, 3)]  # finished within the grace
    assert cancelled == [6]
    assert [(c.job_id, c.at, c.retry, c.reason) for c in fake.nacks] == [
        (slow, 6, Retry.after(0), "worker shutdown")
    ]
    *_, long_poll = fake.reserve_calls
    assert len(fake.reserve_calls) == 3 and long_poll.cancelled
    assert fake.leased == []  # nothing left in flight
    assert worker.in_flight == 0


async def test_zero_shutdown_timeout_cancels_at_once(autojump_clock: MockClock) -> None:
    fake = FakeClient()
    worker = make_worker(fake, shutdown_timeout=0)

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await trio.sleep(100)

    fake.add()
    async with running(worker):
        await trio.sleep(1)
    assert trio.current_time() == 1
    assert [(c.at, c.reason) for c in fake.nacks] == [(1, "worker shutdown")]


async def test_jobs_from_a_reserve_completing_as_shutdown_begins_are_still_processed(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake, max_in_flight=2)
    ran: list[str] = []

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await trio.sleep(1)
        ran.append(ctx.id)

    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(1)
        # No checkpoint between these: the pending reserve is woken with three jobs (one more
        # than asked) and the shutdown lands before it runs again.
        fake.over_deliver = 1
        ids = [fake.add(), fake.add(), fake.add()]
        worker.shutdown()
    first, long_poll = fake.reserve_calls  # nothing reserved after shutdown
    assert (first.returned, long_poll.returned) == (0, 3)
    # The two that got a slot (the first two, in the server's order) ran in the grace; the one
    # left waiting for a slot went straight back. None was dropped.
    assert sorted(ran) == ids[:2]
    assert sorted((c.job_id, c.at) for c in fake.acks) == [(ids[0], 2), (ids[1], 2)]
    assert [(c.job_id, c.at, c.retry, c.reason) for c in fake.nacks] == [
        (ids[2], 1, Retry.after(0), "worker shutdown")
    ]
    assert fake.leased == []


async def test_jobs_waiting_for_a_slot_are_returned_at_shutdown_while_running_ones_finish(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    fake.over_deliver = 2
    worker = make_worker(fake, max_in_flight=1, shutdown_timeout=30)

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await trio.sleep(10)

    first, *waiting = (fake.add(), fake.add(), fake.add())
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(1)
        worker.shutdown()
    assert sorted((c.job_id, c.at, c.reason) for c in fake.nacks) == [
        (i, 1, "worker shutdown") for i in waiting
    ]
    assert [(c.job_id, c.at) for c in fake.acks] == [(first, 10)]
    assert trio.current_time() == 10


async def test_shutdown_from_a_handler(autojump_clock: MockClock) -> None:
    fake = FakeClient()
    worker = make_worker(fake)

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        worker.shutdown()
        await trio.sleep(2)

    fake.add()
    with trio.fail_after(10):
        await worker.run()
    assert [(c.at, c.error) for c in fake.acks] == [(2, None)]


async def test_shutdown_requested_before_run_makes_run_return_at_once(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake)
    handle = worker.shutdown_handle()
    handle.shutdown()
    assert handle.is_shutdown
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)  # started() is still called
    assert fake.reserve_calls == []
    with pytest.raises(RuntimeError, match="once"):
        await worker.run()


async def test_hard_cancel_of_run_settles_nothing(autojump_clock: MockClock) -> None:
    fake = FakeClient()
    worker = make_worker(fake)
    cancelled = False

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        nonlocal cancelled
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            cancelled = True
            raise

    job_id = fake.add()
    with trio.move_on_after(2):
        await worker.run()
    assert cancelled
    assert fake.acks == [] and fake.nacks == []
    assert fake.leased == [job_id]  # left to its lease
    assert worker.in_flight == 0


def test_shutdown_handle_works_from_another_thread() -> None:
    # Real clock here: the thread hop must not let an autojump clock race ahead.
    fake = FakeClient()
    worker = make_worker(fake, wait_timeout=30)
    handle = worker.shutdown_handle()

    async def main() -> float:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            began = trio.current_time()
            await trio.to_thread.run_sync(handle.shutdown)
        return trio.current_time() - began

    trio.run(main)
    # It did not wait out the 30 s long poll (which would have ended uncancelled): a reserve
    # that does not wait was let finish, a long poll (if one was sent) cancelled.
    calls = fake.reserve_calls
    assert [c.cancelled for c in calls] == [c.wait_timeout == 30 for c in calls]
    assert handle.is_shutdown
