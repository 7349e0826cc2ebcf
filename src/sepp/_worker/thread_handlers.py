"""`def` handlers: a Router or Worker runs a plain function in a worker thread, so a blocking
handler (an ORM query, an HTTP client) does not stall the event loop and the other handlers.

Its `ctx` is a `SyncJobContext`, whose `client` blocks: each call runs in the worker's own run
(trio or asyncio) as a task of a task group the handler's task holds while its thread runs, so
the handler's end, however it ends, also ends the calls its thread still has in flight."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from .._client.handler_threads import HANDLER_THREAD
from .._client.sync import RunCalls, SyncClient
from .._model.types import JobContext, Payload
from .._runtime import concurrency


@dataclass(frozen=True, slots=True, eq=False)
class SyncJobContext(JobContext):
    """The `JobContext` a `def` handler gets: the same job and lease (an extend, the worker's
    or the handler's own, moves the one expiry both see), with a blocking `client`.

    Annotate a `def` handler's `ctx` with it for a type checker to know that
    `ctx.client.enqueue(...)` returns the `EnqueueAck` (`sepp.JobContext` works too, untyped).
    """

    _sync: SyncClient | None = field(repr=False)

    @property
    def client(self) -> SyncClient:
        """A `sepp.SyncClient` bound to the Worker's client: every call of `sepp.Client`,
        blocking, each run in the worker's event loop (trio or asyncio) while this thread waits,
        with the handler's context (a follow-up carries its trace). The calls end with the
        handler: when the worker gives it up (its `timeout`, a lost lease, a forced shutdown) a
        call in flight is cancelled and raises `sepp.ClientError`, and so does any call made
        after the handler returned (from a thread it left running). `close()` stops only this
        client. RuntimeError if there is no client (a test's context without `client=`)."""
        if self._sync is None:
            return JobContext.client.fget(self)  # type: ignore[attr-defined,no-any-return]
        return self._sync


def sync_job_context(ctx: JobContext, client: SyncClient | None) -> SyncJobContext:
    """`ctx` as a `def` handler sees it, with `client` as its `ctx.client`."""
    return SyncJobContext(
        ctx.id,
        ctx.queue,
        ctx.job_type,
        ctx.attempt,
        ctx.max_attempts,
        ctx.priority,
        ctx.custom,
        ctx.enqueued_at,
        ctx.scheduled_at,
        ctx.trace_context,
        ctx._lease,  # shared: one lease expiry, one state
        client,
    )


SyncHandler = Callable[[Payload | None, SyncJobContext], None]
"""A plain function `(payload, ctx) -> None` that processes one job in a worker thread (typed
to return None, so that an async function taking a SyncJobContext is refused; what one
registered for a task returns is the task's result)."""

_GIVEN_UP = (
    "the worker gave this job's handler up (its timeout passed, its lease was lost, or the"
    " worker is stopping)"
)
_CANCELLED = (
    f"{_GIVEN_UP} during the call: the call was cancelled, and may or may not have reached the"
    " server"
)
_ENDED = (
    "this job's handler has ended: its ctx.client takes no more calls (a thread it started,"
    " still running?)"
)
_ABANDONED = f"{_GIVEN_UP}: its ctx.client takes no more calls"


def is_sync_function(fn: object) -> bool:
    """A plain `def` function or method (not `async def`)."""
    return (inspect.isfunction(fn) or inspect.ismethod(fn)) and not (
        inspect.iscoroutinefunction(fn)
    )


def is_async_callable(fn: object) -> bool:
    """An `async def` function or method, or an object whose `__call__` is one (a function's
    type is callable too, never async)."""
    if inspect.iscoroutinefunction(fn):
        return True
    return not inspect.isroutine(fn) and inspect.iscoroutinefunction(type(fn).__call__)


def run_in_thread(
    fn: Callable[[Payload | None, SyncJobContext], object],
) -> Callable[[Payload | None, JobContext], Awaitable[object]]:
    """The async handler that runs `fn` in a worker thread, with a `SyncJobContext`.

    A thread cannot be cancelled: when the worker cancels the handler (its lease was lost, or a
    forced shutdown), the handler returns at once and the thread is abandoned. It runs on to its
    end in the background, and whatever it returns or raises is discarded: the job is not acked.
    Its client's calls in flight are cancelled then, and its later calls raise at once.
    """

    @functools.wraps(fn)
    async def in_thread(payload: Payload | None, ctx: JobContext) -> object:
        # A Router's handlers are written before any Worker runs them: the runtime is the
        # running one's (the Worker's), which its client's calls run on too.
        runtime = concurrency.current()
        worker_client = ctx._lease.client
        failure: BaseException | None = None
        returned: object = None
        async with runtime.open_task_group() as tasks:
            calls = blocking = None
            if worker_client is not None:
                calls = RunCalls(
                    runtime,
                    worker_client,
                    tasks,
                    closed=_ENDED,
                    cancelled=_CANCELLED,
                    given_up=_ABANDONED,  # a call cancelled with the handler: none after it
                )
                blocking = SyncClient._over(calls, getattr(worker_client, "address", "?"))
            try:
                returned = await runtime.run_sync_in_thread(
                    _in_handler_thread, fn, payload, ctx, blocking
                )
            except BaseException as exc:  # raised below, not wrapped in an exception group
                failure = exc
            finally:
                if calls is not None:
                    given_up = failure is not None and runtime.is_cancellation(failure)
                    calls.close(_ABANDONED if given_up else None)
                tasks.cancel_scope.cancel()  # the calls of a thread the handler left running
        if failure is not None:
            try:
                raise failure
            finally:
                failure = None
        return returned

    return in_thread


def _in_handler_thread(
    fn: Callable[..., object], payload: Payload | None, ctx: JobContext, client: SyncClient | None
) -> object:
    HANDLER_THREAD.active = True  # the async client's calls refuse this thread
    try:
        result = fn(payload, sync_job_context(ctx, client))
    finally:
        HANDLER_THREAD.active = False
    if result is not None and inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # never run: say so here rather than in a RuntimeWarning
        name = getattr(fn, "__qualname__", type(fn).__name__)
        raise TypeError(
            f"the `def` handler {name} returned {type(result).__name__}, which nothing awaits:"
            " it ran in a worker thread as a plain function. An async handler behind a plain"
            " `def` wrapper (a decorator) must be wrapped by an `async def` that awaits it"
        )
    return result
