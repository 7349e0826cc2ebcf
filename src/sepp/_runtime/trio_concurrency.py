"""The Worker's and the Scheduler's primitives under trio (`TRIO`): trio's own functions and
classes, so nothing sits between a service and trio (`concurrency` says what each means;
`anyio_concurrency` is its twin on asyncio)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import trio

from .primitives import Concurrency
from .protocol import Nursery, Spawner


@contextlib.asynccontextmanager
async def _in_the_nursery(nursery: Nursery) -> AsyncIterator[Spawner]:
    yield nursery


def _run_clock() -> Callable[[], float]:
    return trio.lowlevel.current_clock().current_time


TRIO = Concurrency(
    "trio",
    current_time=trio.current_time,
    clock=_run_clock,
    sleep=trio.sleep,
    sleep_until=trio.sleep_until,
    checkpoint=trio.lowlevel.checkpoint,
    checkpoint_if_cancelled=trio.lowlevel.checkpoint_if_cancelled,
    cancel_scope=trio.CancelScope,
    cancelled=trio.Cancelled,
    move_on_at=trio.move_on_at,
    move_on_after=trio.move_on_after,
    open_nursery=trio.open_nursery,
    open_job_tasks=_in_the_nursery,
    event=trio.Event,
    lock=trio.Lock,
    parking_lot=trio.lowlevel.ParkingLot,
    waiter=trio.lowlevel.current_task,
    park=trio.lowlevel.wait_task_rescheduled,
    unpark=trio.lowlevel.reschedule,
    park_aborted=trio.lowlevel.Abort.SUCCEEDED,
)
