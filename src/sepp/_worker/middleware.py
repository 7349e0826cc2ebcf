"""Middleware: async wrappers a Worker runs around each handler call."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from types import CoroutineType
from typing import Any, Protocol, cast

from .._model.errors import ValidationError
from .._model.types import Job, JobContext, Payload

CallNext = Callable[[], Awaitable[None]]
"""What a middleware awaits to run the rest of the chain: the inner middleware, then the
handler. Await it at most once."""

Middleware = Callable[[Job, CallNext], Awaitable[None]]
"""An async function `(job, call_next) -> None` wrapped around each handler call.

`job` is the reserved `sepp.Job` (`job.payload`, and `job.ctx` with `ctx.client` and
`ctx.state`); `await call_next()` runs the inner middleware and then the handler, in the same
task, so context variables set before it are seen by the handler. What the chain ends with
decides the job: returning acks it (also when `call_next` was never called: the handler is
skipped; calling it without awaiting it fails the job with a RuntimeError, as the handler never
ran), raising nacks it as the exception says, exactly as if the handler had raised it
(`sepp.HandlerError` to choose the nack; a handler's `timeout` arrives as `trio.TooSlowError`).
So a middleware can time the job, log it, set context variables, or turn an exception into
another outcome by catching it and returning or raising something else. Do not swallow
`trio.Cancelled` (under asyncio, `asyncio.CancelledError`; a `timeout` is `trio.TooSlowError`
there too).

Order: the Worker's middleware (first in the list = outermost), then each router's from the
outermost including router in, then the handler's own router's, then the handler's own
registration's (`middleware=` of `handle`, `handler` or `task`).
"""

HandlerFn = Callable[[Payload | None, JobContext], Awaitable[object]]


def checked_middleware(field: str, middleware: object) -> tuple[Middleware, ...]:
    """The middleware as a tuple, each one checked to be callable, and not a plain `def`
    function (which cannot await `call_next()`: its coroutine would be dropped)."""
    if callable(middleware) or not isinstance(middleware, Iterable):
        raise ValidationError(field, "must be a list of middleware functions")
    items: tuple[Middleware, ...] = tuple(middleware)
    for index, item in enumerate(items):
        if not callable(item):
            raise ValidationError(
                f"{field}[{index}]", f"must be callable, got {type(item).__name__}"
            )
        if _plain_function(item):
            name = getattr(item, "__qualname__", type(item).__name__)
            raise ValidationError(
                f"{field}[{index}]",
                f"{name} is a plain `def` function: a middleware is `async def` (job,"
                " call_next), which awaits call_next() to run the handler",
            )
    return items


def _plain_function(fn: object) -> bool:
    """A `def` function or method, also behind a `functools.wraps` wrapper of its own kind."""
    return (inspect.isfunction(fn) or inspect.ismethod(fn)) and not (
        inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(inspect.unwrap(fn))
    )


class HandlerStart(Protocol):
    """Told when the handler function itself starts (the Worker's held job), and given what
    it returned (its result)."""

    returned: object

    def handler_started(self) -> None: ...


def run_chain(
    job: Job, middleware: tuple[Middleware, ...], handler: HandlerFn, start: HandlerStart
) -> Coroutine[Any, Any, None]:
    """What runs `handler` for `job` inside `middleware` (outermost first), to await; `start`
    hears when the handler itself starts, after the middleware before it."""
    return _run_from(job, middleware, 0, handler, start)


async def _run_from(
    job: Job,
    middleware: tuple[Middleware, ...],
    index: int,
    handler: HandlerFn,
    start: HandlerStart,
) -> None:
    if index == len(middleware):
        start.handler_started()
        start.returned = await handler(job.payload, job.ctx)
        return
    inner: CoroutineType[Any, Any, None] | None = None  # what call_next() returned

    def call_next() -> Awaitable[None]:
        nonlocal inner
        if inner is not None:
            raise RuntimeError("a sepp middleware awaited call_next() twice")
        inner = cast(
            "CoroutineType[Any, Any, None]", _run_from(job, middleware, index + 1, handler, start)
        )
        return inner

    try:
        await middleware[index](job, call_next)
    finally:
        # Never started: inspect.getcoroutinestate()'s CORO_CREATED, without its call.
        dropped = inner is not None and inner.cr_frame is not None and not inner.cr_suspended
        if dropped:
            inner.close()  # type: ignore[union-attr]  # never run: said below, not in a warning
    if dropped:
        name = getattr(middleware[index], "__qualname__", type(middleware[index]).__name__)
        raise RuntimeError(
            f"the middleware {name} called call_next() without awaiting it: the handler never"
            " ran (to skip the handler, return without calling call_next())"
        )
