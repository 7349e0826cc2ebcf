"""`on_dead_letter`: the hooks a Worker calls when its nack dead-lettered a job, checked where
they are given (a Worker, a Router) and made async there: a plain `def` hook runs in a worker
thread, as a `def` handler does."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, NamedTuple

from .._model.errors import ValidationError
from .._model.types import JobContext

if TYPE_CHECKING:
    from .thread_handlers import SyncJobContext

DeadLetterHook = (
    Callable[[JobContext, Exception | None], Awaitable[None]]
    | Callable[["SyncJobContext", Exception | None], None]
)
"""`on_dead_letter(ctx, exc)`: called once when this worker's nack dead-lettered a job, with
the job's context and what ended it: the handler's exception (a `sepp.HandlerError` for a
permanent one or a payload that did not decode), or None when nothing was raised (a job type
without a handler, a final attempt cut short by a forced shutdown). An `async def`, or a plain
`def`, which runs in a worker thread with a `sepp.SyncJobContext` (a blocking `ctx.client`)."""

HookFn = Callable[[JobContext, Exception | None], Awaitable[None]]


class HookCall(NamedTuple):
    """A checked hook: its name (for the log) and the async call that runs it."""

    name: str
    call: HookFn


def checked_hook(field: str, hook: object) -> tuple[HookCall, ...]:
    """`hook` (None: none) as the calls to make; a non-callable raises ValidationError, a
    callable that cannot be called as `hook(ctx, exc)` TypeError."""
    if hook is None:
        return ()
    if not callable(hook):
        raise ValidationError(field, f"must be a function (ctx, exc), got {type(hook).__name__}")
    name = getattr(hook, "__qualname__", None) or type(hook).__qualname__
    from .typed_handler import unevaluated_signature

    try:
        signature = unevaluated_signature(hook)
    except (TypeError, ValueError):  # a builtin without a signature: trusted
        signature = None
    if signature is not None:
        try:
            signature.bind(None, None)
        except TypeError:
            raise TypeError(
                f"{field}: the hook {name}{signature} cannot be called as hook(ctx, exc)"
            ) from None
    from .thread_handlers import is_async_callable

    if is_async_callable(hook):
        return (HookCall(name, hook),)
    return (HookCall(name, _in_a_thread(hook, name)),)


def _in_a_thread(hook: Callable[..., object], name: str) -> HookFn:
    """`hook` run in a worker thread as a `def` handler is, its ctx a SyncJobContext."""
    from .thread_handlers import run_in_thread

    async def in_thread(ctx: JobContext, error: Exception | None) -> None:
        def call(_payload: object, sync_ctx: SyncJobContext) -> object:
            return hook(sync_ctx, error)  # an awaitable returned is refused there, loudly

        call.__qualname__ = name
        await run_in_thread(call)(None, ctx)

    return in_thread
