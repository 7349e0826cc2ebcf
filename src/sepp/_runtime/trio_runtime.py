"""The client's trio runtime (`TRIO`): with the services' `concurrency`, the only modules of the
runtime layer that import trio."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

import trio
from trio.lowlevel import Abort, current_root_task, current_task, reschedule, wait_task_rescheduled

from ..wire.drivers._base import ChannelOptions, Endpoint
from ..wire.drivers._trio import Channel
from .protocol import CallSoon, EventLike, Runtime, TaskGroup


class TrioRuntime:
    now = staticmethod(trio.current_time)
    effective_deadline = staticmethod(trio.current_effective_deadline)
    sleep = staticmethod(trio.sleep)
    move_on_at = staticmethod(trio.move_on_at)
    event = staticmethod(trio.Event)
    waiter = staticmethod(current_task)
    park_aborted = Abort.SUCCEEDED
    park = staticmethod(wait_task_rescheduled)
    unpark = staticmethod(reschedule)
    run = staticmethod(trio.run)

    async def bounded(self, work: Callable[[float | None], Awaitable[None]], until: float) -> None:
        with trio.move_on_at(until):
            await work(None)

    def open_task_group(self) -> AbstractAsyncContextManager[TaskGroup]:
        return trio.open_nursery()

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

    def call_soon_handle(self) -> CallSoon:
        token = trio.lowlevel.current_trio_token()

        def call_soon(fn: Callable[[], object]) -> bool:
            try:
                token.run_sync_soon(fn)
            except trio.RunFinishedError:
                return False
            return True

        return call_soon

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
        assert isinstance(tasks, trio.Nursery), "the trio channel runs in a trio nursery"
        return Channel(endpoint, tasks, **options)


TRIO: Runtime = TrioRuntime()
