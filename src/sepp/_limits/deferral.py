"""Giving a job back for later without costing it an attempt: a deferral.

A nack always costs an attempt (and dead-letters on the final one), so a job that must wait
for a limit longer than is worth holding its lease is instead *copied*: the same queue, type,
payload, custom map, priority and trace context, scheduled later, allowed the attempts the
original had left (this delivery never ran), and enqueued with the idempotency key
`sepp.defer:<original id>`; then the original is acked. Its custom map records where it came
from, so the Worker can show the job's attempts as one count across copies.

A crash between the copy's enqueue and the original's ack leaves both: the original comes back
when its lease expires (one attempt later; dead-lettered if that was its last, and then the
copy is the one job left), and deferring it again hits the key, so it is acked and the copy
stays the only job. A redelivered original that is run instead (its limit was free by then)
runs beside its copy: the same at-least-once a crash between a handler's end and its ack
gives, inside the milliseconds between two calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Protocol

from .._model.deferred import COUNT as COUNT
from .._model.deferred import ENTRIES
from .._model.deferred import ORIGIN as ORIGIN
from .._model.deferred import SPENT as SPENT
from .._model.deferred import origin_id as _origin_id
from .._model.deferred import spent_attempts as _spent_attempts
from .._model.errors import AttemptMismatchError, JobNotFoundError
from .._model.rejections import JobRejection
from .._model.types import EnqueueAck, EnqueueRequest, Job, JobContext

KEY_PREFIX = "sepp.defer:"


class DeferClient(Protocol):
    async def enqueue_batch(
        self, jobs: list[EnqueueRequest], *, timeout: float | timedelta | None = ...
    ) -> list[EnqueueAck | JobRejection]: ...

    async def ack(self, ctx: JobContext, *, timeout: float | timedelta | None = ...) -> None: ...


def deferral_key(job_id: str) -> str:
    return f"{KEY_PREFIX}{job_id}"


def spent_attempts(ctx: JobContext) -> int:
    """Attempts the job spent before this copy of it (0 for a job never deferred)."""
    return _spent_attempts(ctx.custom)


def logical_attempt(ctx: JobContext) -> int:
    """The job's attempt counted across its copies (what a handler should be shown)."""
    return ctx.logical_attempt


def logical_max_attempts(ctx: JobContext) -> int:
    return ctx.logical_max_attempts


def deferrals(ctx: JobContext) -> int:
    value = ctx.custom.get(COUNT)
    return value if type(value) is int and value >= 0 else 0


def origin_id(ctx: JobContext) -> str:
    """The id of the job first enqueued, before any deferral."""
    return _origin_id(ctx.custom, ctx.id)


def deferral_request(job: Job, *, scheduled_at: datetime | None) -> EnqueueRequest:
    """The copy that stands in for `job` (not yet enqueued)."""
    ctx = job.ctx
    custom = {k: v for k, v in ctx.custom.items() if k not in ENTRIES}
    custom[ORIGIN] = origin_id(ctx)
    custom[COUNT] = deferrals(ctx) + 1
    # This delivery never ran: it is given back with the rest.
    custom[SPENT] = spent_attempts(ctx) + ctx.attempt - 1
    return EnqueueRequest(
        ctx.queue,
        ctx.job_type,
        payload=job.payload,
        idempotency_key=deferral_key(ctx.id),
        priority=ctx.priority,
        max_attempts=max(ctx.max_attempts - ctx.attempt + 1, 1),
        custom=custom,
        scheduled_at=scheduled_at,
        trace_context=ctx.trace_context,
    )


@dataclass(frozen=True, slots=True)
class Deferral:
    """What deferring did. `rejection`: the copy was refused and the original is untouched
    (still leased: keep it, or try later). Otherwise `copy_id` stands in for the job
    (`deduplicated`: an earlier deferral of this very delivery's job made it), and
    `original_acked` says whether the ack landed (False: the original's lease was already
    lost; it comes back, and deferring it again hits the copy's key)."""

    copy_id: str | None
    deduplicated: bool = False
    original_acked: bool = False
    rejection: JobRejection | None = None


async def defer(
    client: DeferClient,
    job: Job,
    *,
    delay_s: float = 0.0,
    scheduled_at: datetime | None = None,
    now: datetime | None = None,
) -> Deferral:
    """Copy `job` to run at `scheduled_at` (or `delay_s` from now), then ack it."""
    if scheduled_at is None and delay_s > 0:
        scheduled_at = (now or datetime.now(timezone.utc)) + timedelta(seconds=delay_s)
    (result,) = await client.enqueue_batch([deferral_request(job, scheduled_at=scheduled_at)])
    if not isinstance(result, EnqueueAck):
        return Deferral(None, rejection=result)
    try:
        await client.ack(job.ctx)
    except (JobNotFoundError, AttemptMismatchError):
        return Deferral(result.job_id, result.deduplicated, original_acked=False)
    return Deferral(result.job_id, result.deduplicated, original_acked=True)
