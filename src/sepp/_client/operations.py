"""Every operation, defined once for every front end (the trio `Client`, and through it the
blocking `SyncClient`; an asyncio one next): build its request (validate + convert) and read
its response (map + errors), as pure functions. A front end only sends the request, waits for
the response, and applies the deadline and the retry policy; no I/O and no clock here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from .._model import convert as cv
from .._model import validate as v
from .._model.errors import BatchValidationError, MalformedResponseError, SeppError, ValidationError
from .._model.rejections import BatchRejection, JobRejection
from .._model.types import (
    CustomValue,
    DeadLetterRecord,
    EnqueueAck,
    EnqueueRequest,
    Job,
    JobContext,
    Payload,
    Retry,
    ServerInfo,
    TraceContext,
    record_lease_expiry,
)
from .._util.log import Log
from ..wire._status import StatusCode
from .chunking import SERVER_MAX_MESSAGE_BYTES
from .retry import RETRYABLE

if TYPE_CHECKING:
    from .._model.errors import CallKind
    from .._pb import queue_pb2 as pb
else:  # protobuf loads when a client connects, not with `import sepp`
    from .._util.lazy import lazy_module

    pb = lazy_module("sepp._pb.queue_pb2")

T = TypeVar("T")
M = TypeVar("M")

# A Reserve's deadline is its long-poll wait plus this much slack.
RESERVE_DEADLINE_SLACK_S = 10.0
NEVER_RETRIED: frozenset[StatusCode] = frozenset()


@dataclass(frozen=True, slots=True)
class Call:
    """One unary call to send: its method, request message, and what a front end needs to
    apply deadline and retries. `timeout_s` is the operation's own timeout (a reserve's
    long-poll plus slack), used instead of the client's rpc_timeout."""

    method: str
    request: bytes
    retryable: frozenset[StatusCode] = RETRYABLE
    kind: CallKind = "generic"
    ambiguous_retry_safe: bool = True
    timeout_s: float | None = None
    # Rebuilds the request for the transport's transparent retries, given the seconds since
    # the first attempt (see Channel.call); only calls the policy never retries (Reserve).
    retry_request: Callable[[float], bytes] | None = None
    # What the caller called, to name in its errors, when not `method` ("Enqueue").
    label: str | None = None


# -- producing ------------------------------------------------------------------------------


def enqueue_request(
    queue: str | EnqueueRequest,
    job_type: str | None,
    *,
    payload: Payload | None,
    idempotency_key: str | None,
    priority: int | None,
    max_attempts: int | None,
    custom: Mapping[str, CustomValue] | None,
    scheduled_at: datetime | None,
    trace_context: TraceContext | None,
) -> EnqueueRequest:
    """The job of `enqueue()`: an EnqueueRequest given as such, or built from its fields."""
    if isinstance(queue, EnqueueRequest):
        fields = {
            "job_type": job_type,
            "payload": payload,
            "idempotency_key": idempotency_key,
            "priority": priority,
            "max_attempts": max_attempts,
            "custom": custom,
            "scheduled_at": scheduled_at,
            "trace_context": trace_context,
        }
        given = [name for name, value in fields.items() if value is not None]
        if given:
            raise TypeError(
                "enqueue() takes an EnqueueRequest or a job's fields, not both"
                f" (got an EnqueueRequest and {', '.join(given)})"
            )
        return queue
    if job_type is None:
        raise ValidationError("job_type", "is required")
    return EnqueueRequest(
        queue,
        job_type,
        payload=payload,
        idempotency_key=idempotency_key,
        priority=priority,
        max_attempts=max_attempts,
        custom=custom if custom is not None else {},
        scheduled_at=scheduled_at,
        trace_context=trace_context,
    )


def job_requests(jobs: Iterable[EnqueueRequest]) -> list[EnqueueRequest]:
    """The jobs of `enqueue_batch()` / `enqueue_atomic()`: a non-empty list of requests."""
    if isinstance(jobs, (str, bytes, EnqueueRequest)):
        raise ValidationError("jobs", "must be an iterable of EnqueueRequest")
    requests = list(jobs)
    if not requests:
        raise ValidationError("jobs", "must not be empty")
    for index, job in enumerate(requests):
        if not isinstance(job, EnqueueRequest):
            raise ValidationError(f"jobs[{index}]", "must be a sepp.EnqueueRequest")
    return requests


def enqueue_batch_call(
    requests: Sequence[EnqueueRequest],
    trace_context: TraceContext | None = None,
    *,
    label: str | None = None,
) -> Call:
    return Call(
        "EnqueueBatch",
        cv.enqueue_batch_to_pb(requests, trace_context),
        ambiguous_retry_safe=all_keyed(requests),
        label=label,
    )


