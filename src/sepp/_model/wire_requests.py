"""sepp's requests encoded straight from our types to bytes, with no message objects: the
bytes protobuf's SerializeToString gives for the same message (fields in number order, proto3
defaults left out, optional fields written whenever set), checked against it in
tests/unit/test_message_codec.py. Values were validated by our types: this only encodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TypeVar

from .convert import duration_parts, timestamp_parts
from .types import CustomValue, EnqueueRequest, Retry, TraceContext
from .wire_format import double, utf8, varint

_INT64_MASK = (1 << 64) - 1


def _text(tag: bytes, field: str, text: str) -> bytes:
    if text.isascii():
        data = text.encode("ascii")
    else:
        data = utf8(field, text)
    return tag + varint(len(data)) + data


_CACHED = 256
K = TypeVar("K")


class _Fields(dict[K, bytes]):
    """Encoded fields by what they encode, `encode(key)` on a miss: producers repeat their
    (queue, job_type) pairs and payload encodings, a worker its id, and encoding one costs
    more than the look-up. Bounded: cleared when full."""

    __slots__ = ("_encode",)

    def __init__(self, encode: Callable[[K], bytes]) -> None:
        super().__init__()
        self._encode = encode

    def __missing__(self, key: K) -> bytes:
        if len(self) >= _CACHED:
            self.clear()
        field = self[key] = self._encode(key)
        return field


_HEADS: _Fields[tuple[str, str]] = _Fields(
    lambda key: _text(b"\x0a", "queue", key[0]) + _text(b"\x12", "job_type", key[1])
)
_ENCODINGS: _Fields[str] = _Fields(lambda name: _text(b"\x12", "encoding", name) if name else b"")
# A worker sends its id with every ack, nack and extend: (tag, worker_id).
_WORKER_IDS: _Fields[tuple[bytes, str]] = _Fields(lambda key: _text(key[0], "worker_id", key[1]))


def _nested(tag: bytes, body: bytes) -> bytes:
    return tag + varint(len(body)) + body


def _time(tag: bytes, seconds: int, nanos: int) -> bytes:
    body = b""
    if seconds:
        body = b"\x08" + varint(seconds & _INT64_MASK)
    if nanos:
        body += b"\x10" + varint(nanos)
    return tag + varint(len(body)) + body


def _duration(tag: bytes, seconds: float) -> bytes:
    return _time(tag, *duration_parts(seconds))


def _timestamp(tag: bytes, when: datetime) -> bytes:
    return _time(tag, *timestamp_parts(when))


def _trace(trace: TraceContext, *, empty_state: bool) -> bytes:
    """A TraceContext field (7); `empty_state`: an empty tracestate is written, not dropped."""
    body = _text(b"\x0a", "traceparent", trace.traceparent) if trace.traceparent else b""
    state = trace.tracestate
    if state is not None and (state or empty_state):
        body += _text(b"\x12", "tracestate", state)
    return _nested(b"\x3a", body)


def _primitive(value: CustomValue) -> bytes:
    # bool before int: True must never travel as 1.
    if isinstance(value, bool):
        return b"\x20\x01" if value else b"\x20\x00"
    if isinstance(value, int):
        return b"\x18" + varint(value & _INT64_MASK)
    if isinstance(value, float):
        return b"\x11" + double(value)
    return _text(b"\x0a", "custom value", value)


def _custom(custom: Mapping[str, CustomValue]) -> bytes:
    out = []
    for name, value in custom.items():
        entry = _text(b"\x0a", "custom key", name) + _nested(b"\x12", _primitive(value))
        out.append(_nested(b"\x42", entry))
    return b"".join(out)


def enqueue_request(req: EnqueueRequest, trace: TraceContext | None = None) -> list[bytes]:
    """One EnqueueRequest's fields, in parts (a payload travels uncopied until the join);
    `trace` is the batch's trace context, for a job without its own."""
    parts = [_HEADS[req.queue, req.job_type]]
    payload = req.payload
    if payload is not None:
        data = payload.data
        encoding = _ENCODINGS[payload.encoding]
        if data:
            data_size = varint(len(data))
            size = 1 + len(data_size) + len(data) + len(encoding)
            parts += [b"\x1a" + varint(size) + b"\x0a" + data_size, data, encoding]
        else:
            parts.append(b"\x1a" + varint(len(encoding)) + encoding)
    rest = _after_payload(req, trace)
    if rest:
        parts.append(rest)
    return parts


