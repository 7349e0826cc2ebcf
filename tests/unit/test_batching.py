"""The auto-batcher on its own, on trio's MockClock: when a batch goes out, who gets which
result, cancellation before and after sending, and the one error of a closed client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
import trio
from trio.testing import MockClock

import sepp
from sepp._client.batching import EnqueueBatcher
from sepp._model.errors import error_from_status
from sepp._runtime.trio_runtime import TRIO
from sepp.wire._failure import FailureKind
from sepp.wire._status import StatusCode

Result = sepp.EnqueueAck | sepp.JobRejection


@dataclass
class Sender:
    """The batcher's `send`: records each batch (trio time, job types) and answers each job
    with an ack whose id is its job type, or the rejection in `reject`. It takes `latency`
    seconds, or raises `error`."""

    latency: float = 0.0
    error: sepp.SeppError | None = None
    reject: dict[str, sepp.JobRejection] = field(default_factory=dict)
    batches: list[tuple[float, list[str]]] = field(default_factory=list)

    async def __call__(self, requests: list[sepp.EnqueueRequest]) -> list[Result]:
        self.batches.append((trio.current_time(), [r.job_type for r in requests]))
        await trio.sleep(self.latency)
        if self.error is not None:
            raise self.error
        return [self.reject.get(r.job_type) or sepp.EnqueueAck(r.job_type) for r in requests]


@asynccontextmanager
async def batcher(
    sender: Sender, server_max: int | None = None, **config: float
) -> AsyncIterator[tuple[EnqueueBatcher, trio.Nursery]]:
    """A batcher sending from its own nursery, as the client's; closed (like the client) at
    the end, then the nursery is cancelled."""
    async with trio.open_nursery() as client_nursery:
        batching = sepp.Batching(**config)  # type: ignore[arg-type]
        b = EnqueueBatcher(batching, client_nursery, sender, lambda: server_max, runtime=TRIO)
        yield b, client_nursery
        b.close()
        client_nursery.cancel_scope.cancel()


def submitter(
    b: EnqueueBatcher, outcomes: dict[str, Result | BaseException]
) -> Callable[[str], Awaitable[None]]:
    async def submit(job_type: str) -> None:
        try:
            outcomes[job_type] = await b.submit(sepp.EnqueueRequest("q", job_type))
        except sepp.SeppError as exc:
            outcomes[job_type] = exc

    return submit


async def submit_at(
    b: EnqueueBatcher, schedule: str | list[tuple[float, str]]
) -> dict[str, Result | BaseException]:
    """Start a caller per job type at its trio time (a bare string: all at once); every
    caller's outcome once all have one."""
    outcomes: dict[str, Result | BaseException] = {}
    async with trio.open_nursery() as callers:
        submit = submitter(b, outcomes)
        for at, job_type in [(0, t) for t in schedule] if isinstance(schedule, str) else schedule:
            if at > trio.current_time():  # jobs due together start without a checkpoint between
                await trio.sleep_until(at)
            callers.start_soon(submit, job_type)
    return outcomes


CLOSED = error_from_status(
    StatusCode.UNAVAILABLE, "the client is closed", method="EnqueueBatch", kind=FailureKind.CLOSED
)


def assert_closed_error(error: object) -> None:
    """The error every path gives for a closed client: the wire layer's, exactly."""
    assert isinstance(error, sepp.TransportError)
    assert (type(error), error.code, error.details, str(error)) == (
        type(CLOSED),
        StatusCode.UNAVAILABLE,
        "the client is closed",
        "EnqueueBatch: UNAVAILABLE: the client is closed",
    )


# -- when a batch goes out -------------------------------------------------------------------


