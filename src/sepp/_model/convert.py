"""Protobuf messages ⇄ sepp types: pure functions, one converter per message."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from .._util.lazy import lazy_module
from .types import (
    CustomValue,
    DeadLetterCause,
    DeadLetterRecord,
    EnqueueAck,
    EnqueueRequest,
    Job,
    Payload,
    ServerInfo,
    TraceContext,
    reserved_job,
)

if TYPE_CHECKING:
    from google.protobuf import duration_pb2, timestamp_pb2

    from .._pb import queue_pb2 as pb
    from . import rejection_reasons as rj
else:  # protobuf with the first call, the rejection classes with the first rejection
    pb = lazy_module("sepp._pb.queue_pb2")
    rj = lazy_module("sepp._model.rejection_reasons")

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class Malformed(Exception):
    """A message from the server that cannot become one of our types."""


# -- scalars --------------------------------------------------------------------------------


def timestamp_to_pb(when: datetime, out: timestamp_pb2.Timestamp) -> None:
    out.seconds, out.nanos = timestamp_parts(when)


def timestamp_from_pb(ts: timestamp_pb2.Timestamp) -> datetime:
    return timestamp_from_parts(ts.seconds, ts.nanos)


def timestamp_from_parts(seconds: int, nanos: int) -> datetime:
    try:
        return _EPOCH + timedelta(0, seconds, nanos // 1000)  # positional: 2k instructions less
    except OverflowError:
        raise Malformed(f"timestamp out of range: {seconds}s") from None


# The last lease expiry read: a reserve's jobs share theirs, so each after the first is one
# comparison (and the same datetime, which the lease keeper converts once).
_last_expiry: tuple[int, int, datetime] = (0, -1, _EPOCH)


def expiry_from_parts(seconds: int, nanos: int) -> datetime:
    """`timestamp_from_parts`, for a reserved job's lease expiry."""
    global _last_expiry
    last = _last_expiry
    if last[0] == seconds and last[1] == nanos:
        return last[2]
    when = timestamp_from_parts(seconds, nanos)
    _last_expiry = (seconds, nanos, when)
    return when


def timestamp_parts(when: datetime) -> tuple[int, int]:
    """A datetime as a Timestamp's (seconds, nanos)."""
    delta = when - _EPOCH
    total_us = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    seconds, micros = divmod(total_us, 1_000_000)
    return seconds, micros * 1000


def duration_to_pb(seconds: float, out: duration_pb2.Duration) -> None:
    out.seconds, out.nanos = duration_parts(seconds)


def duration_parts(seconds: float) -> tuple[int, int]:
    """Float seconds as a Duration's (seconds, nanos)."""
    whole = int(seconds)
    nanos = round((seconds - whole) * 1e9)
    if nanos >= 1_000_000_000:
        return whole + 1, nanos - 1_000_000_000
    return whole, nanos


def duration_from_pb(d: duration_pb2.Duration) -> timedelta:
    return duration_from_parts(d.seconds, d.nanos)


