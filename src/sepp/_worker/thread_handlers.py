"""`def` handlers: a Router or Worker runs a plain function in a worker thread, so a blocking
handler (an ORM query, an HTTP client) does not stall the event loop and the other handlers."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable

from .._model.types import JobContext, Payload
from .._runtime.concurrency import run_sync_in_thread

SyncHandler = Callable[[Payload | None, JobContext], None]
"""A plain function `(payload, ctx) -> None` that processes one job in a worker thread."""


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
        await run_sync_in_thread(fn, payload, ctx)

    return in_thread
