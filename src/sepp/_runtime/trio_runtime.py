"""trio's runtime (`TRIO`), for the client, the Worker and the Scheduler alike: its members are
trio's own functions and classes, so nothing sits between the code and trio. With the services'
`concurrency`, the only modules of the runtime layer that import trio."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, TypeVar

import trio
import trio.lowlevel
from trio.lowlevel import Abort, current_root_task, current_task, reschedule, wait_task_rescheduled

from .protocol import (
    PLAIN_MEMBERS,
    EventLike,
    Nursery,
    ServiceRuntime,
    Spawner,
    TaskGroup,
    threads_limiter,
)

if TYPE_CHECKING:
    from ..wire.drivers import Channel, ChannelOptions, Endpoint

T = TypeVar("T")


@contextlib.asynccontextmanager
async def _in_the_nursery(nursery: Nursery) -> AsyncIterator[Spawner]:
    yield nursery


class _CallSoon:
    """Calls into one trio run from any thread, through its token."""

    __slots__ = ("_token",)

    def __init__(self) -> None:
        self._token = trio.lowlevel.current_trio_token()

    def __call__(self, fn: Callable[[], object], /, *, idempotent: bool = False) -> bool:
        try:
            self._token.run_sync_soon(fn, idempotent=idempotent)
        except trio.RunFinishedError:
            return False
        return True

    def here(self) -> bool:
        try:
            return trio.lowlevel.current_trio_token() is self._token
        except RuntimeError:
            return False


_THREADS: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("sepp_handler_threads")


class TrioRuntime:
    """trio's members (see `protocol.Runtime` and `protocol.ServiceRuntime`)."""

    # Members are instance slots holding trio's functions and classes: `TRIO.event()` is
    # `trio.Event()` after one attribute read, the cheapest there is.
    __slots__ = (*PLAIN_MEMBERS, "move_on_at", "park", "run", "unpark", "waiter")

    name = "trio"
    park_aborted = Abort.SUCCEEDED

    def __init__(self) -> None:
        self.current_time = trio.current_time
        self.effective_deadline = trio.current_effective_deadline
        self.sleep = trio.sleep
        self.sleep_until = trio.sleep_until
        self.checkpoint = trio.lowlevel.checkpoint
        self.checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled
        self.cancel_scope = trio.CancelScope
        self.move_on_at = trio.move_on_at
        self.move_on_after = trio.move_on_after
        self.open_nursery = trio.open_nursery
        self.event = trio.Event
        self.lock = trio.Lock
        self.parking_lot = trio.lowlevel.ParkingLot
        self.waiter = current_task
        self.park = wait_task_rescheduled
        self.unpark = reschedule
        self.run = trio.run

    def __repr__(self) -> str:
        return "<sepp runtime on trio>"

    def clock(self) -> Callable[[], float]:
        return trio.lowlevel.current_clock().current_time

    async def bounded(self, work: Callable[[float | None], Awaitable[None]], until: float) -> None:
        with trio.move_on_at(until):
            await work(None)

    def open_task_group(self) -> AbstractAsyncContextManager[TaskGroup]:
        return trio.open_nursery()

    def open_job_tasks(self, nursery: Nursery) -> AbstractAsyncContextManager[Spawner]:
        return _in_the_nursery(nursery)

    async def run_concurrently(
        self, worker: Callable[[], Awaitable[None]], *, at_most: int
    ) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(at_most):
                nursery.start_soon(worker)

    def owner(self) -> object | None:
        try:
            return current_root_task()
        except RuntimeError:  # not in a trio run: a client built by hand, outside one (tests)
            return None

    async def wait_event(self, event: EventLike, until: float) -> None:
        assert isinstance(event, trio.Event)
        with trio.move_on_at(until):
            await event.wait()

    def call_soon_handle(self) -> _CallSoon:
        return _CallSoon()

    async def run_sync_in_thread(
        self, fn: Callable[..., T], *args: object, abandon: bool = True
    ) -> T:
        limiter = threads_limiter(_THREADS, trio.CapacityLimiter)
        return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=abandon, limiter=limiter)

    def is_cancellation(self, error: BaseException) -> bool:
        return isinstance(error, trio.Cancelled)

    def check_running(self, what: str) -> None:
        try:
            current_task()
        except RuntimeError:
            raise RuntimeError(f"{what} must be called from trio (inside trio.run())") from None

    def channel(
        self, endpoint: Endpoint, options: ChannelOptions, tasks: TaskGroup | None
    ) -> Channel:
        # Imported here: a Worker under asyncio takes trio's names (`concurrency`) but never
        # connects on trio.
        from ..wire.drivers import Channel

        assert isinstance(tasks, trio.Nursery), "the trio channel runs in a trio nursery"
        return Channel(endpoint, tasks, **options)


TRIO: ServiceRuntime = TrioRuntime()
