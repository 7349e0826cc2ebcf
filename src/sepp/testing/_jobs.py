"""Reserved jobs built by hand, for unit tests of handlers and of fake clients."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from .._model import validate as v
from .._model.errors import ValidationError
from .._model.types import (
    CustomValue,
    EnqueueRequest,
    JobContext,
    TraceContext,
    record_lease_expiry,
    reserved_job,
)
from .._model.types import follow_ups as recorded_follow_ups

if TYPE_CHECKING:
    from .._worker.thread_handlers import SyncJobContext

DEFAULT_TEST_LEASE = timedelta(seconds=30)


def job_context(
    job_type: str = "test",
    *,
    queue: str = "test",
    job_id: str | None = None,
    attempt: int = 1,
    max_attempts: int = 3,
    priority: int = 0,
    custom: Mapping[str, CustomValue] | None = None,
    enqueued_at: datetime | None = None,
    scheduled_at: datetime | None = None,
    trace_context: TraceContext | None = None,
    lease_expires_at: datetime | None = None,
    worker_id: str | None = None,
    client: Any = None,
    state: Any = None,
) -> JobContext:
    """A `JobContext` as `reserve` would return it, to call a handler directly in a test.

    The job id defaults to a fresh UUID, `enqueued_at` to now and `lease_expires_at` to 30 s
    from now (UTC). Values are checked like the server's (ValidationError): attempt and
    max_attempts ≥ 1, priority 0-9, timezone-aware datetimes, a custom map of str, int,
    float or bool. `client` and `state` are what the handler sees as `ctx.client` (any
    object with the client calls it makes, e.g. a fake) and `ctx.state`.
    """
    now = datetime.now(timezone.utc)
    if trace_context is not None and not isinstance(trace_context, TraceContext):
        raise ValidationError("trace_context", "must be a sepp.TraceContext")
    return reserved_job(
        None,
        "",
        id=str(uuid.uuid4()) if job_id is None else v.utf8_text("job_id", job_id),
        queue=v.queue_name("queue", queue),
        job_type=v.utf8_text("job_type", job_type),
        attempt=v.whole_number("attempt", attempt, low=1, high=v.UINT32_MAX),
        max_attempts=v.whole_number("max_attempts", max_attempts, low=1, high=v.UINT32_MAX),
        priority=v.whole_number("priority", priority, low=0, high=9),
        custom=v.custom_map("custom", {} if custom is None else custom),
        enqueued_at=now if enqueued_at is None else v.aware_datetime("enqueued_at", enqueued_at),
        scheduled_at=(
            None if scheduled_at is None else v.aware_datetime("scheduled_at", scheduled_at)
        ),
        trace_context=trace_context,
        lease_expires_at=(
            now + DEFAULT_TEST_LEASE
            if lease_expires_at is None
            else v.aware_datetime("lease_expires_at", lease_expires_at)
        ),
        worker_id=v.optional_text("worker_id", worker_id),
        client=client,
        state=state,
    ).ctx


def sync_job_context(ctx: JobContext) -> SyncJobContext:
    """`ctx` as a `def` handler gets it, to call one directly in a test: a
    `sepp.SyncJobContext` with the same job, lease and state, whose `client` is `ctx`'s (a
    `sepp.SyncClient`, or a fake with the blocking calls the handler makes):
    `send_welcome(payload, sync_job_context(job_context("send_welcome", client=fake)))`."""
    from .._worker.thread_handlers import sync_job_context as as_a_def_handler_sees_it

    if not isinstance(ctx, JobContext):
        raise ValidationError("ctx", "must be a sepp.JobContext")
    client: Any = ctx._lease.client  # a SyncClient, or a fake of one
    return as_a_def_handler_sees_it(ctx, client)


def set_lease_expires_at(ctx: JobContext, expires_at: datetime) -> None:
    """Move a context's lease expiry, as `Client.extend` does: for a fake client's extend."""
    if not isinstance(ctx, JobContext):
        raise ValidationError("ctx", "must be a sepp.JobContext")
    record_lease_expiry(ctx, v.aware_datetime("expires_at", expires_at))


def follow_ups(ctx: JobContext) -> list[EnqueueRequest]:
    """What a handler given `ctx` asked to enqueue with `ctx.then(...)`, in order, as the
    requests the Worker would send (before it adds the idempotency keys it derives): to check
    a handler's follow-ups in a unit test, `assert follow_ups(ctx)[0].job_type == "ship"`."""
    if not isinstance(ctx, JobContext):
        raise ValidationError("ctx", "must be a sepp.JobContext")
    return recorded_follow_ups(ctx)