def read_enqueue_batch(body: bytes, count: int) -> list[EnqueueAck | JobRejection]:
    try:
        return cv.batch_results_from_pb(body, count)
    except Exception as exc:
        raise MalformedResponseError(f"EnqueueBatch: {exc}") from exc


def read_enqueue_one(body: bytes) -> EnqueueAck | JobRejection:
    return convert(cv.single_result_from_pb, body, "EnqueueBatch")


def enqueue_atomic_call(
    requests: Sequence[EnqueueRequest], trace_context: TraceContext | None = None
) -> Call:
    request = cv.enqueue_batch_to_pb(requests, trace_context)
    if len(request) > SERVER_MAX_MESSAGE_BYTES:
        raise ValidationError(
            "jobs",
            f"an atomic enqueue of {len(requests)} jobs encodes to {len(request)} bytes,"
            f" over the server's {SERVER_MAX_MESSAGE_BYTES}-byte message cap"
            " (max_message_bytes); enqueue_batch splits bigger ones",
        )
    return Call("EnqueueAtomic", request, ambiguous_retry_safe=all_keyed(requests))


def read_enqueue_atomic(body: bytes, count: int) -> list[EnqueueAck]:
    """Every job's ack, or BatchValidationError naming the jobs the server refused."""
    msg = parse(pb.EnqueueAtomicResponse, body, "EnqueueAtomic")
    which = msg.WhichOneof("outcome")
    if which == "rejection":
        raise BatchValidationError(
            [
                BatchRejection(e.index, cv.rejection_from_pb(e.rejection))
                for e in msg.rejection.errors
            ]
        )
    if which != "success":
        raise MalformedResponseError("EnqueueAtomic: response has no outcome")
    if len(msg.success.responses) != count:
        raise MalformedResponseError(
            f"EnqueueAtomic: expected {count} results, got {len(msg.success.responses)}"
        )
    return [convert(cv.ack_from_pb, r, "EnqueueAtomic") for r in msg.success.responses]


def all_keyed(requests: Sequence[EnqueueRequest]) -> bool:
    # Without a key on every job, a failure after sending may hide a commit: a retry could
    # duplicate jobs, so only failures known to precede the server's work are retried.
    return all(job.idempotency_key for job in requests)


# -- consuming ------------------------------------------------------------------------------


def reserve_call(
    queues: Sequence[str] | str,
    *,
    lease_duration: float | timedelta,
    wait_timeout: float | timedelta,
    max_jobs: int | None,
    worker_id: str | None,
) -> tuple[Call, list[str]]:
    """A Reserve (never retried: leased jobs would be lost) and the queue names it asks."""
    names = [queues] if isinstance(queues, str) else list(queues)
    if not names:
        raise ValidationError("queues", "must name at least one queue")
    for index, name in enumerate(names):
        v.queue_name(f"queues[{index}]", name)
    lease_s = v.seconds("lease_duration", lease_duration)
    wait_s = v.seconds("wait_timeout", wait_timeout, allow_zero=True)
    if max_jobs is not None:
        v.whole_number("max_jobs", max_jobs, low=1, high=v.UINT32_MAX)
    v.optional_text("worker_id", worker_id)
    msg = pb.ReserveRequest(queues=names)
    cv.duration_to_pb(wait_s, msg.wait_timeout)
    cv.duration_to_pb(lease_s, msg.lease_duration)
    if worker_id is not None:
        msg.worker_id = worker_id
    if max_jobs is not None:
        msg.max_jobs = max_jobs

    def remaining_wait(elapsed_s: float) -> bytes:
        # The server never saw the first attempt (GOAWAY, refused): wait only what is left.
        cv.duration_to_pb(max(0.0, wait_s - elapsed_s), msg.wait_timeout)
        return msg.SerializeToString()

    call = Call(
        "Reserve",
        msg.SerializeToString(),
        retryable=NEVER_RETRIED,
        kind="reserve",
        timeout_s=wait_s + RESERVE_DEADLINE_SLACK_S,
        retry_request=remaining_wait,
    )
    return call, names


def read_reserve(body: bytes, worker_id: str | None, log: Log, client: Any = None) -> list[Job]:
    """The jobs reserved; `client` is what their contexts give handlers as `ctx.client`."""
    jobs: list[Job] = []
    for job_msg in parse(pb.ReserveResponse, body, "Reserve").jobs:
        try:
            jobs.append(cv.job_from_pb(job_msg, worker_id, client))
        except Exception as exc:  # one bad job must not cost the others
            log.warning("sepp: skipping a malformed job from Reserve: %s", exc)
    return jobs