async def test_without_eager_calls_a_batch_goes_out_max_delay_after_its_first_job(
    autojump_clock: MockClock,
) -> None:
    sender = Sender()
    outcomes: dict[str, Result | BaseException] = {}
    async with (
        batcher(sender, max_delay=0.5, eager_calls=0) as (b, _),
        trio.open_nursery() as callers,
    ):
        submit = submitter(b, outcomes)
        callers.start_soon(submit, "a")
        await trio.sleep(0.2)
        callers.start_soon(submit, "b")
        callers.start_soon(submit, "c")
    assert [(at, sorted(types)) for at, types in sender.batches] == [(0.5, ["a", "b", "c"])]
    assert outcomes == {t: sepp.EnqueueAck(t) for t in "abc"}


async def test_a_full_batch_goes_out_at_once(autojump_clock: MockClock) -> None:
    sender = Sender()
    outcomes: dict[str, Result | BaseException] = {}
    async with (
        batcher(sender, max_batch=2, max_delay=5, eager_calls=0) as (b, _),
        trio.open_nursery() as callers,
    ):
        for job_type in "abc":
            callers.start_soon(submitter(b, outcomes), job_type)
    assert [(at, len(types)) for at, types in sender.batches] == [(0, 2), (5, 1)]
    assert len(outcomes) == 3


async def test_batches_never_exceed_the_servers_max_enqueue_batch(
    autojump_clock: MockClock,
) -> None:
    sender = Sender()
    outcomes: dict[str, Result | BaseException] = {}
    async with (
        batcher(sender, server_max=2, max_batch=100, max_delay=1, eager_calls=0) as (b, _),
        trio.open_nursery() as callers,
    ):
        for job_type in "abcde":
            callers.start_soon(submitter(b, outcomes), job_type)
    assert sorted(len(types) for _, types in sender.batches) == [1, 2, 2]


async def test_a_job_that_would_pass_max_batch_bytes_starts_a_new_batch(
    autojump_clock: MockClock,
) -> None:
    sender = Sender()
    outcomes: dict[str, Result | BaseException] = {}
    async with batcher(sender, max_batch_bytes=150, max_delay=1, eager_calls=0) as (b, _):
        async with trio.open_nursery() as callers:
            for job_type in ("a", "b", "c"):  # 72 estimated bytes each
                callers.start_soon(submitter(b, outcomes), job_type)
                await trio.testing.wait_all_tasks_blocked()
    # "c" would pass 150 bytes: the first batch is sealed and sent at once, "c" starts anew.
    assert sender.batches == [(0, ["a", "b"]), (1, ["c"])]


# -- adaptive sending: eager calls, collecting while calls are in flight -----------------------


async def test_a_lone_caller_pays_one_round_trip_and_no_max_delay(
    autojump_clock: MockClock,
) -> None:
    sender = Sender(latency=0.25)
    async with batcher(sender, max_delay=60) as (b, _):
        for job_type in "abc":  # a sequential producer
            assert await b.submit(sepp.EnqueueRequest("q", job_type)) == sepp.EnqueueAck(job_type)
    assert sender.batches == [(0, ["a"]), (0.25, ["b"]), (0.5, ["c"])]
    assert trio.current_time() == 0.75


async def test_jobs_ready_together_are_spread_over_the_eager_calls(
    autojump_clock: MockClock,
) -> None:
    sender = Sender(latency=1)
    async with batcher(sender, max_delay=60, eager_calls=4) as (b, _):
        outcomes = await submit_at(b, "abcdefghij")
    # Ten jobs, four calls that may start: shares of ceil(10/4), ceil(7/3), ceil(4/2), 2.
    assert [(at, len(types)) for at, types in sender.batches] == [(0, 3), (0, 3), (0, 2), (0, 2)]
    assert sorted(t for _, types in sender.batches for t in types) == list("abcdefghij")
    assert outcomes == {t: sepp.EnqueueAck(t) for t in "abcdefghij"}
    assert trio.current_time() == 1


