"""The few protobuf encodings the memory server writes by hand, because they are on every
reserve: a job's fields that never change, once, at enqueue; its attempt and lease at each
delivery. The rest of its messages are the generated classes' (`sepp._pb`)."""

from __future__ import annotations

from typing import Any

from ..._model.wire_format import LEN, VARINT, key, varint

_ID = key(1, LEN)
_JOB_TYPE = key(2, LEN)
_PAYLOAD = key(3, LEN)
_PRIORITY = key(4, VARINT)
_TRACE_CONTEXT = key(5, LEN)
_ENQUEUED_AT = key(6, LEN)
_ATTEMPT = key(7, VARINT)
_MAX_ATTEMPTS = key(8, VARINT)
_LEASE_EXPIRES_AT = key(9, LEN)
_CUSTOM = key(10, LEN)
_SCHEDULED_AT = key(11, LEN)
_QUEUE = key(12, LEN)
_ENTRY_KEY = key(1, LEN)
_ENTRY_VALUE = key(2, LEN)
_SECONDS = key(1, VARINT)
_NANOS = key(2, VARINT)
_REPEATED_JOB = key(1, LEN)  # ReserveResponse.jobs
EPOCH = _LEASE_EXPIRES_AT + b"\x00"  # a Timestamp of 0: present, with no fields


def _text(tag: bytes, text: str) -> bytes:
    raw = text.encode("utf-8")
    return tag + varint(len(raw)) + raw


def _nested(tag: bytes, body: bytes) -> bytes:
    return tag + varint(len(body)) + body


def timestamp_body(ms: int) -> bytes:
    """A Timestamp of `ms` milliseconds since the epoch (floored seconds, whole-ms nanos)."""
    seconds, rest = divmod(ms, 1000)
    out = b"" if seconds == 0 else _SECONDS + varint(seconds)
    return out if rest == 0 else out + _NANOS + varint(rest * 1_000_000)


def static_job_fields(
    *,
    job_id: str,
    queue: str,
    request: Any,
    priority: int,
    max_attempts: int,
    enqueued_at_ms: int,
) -> bytes:
    """A Job's fields as the server stores them at enqueue, all but attempt and lease expiry."""
    parts = [_text(_ID, job_id), _text(_JOB_TYPE, request.job_type)]
    if request.HasField("payload"):
        parts.append(_nested(_PAYLOAD, request.payload.SerializeToString()))
    if priority:
        parts.append(_PRIORITY + varint(priority))
    if request.HasField("trace_context"):
        parts.append(_nested(_TRACE_CONTEXT, request.trace_context.SerializeToString()))
    parts.append(_nested(_ENQUEUED_AT, timestamp_body(enqueued_at_ms)))
    parts.append(_MAX_ATTEMPTS + varint(max_attempts))
    custom = request.custom
    for name in sorted(custom):  # the server keeps the map ordered by key
        entry = _text(_ENTRY_KEY, name) + _nested(_ENTRY_VALUE, custom[name].SerializeToString())
        parts.append(_nested(_CUSTOM, entry))
    if request.HasField("scheduled_at"):
        parts.append(_nested(_SCHEDULED_AT, request.scheduled_at.SerializeToString()))
    parts.append(_text(_QUEUE, queue))
    return b"".join(parts)


def job_message(static: bytes, attempt: int, lease_expires_at_ms: int | None) -> bytes:
    """The Job message: its stored fields, its attempt, and its lease expiry (None: the
    epoch, as in a dead letter's snapshot)."""
    tail = _ATTEMPT + varint(attempt)
    if lease_expires_at_ms is None:
        return static + tail + EPOCH
    return static + tail + _nested(_LEASE_EXPIRES_AT, timestamp_body(lease_expires_at_ms))


def repeated_jobs(jobs: list[bytes]) -> bytes:
    """A ReserveResponse of `jobs` (Job messages)."""
    return b"".join(_REPEATED_JOB + varint(len(job)) + job for job in jobs)
