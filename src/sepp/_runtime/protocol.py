"""What the shared client code needs from the world it runs in: the `Runtime` protocol.

The operations of `Client` are coroutines written once, and every suspension, clock reading,
task, cancel scope and wake-up they need goes through the runtime they were given (never a
default: a forgotten runtime is a type error). One module per runtime implements it:
`trio_runtime` (`TRIO`: awaited as usual) and `blocking_runtime` (`BLOCKING`: every await
completes without suspending, so `SyncClient` runs each operation to its end with one
`coroutine.send(None)`). An asyncio front end is one more such module.

The vocabulary is trio's (task groups with a cancel scope, parking a task until something wakes
it); the blocking runtime has no event loop, and what needs one (tasks, cancel scopes, parking,
calls from other threads) is never reached under it: those members raise `ClientInternalError`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from typing_extensions import TypeVarTuple, Unpack

    from ..wire.drivers._base import ChannelBase, ChannelOptions, Endpoint

    PosArgs = TypeVarTuple("PosArgs")


class EventLike(Protocol):
    def set(self) -> None: ...
    def is_set(self) -> bool: ...


class CancelScope(Protocol):
    """A scope whose body `cancel()` (from the scope's own run) ends at its next suspension."""

    @property
    def cancelled_caught(self) -> bool:
        """Whether the scope ended its body by cancelling it."""

    def cancel(self) -> None: ...


class TaskGroup(Protocol):
    """Where background tasks run (a trio nursery is one): every task in it ends before it
    closes."""

    @property
    def cancel_scope(self) -> CancelScope: ...

    def start_soon(
        self,
        async_fn: Callable[[Unpack[PosArgs]], Awaitable[object]],
        *args: Unpack[PosArgs],
        name: object = None,
    ) -> None:
        """Start `async_fn(*args)` in the group; RuntimeError once the group is closing."""


Waiter = Any
"""What `park` suspends and `unpark` wakes (trio: the task itself)."""

CallSoon = Callable[[Callable[[], object]], bool]
"""Run a function soon in a run, from any thread; False if that run has finished."""


class Runtime(Protocol):
    # -- time ----------------------------------------------------------------------------
    def now(self) -> float:
        """The clock deadlines are kept in, in seconds."""

    def effective_deadline(self) -> float:
        """The caller's own deadline on that clock (trio's cancel scopes); inf if none."""

    async def sleep(self, seconds: float) -> None: ...

    def move_on_at(self, deadline: float) -> AbstractContextManager[CancelScope]:
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