def _after_payload(req: EnqueueRequest, trace: TraceContext | None) -> bytes:
    """The fields after the payload (4 to 9), in number order."""
    out = b""
    if req.idempotency_key is not None:
        out += _text(b"\x22", "idempotency_key", req.idempotency_key)
    if req.priority is not None:
        out += b"\x28" + varint(req.priority)
    if req.max_attempts is not None:
        out += b"\x30" + varint(req.max_attempts)
    if req.trace_context is not None:
        out += _trace(req.trace_context, empty_state=True)
    elif trace is not None:
        out += _trace(trace, empty_state=False)
    if req.custom:
        out += _custom(req.custom)
    if req.scheduled_at is not None:
        out += _timestamp(b"\x4a", req.scheduled_at)
    return out


# A payload this big travels as a part of its own (see enqueue_batch); smaller ones are joined
# with the fields around them, as one buffer costs less to send than several.
SEPARATE_PART_BYTES = 32 * 1024


# The bytes before a payload's data for a plain job (queue, job type and a payload, no other
# field), by (queue, job_type, encoding, data length), and the encoding field after the data:
# producers repeat all four, so such a job costs one lookup and three parts. Bounded: cleared
# when full.
_PLAIN: dict[tuple[str, str, str, int], tuple[bytes, bytes]] = {}
_PLAIN_CACHED = 1024


def _payload_head(length: int, encoding: bytes) -> bytes:
    """The payload field's tag and size, and its data's tag and size: the bytes between the
    job's head and the data."""
    if not length:  # (Payload refuses empty data, but the wire format can say it)
        return b"\x1a" + varint(len(encoding))
    data_size = varint(length)
    return b"\x1a" + varint(1 + len(data_size) + length + len(encoding)) + b"\x0a" + data_size


def _plain(key: tuple[str, str, str, int]) -> tuple[bytes, bytes]:
    queue, job_type, encoding_name, length = key
    head = _HEADS[queue, job_type]
    encoding = _ENCODINGS[encoding_name]
    field_head = _payload_head(length, encoding)
    size = len(head) + len(field_head) + length + len(encoding)
    if len(_PLAIN) >= _PLAIN_CACHED:
        _PLAIN.clear()
    known = _PLAIN[key] = (b"\x0a" + varint(size) + head + field_head, encoding)
    return known


def enqueue_batch(
    jobs: Iterable[EnqueueRequest], trace: TraceContext | None = None
) -> bytes | tuple[bytes, ...]:
    """The EnqueueBatchRequest: its bytes, or, when a payload is big, its parts in order with
    each big payload a part of its own, uncopied: the wire layer sends the parts as they are,
    so such a payload is copied only by the kernel (joining them would cost a fresh copy of
    it, and for 1 MiB the page faults of a fresh MiB).

    One pass, every job three parts at most (its fields before the payload's data, the data,
    the rest), joined once: this is the per-job cost of a batch, so a plain job (queue, job
    type, a payload) takes one lookup of its cached framing (_PLAIN), and any other job the
    cached head and encoding lookups."""
    out: list[bytes] = []
    extend = out.extend
    big = False
    plain = _PLAIN
    for job in jobs:
        payload = job.payload
        if (
            payload is not None
            and trace is None
            and job.idempotency_key is None
            and job.priority is None
            and job.max_attempts is None
            and job.trace_context is None
            and not job.custom
            and job.scheduled_at is None
        ):
            data = payload.data
            key = (job.queue, job.job_type, payload.encoding, len(data))
            before, encoding = plain.get(key) or _plain(key)
            extend((before, data, encoding))
            if key[3] >= SEPARATE_PART_BYTES:
                big = True
            continue
        head = _HEADS[job.queue, job.job_type]
        rest = _after_payload(job, trace)
        if payload is None:
            size = len(head) + len(rest)
            extend((b"\x0a" + varint(size) + head, rest))
            continue
        data = payload.data
        encoding = _ENCODINGS[payload.encoding]
        length = len(data)
        field_head = _payload_head(length, encoding)
        size = len(head) + len(field_head) + length + len(encoding) + len(rest)
        extend((b"\x0a" + varint(size) + head + field_head, data, encoding + rest))
        if size >= SEPARATE_PART_BYTES:
            big = True
    if not big:
        return b"".join(out)
    runs = _runs(out)
    return runs[0] if len(runs) == 1 else runs