def ack_call(ctx: JobContext) -> Call:
    msg = pb.AckRequest(job_id=job_context(ctx).id, attempt=ctx.attempt)
    if ctx.worker_id is not None:
        msg.worker_id = ctx.worker_id
    return Call("Ack", msg.SerializeToString(), kind="lease")


def read_ack(body: bytes) -> None:
    parse(pb.AckResponse, body, "Ack")


def nack_call(ctx: JobContext, reason: str | None, retry: Retry) -> Call:
    msg = pb.NackRequest(job_id=job_context(ctx).id, attempt=ctx.attempt)
    if not isinstance(retry, Retry):
        raise ValidationError(
            "retry", "must be Retry.DEFAULT, Retry.after(...) or Retry.DEAD_LETTER"
        )
    if reason:
        msg.reason = v.utf8_text("reason", reason)
    if retry.kind == "delay" and retry.delay is not None:
        cv.duration_to_pb(retry.delay.total_seconds(), msg.retry.delay)
    elif retry.kind == "dead_letter":
        msg.retry.dead_letter.SetInParent()
    else:
        msg.retry.default.SetInParent()
    if ctx.worker_id is not None:
        msg.worker_id = ctx.worker_id
    return Call("Nack", msg.SerializeToString(), kind="lease")


def read_nack(body: bytes) -> bool:
    """Whether the server dead-lettered the job."""
    return parse(pb.NackResponse, body, "Nack").dead_lettered


def extend_call(ctx: JobContext, lease_duration: float | timedelta) -> Call:
    lease_s = v.seconds("lease_duration", lease_duration)
    msg = pb.ExtendRequest(job_id=job_context(ctx).id, attempt=ctx.attempt)
    cv.duration_to_pb(lease_s, msg.lease_duration)
    if ctx.worker_id is not None:
        msg.worker_id = ctx.worker_id
    return Call("Extend", msg.SerializeToString(), kind="lease")


def read_extend(body: bytes, ctx: JobContext) -> datetime:
    """The new lease expiry, also recorded on `ctx`."""
    response = parse(pb.ExtendResponse, body, "Extend")
    if not response.HasField("lease_expires_at"):
        raise MalformedResponseError("Extend: response has no lease_expires_at")
    expires = convert(cv.timestamp_from_pb, response.lease_expires_at, "Extend")
    record_lease_expiry(ctx, expires)
    return expires


def job_context(ctx: object) -> JobContext:
    if not isinstance(ctx, JobContext):
        raise ValidationError("ctx", "must be the JobContext of a reserved job (job.ctx)")
    return ctx


# -- operations -----------------------------------------------------------------------------


def drain_dead_letters_call(queue: str | None, max: int) -> Call | None:
    """The DrainDeadLetters call (destructive, so never retried); None for `max=0`."""
    v.whole_number("max", max, low=0, high=v.UINT32_MAX)
    if max == 0:
        return None
    msg = pb.DrainDeadLettersRequest(max=max)
    if queue is not None:
        msg.queue = v.queue_name("queue", queue)
    return Call("DrainDeadLetters", msg.SerializeToString(), retryable=NEVER_RETRIED)


def read_drain_dead_letters(body: bytes, log: Log) -> list[DeadLetterRecord]:
    records: list[DeadLetterRecord] = []
    for record in parse(pb.DrainDeadLettersResponse, body, "DrainDeadLetters").records:
        try:
            records.append(cv.dead_letter_from_pb(record))
        except Exception as exc:
            log.warning("sepp: skipping a malformed dead-letter record: %s", exc)
    return records


SERVER_INFO_CALL = Call("GetServerInfo", b"")


def read_server_info(body: bytes) -> ServerInfo:
    msg = parse(pb.GetServerInfoResponse, body, "GetServerInfo")
    return convert(cv.server_info_from_pb, msg, "GetServerInfo")


# -- reading --------------------------------------------------------------------------------


def parse(cls: type[M], body: bytes, method: str) -> M:
    try:
        return cls.FromString(body)  # type: ignore[attr-defined,no-any-return]
    except Exception as exc:
        raise MalformedResponseError(f"{method}: response does not parse: {exc}") from exc


def convert(fn: Callable[[Any], T], value: object, method: str) -> T:
    try:
        return fn(value)
    except SeppError:
        raise
    except Exception as exc:
        raise MalformedResponseError(f"{method}: {exc}") from exc