async def test_jobs_collect_while_eager_calls_are_in_flight_and_go_when_one_finishes(
    autojump_clock: MockClock,
) -> None:
    sender = Sender(latency=1)
    async with batcher(sender, max_delay=60, eager_calls=2) as (b, _):
        outcomes = await submit_at(b, [(0, "a"), (0.1, "b"), (0.2, "c"), (0.3, "d")])
    # "a" and "b" take the two eager calls; "c" and "d" wait for one of them, not max_delay.
    assert sender.batches == [(0, ["a"]), (0.1, ["b"]), (1, ["c", "d"])]
    assert outcomes == {t: sepp.EnqueueAck(t) for t in "abcd"}
    assert trio.current_time() == 2


async def test_while_calls_are_in_flight_a_batch_goes_out_max_delay_after_its_first_job(
    autojump_clock: MockClock,
) -> None:
    sender = Sender(latency=10)
    async with batcher(sender, max_delay=0.5, eager_calls=1) as (b, _):
        # "a" goes at once (answered at t=10); "b" and "c" collect until t=0.2+0.5.
        outcomes = await submit_at(b, [(0, "a"), (0.2, "b"), (0.4, "c")])
    assert sender.batches == [(0, ["a"]), (0.7, ["b", "c"])]
    assert len(outcomes) == 3


async def test_while_calls_are_in_flight_a_full_batch_goes_out_at_once(
    autojump_clock: MockClock,
) -> None:
    sender = Sender(latency=10)
    async with batcher(sender, max_batch=2, max_delay=5, eager_calls=1) as (b, _):
        outcomes = await submit_at(b, [(0, "a"), (1, "b"), (1, "c"), (1, "d")])
    assert [(at, len(types)) for at, types in sender.batches] == [
        (0, 1),
        (1, 2),  # full: out at once, beside the call in flight
        (6, 1),  # the third of b, c, d: max_delay after its first job
    ]
    assert outcomes == {t: sepp.EnqueueAck(t) for t in "abcd"}


async def test_busy_producers_keep_eager_calls_in_flight_and_fill_the_batches(
    autojump_clock: MockClock,
) -> None:
    in_flight = 0
    most_in_flight = 0
    sent: list[tuple[float, int]] = []

    async def send(requests: list[sepp.EnqueueRequest]) -> list[Result]:
        nonlocal in_flight, most_in_flight
        in_flight += 1
        most_in_flight = max(most_in_flight, in_flight)
        sent.append((trio.current_time(), len(requests)))
        await trio.sleep(1)
        in_flight -= 1
        return [sepp.EnqueueAck(r.job_type) for r in requests]

    async with trio.open_nursery() as client_nursery:
        b = EnqueueBatcher(
            sepp.Batching(max_delay=60), client_nursery, send, lambda: None, runtime=TRIO
        )

        async def producer(name: str) -> None:
            for i in range(3):
                await b.submit(sepp.EnqueueRequest("q", f"{name}{i}"))

        async with trio.open_nursery() as producers:
            for name in "abcdefgh":
                producers.start_soon(producer, name)
        client_nursery.cancel_scope.cancel()
    # Eight producers, two eager calls: two calls of four jobs per round trip, no max_delay.
    assert most_in_flight == 2
    assert sent == [(0, 4), (0, 4), (1, 4), (1, 4), (2, 4), (2, 4)]
    assert trio.current_time() == 3


