"""What sepp 0.1.1 checks in a request before it touches any state, with its exact messages:
the structural checks (an INVALID_ARGUMENT status, or a job's InvalidRequest rejection) and a
job's limits (the typed rejections), in the server's order. Pure functions of the request and
the limits; the first problem found is the one reported, as there.

Two of the server's messages quote queue names the way its language's debug formatting
does (`rust_debug`)."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from typing import Any

from .config import QueueLimits, queue_name_problem

_HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")
_UUID_HYPHENS = (8, 13, 18, 23)


# -- structural checks ------------------------------------------------------------------------


def _queue_name(field: str, name: str) -> str | None:
    problem = queue_name_problem(name)
    return None if problem is None else f"{field} {problem}"


def _not_empty(field: str, text: str) -> str | None:
    return f"{field} must not be empty" if not text else None


def _total_nanos(duration: Any) -> int:
    return int(duration.seconds) * 1_000_000_000 + int(duration.nanos)


def _not_negative(field: str, duration: Any) -> str | None:
    return f"{field} must not be negative" if _total_nanos(duration) < 0 else None


def _positive(field: str, duration: Any) -> str | None:
    return f"{field} must be greater than 0" if _total_nanos(duration) <= 0 else None


def is_uuid(text: str) -> bool:
    """The canonical hyphenated form, either case (as the server checks job ids)."""
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) != 36:
        return False
    return all(
        (byte == 0x2D) if index in _UUID_HYPHENS else (byte in _HEX_DIGITS)
        for index, byte in enumerate(raw)
    )


def _first(*problems: str | None) -> str | None:
    for problem in problems:
        if problem is not None:
            return problem
    return None


def enqueue_problem(job: Any) -> str | None:
    """An EnqueueRequest's structural problem (reported as an InvalidRequest rejection)."""
    problem = _first(_queue_name("queue", job.queue), _not_empty("job_type", job.job_type))
    if problem is not None:
        return problem
    if job.HasField("payload"):
        if not job.payload.data:
            return "payload.data must not be empty"
        if not job.payload.encoding:
            return "payload.encoding must not be empty"
    if job.HasField("idempotency_key") and not job.idempotency_key:
        return "idempotency_key must not be empty"
    if job.HasField("priority") and job.priority > 9:
        return "priority must be <= 9"
    if job.HasField("max_attempts") and job.max_attempts < 1:
        return "max_attempts must be >= 1"
    if job.HasField("trace_context") and not job.trace_context.traceparent:
        return "trace_context.traceparent must not be empty"
    for key in sorted(job.custom):  # the server's map is ordered by key
        if not key:
            return "custom key must not be empty"
        if job.custom[key].WhichOneof("value") is None:
            return f"custom[{key}] must set a value"
    return None


def reserve_problem(request: Any) -> str | None:
    if not request.queues:
        return "queues must contain at least 1 item"
    for queue in request.queues:
        problem = _queue_name("queues item", queue)
        if problem is not None:
            return problem
    if request.HasField("wait_timeout"):
        problem = _not_negative("wait_timeout", request.wait_timeout)
        if problem is not None:
            return problem
    if not request.HasField("lease_duration"):
        return "lease_duration is required"
    return _first(
        _positive("lease_duration", request.lease_duration),
        _worker_id(request),
        "max_jobs must be >= 1" if request.HasField("max_jobs") and request.max_jobs < 1 else None,
    )


def _worker_id(request: Any) -> str | None:
    if request.HasField("worker_id") and not request.worker_id:
        return "worker_id must not be empty"
    return None


def _lease_call(request: Any) -> str | None:
    if not is_uuid(request.job_id):
        return "job_id must be a UUID"
    if request.attempt < 1:
        return "attempt must be >= 1"
    return None


def ack_problem(request: Any) -> str | None:
    return _first(_lease_call(request), _worker_id(request))


def nack_problem(request: Any) -> str | None:
    problem = _lease_call(request)
    if problem is not None:
        return problem
    if request.HasField("retry"):
        strategy = request.retry.WhichOneof("strategy")
        if strategy is None:
            return "retry strategy is required"
        if strategy == "delay":
            problem = _not_negative("retry delay", request.retry.delay)
            if problem is not None:
                return problem
    return _worker_id(request)


def extend_problem(request: Any) -> str | None:
    problem = _lease_call(request)
    if problem is not None:
        return problem
    if not request.HasField("lease_duration"):
        return "lease_duration is required"
    return _first(_positive("lease_duration", request.lease_duration), _worker_id(request))


def drain_problem(request: Any) -> str | None:
    if request.HasField("queue") and not request.queue:
        return "queue must not be empty"
    if request.HasField("max") and request.max < 1:
        return "max must be >= 1"
    return None


# -- a job's limits ---------------------------------------------------------------------------

# A rejection before it is a message: the JobRejection field that names its reason, and that
# message's fields.
Rejection = tuple[str, dict[str, Any]]


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _value_bytes(value: Any) -> int:
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return _utf8_len(value.string_value)
    if kind == "bool_value":
        return 1
    return 8 if kind is not None else 0


