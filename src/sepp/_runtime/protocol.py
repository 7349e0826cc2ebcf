"""What the package needs from the library it runs on, said once: the protocols every
runtime's scopes, task groups and events meet, and the one vocabulary of the runtimes built on
them.

The vocabulary is trio's (cancel scopes, task groups that wait for their tasks, parking a task
until something wakes it), and each library has one runtime that speaks it, in a module of
its own: `trio_runtime.TRIO` (trio's own functions and classes, nothing in between),
`asyncio_runtime.ASYNCIO` (uvloop too) and `blocking_runtime.BLOCKING`. Two protocols say
what a runtime provides, one per kind of caller:

- `Runtime`, what the shared client code awaits: the operations of `Client` are coroutines
  written once, and every suspension, clock reading, task, cancel scope and wake-up they need
  goes through the runtime they were given (never a default: a forgotten runtime is a type
  error). All three have it. Under `BLOCKING` every await completes without suspending, so
  `SyncClient` runs each operation to its end with one `coroutine.send(None)`; what needs an
  event loop (tasks, cancel scopes, parking, calls from other threads) is never reached under
  it: those members raise `ClientInternalError`. On asyncio the client's members are plain
  asyncio, so a client needs nothing more.
- `ServiceRuntime`, the rest of what the long-running services (the Worker, the Scheduler, the
  outbox relay) and their parts hold, given them when their `run()` starts (`concurrency`):
  `TRIO`'s, or `ASYNCIO`'s on anyio (the `asyncio` extra), whose scopes and task groups keep
  trio's semantics (level-triggered cancellation, deadlines that move) that the services are
  written for. A member with trio's name has trio's meaning; the one exception is the
  client's `move_on_at`, which on asyncio reads its deadline as it is entered and cancels
  once, as asyncio does: the services make their scopes with `cancel_scope()`.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from typing_extensions import TypeVarTuple, Unpack

    from ..wire.drivers import ChannelBase, ChannelOptions, Endpoint

    PosArgs = TypeVarTuple("PosArgs")

S = TypeVar("S")
T = TypeVar("T")
L = TypeVar("L")


class Cancellable(Protocol):
    """What every runtime's cancel scopes and task groups have: `cancel()` ends the body at its
    next suspension (at once if it is suspended), and the scope swallows that cancellation."""

    @property
    def cancelled_caught(self) -> bool:
        """Whether the scope ended its body by cancelling it."""

    def cancel(self) -> None: ...


class CancelScope(Cancellable, Protocol):
    """A cancel scope entered with `with` (trio's, anyio's, the asyncio driver's `MoveOnAt`),
    with a deadline on the runtime's clock (inf: none). The services make a scope (and may
    cancel it, or move its deadline) before a task enters it, and move its deadline at any
    time after (trio's and anyio's follow; `MoveOnAt`, the client's on asyncio, reads it as it
    is entered)."""

    @property
    def deadline(self) -> float: ...
    @deadline.setter
    def deadline(self, value: float) -> None: ...
    def __enter__(self: S) -> S: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
        /,
    ) -> bool: ...


class Spawner(Protocol):
    """Where tasks start (the Worker's jobs' tasks: a nursery, or a lighter group of them)."""

    def start_soon(
        self,
        async_fn: Callable[[Unpack[PosArgs]], Awaitable[object]],
        *args: Unpack[PosArgs],
        name: object = None,
    ) -> None:
        """Start `async_fn(*args)` in the group; RuntimeError once the group is closing."""


class TaskGroup(Spawner, Protocol):
    """Where background tasks run (a trio nursery is one): every task in it ends before it
    closes, and cancelling it cancels them."""

    @property
    def cancel_scope(self) -> Cancellable: ...


class Nursery(TaskGroup, Protocol):
    """A trio nursery or an anyio task group, as the services use it."""

    @property
    def cancel_scope(self) -> CancelScope: ...
    async def start(
        self, fn: Callable[..., Awaitable[object]], *args: Any, name: object = ...
    ) -> Any: ...


class EventLike(Protocol):
    """An event as the client sets and reads it (a threading.Event under the blocking runtime)."""

    def set(self) -> None: ...
    def is_set(self) -> bool: ...


class Event(EventLike, Protocol):
    """An event a task waits for, with trio's `wait()`: a checkpoint even when it is set
    (trio's; on asyncio, `asyncio_runtime.Event`)."""

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


Waiter = Any
"""What `park` suspends and `unpark` wakes (trio: the task itself)."""


class CallSoon(Protocol):
    """A run (a trio run, an asyncio loop) that any thread or signal handler can have a
    function run in: the one way into a run from outside it."""

    def __call__(self, fn: Callable[[], object], /, *, idempotent: bool = False) -> bool:
        """Run `fn` soon in the run; False if the run has finished. `idempotent`: a call of
        the same `fn` still pending may stand for this one (trio's; asyncio runs each)."""

    def here(self) -> bool:
        """Whether the caller runs in that run (one of its tasks, in its thread)."""


class RunVar(Protocol[L]):
    """A value per run (trio's and anyio's RunVar)."""

    def get(self) -> L: ...
    def set(self, value: L) -> object: ...


def threads_limiter(run_var: RunVar[L], make: Callable[[float], L]) -> L:
    """The run's limiter of the threads `def` handlers and the relay's database calls run in,
    made with `make(math.inf)` on first use: no cap, as a Worker's slots already allow at most
    `max_in_flight` handlers at once (the library's default limiter would cap every Worker at
    40 threads together, shared with any other user of it), and never the loop's default
    executor."""
    try:
        return run_var.get()
    except LookupError:
        limiter = make(math.inf)
        run_var.set(limiter)
        return limiter


# The members that the trio and asyncio runtimes hold as instance slots, set to their library's
# own functions and classes: `rt.event()` is then one attribute read from the library's call.
PLAIN_MEMBERS = (
    "cancel_scope",
    "checkpoint",
    "checkpoint_if_cancelled",
    "current_time",
    "effective_deadline",
    "event",
    "lock",
    "move_on_after",
    "open_nursery",
    "parking_lot",
    "sleep",
    "sleep_until",
)


class Runtime(Protocol):
    """What the shared client code awaits (see the module's docstring)."""

    # -- time ----------------------------------------------------------------------------
    def current_time(self) -> float:
        """The monotonic clock deadlines are kept in, in seconds (trio's MockClock in tests;
        the loop's clock on asyncio)."""

    def effective_deadline(self) -> float:
        """The caller's own deadline on that clock (trio's cancel scopes); inf if none."""

    async def sleep(self, seconds: float) -> None: ...

    def move_on_at(self, deadline: float) -> CancelScope:
        """A cancel scope that cancels its body when the clock reaches `deadline` (inf:
        only when cancelled), swallowing that cancellation. The client's: on asyncio it is
        the driver's `MoveOnAt`, whose deadline is read as it is entered."""

    async def bounded(self, work: Callable[[float | None], Awaitable[None]], until: float) -> None:
        """Run `work(timeout_s)` until the clock reaches `until`: trio cancels it there, and a
        blocking front end passes the time left as its timeout (None: no limit)."""

    # -- tasks ---------------------------------------------------------------------------
    def open_task_group(self) -> AbstractAsyncContextManager[TaskGroup]:
        """A new task group: its block ends when every task in it has ended (the client's:
        plain asyncio tasks on asyncio)."""

    async def run_concurrently(
        self, worker: Callable[[], Awaitable[None]], *, at_most: int
    ) -> None:
        """Run up to `at_most` copies of `worker` at once, which share one source of work, and
        return when all have ended: trio runs `at_most` copies, the blocking runtime one, which
        then does all of the work."""

    def owner(self) -> object | None:
        """What a client opened here serves (trio: its run's root task); None: any caller."""

    # -- wake-ups ------------------------------------------------------------------------
    def event(self) -> EventLike: ...

    async def wait_event(self, event: EventLike, until: float) -> None:
        """Wait until `event` is set, or the clock reaches `until`."""

    def waiter(self) -> Waiter:
        """The current task, as `unpark` wakes it once it is parked."""

    @property
    def park_aborted(self) -> object:
        """What the `abort` callback given to `park` returns."""

    def park(self, abort: Callable[[Any], Any]) -> Awaitable[None]:
        """Suspend the current task until `unpark(waiter)` with its waiter: no Event, one
        wake-up (the shape of trio's `wait_task_rescheduled`, so trio parks with no wrapper
        on every caller's path). If it is cancelled first, `abort(raise_cancel)` runs and
        returns `park_aborted`, the waiter is never to be unparked, and the cancellation goes
        on."""

    def unpark(self, waiter: Waiter) -> None:
        """Resume a parked waiter (once, from the waiter's own run)."""

    # -- the run itself, and other threads -------------------------------------------------
    def run(self, main: Callable[..., Awaitable[object]], *args: Any) -> object:
        """Run `main(*args)` to its end in a new run of this runtime (in the calling thread)."""

    def call_soon_handle(self) -> CallSoon:
        """How other threads (and signal handlers) have a function run in the current run."""

    def is_cancellation(self, error: BaseException) -> bool:
        """Whether `error` is this runtime cancelling a task (not a failure of the task)."""

    def check_running(self, what: str) -> None:
        """Raise a RuntimeError saying what to do when `what` is called outside this runtime."""

    def channel(
        self, endpoint: Endpoint, options: ChannelOptions, tasks: TaskGroup | None
    ) -> ChannelBase:
        """A channel to `endpoint` for this runtime (its connection tasks in `tasks`)."""


class ServiceRuntime(Runtime, Protocol):
    """What the Worker (with its slots and lease keeper), the Scheduler and the outbox relay
    take from the library they run on, beside the client's members (see the module's
    docstring): `TRIO`, or `ASYNCIO` once `for_services()` has loaded anyio's members."""

    name: str

    # -- time ------------------------------------------------------------------------------
    def clock(self) -> Callable[[], float]:
        """In a run: its clock's own reading function, what `current_time` reads (one call a
        reading, where `current_time` looks the run up each time: a job reads it twice)."""

    def sleep_until(self, deadline: float) -> Awaitable[None]: ...

    def checkpoint(self) -> Awaitable[None]:
        """Let other tasks run, and deliver a pending cancellation."""

    def checkpoint_if_cancelled(self) -> Awaitable[None]:
        """Only deliver a pending cancellation."""

    # -- cancel scopes ---------------------------------------------------------------------
    def cancel_scope(self, *, deadline: float = ...) -> CancelScope:
        """A `CancelScope` with trio's semantics: `cancel()` and a `deadline` that may be
        moved at any time, made (and cancelled, or given a deadline) before the task that runs
        the block enters it. Cancellation is level-triggered: every await inside the block
        raises until the block ends, which catches it (asyncio's own is one CancelledError per
        `cancel()`: anyio's scopes are trio's)."""

    def move_on_after(self, seconds: float) -> CancelScope:
        """`cancel_scope()` with its deadline `seconds` from now."""

    # -- tasks -----------------------------------------------------------------------------
    def open_nursery(self) -> AbstractAsyncContextManager[Nursery]:
        """Tasks owned by a block that waits for them all (`start_soon`, `start`, its
        `cancel_scope`); for `nursery.start(service.run)`, `TaskStatus` and
        `TASK_STATUS_IGNORED` (`concurrency`)."""

    def open_job_tasks(self, nursery: Nursery) -> AbstractAsyncContextManager[Spawner]:
        """A block for the Worker's jobs' tasks inside `nursery`, that waits for them. On trio
        `nursery` itself; on asyncio plain asyncio tasks (anyio's cost about 25 µs more each),
        cancelled with the block's task."""

    async def run_sync_in_thread(
        self, fn: Callable[..., T], *args: object, abandon: bool = True
    ) -> T:
        """`fn(*args)` in a worker thread (`threads_limiter`); a cancellation returns at once
        and abandons the thread (`abandon=False`: waits for `fn` to return, for work never to
        be left half done, such as the relay's database transactions)."""

    # -- wake-ups --------------------------------------------------------------------------
    def event(self) -> Event: ...
    def lock(self) -> Lock: ...

    def parking_lot(self) -> ParkingLot:
        """`park()` until `unpark_all()`; truthy while a task is parked."""
