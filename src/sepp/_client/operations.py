"""Every operation, defined once for every front end (the trio `Client`, and through it the
blocking `SyncClient`; an asyncio one next): build its request (validate + convert) and read
its response (map + errors), as pure functions. A front end only sends the request, waits for
the response, and applies the deadline and the retry policy; no I/O and no clock here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar

from .._model import message_codec as mc
from .._model import validate as v
from .._model.errors import MalformedResponseError, SeppError, ValidationError
from .._model.rejections import JobRejection
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
from .._model.wire_format import DecodeError
from .._util.log import Log
from ..wire import Request, StatusCode, request_size
from .chunking import SERVER_MAX_MESSAGE_BYTES
from .retry import RETRYABLE

if TYPE_CHECKING:
    from .._model.errors import CallKind

T = TypeVar("T")

# A Reserve's deadline is its long-poll wait plus this much slack.
RESERVE_DEADLINE_SLACK_S = 10.0
NEVER_RETRIED: frozenset[StatusCode] = frozenset()


@dataclass(slots=True)
class Call:
    """One unary call to send: its method, request message, and what a front end needs to
    apply deadline and retries. `timeout_s` is the operation's own timeout (a reserve's
    long-poll plus slack), used instead of the client's rpc_timeout. Not frozen: a frozen
    dataclass's __init__ sets each field through object.__setattr__ (13.5k instructions a
    call against 2.7k), and every call makes one; nothing changes one once made."""

    method: str
    request: Request
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
    if set(map(type, requests)) != _REQUEST_TYPE:  # (a C loop; subclasses are looked at here)
        for index, job in enumerate(requests):
            if not isinstance(job, EnqueueRequest):
                raise ValidationError(f"jobs[{index}]", "must be a sepp.EnqueueRequest")
    return requests


_REQUEST_TYPE = {EnqueueRequest}


def enqueue_batch_call(
    requests: Sequence[EnqueueRequest],
    trace_context: TraceContext | None = None,
    *,
    label: str | None = None,
) -> Call:
    return Call(
        "EnqueueBatch",
        mc.REQUESTS.enqueue_batch(requests, trace_context),
        ambiguous_retry_safe=all_keyed(requests),
        label=label,
    )


def read_enqueue_batch(body: bytes, count: int) -> list[EnqueueAck | JobRejection]:
    return read(lambda b: mc.RESPONSES.batch_results(b, count), body, "EnqueueBatch")


def read_enqueue_one(body: bytes) -> EnqueueAck | JobRejection:
    return read(mc.RESPONSES.single_result, body, "EnqueueBatch")


def enqueue_atomic_call(
    requests: Sequence[EnqueueRequest], trace_context: TraceContext | None = None
) -> Call:
    request = mc.REQUESTS.enqueue_batch(requests, trace_context)
    size = request_size(request)
    if size > SERVER_MAX_MESSAGE_BYTES:
        raise ValidationError(
            "jobs",
            f"an atomic enqueue of {len(requests)} jobs encodes to {size} bytes,"
            f" over the server's {SERVER_MAX_MESSAGE_BYTES}-byte message cap"
            " (max_message_bytes); enqueue_batch splits bigger ones",
        )
    return Call("EnqueueAtomic", request, ambiguous_retry_safe=all_keyed(requests))


def read_enqueue_atomic(body: bytes, count: int) -> list[EnqueueAck]:
    """Every job's ack, or BatchValidationError naming the jobs the server refused."""
    return read(lambda b: mc.RESPONSES.atomic_acks(b, count), body, "EnqueueAtomic")


def all_keyed(requests: Sequence[EnqueueRequest]) -> bool:
    # Without a key on every job, a failure after sending may hide a commit: a retry could
    # duplicate jobs, so only failures known to precede the server's work are retried.
    return all(map(_IDEMPOTENCY_KEY, requests))


