"""sepp's responses decoded straight from bytes to our types, with no message objects: the
schemas of the messages we read, and one reader per response. What they return, and when they
raise Malformed, is what `convert` makes of protobuf's parse (tests/unit/test_message_codec.py
holds them together); bytes that do not parse raise wire_format.DecodeError.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from datetime import datetime, timedelta
from itertools import repeat
from typing import TYPE_CHECKING, Any

from . import convert as cv
from .convert import Malformed
from .errors import BatchValidationError
from .rejections import BatchRejection
from .types import (
    CustomValue,
    DeadLetterCause,
    DeadLetterRecord,
    EnqueueAck,
    Job,
    Payload,
    ServerInfo,
    TraceContext,
    reserved_job,
)
from .wire_format import (
    BOOL,
    BYTES,
    DOUBLE,
    INT32,
    INT64,
    MESSAGE,
    MESSAGES,
    STRING,
    STRINGS,
    TIME,
    UINT32,
    UINT64,
    UNKNOWN,
    Schema,
    decode,
)

if TYPE_CHECKING:
    from . import rejection_reasons as rj
else:
    from .._util.lazy import lazy_module

    rj = lazy_module("sepp._model.rejection_reasons")

Fields = dict[str, Any]

# -- schemas (field number -> name, kind, sub-schema, oneof) ---------------------------------

PRIMITIVE: Schema = {
    1: ("string_value", STRING, None, "value"),
    2: ("double_value", DOUBLE, None, "value"),
    3: ("int_value", INT64, None, "value"),
    4: ("bool_value", BOOL, None, "value"),
}
CUSTOM_ENTRY: Schema = {1: ("key", STRING, None, None), 2: ("value", MESSAGE, PRIMITIVE, None)}
JOB: Schema = {
    1: ("id", STRING, None, None),
    2: ("job_type", STRING, None, None),
    3: (
        "payload",
        MESSAGE,
        {1: ("data", BYTES, None, None), 2: ("encoding", STRING, None, None)},
        None,
    ),
    4: ("priority", UINT32, None, None),
    5: (
        "trace_context",
        MESSAGE,
        {1: ("traceparent", STRING, None, None), 2: ("tracestate", STRING, None, None)},
        None,
    ),
    6: ("enqueued_at", MESSAGE, TIME, None),
    7: ("attempt", UINT32, None, None),
    8: ("max_attempts", UINT32, None, None),
    9: ("lease_expires_at", MESSAGE, TIME, None),
    10: ("custom", MESSAGES, CUSTOM_ENTRY, None),
    11: ("scheduled_at", MESSAGE, TIME, None),
    12: ("queue", STRING, None, None),
}


def _limits(first: str, limit: int, actual: int) -> Schema:
    return {1: (first, limit, None, None), 2: ("actual", actual, None, None)}


_ONE_QUEUE: Schema = {1: ("queue", STRING, None, None)}
_ALLOWED = 2, ("allowed", STRINGS, None, None)
# The oneof members of JobRejection, in field order, with how each becomes our type.
_REASONS: tuple[tuple[str, Schema, Callable[[Fields], rj.JobRejection]], ...] = (
    ("unknown_queue", _ONE_QUEUE, lambda m: rj.UnknownQueue(m.get("queue", ""))),
    (
        "payload_too_large",
        _limits("limit", UINT64, UINT64),
        lambda m: rj.PayloadTooLarge(m.get("limit", 0), m.get("actual", 0)),
    ),
    (
        "encoding_not_allowed",
        {1: ("encoding", STRING, None, None), _ALLOWED[0]: _ALLOWED[1]},
        lambda m: rj.EncodingNotAllowed(m.get("encoding", ""), tuple(m.get("allowed", ()))),
    ),
    (
        "job_type_not_allowed",
        {1: ("job_type", STRING, None, None), _ALLOWED[0]: _ALLOWED[1]},
        lambda m: rj.JobTypeNotAllowed(m.get("job_type", ""), tuple(m.get("allowed", ()))),
    ),
    (
        "custom_entries_too_many",
        _limits("limit", UINT32, UINT32),
        lambda m: rj.CustomEntriesTooMany(m.get("limit", 0), m.get("actual", 0)),
    ),
    (
        "custom_map_too_large",
        _limits("limit", UINT64, UINT64),
        lambda m: rj.CustomMapTooLarge(m.get("limit", 0), m.get("actual", 0)),
    ),
    (
        "custom_key_too_long",
        {
            1: ("key", STRING, None, None),
            2: ("limit", UINT32, None, None),
            3: ("actual", UINT64, None, None),
        },
        lambda m: rj.CustomKeyTooLong(m.get("key", ""), m.get("limit", 0), m.get("actual", 0)),
    ),
    (
        "queue_name_too_long",
        _limits("limit", UINT32, UINT64),
        lambda m: rj.QueueNameTooLong(m.get("limit", 0), m.get("actual", 0)),
    ),
    (
        "job_type_name_too_long",
        _limits("limit", UINT32, UINT64),
        lambda m: rj.JobTypeNameTooLong(m.get("limit", 0), m.get("actual", 0)),
    ),
    (
        "idempotency_key_too_long",
        _limits("limit", UINT32, UINT64),
        lambda m: rj.IdempotencyKeyTooLong(m.get("limit", 0), m.get("actual", 0)),
    ),
    (
        "scheduled_too_far",
        {1: ("horizon", MESSAGE, TIME, None), 2: ("actual", MESSAGE, TIME, None)},
        lambda m: rj.ScheduledTooFar(
            _duration(m.get("horizon")), _timestamp(m["actual"]) if "actual" in m else None
        ),
    ),
    (
        "invalid_request",
        {1: ("message", STRING, None, None)},
        lambda m: rj.InvalidRequest(m.get("message", "")),
    ),
    (
        "queue_full",
        {1: ("queue", STRING, None, None), 2: ("limit", UINT64, None, None)},
        lambda m: rj.QueueFull(m.get("queue", ""), m.get("limit", 0)),
    ),
    ("queue_closing", _ONE_QUEUE, lambda m: rj.QueueClosing(m.get("queue", ""))),
)
REJECTION: Schema = {
    number: (name, MESSAGE, schema, "reason")
    for number, (name, schema, _) in enumerate(_REASONS, start=1)
}
_BUILD_REASON = {name: build for name, _, build in _REASONS}

ENQUEUE_RESPONSE: Schema = {
    1: ("job_id", STRING, None, None),
    2: ("deduplicated", BOOL, None, None),
}
JOB_RESULT: Schema = {
    1: ("success", MESSAGE, ENQUEUE_RESPONSE, "outcome"),
    2: ("rejection", MESSAGE, REJECTION, "outcome"),
}
ENQUEUE_BATCH_RESPONSE: Schema = {1: ("results", MESSAGES, JOB_RESULT, None)}
ENQUEUE_ATOMIC_RESPONSE: Schema = {
    1: ("success", MESSAGE, {1: ("responses", MESSAGES, ENQUEUE_RESPONSE, None)}, "outcome"),
    2: (
        "rejection",
        MESSAGE,
        {
            1: (
                "errors",
                MESSAGES,
                {1: ("index", UINT32, None, None), 2: ("rejection", MESSAGE, REJECTION, None)},
                None,
            )
        },
        "outcome",
    ),
}
RESERVE_RESPONSE: Schema = {1: ("jobs", MESSAGES, JOB, None)}
ACK_RESPONSE: Schema = {1: ("job_id", STRING, None, None)}
NACK_RESPONSE: Schema = {
    1: ("job_id", STRING, None, None),
    2: ("dead_lettered", BOOL, None, None),
}
EXTEND_RESPONSE: Schema = {
    1: ("job_id", STRING, None, None),
    2: ("lease_expires_at", MESSAGE, TIME, None),
}
DEAD_LETTER_RECORD: Schema = {
    1: ("job", MESSAGE, JOB, None),
    2: ("cause", INT32, None, None),
    3: ("failed_at", MESSAGE, TIME, None),
    4: ("final_attempt", UINT32, None, None),
    5: ("last_reason", STRING, None, None),
}
DRAIN_RESPONSE: Schema = {1: ("records", MESSAGES, DEAD_LETTER_RECORD, None)}
_COUNTS = {
    7: "max_custom_entries",
    9: "max_custom_key_bytes",
    10: "max_queue_name_bytes",
    11: "max_job_type_bytes",
    12: "max_idempotency_key_bytes",
    14: "max_enqueue_batch",
    15: "max_reserve_batch",
    16: "max_reserve_queues",
}
SERVER_INFO: Schema = {
    1: ("server_version", STRING, None, None),
    2: ("supported_protocol_versions", STRINGS, None, None),
    3: ("server_time", MESSAGE, TIME, None),
    4: ("restricts_encodings", BOOL, None, None),
    5: ("allowed_encodings", STRINGS, None, None),
    6: ("max_payload_bytes", UINT64, None, None),
    8: ("max_custom_total_bytes", UINT64, None, None),
    13: ("max_schedule_horizon", MESSAGE, TIME, None),
    17: ("max_wait_timeout", MESSAGE, TIME, None),
    18: ("max_lease_duration", MESSAGE, TIME, None),
    19: ("strict_queues", BOOL, None, None),
    20: ("dead_letter_retention_enabled", BOOL, None, None),
    **{number: (name, UINT32, None, None) for number, name in _COUNTS.items()},
}

# -- scalars --------------------------------------------------------------------------------


def _timestamp(fields: Fields) -> datetime:
    return cv.timestamp_from_parts(fields.get("seconds", 0), fields.get("nanos", 0))


def _duration(fields: Fields | None) -> timedelta:
    if fields is None:
        return timedelta(0)
    return cv.duration_from_parts(fields.get("seconds", 0), fields.get("nanos", 0))


_PRIMITIVES = ("string_value", "int_value", "double_value", "bool_value")


def _custom(entries: list[Fields]) -> dict[str, CustomValue]:
    custom: dict[str, Fields] = {}
    for entry in entries:  # a repeated key: the last entry wins, as in protobuf's maps
        if UNKNOWN not in entry:  # upb drops an entry with unknown fields
            custom[entry.get("key", "")] = entry.get("value", {})
    out: dict[str, CustomValue] = {}
    for key, value in custom.items():
        for name in _PRIMITIVES:
            if name in value:
                out[key] = value[name]
                break
        else:
            raise Malformed(f"custom entry {key!r} has no value")
    return out


def _payload(job: Fields) -> Payload | None:
    payload = job.get("payload")
    if payload is None:
        return None
    data = payload.get("data")
    if not data:
        return None
    return Payload(data, payload.get("encoding") or "application/octet-stream")


def _trace(job: Fields) -> TraceContext | None:
    trace = job.get("trace_context")
    if trace is None or not trace.get("traceparent"):
        return None
    return TraceContext(trace["traceparent"], trace.get("tracestate"))


# -- producing ------------------------------------------------------------------------------


def _ack(response: Fields) -> EnqueueAck:
    job_id = response.get("job_id")
    if not job_id:
        raise Malformed("enqueue response without a job id")
    return EnqueueAck(job_id, response.get("deduplicated", False))


def rejection(fields: Fields) -> rj.JobRejection:
    for name, value in fields.items():  # the oneof keeps at most one member
        if name != UNKNOWN:
            return _BUILD_REASON[name](value)
    return rj.UnknownRejection()


def _job_result(result: Fields) -> EnqueueAck | rj.JobRejection:
    success = result.get("success")
    if success is not None:
        return _ack(success)
    failure = result.get("rejection")
    if failure is not None:
        return rejection(failure)
    raise Malformed("a job result has neither success nor rejection")


def batch_results(body: bytes, expected: int) -> list[EnqueueAck | rj.JobRejection]:
    acks = _uniform_acks(body)
    if acks is None:
        acks = _acks_in_place(body)
    if acks is not None:
        if len(acks) != expected:
            raise Malformed(f"expected {expected} results, got {len(acks)}")
        return acks
    results = decode(body, ENQUEUE_BATCH_RESPONSE).get("results", ())
    if len(results) != expected:
        raise Malformed(f"expected {expected} results, got {len(results)}")
    return [_job_result(result) for result in results]


def _uniform_acks(body: bytes) -> list[EnqueueAck | rj.JobRejection] | None:
    """The commonest answer of all, read with no Python loop: every job accepted, none
    deduplicated, the ids ASCII and of one length (the server's are), so the body is one 6-byte
    frame and an id, repeated. Splitting the text at the first frame gives back exactly that
    shape or something else, which the lengths then tell apart. None for anything else."""
    end = len(body)
    if end < 6 or body[0] != 0x0A or body[2] != 0x0A or body[4] != 0x0A:
        return None
    size = body[1]  # 0a size | 0a size-2 | 0a size-4 job_id
    if size >= 0x80 or body[3] != size - 2 or body[5] != size - 4 or size == 4:
        return None
    count, extra = divmod(end, size + 2)
    if extra or not body.isascii():
        return None
    text = body.decode("ascii")
    ids = text.split(text[:6])
    # "" before the first frame, then `count` ids, all of one length: the lengths add up only
    # if that length is size - 4, so the body is the frame and an id `count` times over.
    if len(ids) != count + 1 or ids[0] or len(set(map(len, ids))) != 2:
        return None
    del ids[0]
    acks: list[EnqueueAck | rj.JobRejection] = list(map(_new_ack, repeat(EnqueueAck, count)))
    deque(map(_set_job_id, acks, ids), 0)  # the slots' setters, looped over in C
    deque(map(_set_deduplicated, acks, repeat(False, count)), 0)
    return acks


def _acks_in_place(body: bytes) -> list[EnqueueAck | rj.JobRejection] | None:
    """The common answer, every job accepted, read in place (the schema reader costs about
    three times as much per job): results laid out as protobuf writes them, each a success
    with a short ASCII job id and perhaps its deduplicated flag. None at the first byte that
    is anything else; the caller then reads the whole body through the schema."""
    out: list[EnqueueAck | rj.JobRejection] = []
    append = out.append
    new, set_job_id, set_deduplicated = _new_ack, _set_job_id, _set_deduplicated
    pos = 0
    end = len(body)
    while pos < end:
        # 0a L | 0a L-2 | 0a N job_id (10 00|01)?: one result, one success, one job id.
        if pos + 6 > end or body[pos] != 0x0A or body[pos + 2] != 0x0A or body[pos + 4] != 0x0A:
            return None
        size = body[pos + 1]
        if size >= 0x80 or body[pos + 3] != size - 2:
            return None
        stop = pos + 2 + size
        id_end = pos + 6 + body[pos + 5]
        if stop > end or id_end == pos + 6:
            return None
        if id_end == stop:
            deduplicated = False
        elif id_end + 2 == stop and body[id_end] == 0x10 and body[id_end + 1] < 2:
            deduplicated = body[id_end + 1] == 1
        else:
            return None
        job_id = body[pos + 6 : id_end]
        if not job_id.isascii():
            return None
        ack = new(EnqueueAck)  # EnqueueAck(...) sets its frozen fields at twice the cost
        set_job_id(ack, job_id.decode("ascii"))
        set_deduplicated(ack, deduplicated)
        append(ack)
        pos = stop
    return out


_new_ack = object.__new__
_set_job_id = vars(EnqueueAck)["job_id"].__set__  # the slots' own setters
_set_deduplicated = vars(EnqueueAck)["deduplicated"].__set__


def single_result(body: bytes) -> EnqueueAck | rj.JobRejection:
    # The common answer, one success with a short ASCII job id and protobuf's own layout,
    # read in place; anything else (or anything unexpected) through the schema.
    size = len(body)
    if 6 <= size < 130 and body[0] == 0x0A and body[1] == size - 2 and body[2] == 0x0A:
        if body[3] == size - 4 and body[4] == 0x0A:
            end = 6 + body[5]
            dedup = body[end:]
            if 6 < end < 128 and (end == size or dedup in _DEDUP_FLAGS):
                job_id = body[6:end]
                if job_id.isascii():
                    return EnqueueAck(job_id.decode("ascii"), dedup == b"\x10\x01")
    return batch_results(body, 1)[0]


_DEDUP_FLAGS = (b"\x10\x00", b"\x10\x01")


def atomic_acks(body: bytes, expected: int) -> list[EnqueueAck]:
    """Every job's ack, or BatchValidationError naming the jobs the server refused."""
    msg = decode(body, ENQUEUE_ATOMIC_RESPONSE)
    if "rejection" in msg:
        errors = msg["rejection"].get("errors", ())
        raise BatchValidationError(
            [BatchRejection(e.get("index", 0), rejection(e.get("rejection", {}))) for e in errors]
        )
    if "success" not in msg:
        raise Malformed("response has no outcome")
    responses = msg["success"].get("responses", ())
    if len(responses) != expected:
        raise Malformed(f"expected {expected} results, got {len(responses)}")
    return [_ack(r) for r in responses]


# -- consuming ------------------------------------------------------------------------------


def reserved_jobs(body: bytes) -> list[Fields]:
    """Every job of a Reserve response, parsed (a bad one fails the whole response, as in
    protobuf); each becomes a Job with `job`, which may refuse it alone."""
    jobs: list[Fields] = decode(body, RESERVE_RESPONSE).get("jobs", [])
    return jobs


def job(fields: Fields, worker_id: str | None, client: object = None) -> Job:
    job_id = fields.get("id")
    job_type = fields.get("job_type")
    priority = fields.get("priority", 0)
    attempt = fields.get("attempt", 0)
    if not job_id or not job_type:
        raise Malformed("job without id or job_type")
    if priority > 9:
        raise Malformed(f"job {job_id} has priority {priority}")
    if attempt < 1:
        raise Malformed(f"job {job_id} has attempt {attempt}")
    enqueued_at = fields.get("enqueued_at")
    lease_expires_at = fields.get("lease_expires_at")
    if enqueued_at is None or lease_expires_at is None:
        raise Malformed(f"job {job_id} lacks enqueued_at or lease_expires_at")
    custom = fields.get("custom")
    scheduled_at = fields.get("scheduled_at")
    payload = fields.get("payload")
    data = encoding = None
    if payload is not None:
        data = payload.get("data")
        encoding = payload.get("encoding")
    return reserved_job(
        data,
        encoding or "",
        job_id,
        fields.get("queue", ""),
        job_type,
        attempt,
        fields.get("max_attempts", 0),
        priority,
        _custom(custom) if custom else {},
        _timestamp(enqueued_at),
        _timestamp(scheduled_at) if scheduled_at is not None else None,
        _trace(fields),
        cv.expiry_from_parts(lease_expires_at.get("seconds", 0), lease_expires_at.get("nanos", 0)),
        worker_id,
        client,
    )


def ack_response(body: bytes) -> None:
    decode(body, ACK_RESPONSE)


def nack_dead_lettered(body: bytes) -> bool:
    dead: bool = decode(body, NACK_RESPONSE).get("dead_lettered", False)
    return dead


def extended_until(body: bytes) -> datetime:
    expires = decode(body, EXTEND_RESPONSE).get("lease_expires_at")
    if expires is None:
        raise Malformed("response has no lease_expires_at")
    return _timestamp(expires)


# -- operations -----------------------------------------------------------------------------


def dead_letter_records(body: bytes) -> list[Fields]:
    records: list[Fields] = decode(body, DRAIN_RESPONSE).get("records", [])
    return records


def dead_letter(record: Fields) -> DeadLetterRecord:
    job = record.get("job", {})
    if not job.get("id") or not job.get("job_type"):
        raise Malformed("dead-letter record without job id or job_type")
    try:
        cause = DeadLetterCause(record.get("cause", 0))
    except ValueError:
        cause = DeadLetterCause.UNSPECIFIED
    enqueued_at = job.get("enqueued_at")
    scheduled_at = job.get("scheduled_at")
    failed_at = record.get("failed_at")
    return DeadLetterRecord(
        job_id=job["id"],
        queue=job.get("queue", ""),
        job_type=job["job_type"],
        payload=_payload(job),
        priority=job.get("priority", 0),
        attempt=job.get("attempt", 0),
        max_attempts=job.get("max_attempts", 0),
        custom=_custom(job.get("custom", [])),
        trace_context=_trace(job),
        enqueued_at=_timestamp(enqueued_at) if enqueued_at is not None else None,
        scheduled_at=_timestamp(scheduled_at) if scheduled_at is not None else None,
        cause=cause,
        failed_at=_timestamp(failed_at) if failed_at is not None else None,
        final_attempt=record.get("final_attempt", 0),
        last_reason=record.get("last_reason"),
    )


def server_info(body: bytes) -> ServerInfo:
    msg = decode(body, SERVER_INFO)
    if not msg.get("server_version"):
        raise Malformed("server info without a server_version")
    if "server_time" not in msg:
        raise Malformed("server info without server_time")
    counts = {name: msg.get(name, 0) for name in _COUNTS.values()}
    return ServerInfo(
        server_version=msg["server_version"],
        supported_protocol_versions=tuple(msg.get("supported_protocol_versions", ())),
        server_time=_timestamp(msg["server_time"]),
        restricts_encodings=msg.get("restricts_encodings", False),
        allowed_encodings=tuple(msg.get("allowed_encodings", ())),
        max_payload_bytes=msg.get("max_payload_bytes", 0),
        max_custom_total_bytes=msg.get("max_custom_total_bytes", 0),
        max_schedule_horizon=_duration(msg.get("max_schedule_horizon")),
        max_wait_timeout=_duration(msg.get("max_wait_timeout")),
        max_lease_duration=_duration(msg.get("max_lease_duration")),
        strict_queues=msg.get("strict_queues", False),
        dead_letter_retention_enabled=msg.get("dead_letter_retention_enabled", False),
        **counts,
    )