def _runs(parts: list[bytes]) -> tuple[bytes, ...]:
    """`parts` with every run of small parts joined, the big ones kept apart."""
    out: list[bytes] = []
    run: list[bytes] = []
    for part in parts:
        if len(part) < SEPARATE_PART_BYTES:
            run.append(part)
            continue
        if run:
            out.append(b"".join(run))
            run.clear()
        out.append(part)
    if run:
        out.append(b"".join(run))
    return tuple(out)


def reserve(
    queues: Sequence[str],
    wait_s: float,
    lease_s: float,
    worker_id: str | None,
    max_jobs: int | None,
) -> bytes:
    parts = [_text(b"\x0a", "queues", name) for name in queues]
    parts.append(_duration(b"\x12", wait_s))
    parts.append(_duration(b"\x1a", lease_s))
    if worker_id is not None:
        parts.append(_text(b"\x22", "worker_id", worker_id))
    if max_jobs is not None:
        parts.append(b"\x28" + varint(max_jobs))
    return b"".join(parts)


def _lease(job_id: str, attempt: int) -> bytes:
    length = len(job_id)
    if 0 < length < 128 and 0 < attempt < 128 and job_id.isascii():
        # The server's ids and attempts: one byte each for their lengths and the attempt;
        # one formatting, where the general way is five calls and four concatenations.
        return b"\x0a%c%b\x10%c" % (length, job_id.encode("ascii"), attempt)
    head = _text(b"\x0a", "job_id", job_id) if job_id else b""
    return head + b"\x10" + varint(attempt) if attempt else head


def ack(job_id: str, attempt: int, worker_id: str | None) -> bytes:
    out = _lease(job_id, attempt)
    if worker_id is not None:
        out += _WORKER_IDS[b"\x1a", worker_id]
    return out


def nack(
    job_id: str, attempt: int, reason: str | None, retry: Retry, worker_id: str | None
) -> bytes:
    out = _lease(job_id, attempt)
    if reason:
        out += _text(b"\x1a", "reason", reason)
    if retry.kind == "delay" and retry.delay is not None:
        out += b"\x22" + _nested_len(_duration(b"\x12", retry.delay.total_seconds()))
    elif retry.kind == "dead_letter":
        out += b"\x22\x02\x1a\x00"
    else:
        out += b"\x22\x02\x0a\x00"
    if worker_id is not None:
        out += _WORKER_IDS[b"\x2a", worker_id]
    return out


def _nested_len(body: bytes) -> bytes:
    return varint(len(body)) + body


def extend(job_id: str, attempt: int, lease_s: float, worker_id: str | None) -> bytes:
    out = _lease(job_id, attempt) + _duration(b"\x1a", lease_s)
    if worker_id is not None:
        out += _WORKER_IDS[b"\x22", worker_id]
    return out


def drain_dead_letters(queue: str | None, max: int) -> bytes:
    out = _text(b"\x0a", "queue", queue) if queue is not None else b""
    return out + b"\x10" + varint(max)
