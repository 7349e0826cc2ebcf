"""Everything the Worker (with its slots and lease keeper) and the Scheduler take from their
concurrency library, in one module: they import these names, never trio or anyio itself.

A service picks its `Concurrency` once, when its `run()` starts (`current()`): under trio
`trio_concurrency.TRIO`, trio's own functions and classes, so nothing sits between the Worker
and trio; under asyncio (and uvloop) `anyio_concurrency.ANYIO`, on anyio, whose task groups
and cancel scopes have trio's semantics. Each part of a service holds the one it runs with
(built with `TRIO`, given another by `use(cc)` before the run). What a `Concurrency` provides:

- `current_time()`: a monotonic clock in seconds that deadlines are kept in (trio's MockClock
  in tests; the loop's clock on asyncio); `clock()`, in a run, that clock's own reading
  function (one call a reading, where `current_time` looks the run up each time);
  `sleep(s)`, `sleep_until(t)`; `checkpoint()`: let other tasks run and deliver a pending
  cancellation; `checkpoint_if_cancelled()`: only the latter.
- `cancel_scope()` (a `CancelScope`: `cancel()`, a `deadline` that may be moved at any time,
  `cancelled_caught`), made (and cancelled, or given a deadline) before the task that runs
  the block enters it. Cancellation is level-triggered: every await inside the block raises
  (`cancelled`: `trio.Cancelled`, `asyncio.CancelledError`) until the block ends, which
  catches it (asyncio's own is one CancelledError per `cancel()`: anyio's scopes are
  trio's). `move_on_at(t)` and `move_on_after(s)` are scopes with a deadline.
- `open_nursery()` and `Nursery.start_soon(fn, *args, name=...)`: tasks owned by a block that
  waits for them all. `TaskStatus` and `TASK_STATUS_IGNORED` for `nursery.start(service.run)`
  (anyio's `TaskGroup.start` passes its own task status, which has the same `started()`).
- `open_job_tasks(nursery)`: a block for the Worker's jobs' tasks inside `nursery`, that
  waits for them; a `Spawner` (`start_soon` only). On trio it is `nursery` itself; on asyncio
  plain asyncio tasks (anyio's cost about 25 µs more each), cancelled with the block's task.
- `event()` (`set()`, `is_set()`, `wait()`), `lock()`, `parking_lot()` (`park()`,
  `unpark_all()`, truthy while a task is parked); `waiter()`, `park(abort)`, `unpark(waiter)`
  and `park_aborted`: one task parked with no Event, as the client's `Runtime` parks
  (`protocol.Runtime.park`; the job runners wait so).

Beside it, for every runtime: `RunHandle`, calls into the run from another thread or a signal
handler (trio's token; asyncio's `loop.call_soon_threadsafe`); `run_sync_in_thread(fn, *args)`,
a blocking function in a worker thread (abandoned, not waited for, when the awaiting task is
cancelled; no cap on the threads beyond the Worker's own `max_in_flight`, and never the loop's
default executor); `TooSlowError`, what a handler's timeout raises (trio's, on every runtime).

The monitor's HTTP server (`http_responder`, `WorkerMonitor.serve`) is the one other place in
the Worker that uses trio: it owns its sockets, as a wire driver does.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import sniffio
import trio

from .primitives import Concurrency as Concurrency
from .protocol import CancelScope as CancelScope
from .protocol import Event as Event
from .protocol import Lock as Lock
from .protocol import Nursery as Nursery
from .protocol import ParkingLot as ParkingLot
from .protocol import Spawner as Spawner
from .trio_concurrency import TRIO as TRIO

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")

TooSlowError = trio.TooSlowError
TaskStatus = trio.TaskStatus
TASK_STATUS_IGNORED = trio.TASK_STATUS_IGNORED


def running_library() -> str:
    """ "trio", "asyncio", ...: what the calling task runs on."""
    try:
        return sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        raise RuntimeError("a sepp Worker or Scheduler runs inside trio or asyncio") from None


def current() -> Concurrency:
    """The primitives of the library the calling task runs on (once per service run)."""
    library = running_library()
    if library == "trio":
        return TRIO
    if library == "asyncio":
        return _on_asyncio()
    from .._model.errors import SeppError

    raise SeppError(f"sepp's Worker and Scheduler run on trio or asyncio, not on {library}")


def _on_asyncio() -> Concurrency:
    try:
        from . import anyio_concurrency
    except ImportError as exc:
        if exc.name is None or exc.name.split(".")[0] != "anyio":
            raise
        from .._model.errors import SeppError

        raise SeppError(
            "running a sepp Worker or Scheduler under asyncio needs anyio: "
            "pip install 'sepp-trio[asyncio]'"
        ) from None
    return anyio_concurrency.ANYIO


class RunHandle:
    """The run a service (Worker, Scheduler) is running in, while it runs, so that a request
    from another thread or a signal handler reaches it: a trio run or an asyncio loop."""

    __slots__ = ("_loop", "_thread", "_token")

    def __init__(self) -> None:
        self._token: trio.lowlevel.TrioToken | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0

    def enter(self) -> None:
        """Called by the service's `run()` when it starts, in the run."""
        if running_library() == "trio":
            self._token = trio.lowlevel.current_trio_token()
        else:
            import asyncio

            self._loop = asyncio.get_running_loop()
            self._thread = threading.get_ident()

    def leave(self) -> None:
        self._token = None
        self._loop = None

    def call(self, fn: Callable[[], None], *, from_task: bool) -> None:
        """Run `fn` in the run: at once when called by one of its tasks (`from_task`), else
        soon (at most one pending call of the same `fn` on trio; `fn` must be idempotent).
        Nothing happens outside `enter()` and `leave()`: the service reads its flags when it
        starts."""
        token = self._token
        if token is not None:
            if from_task and _current_token() is token:
                fn()
                return
            try:
                token.run_sync_soon(fn, idempotent=True)
            except trio.RunFinishedError:
                pass
            return
        loop = self._loop
        if loop is None:
            return
        if from_task and threading.get_ident() == self._thread and _running_loop() is loop:
            fn()
            return
        try:
            loop.call_soon_threadsafe(fn)
        except RuntimeError:
            pass  # the loop is closed: the run is over


def _current_token() -> trio.lowlevel.TrioToken | None:
    try:
        return trio.lowlevel.current_trio_token()
    except RuntimeError:
        return None


def _running_loop() -> asyncio.AbstractEventLoop | None:
    import asyncio

    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


# Threads for `def` handlers: unlimited here, as a Worker's slots already allow at most
# max_in_flight handlers at once (trio's default limiter would cap every worker at 40 threads
# together, shared with any other to_thread user).
_THREADS: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("sepp_handler_threads")


async def run_sync_in_thread(fn: Callable[..., T], *args: object, abandon: bool = True) -> T:
    """`fn(*args)` in a worker thread; a cancellation returns at once and abandons the thread
    (`abandon=False`: waits for `fn` to return, for work never to be left half done, such as
    the outbox relay's database transactions). On asyncio the thread is anyio's, never the
    loop's default executor."""
    if sniffio.current_async_library() == "trio":
        return await trio.to_thread.run_sync(
            fn, *args, abandon_on_cancel=abandon, limiter=_limiter()
        )
    from . import anyio_concurrency

    return await anyio_concurrency.run_sync_in_thread(fn, *args, abandon=abandon)


def _limiter() -> trio.CapacityLimiter:
    try:
        return _THREADS.get()
    except LookupError:
        limiter = trio.CapacityLimiter(math.inf)
        _THREADS.set(limiter)
        return limiter
