"""The asyncio runtime (`ASYNCIO`, also under uvloop): the client's one asyncio module, loaded
only when a client is opened under asyncio (so `import sepp` under trio never imports it).

trio's vocabulary on asyncio: a task group whose tasks all end before it closes (its own, as
asyncio.TaskGroup is 3.11+ and cancels its body), cancel scopes from `_asyncio_scopes`, parking
a task on a future. A client serves the event loop that opened it (`owner`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

from ..wire.drivers._asyncio import AsyncioChannel
from ..wire.drivers._asyncio_scopes import MoveOnAt, enclosing_deadline
from ..wire.drivers._base import ChannelOptions, Endpoint
from .protocol import CallSoon, EventLike, Runtime, TaskGroup, Waiter

if TYPE_CHECKING:
    from typing_extensions import TypeVarTuple, Unpack

    PosArgs = TypeVarTuple("PosArgs")

_ABORTED = object()


class _TaskGroup:
    """Tasks that all end before the group's block does. A task failing cancels the others
    (the block then raises the failures as a group, as a trio nursery does); cancelling the
    group (`cancel_scope.cancel()`) cancels its tasks; the caller cancelled while waiting for
    them cancels them too, waits for them, then goes on being cancelled."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[object]] = set()
        self._errors: list[BaseException] = []
        self._closed = False
        self._all_done: asyncio.Future[None] | None = None
        self.cancelled_caught = False

    @property
    def cancel_scope(self) -> _TaskGroup:
        return self

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()

    def start_soon(
        self,
        async_fn: Callable[[Unpack[PosArgs]], Awaitable[object]],
        *args: Unpack[PosArgs],
        name: object = None,
    ) -> None:
        if self._closed:
            raise RuntimeError("this task group is closed")
        coro = cast("Coroutine[Any, Any, object]", async_fn(*args))
        task = self._loop.create_task(coro, name=None if name is None else str(name))
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[object]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            error = task.exception()
            if error is not None:
                self._errors.append(error)
                self.cancel()
        if not self._tasks and self._all_done is not None and not self._all_done.done():
            self._all_done.set_result(None)

    async def __aenter__(self) -> _TaskGroup:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc is not None:
            self.cancel()
        cancelled: asyncio.CancelledError | None = None
        while self._tasks:
            self._all_done = self._loop.create_future()
            try:
                await self._all_done
            except asyncio.CancelledError as error:
                cancelled = error  # the tasks end first, then the cancellation goes on
                self.cancel()
        self._closed = True
        if self._errors:
            errors, self._errors = self._errors, []
            raise BaseExceptionGroup("errors in a sepp client task", errors)
        if cancelled is not None:
            raise cancelled
        return False


class AsyncioRuntime:
    def now(self) -> float:
        return asyncio.get_running_loop().time()

    effective_deadline = staticmethod(enclosing_deadline)
    sleep = staticmethod(asyncio.sleep)

    def move_on_at(self, deadline: float) -> MoveOnAt:
        return MoveOnAt(deadline)

    async def bounded(self, work: Callable[[float | None], Awaitable[None]], until: float) -> None:
        with MoveOnAt(until):
            await work(None)

    def open_task_group(self) -> AbstractAsyncContextManager[TaskGroup]:
        return _TaskGroup()

    async def run_concurrently(
        self, worker: Callable[[], Awaitable[None]], *, at_most: int
    ) -> None:
        async with _TaskGroup() as group:
            for _ in range(at_most):
                group.start_soon(worker)

    def owner(self) -> object | None:
        try:
            return asyncio.get_running_loop()
        except RuntimeError:
            return None

    def event(self) -> EventLike:
        return asyncio.Event()

    async def wait_event(self, event: EventLike, until: float) -> None:
        assert isinstance(event, asyncio.Event)
        with MoveOnAt(until):
            await event.wait()

    # Parking: the waiter is a future; the task that made it parks on it.
    park_aborted = _ABORTED

    def __init__(self) -> None:
        self._parking: dict[asyncio.Task[Any], asyncio.Future[None]] = {}

    def waiter(self) -> Waiter:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task = asyncio.current_task()
        assert task is not None
        self._parking[task] = future
        return future

    async def park(self, abort: Callable[[Any], Any]) -> None:
        task = asyncio.current_task()
        assert task is not None
        future = self._parking.pop(task)
        try:
            await future
        except asyncio.CancelledError:
            if not future.done() or future.cancelled():
                future.cancel()
                abort(None)  # never unparked now
            raise

    def unpark(self, waiter: Waiter) -> None:
        if not waiter.done():
            waiter.set_result(None)

    def run(self, main: Callable[..., Awaitable[object]], *args: Any) -> object:
        async def entry() -> object:
            return await main(*args)

        return asyncio.run(entry())

    def call_soon_handle(self) -> CallSoon:
        loop = asyncio.get_running_loop()

        def call_soon(fn: Callable[[], object]) -> bool:
            try:
                loop.call_soon_threadsafe(fn)
            except RuntimeError:  # the loop is closed
                return False
            return True

        return call_soon

    def is_cancellation(self, error: BaseException) -> bool:
        return isinstance(error, asyncio.CancelledError)

    def check_running(self, what: str) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(f"{what} must be called from a running asyncio loop") from None

    def channel(
        self, endpoint: Endpoint, options: ChannelOptions, tasks: TaskGroup | None
    ) -> AsyncioChannel:
        return AsyncioChannel(endpoint, **options)


ASYNCIO: Runtime = AsyncioRuntime()
