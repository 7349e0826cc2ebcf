"""Sentry for sepp workers (the `sentry` extra: `pip install 'sepp-trio[sentry]'`).

`SentryMiddleware` gives each job a Sentry scope of its own, tagged with the job, and reports a
job to Sentry once: when this worker's nack dead-lettered it (its `on_dead_letter` hook). A
failure that is retried, a `HandlerError.retry`, a `retry_after`, is never reported; a job's
final failure always is. Call `sentry_sdk.init(...)` as usual, then give the Worker (or the
Router that `sepp-trio worker` runs) both halves::

    sentry = SentryMiddleware()
    worker = sepp.Worker(client, ["payments"], middleware=[sentry],
                         on_dead_letter=sentry.on_dead_letter)

Without the middleware the hook still reports each dead letter, tagged, in a scope of its own;
without the hook nothing is reported but what the handlers capture themselves (and, through
sentry-sdk's logging integration, the worker's ERROR lines).
"""

from __future__ import annotations

import collections
import contextlib
import weakref
from typing import TYPE_CHECKING, Any

try:
    import sentry_sdk
    from sentry_sdk.scope import add_global_event_processor, use_isolation_scope
    from sentry_sdk.utils import event_from_exception
except ImportError as exc:  # the extra is not installed
    raise ImportError(
        "sepp.contrib.sentry needs sentry-sdk: pip install 'sepp-trio[sentry]'"
    ) from exc

import sepp

if TYPE_CHECKING:
    from sentry_sdk.scope import Scope

__all__ = ["SentryMiddleware"]

MAX_TAG_VALUE = 200  # Sentry's limit on a tag's value
SCOPE_ATTRIBUTE = "_sepp_sentry_scope"  # on a job's exception: the scope the job ran in
MAX_CAUSES = 8  # how far the hook follows an exception's causes to find that scope
# Jobs reported whose ERROR log line has not been seen yet (sentry-sdk's logging integration
# turned off, or a logger of the user's own): forgotten, oldest first, past this many.
REMEMBERED_REPORTS = 1000


class SentryMiddleware:
    """A `sepp.Middleware` that runs each job in a Sentry isolation scope of its own (its
    breadcrumbs cleared), tagged `sepp.job_id`, `sepp.job_type`, `sepp.queue` and
    `sepp.attempt`, with a `sepp job` context (also `max_attempts`, `priority`, `enqueued_at`)
    and the job type as the transaction name, so that whatever a handler captures or logs is
    told apart by job; and whose `on_dead_letter` hook reports a dead-lettered job's exception
    (unhandled, mechanism `sepp`) in that job's scope, with the breadcrumbs of its run (a job
    dead-lettered with no exception, an unknown type say, as an error message).

    sentry-sdk's logging integration would also turn the worker's ERROR line about the dead
    letter into an event of its own: that one is dropped for a job the hook reported, so each
    dead letter is one event. Use one instance for both halves."""

    __slots__ = ("__weakref__", "_reported")

    def __init__(self) -> None:
        self._reported: collections.OrderedDict[tuple[str, int], None] = collections.OrderedDict()
        add_global_event_processor(_DropReportedLines(self))

    def __repr__(self) -> str:
        return "<sepp.contrib.sentry.SentryMiddleware>"

    async def __call__(self, job: sepp.Job, call_next: sepp.CallNext) -> None:
        with sentry_sdk.isolation_scope() as scope:
            scope.clear_breadcrumbs()  # the worker's, and other jobs', are not this job's
            _describe_job(scope, job.ctx)
            try:
                await call_next()
            except Exception as exc:
                # The scope goes with the exception, for the hook (and with it, if the job is
                # retried). Built-in exceptions take no weak references, but every one has a
                # __dict__ (a frozen dataclass's refuses it: then the hook makes a new scope).
                with contextlib.suppress(Exception):
                    setattr(exc, SCOPE_ATTRIBUTE, scope)
                raise

    async def on_dead_letter(self, ctx: sepp.JobContext, exc: Exception | None) -> None:
        """The `on_dead_letter` hook: report the job, in the scope it ran in if this
        middleware ran it (else in a new one, tagged the same)."""
        scope = _scope_of(exc)
        self._reported[(ctx.id, ctx.attempt)] = None
        while len(self._reported) > REMEMBERED_REPORTS:
            self._reported.popitem(last=False)
        if scope is None:
            with sentry_sdk.isolation_scope() as scope:
                scope.clear_breadcrumbs()  # the worker's, and other jobs', are not this job's
                _describe_job(scope, ctx)
                _capture(ctx, exc)
        else:
            with use_isolation_scope(scope):
                _capture(ctx, exc)

    def _forget_reported(self, ctx: sepp.JobContext) -> bool:
        """Whether the hook reported `ctx`'s dead letter (it is forgotten then)."""
        try:
            del self._reported[(ctx.id, ctx.attempt)]
        except KeyError:
            return False
        return True


class _DropReportedLines:
    """A global event processor: drops the event sentry-sdk's logging integration made of the
    worker's ERROR line about a dead letter that `middleware`'s hook reported already."""

    __slots__ = ("_middleware",)

    def __init__(self, middleware: SentryMiddleware) -> None:
        self._middleware = weakref.ref(middleware)

    def __call__(self, event: Any, hint: Any) -> Any:
        record = hint.get("log_record") if isinstance(hint, dict) else None
        if record is None or not getattr(record, "sepp_dead_lettered", False):
            return event
        middleware = self._middleware()
        args = record.args if isinstance(record.args, tuple) else ()
        ctx = next((arg for arg in args if isinstance(arg, sepp.JobContext)), None)
        if middleware is not None and ctx is not None and middleware._forget_reported(ctx):
            return None
        return event


def _scope_of(exc: BaseException | None) -> Scope | None:
    """The scope the middleware left on `exc`, or on what it was raised from (an outer
    middleware that turned the exception into another)."""
    for _ in range(MAX_CAUSES):
        if exc is None:
            return None
        scope = getattr(exc, SCOPE_ATTRIBUTE, None)
        if scope is not None:
            return scope  # type: ignore[no-any-return]
        exc = exc.__cause__ or exc.__context__
    return None


def _describe_job(scope: Scope, ctx: sepp.JobContext) -> None:
    scope.set_tag("sepp.job_id", ctx.id)
    scope.set_tag("sepp.job_type", ctx.job_type[:MAX_TAG_VALUE])
    scope.set_tag("sepp.queue", ctx.queue[:MAX_TAG_VALUE])
    scope.set_tag("sepp.attempt", str(ctx.attempt))
    scope.set_context(
        "sepp job",
        {
            "id": ctx.id,
            "job_type": ctx.job_type,
            "queue": ctx.queue,
            "attempt": ctx.attempt,
            "max_attempts": ctx.max_attempts,
            "priority": ctx.priority,
            "enqueued_at": ctx.enqueued_at.isoformat(),
        },
    )
    scope.set_transaction_name(ctx.job_type)


def _capture(ctx: sepp.JobContext, exc: Exception | None) -> None:
    if exc is None:
        sentry_sdk.capture_message(
            f"sepp: job {ctx.job_type!r} dead-lettered on attempt {ctx.attempt}/"
            f"{ctx.max_attempts} with no exception (no handler for its type, or its final"
            " attempt cut short by a shutdown)",
            level="error",
        )
        return
    # By keyword: sentry-sdk 3 dropped the `client_options` parameter before it.
    event, hint = event_from_exception(exc, mechanism={"type": "sepp", "handled": False})
    sentry_sdk.capture_event(event, hint=hint)