_IDEMPOTENCY_KEY = attrgetter("idempotency_key")


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
    encode = mc.REQUESTS.reserve

    def remaining_wait(elapsed_s: float) -> bytes:
        # The server never saw the first attempt (GOAWAY, refused): wait only what is left.
        return encode(names, max(0.0, wait_s - elapsed_s), lease_s, worker_id, max_jobs)

    call = Call(
        "Reserve",
        encode(names, wait_s, lease_s, worker_id, max_jobs),
        retryable=NEVER_RETRIED,
        kind="reserve",
        timeout_s=wait_s + RESERVE_DEADLINE_SLACK_S,
        retry_request=remaining_wait,
    )
    return call, names


def read_reserve(body: bytes, worker_id: str | None, log: Log, client: Any = None) -> list[Job]:
    """The jobs reserved; `client` is what their contexts give handlers as `ctx.client`."""
    jobs: list[Job] = []
    codec = mc.RESPONSES
    for fields in read(codec.reserved_jobs, body, "Reserve"):
        try:
            jobs.append(codec.job(fields, worker_id, client))
        except Exception as exc:  # one bad job must not cost the others
            log.warning("sepp: skipping a malformed job from Reserve: %s", exc)
    return jobs


def ack_call(ctx: JobContext) -> Call:
    request = mc.REQUESTS.ack(job_context(ctx).id, ctx.attempt, ctx.worker_id)
    return Call("Ack", request, kind="lease")


def read_ack(body: bytes) -> None:
    read(mc.RESPONSES.ack_response, body, "Ack")


def nack_call(ctx: JobContext, reason: str | None, retry: Retry) -> Call:
    job_id = job_context(ctx).id
    if not isinstance(retry, Retry):
        raise ValidationError(
            "retry", "must be Retry.DEFAULT, Retry.after(...) or Retry.DEAD_LETTER"
        )
    if reason:
        v.utf8_text("reason", reason)
    request = mc.REQUESTS.nack(job_id, ctx.attempt, reason, retry, ctx.worker_id)
    return Call("Nack", request, kind="lease")


def read_nack(body: bytes) -> bool:
    """Whether the server dead-lettered the job."""
    return read(mc.RESPONSES.nack_dead_lettered, body, "Nack")


def extend_call(ctx: JobContext, lease_duration: float | timedelta) -> Call:
    lease_s = v.seconds("lease_duration", lease_duration)
    request = mc.REQUESTS.extend(job_context(ctx).id, ctx.attempt, lease_s, ctx.worker_id)
    return Call("Extend", request, kind="lease")


def read_extend(body: bytes, ctx: JobContext) -> datetime:
    """The new lease expiry, also recorded on `ctx`."""
    expires = read(mc.RESPONSES.extended_until, body, "Extend")
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
    if queue is not None:
        v.queue_name("queue", queue)
    request = mc.REQUESTS.drain_dead_letters(queue, max)
    return Call("DrainDeadLetters", request, retryable=NEVER_RETRIED)


def read_drain_dead_letters(body: bytes, log: Log) -> list[DeadLetterRecord]:
    records: list[DeadLetterRecord] = []
    codec = mc.RESPONSES
    for record in read(codec.dead_letter_records, body, "DrainDeadLetters"):
        try:
            records.append(codec.dead_letter(record))
        except Exception as exc:
            log.warning("sepp: skipping a malformed dead-letter record: %s", exc)
    return records


SERVER_INFO_CALL = Call("GetServerInfo", b"")


def read_server_info(body: bytes) -> ServerInfo:
    return read(mc.RESPONSES.server_info, body, "GetServerInfo")


# -- reading --------------------------------------------------------------------------------


def read(reader: Callable[[bytes], T], body: bytes, method: str) -> T:
    """`reader(body)`, its failures as MalformedResponseError naming the call."""
    try:
        return reader(body)
    except SeppError:
        raise
    except DecodeError as exc:
        raise MalformedResponseError(f"{method}: response does not parse: {exc}") from exc
    except Exception as exc:
        raise MalformedResponseError(f"{method}: {exc}") from exc
