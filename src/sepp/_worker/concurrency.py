"""Everything the Worker (with its slots and lease keeper) and the Scheduler take from their
concurrency library, in one module: they import these names, never trio itself.

They run on trio. Another runtime (asyncio) runs them by providing the same names with the
same meaning:

- `current_time()`: a monotonic clock in seconds that deadlines are kept in (trio's MockClock
  in tests); `sleep(s)`, `sleep_until(t)`; `checkpoint()`: let other tasks run and deliver a
  pending cancellation; `checkpoint_if_cancelled()`: only the latter.
- `CancelScope`: `cancel()`, a `deadline` that may be moved at any time, `cancelled_caught`;
  made (and cancelled, or given a deadline) before the task that runs the block enters it.
  Cancellation is level-triggered: every await inside the block raises until the block ends,
  which catches it (asyncio's is one CancelledError per `cancel()`). `move_on_at(t)` and
  `move_on_after(s)` are scopes with a deadline.
- `open_nursery()` and `Nursery.start_soon(fn, *args, name=...)`: tasks owned by a block that
  waits for them all; `TaskStatus` and `TASK_STATUS_IGNORED` for `nursery.start(service.run)`.
- `Event` (`set()`, `is_set()`, `wait()`), `Lock`, `ParkingLot` (`park()`, `unpark_all()`,
  truthy while a task is parked).
- `RunHandle`: calls into the run from another thread or a signal handler (trio's token;
  asyncio's `loop.call_soon_threadsafe`).
- `run_sync_in_thread(fn, *args)`: a blocking function in a worker thread, abandoned (not
  waited for) when the awaiting task is cancelled; no cap on the threads beyond the Worker's
  own `max_in_flight`.
- `TooSlowError`: what a handler's timeout raises (middleware may catch trio's).

The monitor's HTTP server (`http_responder`, `WorkerMonitor.serve`) is the one other place in
the Worker that uses trio: it owns its sockets, as a wire driver does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")

current_time = trio.current_time
sleep = trio.sleep
sleep_until = trio.sleep_until
checkpoint = trio.lowlevel.checkpoint
checkpoint_if_cancelled = trio.lowlevel.checkpoint_if_cancelled

CancelScope = trio.CancelScope
move_on_at = trio.move_on_at
move_on_after = trio.move_on_after
TooSlowError = trio.TooSlowError

open_nursery = trio.open_nursery
Nursery = trio.Nursery
TaskStatus = trio.TaskStatus
TASK_STATUS_IGNORED = trio.TASK_STATUS_IGNORED

Event = trio.Event
Lock = trio.Lock
ParkingLot = trio.lowlevel.ParkingLot


class RunHandle:
    """The run a service (Worker, Scheduler) is running in, while it runs, so that a request
    from another thread or a signal handler reaches it."""

    __slots__ = ("_token",)

    def __init__(self) -> None:
        self._token: trio.lowlevel.TrioToken | None = None

    def enter(self) -> None:
        """Called by the service's `run()` when it starts, in the run."""
        self._token = trio.lowlevel.current_trio_token()

    def leave(self) -> None:
        self._token = None

    def call(self, fn: Callable[[], None], *, from_task: bool) -> None:
        """Run `fn` in the run: at once when called by one of its tasks (`from_task`), else
        soon (at most one pending call of the same `fn`). Nothing happens outside `enter()` and
        `leave()`: the service reads its flags when it starts."""
        token = self._token
        if token is None:
            return
        if from_task and _current_token() is token:
            fn()
            return
        try:
            token.run_sync_soon(fn, idempotent=True)
        except trio.RunFinishedError:
            pass


def _current_token() -> trio.lowlevel.TrioToken | None:
    try:
        return trio.lowlevel.current_trio_token()
    except RuntimeError:
        return None


# Threads for `def` handlers: unlimited here, as a Worker's slots already allow at most
# max_in_flight handlers at once (trio's default limiter would cap every worker at 40 threads
# together, shared with any other to_thread user).
_THREADS: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("sepp_handler_threads")


async def run_sync_in_thread(fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)` in a worker thread; a cancellation returns at once and abandons the thread."""
    return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True, limiter=_limiter())


def _limiter() -> trio.CapacityLimiter:
    try:
        return _THREADS.get()
    except LookupError:
        limiter = trio.CapacityLimiter(math.inf)
        _THREADS.set(limiter)
        return limiter
