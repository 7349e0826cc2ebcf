"""`def` handlers: a Router or Worker runs a plain function in a worker thread, so a blocking
handler (an ORM query, an HTTP client) does not stall trio and the other handlers."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Awaitable, Callable

import trio

from .._model.types import JobContext, Payload

SyncHandler = Callable[[Payload | None, JobContext], None]
"""A plain function `(payload, ctx) -> None` that processes one job in a worker thread."""

# Threads for `def` handlers: unlimited here, as a Worker's slots already allow at most
# max_in_flight handlers at once (trio's default limiter would cap every worker at 40 threads
# together, shared with any other to_thread user).
_THREADS: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("sepp_handler_threads")


def is_sync_function(fn: object) -> bool:
    """A plain `def` function or method (not `async def`)."""
    return (inspect.isfunction(fn) or inspect.ismethod(fn)) and not (
        inspect.iscoroutinefunction(fn)
    )


def run_in_thread(fn: SyncHandler) -> Callable[[Payload | None, JobContext], Awaitable[None]]:
    """The async handler that runs `fn` in a worker thread.

    A thread cannot be cancelled: when the worker cancels the handler (its lease was lost, or a
    forced shutdown), the handler returns at once and the thread is abandoned. It runs on to its
    end in the background, and whatever it returns or raises is discarded: the job is not acked.
    """

    @functools.wraps(fn)
    async def in_thread(payload: Payload | None, ctx: JobContext) -> None:
        await trio.to_thread.run_sync(fn, payload, ctx, abandon_on_cancel=True, limiter=_limiter())

    return in_thread


def _limiter() -> trio.CapacityLimiter:
    try:
        return _THREADS.get()
    except LookupError:
        limiter = trio.CapacityLimiter(math.inf)
        _THREADS.set(limiter)
        return limiter
