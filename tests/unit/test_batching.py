"""The auto-batcher on its own, on trio's MockClock: when a batch goes out, who gets which
result, cancellation before and after sending, and the one error of a closed client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio
from trio.testing import MockClock

import sepp
from sepp._batching import EnqueueBatcher
from sepp._errors import error_from_status
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
        b = EnqueueBatcher(batching, client_nursery, sender, lambda: server_max)
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


async def test_a_batch_goes_out_max_delay_after_its_first_job(autojump_clock: MockClock) -> None:
    sender = Sender()
    outcomes: dict[str, Result | BaseException] = {}
    async with batcher(sender, max_delay=0.5) as (b, _), trio.open_nursery() as callers:
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
    async with batcher(sender, max_batch=2, max_delay=5) as (b, _), trio.open_nursery() as callers:
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
        batcher(sender, server_max=2, max_batch=100, max_delay=1) as (b, _),
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
    async with batcher(sender, max_batch_bytes=150, max_delay=1) as (b, _):
        async with trio.open_nursery() as callers:
            for job_type in ("a", "b", "c"):  # 72 estimated bytes each
                callers.start_soon(submitter(b, outcomes), job_type)
                await trio.testing.wait_all_tasks_blocked()
    # "c" would pass 150 bytes: the first batch is sealed and sent at once, "c" starts anew.
    assert sender.batches == [(0, ["a", "b"]), (1, ["c"])]


# -- results ---------------------------------------------------------------------------------


async def test_each_caller_gets_its_own_result_or_rejection(autojump_clock: MockClock) -> None:
    sender = Sender(reject={"bad": sepp.QueueFull("q", 10)})
    outcomes: dict[str, Result | BaseException] = {}
    async with batcher(sender, max_delay=0.1) as (b, _), trio.open_nursery() as callers:
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
    async with batcher(sender, max_delay=0.3) as (b, _):
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
    async with batcher(sender, max_delay=0.1) as (b, _):
        async with trio.open_nursery() as callers:
            callers.start_soon(submitter(b, outcomes), "keep")
            with trio.move_on_after(0.5) as scope:  # the batch is on the wire by then
                await b.submit(sepp.EnqueueRequest("q", "cancelled"))
    assert scope.cancelled_caught
    assert [sorted(types) for _, types in sender.batches] == [["cancelled", "keep"]]
    assert outcomes == {"keep": sepp.EnqueueAck("keep")}
    assert trio.current_time() == 1.1  # the others still got their results


# -- a closed client -------------------------------------------------------------------------


async def test_every_closed_client_path_raises_the_wire_layers_error(
    autojump_clock: MockClock,
) -> None:
    sender = Sender(latency=10)
    outcomes: dict[str, Result | BaseException] = {}
    async with trio.open_nursery() as callers:
        async with batcher(sender, max_delay=1) as (b, _):
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


def test_the_closed_error_is_the_wire_layers() -> None:
    assert_closed_error(CLOSED)
