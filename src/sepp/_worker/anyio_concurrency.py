"""The Worker's and the Scheduler's primitives under asyncio (and uvloop), on anyio: its task
groups and cancel scopes keep trio's semantics (level-triggered cancellation, deadlines that
move, a block that waits for its tasks), which the services are written for. Imported only
when a service runs under asyncio; anyio is the `asyncio` extra."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TypeVar, cast

import anyio
import anyio.lowlevel
import anyio.to_thread

from .primitives import CancelScope, Concurrency, Nursery

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
    sleep=anyio.sleep,
    sleep_until=anyio.sleep_until,
    checkpoint=anyio.lowlevel.checkpoint,
    checkpoint_if_cancelled=anyio.lowlevel.checkpoint_if_cancelled,
    cancel_scope=_Scope,
    move_on_at=_move_on_at,
    move_on_after=_move_on_after,
    # A task group is a nursery (start_soon(fn, *args, name=...)); its typing says so less.
    open_nursery=cast(
        "Callable[[], AbstractAsyncContextManager[Nursery]]", anyio.create_task_group
    ),
    event=_Event,
    lock=anyio.Lock,
    parking_lot=ParkingLot,
)

# Threads for `def` handlers: a limiter per loop without a cap (the Worker's slots are the cap),
# not anyio's default one (40 threads, shared with every other to_thread user) nor the loop's
# default executor.
_THREADS: anyio.lowlevel.RunVar[anyio.CapacityLimiter] = anyio.lowlevel.RunVar(
    "sepp_handler_threads"
)


async def run_sync_in_thread(fn: Callable[..., T], *args: object) -> T:
    try:
        limiter = _THREADS.get()
    except LookupError:
        limiter = anyio.CapacityLimiter(math.inf)
        _THREADS.set(limiter)
    return await anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=True, limiter=limiter)
