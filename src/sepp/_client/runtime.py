"""What the shared client code needs from the world it runs in, for each front end.

The operations of `Client` are coroutines written once. Under trio (`TRIO`) they are awaited as
usual. Under `BLOCKING` every await completes without suspending (the blocking channel reads
its socket in the calling thread, sleeps are `time.sleep`), so `SyncClient` runs each
operation to its end with one `coroutine.send(None)` (`run_blocking`). An asyncio front end
is one more of these.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

import trio

T = TypeVar("T")


class EventLike(Protocol):
    def set(self) -> None: ...
    def is_set(self) -> bool: ...


class Runtime(Protocol):
    def now(self) -> float:
        """The clock deadlines are kept in, in seconds."""

    def effective_deadline(self) -> float:
        """The caller's own deadline on that clock (trio's cancel scopes); inf if none."""

    async def sleep(self, seconds: float) -> None: ...

    async def run_senders(self, sender: Callable[[], Awaitable[None]], count: int) -> None:
        """Run `count` copies of `sender` concurrently (one after another where there is no
        concurrency: the copies share their work, so one does it all)."""

    def event(self) -> EventLike: ...

    async def wait_event(self, event: EventLike, until: float) -> None:
        """Wait until `event` is set, or the clock reaches `until`."""

    async def bounded(self, work: Callable[[float | None], Awaitable[None]], until: float) -> None:
        """Run `work(timeout_s)` until the clock reaches `until`: trio cancels it there, and a
        blocking front end passes the time left as its timeout (None: no limit)."""

    def owner(self) -> object | None:
        """What a client opened here serves (trio: its run's root task); None: any caller."""


class _Trio:
    def now(self) -> float:
        return trio.current_time()

    def effective_deadline(self) -> float:
        return trio.current_effective_deadline()

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)

    async def run_senders(self, sender: Callable[[], Awaitable[None]], count: int) -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(sender)

    def event(self) -> EventLike:
        return trio.Event()

    async def wait_event(self, event: EventLike, until: float) -> None:
        assert isinstance(event, trio.Event)
        with trio.move_on_at(until):
            await event.wait()

    async def bounded(self, work: Callable[[float | None], Awaitable[None]], until: float) -> None:
        with trio.move_on_at(until):
            await work(None)

    def owner(self) -> object | None:
        try:
            return trio.lowlevel.current_root_task()
        except RuntimeError:  # not in a trio run: a client built by hand, outside one (tests)
            return None


class _Blocking:
    def now(self) -> float:
        return time.monotonic()

    def effective_deadline(self) -> float:
        return math.inf

    async def sleep(self, seconds: float) -> None:
        time.sleep(seconds)  # noqa: ASYNC251 - this runtime blocks by design

    async def run_senders(self, sender: Callable[[], Awaitable[None]], count: int) -> None:
        await sender()

    def event(self) -> EventLike:
        return threading.Event()

    async def wait_event(self, event: EventLike, until: float) -> None:
        assert isinstance(event, threading.Event)
        left = until - time.monotonic()
        if left > 0:
            event.wait(None if left == math.inf else left)

    async def bounded(self, work: Callable[[float | None], Awaitable[None]], until: float) -> None:
        left = until - time.monotonic()
        if left > 0:
            await work(None if left == math.inf else left)

    def owner(self) -> object | None:
        return None


TRIO: Runtime = _Trio()
BLOCKING: Runtime = _Blocking()


def run_blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine of the shared client code under BLOCKING to its end, here and now."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("sepp internal error: a blocking operation tried to suspend")
