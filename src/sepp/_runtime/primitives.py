"""What the Worker and the Scheduler take from a concurrency library: the `Concurrency` of
primitives one run uses, made of the scopes, nurseries, events, locks and parking lots of
`protocol` (trio's and anyio's both meet them). `concurrency` says what each means."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from .protocol import CancelScope, Event, Lock, Nursery, ParkingLot, Spawner, Waiter


class Concurrency:
    """One concurrency library's primitives, as the Worker and the Scheduler use them."""

    __slots__ = (
        "cancel_scope",
        "cancelled",
        "checkpoint",
        "checkpoint_if_cancelled",
        "clock",
        "current_time",
        "event",
        "lock",
        "move_on_after",
        "move_on_at",
        "name",
        "open_job_tasks",
        "open_nursery",
        "park",
        "park_aborted",
        "parking_lot",
        "sleep",
        "sleep_until",
        "unpark",
        "waiter",
    )

    def __init__(
        self,
        name: str,
        *,
        current_time: Callable[[], float],
        clock: Callable[[], Callable[[], float]],
        sleep: Callable[[float], Awaitable[None]],
        sleep_until: Callable[[float], Awaitable[None]],
        checkpoint: Callable[[], Awaitable[None]],
        checkpoint_if_cancelled: Callable[[], Awaitable[None]],
        cancel_scope: Callable[[], CancelScope],
        cancelled: type[BaseException],
        move_on_at: Callable[[float], CancelScope],
        move_on_after: Callable[[float], CancelScope],
        open_nursery: Callable[[], AbstractAsyncContextManager[Nursery]],
        open_job_tasks: Callable[[Nursery], AbstractAsyncContextManager[Spawner]],
        event: Callable[[], Event],
        lock: Callable[[], Lock],
        parking_lot: Callable[[], ParkingLot],
        waiter: Callable[[], Waiter],
        park: Callable[[Callable[[Any], Any]], Awaitable[None]],
        unpark: Callable[[Waiter], None],
        park_aborted: object,
    ) -> None:
        self.name = name
        self.current_time = current_time
        self.clock = clock
        self.sleep = sleep
        self.sleep_until = sleep_until
        self.checkpoint = checkpoint
        self.checkpoint_if_cancelled = checkpoint_if_cancelled
        self.cancel_scope = cancel_scope
        self.cancelled = cancelled
        self.move_on_at = move_on_at
        self.move_on_after = move_on_after
        self.open_nursery = open_nursery
        self.open_job_tasks = open_job_tasks
        self.event = event
        self.lock = lock
        self.parking_lot = parking_lot
        self.waiter = waiter
        self.park = park
        self.unpark = unpark
        self.park_aborted = park_aborted

    def __repr__(self) -> str:
        return f"<sepp concurrency on {self.name}>"
