"""The Worker's and the Scheduler's primitives under asyncio (and uvloop), on anyio: its task
groups and cancel scopes keep trio's semantics (level-triggered cancellation, deadlines that
move, a block that waits for its tasks), which the services are written for. Imported only
when a service runs under asyncio; anyio is the `asyncio` extra."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, TypeVar, cast

import anyio
import anyio.lowlevel
import anyio.to_thread

from .asyncio_runtime import ASYNCIO
from .primitives import Concurrency
from .protocol import CancelScope, Nursery

if TYPE_CHECKING:
    from typing_extensions import TypeVarTuple, Unpack

    PosArgs = TypeVarTuple("PosArgs")

T = TypeVar("T")


class ParkingLot:
    """trio's ParkingLot as the Worker uses it: `park()` until `unpark_all()`; truthy while a
    task is parked."""

    __slots__ = ("_parked",)

    def __init__(self) -> None:
        self._parked: dict[int, anyio.Event] = {}

    def __bool__(self) -> bool:
        return bool(self._parked)

    async def park(self) -> None:
        event = _Event()
        key = id(event)
        self._parked[key] = event
        try:
            await event.wait()
        finally:
            self._parked.pop(key, None)

    def unpark_all(self) -> None:
        parked, self._parked = self._parked, {}
        for event in parked.values():
            event.set()


def _asyncio_classes() -> tuple[Callable[..., CancelScope], Callable[[], anyio.Event]]:
    """anyio's asyncio cancel scope and event classes: what `anyio.CancelScope()` and
    `anyio.Event()` make, without their look-up of the running backend (sniffio) each time,
    which a job pays a few times. Their public forms where anyio moved them."""
    try:
        from anyio._backends._asyncio import CancelScope as AsyncioScope
        from anyio._backends._asyncio import Event as AsyncioEvent
    except ImportError:
        return anyio.CancelScope, anyio.Event
    if not (issubclass(AsyncioScope, anyio.CancelScope) and issubclass(AsyncioEvent, anyio.Event)):
        return anyio.CancelScope, anyio.Event
    return AsyncioScope, AsyncioEvent


_Scope, _Event = _asyncio_classes()


def _asyncio_checkpoints() -> tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]:
    """anyio's checkpoints on asyncio without their backend look-up (a job pays one)."""
    try:
        from anyio._backends._asyncio import AsyncIOBackend
    except ImportError:
        return anyio.lowlevel.checkpoint, anyio.lowlevel.checkpoint_if_cancelled
    return AsyncIOBackend.checkpoint, AsyncIOBackend.checkpoint_if_cancelled


_checkpoint, _checkpoint_if_cancelled = _asyncio_checkpoints()


class _JobTasks:
    """The Worker's jobs' tasks on asyncio: asyncio tasks each in an anyio cancel scope of its
    own, where anyio's task group costs about 25 µs more a task (a task handle with its own
    scope and event, a wrapping coroutine, a look-up of the running backend for each), a
    job's largest cost on asyncio. The block waits for its tasks; the block's task being
    cancelled (the Worker's run, in anyio's task group) cancels their scopes, and one failing
    cancels the others and the enclosing task group (so the block's body too) and is raised
    from the block, as a nursery does. Through the scopes the cancellation is anyio's:
    level-triggered, and stopped by a shielded scope inside."""

    __slots__ = ("_all_done", "_cancelling", "_errors", "_loop", "_nursery", "_scopes", "_tasks")

    def __init__(self, nursery: Nursery) -> None:
        self._nursery = nursery
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._scopes: set[CancelScope] = set()
        self._errors: list[BaseException] = []
        self._all_done: asyncio.Future[None] | None = None
        self._cancelling = False

    def start_soon(
        self,
        fn: Callable[[Unpack[PosArgs]], Awaitable[object]],
        *args: Unpack[PosArgs],
        name: object = None,
    ) -> None:
        task = self._loop.create_task(self._run(fn, args), name=None if name is None else str(name))
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    async def _run(self, fn: Callable[..., Awaitable[object]], args: tuple[Any, ...]) -> None:
        scope = _Scope()
        self._scopes.add(scope)
        try:
            with scope:
                if self._cancelling:
                    scope.cancel()
                await fn(*args)
        finally:
            self._scopes.discard(scope)

    def _cancel(self) -> None:
        self._cancelling = True
        for scope in self._scopes:
            scope.cancel()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            self._errors.append(error)
            self._cancel()
            self._nursery.cancel_scope.cancel()
        if not self._tasks and self._all_done is not None and not self._all_done.done():
            self._all_done.set_result(None)

    async def wait(self, body_error: BaseException | None) -> None:
        if body_error is not None:
            self._cancel()
        cancelled: BaseException | None = None
        with cast("anyio.CancelScope", _Scope()) as scope:
            while self._tasks:
                self._all_done = self._loop.create_future()
                try:
                    await self._all_done
                except asyncio.CancelledError as error:
                    # The tasks end first, then the cancellation goes on; shielded meanwhile,
                    # as anyio's own group is, or anyio would cancel each wait again.
                    cancelled = error
                    scope.shield = True
                    self._cancel()
        if self._errors:
            errors, self._errors = self._errors, []
            raise BaseExceptionGroup("errors in a sepp Worker's job tasks", errors)
        if cancelled is not None:
            raise cancelled


@contextlib.asynccontextmanager
async def _open_job_tasks(nursery: Nursery) -> AsyncIterator[_JobTasks]:
    tasks = _JobTasks(nursery)
    try:
        yield tasks
    except BaseException as error:
        await tasks.wait(error)
        raise
    await tasks.wait(None)


def _loop_time() -> float:
    # anyio's deadlines are on the running loop's clock; this skips its backend look-up.
    return asyncio.get_running_loop().time()


def _move_on_at(deadline: float) -> CancelScope:
    return _Scope(deadline=deadline)


def _move_on_after(delay_s: float) -> CancelScope:
    return _Scope(deadline=_loop_time() + delay_s)


ANYIO = Concurrency(
    "asyncio (anyio)",
    current_time=_loop_time,
    clock=lambda: asyncio.get_running_loop().time,
    sleep=anyio.sleep,
    sleep_until=anyio.sleep_until,
    checkpoint=_checkpoint,
    checkpoint_if_cancelled=_checkpoint_if_cancelled,
    cancel_scope=_Scope,
    cancelled=asyncio.CancelledError,
    move_on_at=_move_on_at,
    move_on_after=_move_on_after,
    # A task group is a nursery (start_soon(fn, *args, name=...)); its typing says so less.
    open_nursery=cast(
        "Callable[[], AbstractAsyncContextManager[Nursery]]", anyio.create_task_group
    ),
    open_job_tasks=_open_job_tasks,
    event=_Event,
    lock=anyio.Lock,
    parking_lot=ParkingLot,
    waiter=ASYNCIO.waiter,
    park=ASYNCIO.park,
    unpark=ASYNCIO.unpark,
    park_aborted=ASYNCIO.park_aborted,
)

# Threads for `def` handlers: a limiter per loop without a cap (the Worker's slots are the cap),
# not anyio's default one (40 threads, shared with every other to_thread user) nor the loop's
# default executor.
_THREADS: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar(
    "sepp_handler_threads"
)


async def run_sync_in_thread(fn: Callable[..., T], *args: object, abandon: bool = True) -> T:
    try:
        limiter = _THREADS.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(math.inf)
        _THREADS.set(limiter)
    return await anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=abandon, limiter=limiter)
