"""asyncio's runtime (`ASYNCIO`, also under uvloop), for the client, the Worker and the
Scheduler: loaded only when one runs under asyncio (so `import sepp` under trio never imports
it, nor asyncio).

trio's vocabulary on asyncio. The client's members are plain asyncio, so a client needs
nothing more: cancel scopes from `_asyncio_scopes`, a task group of plain tasks, parking a
task on a future; a client serves the event loop that opened it (`owner`). The services'
members (`for_services()`) are anyio's (the `asyncio` extra, imported then): its task groups
and cancel scopes keep trio's semantics (level-triggered cancellation, deadlines that move, a
block that waits for its tasks), which the services are written for; but the Worker's jobs'
tasks are this module's one task group, for their cost.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..wire.drivers import AsyncioChannel, ChannelOptions, Endpoint, MoveOnAt, enclosing_deadline
from .protocol import (
    PLAIN_MEMBERS,
    CancelScope,
    EventLike,
    Lock,
    Nursery,
    ServiceRuntime,
    Waiter,
    threads_limiter,
)
from .protocol import (
    TaskGroup as TaskGroupLike,
)

if TYPE_CHECKING:
    from typing_extensions import TypeVarTuple, Unpack

    PosArgs = TypeVarTuple("PosArgs")

T = TypeVar("T")

_ABORTED = object()


class Event(asyncio.Event):
    """asyncio's event with trio's `wait()` (anyio's too): a checkpoint when it is already set,
    so a loop that waits for a set event still lets the others run and sees a cancellation."""

    __slots__ = ()

    async def wait(self) -> None:  # type: ignore[override]  # returns nothing, as trio's
        if self.is_set():
            await asyncio.sleep(0)
        else:
            await super().wait()


class ParkingLot:
    """trio's ParkingLot as the Worker uses it: `park()` until `unpark_all()`; truthy while a
    task is parked."""

    __slots__ = ("_parked",)

    def __init__(self) -> None:
        self._parked: dict[int, Event] = {}

    def __bool__(self) -> bool:
        return bool(self._parked)

    async def park(self) -> None:
        event = Event()
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


class TaskGroup:
    """Tasks that all end before the group's block does: the client's task group, plain
    asyncio tasks (asyncio.TaskGroup is 3.11+ and cancels its body). A task failing cancels
    the others (the block then raises the failures as a group, as a trio nursery does);
    cancelling the group (`cancel_scope.cancel()`) cancels its tasks; the caller cancelled
    while waiting for them cancels them too, waits for them, then goes on being cancelled."""

    __slots__ = ("_all_done", "_closed", "_errors", "_loop", "_tasks", "cancelled_caught")

    _what = "a sepp client task"

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._errors: list[BaseException] = []
        self._closed = False
        self._all_done: asyncio.Future[None] | None = None
        self.cancelled_caught = False

    @property
    def cancel_scope(self) -> TaskGroup:
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

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            self._errors.append(error)
            self._failed()
        if not self._tasks and self._all_done is not None and not self._all_done.done():
            self._all_done.set_result(None)

    def _failed(self) -> None:
        self.cancel()

    async def __aenter__(self) -> TaskGroup:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc is not None:
            self.cancel()
        cancelled = await self._wait_for_tasks(None)
        self._closed = True
        if self._errors:
            errors, self._errors = self._errors, []
            raise BaseExceptionGroup(f"errors in {self._what}", errors)
        if cancelled is not None:
            raise cancelled
        return False

    async def _wait_for_tasks(self, shield: Any) -> BaseException | None:
        """Until every task has ended; the cancellation that came meanwhile, if one did (the
        tasks end first, then it goes on). `shield`: an anyio scope around this wait, shielded
        once cancelled, as anyio's own group does, or anyio would cancel each wait again."""
        cancelled: BaseException | None = None
        while self._tasks:
            self._all_done = self._loop.create_future()
            try:
                await self._all_done
            except asyncio.CancelledError as error:
                cancelled = error
                if shield is not None:
                    shield.shield = True
                self.cancel()
        return cancelled


class _JobTasks(TaskGroup):
    """The Worker's jobs' tasks (`open_job_tasks`): asyncio tasks each in an anyio cancel scope
    of its own, where anyio's task group costs about 25 µs more a task (a task handle with its
    own scope and event, a wrapping coroutine, a look-up of the running backend for each), a
    job's largest cost on asyncio. The block's task being cancelled (the Worker's run, in
    anyio's task group) cancels their scopes, and one failing cancels the others and the
    enclosing task group (so the block's body too), as a nursery does. Through the scopes the
    cancellation is anyio's: level-triggered, and stopped by a shielded scope inside."""

    __slots__ = ("_cancelling", "_nursery", "_scope", "_scopes")

    _what = "a sepp Worker's job tasks"

    def __init__(self, nursery: Nursery, scope: Callable[[], CancelScope]) -> None:
        super().__init__()
        self._nursery = nursery
        self._scope = scope  # anyio's asyncio cancel scope class
        self._scopes: set[CancelScope] = set()
        self._cancelling = False

    def start_soon(
        self,
        async_fn: Callable[[Unpack[PosArgs]], Awaitable[object]],
        *args: Unpack[PosArgs],
        name: object = None,
    ) -> None:
        task = self._loop.create_task(
            self._run(async_fn, args), name=None if name is None else str(name)
        )
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    async def _run(self, fn: Callable[..., Awaitable[object]], args: tuple[Any, ...]) -> None:
        scope = self._scope()
        self._scopes.add(scope)
        try:
            with scope:
                if self._cancelling:
                    scope.cancel()
                await fn(*args)
        finally:
            self._scopes.discard(scope)

    def cancel(self) -> None:
        self._cancelling = True
        for scope in self._scopes:
            scope.cancel()

    def _failed(self) -> None:
        self.cancel()
        self._nursery.cancel_scope.cancel()

    async def _wait_for_tasks(self, shield: Any) -> BaseException | None:
        cancelled: BaseException | None = None
        with self._scope() as scope:
            cancelled = await super()._wait_for_tasks(scope)
        return cancelled


class _CallSoon:
    """Calls into one asyncio loop from any thread (each runs: no idempotent merging)."""

    __slots__ = ("_loop", "_thread")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()

    def __call__(self, fn: Callable[[], object], /, *, idempotent: bool = False) -> bool:
        try:
            self._loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the loop is closed
            return False
        return True

    def here(self) -> bool:
        if threading.get_ident() != self._thread:
            return False
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False


def _loop_time() -> float:
    # anyio's deadlines are on the running loop's clock too.
    return asyncio.get_running_loop().time()


async def _sleep_until(deadline: float) -> None:
    await asyncio.sleep(max(deadline - asyncio.get_running_loop().time(), 0))


class AsyncioRuntime:
    """asyncio's members (see `protocol.Runtime`, and `protocol.ServiceRuntime` once
    `for_services()` has loaded anyio's)."""

    __slots__ = (*PLAIN_MEMBERS, "_parking", "_threads", "_to_thread")

    name = "asyncio"
    # Parking: the waiter is a future; the task that made it parks on it.
    park_aborted = _ABORTED

    cancel_scope: Callable[..., CancelScope]
    checkpoint: Callable[[], Awaitable[None]]
    checkpoint_if_cancelled: Callable[[], Awaitable[None]]
    lock: Callable[[], Lock]
    move_on_after: Callable[[float], CancelScope]
    open_nursery: Callable[[], AbstractAsyncContextManager[Nursery]]
    _threads: Any  # anyio's RunVar of the threads limiter
    _to_thread: Callable[..., Awaitable[Any]]  # anyio.to_thread.run_sync

    def __init__(self) -> None:
        self._parking: dict[asyncio.Task[Any], asyncio.Future[None]] = {}
        self.current_time = _loop_time
        self.effective_deadline = enclosing_deadline
        self.sleep = asyncio.sleep
        self.sleep_until = _sleep_until
        self.event = Event
        self.parking_lot = ParkingLot

    def __repr__(self) -> str:
        return "<sepp runtime on asyncio>"

    def for_services(self) -> ServiceRuntime:
        """This runtime with the services' members too: anyio's, imported the first time
        (SeppError saying what to install without it)."""
        try:
            self.cancel_scope  # noqa: B018 - set once anyio's members are
        except AttributeError:
            _load_anyio_members(self)
        return self

    def clock(self) -> Callable[[], float]:
        return asyncio.get_running_loop().time

    def move_on_at(self, deadline: float) -> MoveOnAt:
        return MoveOnAt(deadline)

    async def bounded(self, work: Callable[[float | None], Awaitable[None]], until: float) -> None:
        with MoveOnAt(until):
            await work(None)

    def open_task_group(self) -> TaskGroup:
        return TaskGroup()

    def open_job_tasks(self, nursery: Nursery) -> _JobTasks:
        return _JobTasks(nursery, self.cancel_scope)

    async def run_concurrently(
        self, worker: Callable[[], Awaitable[None]], *, at_most: int
    ) -> None:
        async with TaskGroup() as group:
            for _ in range(at_most):
                group.start_soon(worker)

    def owner(self) -> object | None:
        try:
            return asyncio.get_running_loop()
        except RuntimeError:
            return None

    async def wait_event(self, event: EventLike, until: float) -> None:
        assert isinstance(event, asyncio.Event)
        if event.is_set():
            return  # without the checkpoint of `Event.wait()`: the client never needed it
        with MoveOnAt(until):
            await event.wait()

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

    def call_soon_handle(self) -> _CallSoon:
        return _CallSoon()

    async def run_sync_in_thread(
        self, fn: Callable[..., T], *args: object, abandon: bool = True
    ) -> T:
        import anyio

        limiter = threads_limiter(self._threads, anyio.CapacityLimiter)
        result: T = await self._to_thread(fn, *args, abandon_on_cancel=abandon, limiter=limiter)
        return result

    def is_cancellation(self, error: BaseException) -> bool:
        return isinstance(error, asyncio.CancelledError)

    def check_running(self, what: str) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(f"{what} must be called from a running asyncio loop") from None

    def channel(
        self, endpoint: Endpoint, options: ChannelOptions, tasks: TaskGroupLike | None
    ) -> AsyncioChannel:
        return AsyncioChannel(endpoint, **options)


def _load_anyio_members(runtime: AsyncioRuntime) -> None:
    """The services' members, on anyio's asyncio backend itself where anyio allows: what
    `anyio.CancelScope()` makes and anyio's checkpoints, without their look-up of the running
    backend (sniffio) each time, which a job pays a few times; anyio's public forms where it
    moved them."""
    try:
        import anyio
        import anyio.lowlevel
        import anyio.to_thread
    except ImportError as exc:
        if exc.name is None or exc.name.split(".")[0] != "anyio":
            raise
        from .._model.errors import SeppError

        raise SeppError(
            "running a sepp Worker or Scheduler under asyncio needs anyio: "
            "pip install 'sepp-trio[asyncio]'"
        ) from None
    scope: Callable[..., CancelScope] = anyio.CancelScope
    try:
        from anyio._backends._asyncio import CancelScope as AsyncioScope
    except ImportError:
        pass
    else:
        if issubclass(AsyncioScope, anyio.CancelScope):
            scope = AsyncioScope
    try:
        from anyio._backends._asyncio import AsyncIOBackend
    except ImportError:
        checkpoint = anyio.lowlevel.checkpoint
        checkpoint_if_cancelled = anyio.lowlevel.checkpoint_if_cancelled
    else:
        checkpoint = AsyncIOBackend.checkpoint
        checkpoint_if_cancelled = AsyncIOBackend.checkpoint_if_cancelled

    def move_on_after(seconds: float) -> CancelScope:
        return scope(deadline=asyncio.get_running_loop().time() + seconds)

    runtime._threads = anyio.lowlevel.RunVar("sepp_handler_threads")
    runtime.checkpoint = checkpoint
    runtime.checkpoint_if_cancelled = checkpoint_if_cancelled
    runtime._to_thread = anyio.to_thread.run_sync
    runtime.lock = anyio.Lock
    runtime.move_on_after = move_on_after
    # A task group is a nursery (start_soon(fn, *args, name=...)); its typing says so less.
    runtime.open_nursery = cast(
        "Callable[[], AbstractAsyncContextManager[Nursery]]", anyio.create_task_group
    )
    runtime.cancel_scope = scope  # last: its presence says the members are loaded


ASYNCIO = AsyncioRuntime()
