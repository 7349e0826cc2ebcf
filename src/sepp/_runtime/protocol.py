"""What the package needs from the library it runs on, said once: the protocols every
runtime's scopes, task groups and events meet, the client's `Runtime` and the services'
`Concurrency` (`primitives`) built on them.

The vocabulary is trio's (cancel scopes, task groups that wait for their tasks, parking a task
until something wakes it). Two bundles use it, one per kind of caller:

- `Runtime`, what the shared client code awaits: the operations of `Client` are coroutines
  written once, and every suspension, clock reading, task, cancel scope and wake-up they need
  goes through the runtime they were given (never a default: a forgotten runtime is a type
  error). One per front end: `trio_runtime` (`TRIO`: awaited as usual), `asyncio_runtime`
  (`ASYNCIO`, uvloop too: plain asyncio, so a client needs nothing more) and `blocking_runtime`
  (`BLOCKING`: every await completes without suspending, so `SyncClient` runs each operation to
  its end with one `coroutine.send(None)`; what needs an event loop (tasks, cancel scopes,
  parking, calls from other threads) is never reached under it: those members raise
  `ClientInternalError`).
- `Concurrency` (`primitives`), what the long-running services (the Worker, the Scheduler) and
  their parts hold: trio's own functions (`trio_concurrency.TRIO`), or anyio's on asyncio
  (`anyio_concurrency.ANYIO`), whose scopes keep trio's semantics (level-triggered, deadlines
  that move) that the services are written for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from typing_extensions import TypeVarTuple, Unpack

    from ..wire.drivers._base import ChannelBase, ChannelOptions, Endpoint

    PosArgs = TypeVarTuple("PosArgs")

S = TypeVar("S")


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
    """An event a task waits for (trio's, anyio's)."""

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

CallSoon = Callable[[Callable[[], object]], bool]
"""Run a function soon in a run, from any thread; False if that run has finished."""


class Runtime(Protocol):
    """What the shared client code awaits (see the module's docstring)."""

    # -- time ----------------------------------------------------------------------------
    def now(self) -> float:
        """The clock deadlines are kept in, in seconds."""

    def effective_deadline(self) -> float:
        """The caller's own deadline on that clock (trio's cancel scopes); inf if none."""

    async def sleep(self, seconds: float) -> None: ...

    def move_on_at(self, deadline: float) -> CancelScope:
        """A cancel scope that cancels its body when the clock reaches `deadline` (inf:
        only when cancelled), swallowing that cancellation."""

    async def bounded(self, work: Callable[[float | None], Awaitable[None]], until: float) -> None:
        """Run `work(timeout_s)` until the clock reaches `until`: trio cancels it there, and a
        blocking front end passes the time left as its timeout (None: no limit)."""

    # -- tasks ---------------------------------------------------------------------------
    def open_task_group(self) -> AbstractAsyncContextManager[TaskGroup]:
        """A new task group: its block ends when every task in it has ended."""

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
        """How other threads have a function run soon in the current run."""

    def is_cancellation(self, error: BaseException) -> bool:
        """Whether `error` is this runtime cancelling a task (not a failure of the task)."""

    def check_running(self, what: str) -> None:
        """Raise a RuntimeError saying what to do when `what` is called outside this runtime."""

    def channel(
        self, endpoint: Endpoint, options: ChannelOptions, tasks: TaskGroup | None
    ) -> ChannelBase:
        """A channel to `endpoint` for this runtime (its connection tasks in `tasks`)."""
