"""The blocking runtime (`BLOCKING`, `SyncClient`'s): every await of the shared client code
completes without suspending (the blocking channel reads its socket in the calling thread,
sleeps are `time.sleep`), so `run_blocking` runs an operation to its end with one
`coroutine.send(None)`. It has only the client's members (`protocol.Runtime`: no Worker or
Scheduler runs on it); what needs an event loop (tasks, cancel scopes, parking, calls from
other threads) is never reached here, and raises ClientInternalError if it is."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from .._model.errors import ClientInternalError
from .protocol import CallSoon, CancelScope, EventLike, TaskGroup, Waiter

if TYPE_CHECKING:
    from ..wire.drivers._base import ChannelOptions, Endpoint
    from ..wire.drivers._blocking import BlockingChannel

T = TypeVar("T")


def run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine of the shared client code under BLOCKING to its end, here and now."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise ClientInternalError("a blocking operation tried to suspend")


def _needs_an_event_loop(what: str) -> NoReturn:
    raise ClientInternalError(f"{what} needs an event loop, and the blocking runtime has none")


class BlockingRuntime:
    current_time = staticmethod(time.monotonic)

    def effective_deadline(self) -> float:
        return math.inf

    async def sleep(self, seconds: float) -> None:
        time.sleep(seconds)  # noqa: ASYNC251 - this runtime blocks by design

    def move_on_at(self, deadline: float) -> CancelScope:
        _needs_an_event_loop("a cancel scope")

    async def bounded(self, work: Callable[[float | None], Awaitable[None]], until: float) -> None:
        left = until - time.monotonic()
        if left > 0:
            await work(None if left == math.inf else left)

    def open_task_group(self) -> AbstractAsyncContextManager[TaskGroup]:
        _needs_an_event_loop("a task group")

    async def run_concurrently(
        self, worker: Callable[[], Awaitable[None]], *, at_most: int
    ) -> None:
        await worker()

    def owner(self) -> object | None:
        return None

    def event(self) -> EventLike:
        return threading.Event()

    async def wait_event(self, event: EventLike, until: float) -> None:
        assert isinstance(event, threading.Event)
        left = until - time.monotonic()
        if left > 0:
            event.wait(None if left == math.inf else left)

    def waiter(self) -> Waiter:
        _needs_an_event_loop("parking a task")

    @property
    def park_aborted(self) -> object:
        _needs_an_event_loop("parking a task")

    def park(self, abort: Callable[[Any], Any]) -> Awaitable[None]:
        _needs_an_event_loop("parking a task")

    def unpark(self, waiter: Waiter) -> None:
        _needs_an_event_loop("parking a task")

    def run(self, main: Callable[..., Awaitable[object]], *args: Any) -> object:
        awaitable = main(*args)
        assert isinstance(awaitable, Coroutine)
        return run_blocking(awaitable)

    def call_soon_handle(self) -> CallSoon:
        _needs_an_event_loop("a run other threads call into")

    def is_cancellation(self, error: BaseException) -> bool:
        return False  # nothing cancels a blocking call but its own timeout

    def check_running(self, what: str) -> None:
        """Any thread may run the blocking front end."""

    def channel(
        self, endpoint: Endpoint, options: ChannelOptions, tasks: TaskGroup | None
    ) -> BlockingChannel:
        from ..wire.drivers._blocking import BlockingChannel

        return BlockingChannel(endpoint, **options)


BLOCKING = BlockingRuntime()  # a Runtime (checked where it is passed as one)