def limit_rejection(
    job: Any,
    limits: QueueLimits,
    *,
    max_queue_name_bytes: int,
    max_job_type_bytes: int,
    max_idempotency_key_bytes: int,
    now_ms: int,
) -> Rejection | None:
    """The first limit `job` breaks (a structurally valid job), in the server's order."""
    size = _utf8_len(job.queue)
    if size > max_queue_name_bytes:
        return "queue_name_too_long", {"limit": max_queue_name_bytes, "actual": size}
    size = _utf8_len(job.job_type)
    if size > max_job_type_bytes:
        return "job_type_name_too_long", {"limit": max_job_type_bytes, "actual": size}
    allowed = limits.allowed_job_types
    if allowed is not None and job.job_type not in allowed:
        return "job_type_not_allowed", {"job_type": job.job_type, "allowed": list(allowed)}
    if job.HasField("idempotency_key"):
        size = _utf8_len(job.idempotency_key)
        if size > max_idempotency_key_bytes:
            return "idempotency_key_too_long", {"limit": max_idempotency_key_bytes, "actual": size}
    if job.HasField("payload"):
        size = len(job.payload.data)
        if size > limits.max_payload_bytes:
            return "payload_too_large", {"limit": limits.max_payload_bytes, "actual": size}
        encodings = limits.allowed_encodings
        if encodings is not None and job.payload.encoding not in encodings:
            return "encoding_not_allowed", {
                "encoding": job.payload.encoding,
                "allowed": list(encodings),
            }
    custom = job.custom
    if len(custom) > limits.max_custom_entries:
        return "custom_entries_too_many", {
            "limit": limits.max_custom_entries,
            "actual": len(custom),
        }
    total = 0
    for key in sorted(custom):
        size = _utf8_len(key)
        if size > limits.max_custom_key_bytes:
            return "custom_key_too_long", {
                "key": key,
                "limit": limits.max_custom_key_bytes,
                "actual": size,
            }
        total += size + _value_bytes(custom[key])
    if total > limits.max_custom_total_bytes:
        return "custom_map_too_large", {"limit": limits.max_custom_total_bytes, "actual": total}
    if job.HasField("scheduled_at"):
        at_ms = timestamp_ms(job.scheduled_at)
        if at_ms > now_ms + limits.max_schedule_horizon_ms:
            return "scheduled_too_far", {
                "horizon_ms": limits.max_schedule_horizon_ms,
                "actual": job.scheduled_at,
            }
    return None


# -- time on the wire ---------------------------------------------------------------------------

_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def timestamp_ms(timestamp: Any) -> int:
    """A Timestamp as whole milliseconds since the epoch, the way the server reads one:
    normalized (nanos folded into seconds, then made non-negative), floored to the
    millisecond, saturating at the 64-bit range."""
    seconds, nanos = _normalized(int(timestamp.seconds), int(timestamp.nanos))
    if nanos < 0:
        seconds, nanos = seconds - 1, nanos + 1_000_000_000
    return max(_I64_MIN, min(_I64_MAX, seconds * 1000 + nanos // 1_000_000))


def duration_ms(duration: Any) -> int:
    """A Duration as whole milliseconds, negative parts counting as zero (the server's way)."""
    seconds, nanos = _normalized(int(duration.seconds), int(duration.nanos))
    if seconds < 0 < nanos:
        seconds, nanos = seconds + 1, nanos - 1_000_000_000
    elif nanos < 0 < seconds:
        seconds, nanos = seconds - 1, nanos + 1_000_000_000
    return max(seconds, 0) * 1000 + max(nanos, 0) // 1_000_000


def _normalized(seconds: int, nanos: int) -> tuple[int, int]:
    if nanos <= -1_000_000_000 or nanos >= 1_000_000_000:
        seconds += int(nanos / 1_000_000_000)
        nanos = nanos - int(nanos / 1_000_000_000) * 1_000_000_000
    return seconds, nanos


# -- the server's debug quoting -------------------------------------------------------------

_ESCAPES = {"\t": "\\t", "\r": "\\r", "\n": "\\n", "\\": "\\\\", '"': '\\"', "\0": "\\0"}
# Grapheme_Extend beyond the combining marks (Mn, Me): Other_Grapheme_Extend, and the emoji
# skin-tone modifiers; Python's unicodedata has no such property.
_OTHER_GRAPHEME_EXTEND = frozenset(
    [
        0x09BE, 0x09D7, 0x0B3E, 0x0B57, 0x0BBE, 0x0BD7, 0x0CC2, 0x0CD5, 0x0CD6, 0x0D3E, 0x0D57,
        0x0DCF, 0x0DDF, 0x1B35, 0x200C, 0x302E, 0x302F, 0xFF9E, 0xFF9F, 0x1133E, 0x11357,
        0x114B0, 0x114BD, 0x115AF, 0x11930, 0x1D165, *range(0x1D16E, 0x1D173),
        *range(0x1F3FB, 0x1F400), *range(0xE0020, 0xE0080),
    ]
)  # fmt: skip


def _escaped(char: str) -> str:
    escape = _ESCAPES.get(char)
    if escape is not None:
        return escape
    if char.isprintable() and not (
        unicodedata.category(char) in ("Mn", "Me") or ord(char) in _OTHER_GRAPHEME_EXTEND
    ):
        return char
    return f"\\u{{{ord(char):x}}}"


def rust_debug(text: str) -> str:
    """`text` quoted as the server's error messages quote a name: in double quotes, with
    backslash escapes, and unprintable or combining characters as `\\u{hex}`."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    return '"' + "".join(_escaped(char) for char in text) + '"'


def rust_debug_list(texts: Iterable[str]) -> str:
    return "[" + ", ".join(rust_debug(text) for text in texts) + "]"
