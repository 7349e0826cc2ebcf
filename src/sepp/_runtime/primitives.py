"""The shape of what the Worker and the Scheduler take from a concurrency library: the
`Concurrency` of primitives one run uses, and the protocols its scopes, nurseries, events,
locks and parking lots meet (trio's and anyio's both do). `concurrency` says what each means."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Protocol, TypeVar

S = TypeVar("S")


class CancelScope(Protocol):
    """What the services use of a cancel scope (trio's and anyio's have it)."""

    @property
    def deadline(self) -> float: ...
    @deadline.setter
    def deadline(self, value: float) -> None: ...
    @property
    def cancelled_caught(self) -> bool: ...
    def cancel(self) -> None: ...
    def __enter__(self: S) -> S: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
        /,
    ) -> bool: ...


class Spawner(Protocol):
    """Where the Worker starts its jobs' tasks: a nursery, or a lighter group of them."""

    def start_soon(
        self, fn: Callable[..., Awaitable[object]], *args: Any, name: object = ...
    ) -> None: ...


class Nursery(Protocol):
    @property
    def cancel_scope(self) -> CancelScope: ...
    def start_soon(
        self, fn: Callable[..., Awaitable[object]], *args: Any, name: object = ...
    ) -> None: ...
    async def start(
        self, fn: Callable[..., Awaitable[object]], *args: Any, name: object = ...
    ) -> Any: ...


class Event(Protocol):
    def set(self) -> None: ...
    def is_set(self) -> bool: ...
    async def wait(self) -> None: ...


class Lock(Protocol):
    async def __aenter__(self) -> object: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
        /,
    ) -> object: ...


class ParkingLot(Protocol):
    def __bool__(self) -> bool: ...
    async def park(self) -> None: ...
    def unpark_all(self) -> object: ...


class Concurrency:
    """One concurrency library's primitives, as the Worker and the Scheduler use them."""

    __slots__ = (
        "cancel_scope",
        "checkpoint",
        "checkpoint_if_cancelled",
        "current_time",
        "event",
        "lock",
        "move_on_after",
        "move_on_at",
        "name",
        "open_job_tasks",
        "open_nursery",
        "parking_lot",
        "sleep",
        "sleep_until",
    )

    def __init__(
        self,
        name: str,
        *,
        current_time: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
        sleep_until: Callable[[float], Awaitable[None]],
        checkpoint: Callable[[], Awaitable[None]],
        checkpoint_if_cancelled: Callable[[], Awaitable[None]],
        cancel_scope: Callable[[], CancelScope],
        move_on_at: Callable[[float], CancelScope],
        move_on_after: Callable[[float], CancelScope],
        open_nursery: Callable[[], AbstractAsyncContextManager[Nursery]],
        open_job_tasks: Callable[[Nursery], AbstractAsyncContextManager[Spawner]],
        event: Callable[[], Event],
        lock: Callable[[], Lock],
        parking_lot: Callable[[], ParkingLot],
    ) -> None:
        self.name = name
        self.current_time = current_time
        self.sleep = sleep
        self.sleep_until = sleep_until
        self.checkpoint = checkpoint
        self.checkpoint_if_cancelled = checkpoint_if_cancelled
        self.cancel_scope = cancel_scope
        self.move_on_at = move_on_at
        self.move_on_after = move_on_after
        self.open_nursery = open_nursery
        self.open_job_tasks = open_job_tasks
        self.event = event
        self.lock = lock
        self.parking_lot = parking_lot

    def __repr__(self) -> str:
        return f"<sepp concurrency on {self.name}>"
