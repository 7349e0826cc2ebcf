"""Opt-in auto-batching of single-job `enqueue` calls into EnqueueBatch requests.

Group commit: a batch goes out as soon as fewer than `eager_calls` of the batcher's calls are
in flight, so a lone caller pays one round trip and no `max_delay`; while that many are in
flight, jobs accumulate and the batch goes out when one of them finishes, when it is full, or
`max_delay` after its first job. Under load, batches grow to fill the time the calls take.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

from .._model import validate as v
from .._model.errors import SeppError, error_from_status
from .._model.rejections import JobRejection
from .._model.types import EnqueueAck, EnqueueRequest
from .._runtime.protocol import Runtime, TaskGroup, Waiter
from ..wire._failure import FailureKind
from ..wire._status import StatusCode
from .chunking import SERVER_MAX_MESSAGE_BYTES, estimated_bytes


@dataclass(frozen=True, slots=True)
class Batching:
    """Send concurrent `enqueue` calls as shared EnqueueBatch requests.

    A batch goes out at once while fewer than `eager_calls` of the batcher's EnqueueBatch
    calls are in flight (jobs ready together are shared out over the calls that may start).
    Otherwise it collects jobs until one of them finishes, until it holds
    `max_batch` jobs (never more than the server's `max_enqueue_batch`) or would exceed
    `max_batch_bytes`, or until `max_delay` after its first job, whichever comes first.
    `eager_calls=0` always waits for a full batch or `max_delay`. `max_batch_bytes` may be at
    most 16 MiB, the server's message cap (sepp's `max_message_bytes`, which it does not
    advertise). Every caller still gets its
    own EnqueueAck or JobRejectedError; a failure of the whole request raises the same typed
    error in each.
    """

    max_batch: int = 256
    max_delay: float | timedelta = 0.002
    max_batch_bytes: int = 4 * 1024 * 1024
    eager_calls: int = 2

    def __post_init__(self) -> None:
        v.whole_number("batching.max_batch", self.max_batch, low=1, high=100_000)
        v.seconds("batching.max_delay", self.max_delay, allow_zero=True)
        # A batch over the server's (unadvertised) message cap would fail whole; the estimate
        # is an upper bound, so a batch kept under it always fits.
        v.whole_number(
            "batching.max_batch_bytes",
            self.max_batch_bytes,
            low=1,
            high=SERVER_MAX_MESSAGE_BYTES,
        )
        v.whole_number("batching.eager_calls", self.eager_calls, low=0, high=1_000)


Result = EnqueueAck | JobRejection
SendBatch = Callable[[list[EnqueueRequest]], Awaitable[list[Result]]]


class _Batch:
    __slots__ = ("aborted", "deadline", "dispatcher", "limit", "sealed", "size_bytes", "slots")

    def __init__(self, limit: int, deadline: float, aborted: object) -> None:
        self.slots: list[_Slot] = []
        self.size_bytes = 0
        self.limit = limit
        self.deadline = deadline
        # Full (or over max_batch_bytes): takes no more jobs and goes out at once.
        self.sealed = False
        # The batch's dispatcher task, parked while it waits for a call to finish.
        self.dispatcher: Waiter | None = None
        self.aborted = aborted  # what a parked task's abort returns to the runtime


class _Slot:
    """One caller's job; the caller is parked (no Event) until `result` or `error` is set."""

    __slots__ = ("batch", "error", "request", "result", "sent", "size", "task")

    def __init__(self, request: EnqueueRequest, size: int, batch: _Batch, task: Waiter) -> None:
        self.request = request
        self.size = size
        self.batch = batch
        self.task: Waiter | None = task
        self.sent = False
        self.result: Result | None = None
        self.error: SeppError | None = None

    def abort(self, _raise_cancel: object) -> object:
        """The caller is cancelled: nothing is delivered to it, and a job not yet sent is
        withdrawn so that it is never enqueued."""
        self.task = None
        if not self.sent:
            self.batch.slots.remove(self)
            self.batch.size_bytes -= self.size
        return self.batch.aborted


