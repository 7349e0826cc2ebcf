"""Opt-in auto-batching of single-job `enqueue` calls into EnqueueBatch requests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

import trio

from . import _validate as v
from ._chunking import estimated_bytes
from ._errors import SeppError, error_from_status
from ._rejections import JobRejection
from ._types import EnqueueAck, EnqueueRequest
from .wire._failure import FailureKind
from .wire._status import StatusCode


@dataclass(frozen=True, slots=True)
class Batching:
    """Send concurrent `enqueue` calls made within `max_delay` as one EnqueueBatch.

    A batch goes out when it holds `max_batch` jobs (never more than the server's
    `max_enqueue_batch`), when it would exceed `max_batch_bytes`, or `max_delay` after its
    first job, whichever comes first. Every caller still gets its own EnqueueAck or
    JobRejectedError; a failure of the whole request raises the same typed error in each.
    """

    max_batch: int = 256
    max_delay: float | timedelta = 0.002
    max_batch_bytes: int = 4 * 1024 * 1024

    def __post_init__(self) -> None:
        v.whole_number("batching.max_batch", self.max_batch, low=1, high=100_000)
        v.seconds("batching.max_delay", self.max_delay, allow_zero=True)
        v.whole_number("batching.max_batch_bytes", self.max_batch_bytes, low=1, high=2**31)


Result = EnqueueAck | JobRejection
SendBatch = Callable[[list[EnqueueRequest]], Awaitable[list[Result]]]


class _Slot:
    __slots__ = ("done", "error", "request", "result", "sent")

    def __init__(self, request: EnqueueRequest) -> None:
        self.request = request
        self.done = trio.Event()
        self.result: Result | None = None
        self.error: SeppError | None = None
        self.sent = False


class _Batch:
    __slots__ = ("full", "size_bytes", "slots")

    def __init__(self) -> None:
        self.slots: list[_Slot] = []
        self.size_bytes = 0
        self.full = trio.Event()


class EnqueueBatcher:
    """Collects single enqueues; a short-lived task in the client's nursery sends each batch,
    so a caller's cancellation never cancels the others' jobs."""

    def __init__(
        self,
        config: Batching,
        nursery: trio.Nursery,
        send: SendBatch,
        server_max_batch: Callable[[], int | None],
    ) -> None:
        self._config = config
        self._delay_s = v.seconds("max_delay", config.max_delay, allow_zero=True)
        self._nursery = nursery
        self._send = send
        self._server_max_batch = server_max_batch
        self._open: _Batch | None = None
        self._unsent: set[_Batch] = set()
        self._closed = False

    def _limit(self) -> int:
        server = self._server_max_batch()
        return min(self._config.max_batch, server) if server else self._config.max_batch

    async def submit(self, request: EnqueueRequest) -> Result:
        if self._closed:
            raise _client_closed()
        size = estimated_bytes(request)
        batch = self._open
        if batch is not None and batch.size_bytes + size > self._config.max_batch_bytes:
            self._seal(batch)
            batch = None
        if batch is None:
            batch = self._open = _Batch()
            self._unsent.add(batch)
            self._nursery.start_soon(self._flush_later, batch)
        slot = _Slot(request)
        batch.slots.append(slot)
        batch.size_bytes += size
        if len(batch.slots) >= self._limit():
            self._seal(batch)
        try:
            await slot.done.wait()
        except BaseException:
            if not slot.sent:
                # Not sent yet: withdraw it so a cancelled caller's job is never enqueued.
                batch.slots.remove(slot)
                batch.size_bytes -= size
            raise
        if slot.error is not None:
            raise _clone(slot.error)
        assert slot.result is not None
        return slot.result

    def _seal(self, batch: _Batch) -> None:
        if self._open is batch:
            self._open = None
        batch.full.set()

    async def _flush_later(self, batch: _Batch) -> None:
        with trio.move_on_after(self._delay_s):
            await batch.full.wait()
        self._seal(batch)
        self._unsent.discard(batch)
        live = batch.slots
        if not live:
            return
        for slot in live:
            slot.sent = True
        try:
            results = await self._send([slot.request for slot in live])
        except SeppError as exc:
            for slot in live:
                slot.error = exc
                slot.done.set()
            return
        except BaseException:
            error = _client_closed()
            for slot in live:
                slot.error = error
                slot.done.set()
            raise
        for slot, result in zip(live, results, strict=True):
            slot.result = result
            slot.done.set()

    def close(self) -> None:
        """Fail every job not yet sent; batches in flight fail as their task is cancelled."""
        self._closed = True
        error = _client_closed()
        for batch in self._unsent:
            for slot in batch.slots:
                slot.error = error
                slot.done.set()
            batch.slots.clear()
        self._unsent.clear()
        self._open = None


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