async def test_each_caller_is_woken_once(autojump_clock: MockClock) -> None:
    steps: dict[trio.lowlevel.Task, int] = {}

    class CountSteps(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            steps[task] = steps.get(task, 0) + 1

    callers: list[trio.lowlevel.Task] = []
    async with batcher(Sender(latency=1), max_delay=60) as (b, _):

        async def caller(job_type: str) -> None:
            callers.append(trio.lowlevel.current_task())
            await b.submit(sepp.EnqueueRequest("q", job_type))

        trio.lowlevel.add_instrument(CountSteps())
        async with trio.open_nursery() as nursery:
            for job_type in "abcdef":
                nursery.start_soon(caller, job_type)
    # One step runs the caller up to the batcher, the second returns its result.
    assert [steps[task] for task in callers] == [2] * 6


# -- results ---------------------------------------------------------------------------------


async def test_each_caller_gets_its_own_result_or_rejection(autojump_clock: MockClock) -> None:
    sender = Sender(reject={"bad": sepp.QueueFull("q", 10)})
    outcomes: dict[str, Result | BaseException] = {}
    async with (
        batcher(sender, max_delay=0.1, eager_calls=1) as (b, _),
        trio.open_nursery() as callers,
    ):
        for job_type in ("ok", "bad", "fine"):
            callers.start_soon(submitter(b, outcomes), job_type)
    assert len(sender.batches) == 1
    assert outcomes == {
        "ok": sepp.EnqueueAck("ok"),
        "bad": sepp.QueueFull("q", 10),
        "fine": sepp.EnqueueAck("fine"),
    }


async def test_a_failed_batch_gives_each_caller_its_own_copy_of_the_error(
    autojump_clock: MockClock,
) -> None:
    failure = sepp.OverloadedError("EnqueueBatch: RESOURCE_EXHAUSTED: busy")
    outcomes: dict[str, Result | BaseException] = {}
    async with batcher(Sender(error=failure), max_delay=0.1) as (b, _):
        async with trio.open_nursery() as callers:
            for job_type in "abc":
                callers.start_soon(submitter(b, outcomes), job_type)
    errors = list(outcomes.values())
    assert all(type(e) is sepp.OverloadedError and str(e) == str(failure) for e in errors)
    assert len({id(e) for e in errors}) == 3


# -- cancellation ----------------------------------------------------------------------------


async def test_a_caller_cancelled_before_sending_is_withdrawn(autojump_clock: MockClock) -> None:
    sender = Sender()
    outcomes: dict[str, Result | BaseException] = {}
    async with batcher(sender, max_delay=0.3, eager_calls=0) as (b, _):
        async with trio.open_nursery() as callers:
            callers.start_soon(submitter(b, outcomes), "keep")
            with trio.move_on_after(0.05) as scope:
                await b.submit(sepp.EnqueueRequest("q", "cancelled"))
    assert scope.cancelled_caught
    assert sender.batches == [(0.3, ["keep"])]  # the cancelled job was never sent
    assert outcomes == {"keep": sepp.EnqueueAck("keep")}


async def test_a_caller_cancelled_after_sending_leaves_the_batch_alone(
    autojump_clock: MockClock,
) -> None:
    sender = Sender(latency=1)
    outcomes: dict[str, Result | BaseException] = {}
    async with batcher(sender, max_delay=0.1, eager_calls=0) as (b, _):
        async with trio.open_nursery() as callers:
            callers.start_soon(submitter(b, outcomes), "keep")
            with trio.move_on_after(0.5) as scope:  # the batch is on the wire by then
                await b.submit(sepp.EnqueueRequest("q", "cancelled"))
    assert scope.cancelled_caught
    assert [sorted(types) for _, types in sender.batches] == [["cancelled", "keep"]]
    assert outcomes == {"keep": sepp.EnqueueAck("keep")}
    assert trio.current_time() == 1.1  # the others still got their results


async def test_a_caller_cancelled_while_its_job_waits_for_a_call_is_withdrawn(
    autojump_clock: MockClock,
) -> None:
    sender = Sender(latency=1)
    outcomes: dict[str, Result | BaseException] = {}
    async with batcher(sender, max_delay=60, eager_calls=1) as (b, _):
        async with trio.open_nursery() as callers:
            callers.start_soon(submitter(b, outcomes), "in_flight")
            await trio.sleep(0.1)
            with trio.move_on_after(0.4) as scope:
                await b.submit(sepp.EnqueueRequest("q", "cancelled"))
            callers.start_soon(submitter(b, outcomes), "kept")
    assert scope.cancelled_caught
    assert sender.batches == [(0, ["in_flight"]), (1, ["kept"])]
    assert outcomes == {"in_flight": sepp.EnqueueAck("in_flight"), "kept": sepp.EnqueueAck("kept")}


async def test_a_batch_whose_callers_all_left_is_not_sent(autojump_clock: MockClock) -> None:
    sender = Sender(latency=1)
    outcomes: dict[str, Result | BaseException] = {}
    async with batcher(sender, max_delay=60, eager_calls=1) as (b, _):
        async with trio.open_nursery() as callers:
            callers.start_soon(submitter(b, outcomes), "in_flight")
            await trio.sleep(0.1)
            with trio.move_on_after(0.4):
                await b.submit(sepp.EnqueueRequest("q", "cancelled"))
        # A later job starts a fresh batch, which goes out at once.
        assert await b.submit(sepp.EnqueueRequest("q", "later")) == sepp.EnqueueAck("later")
    assert sender.batches == [(0, ["in_flight"]), (1, ["later"])]


# -- a closed client -------------------------------------------------------------------------


async def test_every_closed_client_path_raises_the_wire_layers_error(
    autojump_clock: MockClock,
) -> None:
    sender = Sender(latency=10)
    outcomes: dict[str, Result | BaseException] = {}
    async with trio.open_nursery() as callers:
        async with batcher(sender, max_delay=1, eager_calls=0) as (b, _):
            submit = submitter(b, outcomes)
            callers.start_soon(submit, "in_flight")  # sent at t=1, no answer before t=11
            await trio.sleep(1.5)
            callers.start_soon(submit, "queued")  # would go out at t=2.5
            await trio.sleep(0.5)
        # Leaving the block closed the batcher and cancelled its nursery at t=2.
        callers.start_soon(submit, "after_close")
    assert sender.batches == [(1, ["in_flight"])]  # the queued job was never sent
    assert set(outcomes) == {"in_flight", "queued", "after_close"}
    for error in outcomes.values():
        assert_closed_error(error)


async def test_jobs_waiting_for_a_call_fail_when_the_client_closes(
    autojump_clock: MockClock,
) -> None:
    sender = Sender(latency=10)
    outcomes: dict[str, Result | BaseException] = {}
    async with trio.open_nursery() as callers:
        async with batcher(sender, max_delay=60, eager_calls=1) as (b, _):
            submit = submitter(b, outcomes)
            callers.start_soon(submit, "in_flight")
            await trio.sleep(1)
            callers.start_soon(submit, "waiting")
            await trio.sleep(1)
    assert sender.batches == [(0, ["in_flight"])]
    assert trio.current_time() == 2  # nobody waited for max_delay or the call
    for error in outcomes.values():
        assert_closed_error(error)


async def test_waiting_jobs_fail_if_the_client_nursery_goes_away_without_close(
    autojump_clock: MockClock,
) -> None:
    sender = Sender(latency=10)
    outcomes: dict[str, Result | BaseException] = {}
    with trio.fail_after(30):  # on the mock clock: a caller left waiting fails the test
        async with trio.open_nursery() as callers, trio.open_nursery() as client_nursery:
            batching = sepp.Batching(max_delay=60, eager_calls=1)
            b = EnqueueBatcher(batching, client_nursery, sender, lambda: None, runtime=TRIO)
            submit = submitter(b, outcomes)
            callers.start_soon(submit, "in_flight")
            await trio.sleep(1)
            callers.start_soon(submit, "waiting")
            await trio.sleep(1)
            client_nursery.cancel_scope.cancel()
    assert set(outcomes) == {"in_flight", "waiting"}
    for error in outcomes.values():
        assert_closed_error(error)


def test_the_closed_error_is_the_wire_layers() -> None:
    assert_closed_error(CLOSED)


def test_max_batch_bytes_over_the_servers_message_cap_is_refused() -> None:
    assert sepp.Batching(max_batch_bytes=16 * 1024 * 1024).max_batch_bytes == 16 * 1024 * 1024
    with pytest.raises(sepp.ValidationError, match="between 1 and 16777216") as info:
        sepp.Batching(max_batch_bytes=16 * 1024 * 1024 + 1)
    assert info.value.field == "batching.max_batch_bytes"