class EnqueueBatcher:
    """Collects single enqueues; a short-lived dispatcher task per batch, in the client's
    nursery, sends it, so a caller's cancellation never cancels the others' jobs."""

    def __init__(
        self,
        config: Batching,
        nursery: TaskGroup,
        send: SendBatch,
        server_max_batch: Callable[[], int | None],
        *,
        runtime: Runtime,
    ) -> None:
        self._max_batch = config.max_batch
        self._max_bytes = config.max_batch_bytes
        self._delay_s = v.seconds("max_delay", config.max_delay, allow_zero=True)
        self._eager_calls = config.eager_calls
        self._nursery = nursery
        self._rt = runtime
        # Bound once: the parking is on every caller's path.
        self._waiter = runtime.waiter
        self._park = runtime.park
        self._unpark = runtime.unpark
        self._send = send
        self._server_max_batch = server_max_batch
        # The batch taking new jobs; the only one that can be waiting for a call to finish.
        self._open: _Batch | None = None
        self._unsent: set[_Batch] = set()
        self._in_flight = 0
        self._closed = False

    async def submit(self, request: EnqueueRequest) -> Result:
        if self._closed:
            raise _client_closed()
        size = estimated_bytes(request)
        batch = self._open
        if batch is not None and batch.size_bytes + size > self._max_bytes:
            self._seal(batch)
            batch = None
        if batch is None:
            batch = self._open = self._new_batch()
        slot = _Slot(request, size, batch, self._waiter())
        batch.slots.append(slot)
        batch.size_bytes += size
        if len(batch.slots) >= batch.limit:
            self._seal(batch)
        await self._park(slot.abort)
        if slot.error is not None:
            raise _clone(slot.error)
        assert slot.result is not None
        return slot.result

    def _new_batch(self) -> _Batch:
        server = self._server_max_batch()
        limit = min(self._max_batch, server) if server else self._max_batch
        batch = _Batch(limit, self._rt.current_time() + self._delay_s, self._rt.park_aborted)
        self._unsent.add(batch)
        self._nursery.start_soon(self._dispatch, batch)
        return batch

    def _seal(self, batch: _Batch) -> None:
        if self._open is batch:
            self._open = None
        batch.sealed = True
        self._wake(batch)

    def _retire(self, batch: _Batch) -> None:
        """All of the batch's jobs are sent (or withdrawn): new jobs need a new batch."""
        if self._open is batch:
            self._open = None
        self._unsent.discard(batch)

    async def _dispatch(self, batch: _Batch) -> None:
        """Send the batch, or a share of it when several calls may start now."""
        if not batch.sealed and self._in_flight >= self._eager_calls:
            await self._wait_for_turn(batch)
        jobs = len(batch.slots)
        free = self._eager_calls - self._in_flight
        share = jobs if free <= 1 else -(-jobs // free)
        if share < jobs:
            # Spread the jobs over the calls that may start at once: the client works on
            # one call's results while the server works on the next one.
            live = batch.slots[:share]
            del batch.slots[:share]
            batch.size_bytes -= sum(slot.size for slot in live)
            self._nursery.start_soon(self._dispatch, batch)
        else:
            live = batch.slots
            batch.slots = []
            self._retire(batch)
            if not live:
                return
        requests = []
        for slot in live:
            slot.sent = True
            requests.append(slot.request)
        self._in_flight += 1
        try:
            results = await self._send(requests)
        except SeppError as exc:
            self._fail(live, exc)
            return
        except BaseException:
            self._fail(live, _client_closed())
            raise
        finally:
            self._in_flight -= 1
            if self._open is not None and self._in_flight < self._eager_calls:
                self._wake(self._open)  # a call finished: the collected jobs go now
        unpark = self._unpark
        for slot, result in zip(live, results, strict=True):
            if slot.task is not None:
                slot.result = result
                unpark(slot.task)

    async def _wait_for_turn(self, batch: _Batch) -> None:
        """Until a call finishes, the batch is sealed, or max_delay after its first job."""

        def abort(_raise_cancel: object) -> object:
            batch.dispatcher = None
            return batch.aborted

        batch.dispatcher = self._waiter()
        try:
            with self._rt.move_on_at(batch.deadline):
                await self._park(abort)
        except BaseException:
            # The client's nursery is going away: nobody else will answer these callers.
            self._fail(batch.slots, _client_closed())
            batch.slots.clear()
            self._retire(batch)
            raise

    def close(self) -> None:
        """Fail every job not yet sent; calls in flight fail as their task is cancelled."""
        self._closed = True
        error = _client_closed()
        for batch in self._unsent:
            self._fail(batch.slots, error)
            batch.slots.clear()
            self._wake(batch)
        self._unsent.clear()
        self._open = None

    def _wake(self, batch: _Batch) -> None:
        task = batch.dispatcher
        if task is not None:
            batch.dispatcher = None
            self._unpark(task)

    def _fail(self, slots: list[_Slot], error: SeppError) -> None:
        for slot in slots:
            if slot.task is not None:
                slot.error = error
                self._unpark(slot.task)
                slot.task = None


def _client_closed() -> SeppError:
    # The very error a call on the closed channel gets, so callers see one error, one code.
    return error_from_status(
        StatusCode.UNAVAILABLE,
        "the client is closed",
        method="EnqueueBatch",
        kind=FailureKind.CLOSED,
    )


def _clone(error: SeppError) -> SeppError:
    """A separate exception object per caller: tracebacks are per raise, and callers run in
    different tasks."""
    clone = type(error).__new__(type(error))
    clone.__dict__.update(error.__dict__)
    clone.args = error.args
    return clone