def duration_from_parts(seconds: int, nanos: int) -> timedelta:
    try:
        return timedelta(seconds=seconds, microseconds=nanos // 1000)
    except OverflowError:
        raise Malformed(f"duration out of range: {seconds}s") from None


def _custom_to_pb(custom: Mapping[str, CustomValue], out: Mapping[str, pb.PrimitiveValue]) -> None:
    for key, value in custom.items():
        slot = out[key]
        # bool before int: True must never travel as 1.
        if isinstance(value, bool):
            slot.bool_value = value
        elif isinstance(value, int):
            slot.int_value = value
        elif isinstance(value, float):
            slot.double_value = value
        else:
            slot.string_value = value


def _custom_from_pb(custom: Mapping[str, pb.PrimitiveValue]) -> dict[str, CustomValue]:
    out: dict[str, CustomValue] = {}
    for key, value in custom.items():
        which = value.WhichOneof("value")
        if which == "string_value":
            out[key] = value.string_value
        elif which == "int_value":
            out[key] = value.int_value
        elif which == "double_value":
            out[key] = value.double_value
        elif which == "bool_value":
            out[key] = value.bool_value
        else:
            raise Malformed(f"custom entry {key!r} has no value")
    return out


def _payload_from_pb(msg: pb.Job) -> Payload | None:
    if not msg.HasField("payload"):
        return None
    payload = msg.payload
    data = payload.data
    if not data:
        return None
    # The server requires an encoding; tolerate a missing one rather than drop the job.
    return Payload(data, payload.encoding or "application/octet-stream")


def _trace_from_pb(msg: pb.Job) -> TraceContext | None:
    if not msg.HasField("trace_context") or not msg.trace_context.traceparent:
        return None
    tc = msg.trace_context
    return TraceContext(tc.traceparent, tc.tracestate if tc.HasField("tracestate") else None)


# -- requests -------------------------------------------------------------------------------


def enqueue_request_to_pb(req: EnqueueRequest, jobs: Any) -> pb.EnqueueRequest:
    """Append `req` to a repeated EnqueueRequest field; returns the new message."""
    out = jobs.add(queue=req.queue, job_type=req.job_type)
    payload = req.payload
    if payload is not None:
        out_payload = out.payload
        out_payload.data = payload.data
        out_payload.encoding = payload.encoding
    if req.idempotency_key is not None:
        out.idempotency_key = req.idempotency_key
    if req.priority is not None:
        out.priority = req.priority
    if req.max_attempts is not None:
        out.max_attempts = req.max_attempts
    if req.trace_context is not None:
        out.trace_context.traceparent = req.trace_context.traceparent
        if req.trace_context.tracestate is not None:
            out.trace_context.tracestate = req.trace_context.tracestate
    if req.custom:
        _custom_to_pb(req.custom, out.custom)
    if req.scheduled_at is not None:
        timestamp_to_pb(req.scheduled_at, out.scheduled_at)
    return out  # type: ignore[no-any-return]


def enqueue_batch_to_pb(jobs: Iterable[EnqueueRequest], trace: TraceContext | None = None) -> bytes:
    msg = pb.EnqueueBatchRequest()
    repeated = msg.jobs
    for job in jobs:
        out = enqueue_request_to_pb(job, repeated)
        if trace is not None and job.trace_context is None:
            trace_to_pb(trace, out.trace_context)
    return msg.SerializeToString()


def trace_to_pb(trace: TraceContext, out: pb.TraceContext) -> None:
    """A batch's trace context, for a job without its own (an empty tracestate is dropped)."""
    out.traceparent = trace.traceparent
    if trace.tracestate:
        out.tracestate = trace.tracestate


# -- responses ------------------------------------------------------------------------------


def ack_from_pb(msg: pb.EnqueueResponse) -> EnqueueAck:
    if not msg.job_id:
        raise Malformed("enqueue response without a job id")
    return EnqueueAck(msg.job_id, msg.deduplicated)


_REJECTIONS: dict[str, Callable[[Any], rj.JobRejection]] = {
    "unknown_queue": lambda m: rj.UnknownQueue(m.queue),
    "payload_too_large": lambda m: rj.PayloadTooLarge(m.limit, m.actual),
    "encoding_not_allowed": lambda m: rj.EncodingNotAllowed(m.encoding, tuple(m.allowed)),
    "job_type_not_allowed": lambda m: rj.JobTypeNotAllowed(m.job_type, tuple(m.allowed)),
    "custom_entries_too_many": lambda m: rj.CustomEntriesTooMany(m.limit, m.actual),
    "custom_map_too_large": lambda m: rj.CustomMapTooLarge(m.limit, m.actual),
    "custom_key_too_long": lambda m: rj.CustomKeyTooLong(m.key, m.limit, m.actual),
    "queue_name_too_long": lambda m: rj.QueueNameTooLong(m.limit, m.actual),
    "job_type_name_too_long": lambda m: rj.JobTypeNameTooLong(m.limit, m.actual),
    "idempotency_key_too_long": lambda m: rj.IdempotencyKeyTooLong(m.limit, m.actual),
    "scheduled_too_far": lambda m: rj.ScheduledTooFar(
        duration_from_pb(m.horizon), timestamp_from_pb(m.actual) if m.HasField("actual") else None
    ),
    "invalid_request": lambda m: rj.InvalidRequest(m.message),
    "queue_full": lambda m: rj.QueueFull(m.queue, m.limit),
    "queue_closing": lambda m: rj.QueueClosing(m.queue),
}


def rejection_from_pb(msg: pb.JobRejection) -> rj.JobRejection:
    which = msg.WhichOneof("reason")
    if which is None:
        return rj.UnknownRejection()
    build = _REJECTIONS.get(which)
    if build is None:
        return rj.UnknownRejection()
    result: rj.JobRejection = build(getattr(msg, which))
    return result


def batch_results_from_pb(body: bytes, expected: int) -> list[EnqueueAck | rj.JobRejection]:
    msg = pb.EnqueueBatchResponse.FromString(body)
    if len(msg.results) != expected:
        raise Malformed(f"expected {expected} results, got {len(msg.results)}")
    return [job_result_from_pb(result) for result in msg.results]


def single_result_from_pb(body: bytes) -> EnqueueAck | rj.JobRejection:
    """The one result of an EnqueueBatch of one job."""
    results = pb.EnqueueBatchResponse.FromString(body).results
    if len(results) != 1:
        raise Malformed(f"expected 1 results, got {len(results)}")
    return job_result_from_pb(results[0])


def job_result_from_pb(result: pb.JobResult) -> EnqueueAck | rj.JobRejection:
    which = result.WhichOneof("outcome")
    if which == "success":
        return ack_from_pb(result.success)
    if which == "rejection":
        return rejection_from_pb(result.rejection)
    raise Malformed("a job result has neither success nor rejection")


def job_from_pb(msg: pb.Job, worker_id: str | None, client: object = None) -> Job:
    """Build a Job; raises Malformed when a field a worker relies on is missing or invalid."""
    # Each field is read once: every read of a protobuf field builds a Python object.
    job_id = msg.id
    job_type = msg.job_type
    priority = msg.priority
    attempt = msg.attempt
    if not job_id or not job_type:
        raise Malformed("job without id or job_type")
    if priority > 9:
        raise Malformed(f"job {job_id} has priority {priority}")
    if attempt < 1:
        raise Malformed(f"job {job_id} has attempt {attempt}")
    has = msg.HasField
    if not has("enqueued_at") or not has("lease_expires_at"):
        raise Malformed(f"job {job_id} lacks enqueued_at or lease_expires_at")
    custom = msg.custom
    data: bytes | None = None
    encoding = ""
    if has("payload"):
        payload = msg.payload
        data = payload.data
        if data:
            encoding = payload.encoding
    enqueued_at = msg.enqueued_at
    expiry = msg.lease_expires_at
    return reserved_job(
        data,
        encoding,
        job_id,
        msg.queue,
        job_type,
        attempt,
        msg.max_attempts,
        priority,
        _custom_from_pb(custom) if custom else {},
        timestamp_from_parts(enqueued_at.seconds, enqueued_at.nanos),
        timestamp_from_pb(msg.scheduled_at) if has("scheduled_at") else None,
        _trace_from_pb(msg) if has("trace_context") else None,
        expiry_from_parts(expiry.seconds, expiry.nanos),
        worker_id,
        client,
    )


def dead_letter_from_pb(msg: pb.DeadLetterRecord) -> DeadLetterRecord:
    job = msg.job
    if not job.id or not job.job_type:
        raise Malformed("dead-letter record without job id or job_type")
    try:
        cause = DeadLetterCause(msg.cause)
    except ValueError:
        cause = DeadLetterCause.UNSPECIFIED
    return DeadLetterRecord(
        job_id=job.id,
        queue=job.queue,
        job_type=job.job_type,
        payload=_payload_from_pb(job),
        priority=job.priority,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        custom=_custom_from_pb(job.custom),
        trace_context=_trace_from_pb(job),
        enqueued_at=timestamp_from_pb(job.enqueued_at) if job.HasField("enqueued_at") else None,
        scheduled_at=timestamp_from_pb(job.scheduled_at) if job.HasField("scheduled_at") else None,
        cause=cause,
        failed_at=timestamp_from_pb(msg.failed_at) if msg.HasField("failed_at") else None,
        final_attempt=msg.final_attempt,
        last_reason=msg.last_reason if msg.HasField("last_reason") else None,
    )


def server_info_from_pb(msg: pb.GetServerInfoResponse) -> ServerInfo:
    if not msg.server_version:
        raise Malformed("server info without a server_version")
    if not msg.HasField("server_time"):
        raise Malformed("server info without server_time")
    return ServerInfo(
        server_version=msg.server_version,
        supported_protocol_versions=tuple(msg.supported_protocol_versions),
        server_time=timestamp_from_pb(msg.server_time),
        restricts_encodings=msg.restricts_encodings,
        allowed_encodings=tuple(msg.allowed_encodings),
        max_payload_bytes=msg.max_payload_bytes,
        max_custom_entries=msg.max_custom_entries,
        max_custom_total_bytes=msg.max_custom_total_bytes,
        max_custom_key_bytes=msg.max_custom_key_bytes,
        max_queue_name_bytes=msg.max_queue_name_bytes,
        max_job_type_bytes=msg.max_job_type_bytes,
        max_idempotency_key_bytes=msg.max_idempotency_key_bytes,
        max_schedule_horizon=duration_from_pb(msg.max_schedule_horizon),
        max_enqueue_batch=msg.max_enqueue_batch,
        max_reserve_batch=msg.max_reserve_batch,
        max_reserve_queues=msg.max_reserve_queues,
        max_wait_timeout=duration_from_pb(msg.max_wait_timeout),
        max_lease_duration=duration_from_pb(msg.max_lease_duration),
        strict_queues=msg.strict_queues,
        dead_letter_retention_enabled=msg.dead_letter_retention_enabled,
    )
