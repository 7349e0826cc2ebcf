"""Our message codec (wire_requests, wire_responses) against the generated protobuf classes,
its reference and oracle: requests byte for byte, responses field for field, and malformed
bytes refused exactly when protobuf refuses them (upb's rules, where protobuf's own
implementations disagree: the rows below say so).
"""

from __future__ import annotations

import math
import platform
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from fixtures.fuzz import examples
from google.protobuf import __version__ as protobuf_version
from google.protobuf.internal import api_implementation
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st

import sepp
from sepp._client import operations as ops
from sepp._model import message_codec as mc
from sepp._model import protobuf_codec, wire_requests, wire_responses
from sepp._model.wire_format import DecodeError, decode, read_varint, varint
from sepp._pb import queue_pb2 as pb
from sepp.wire._framing import joined

UPB = api_implementation.Type() == "upb"
PYPY = platform.python_implementation() == "PyPy"
PROTOBUF_MAJOR = int(protobuf_version.split(".")[0])
pytestmark = [pytest.mark.unit, pytest.mark.arch_smoke]

# -- strategies ------------------------------------------------------------------------------

texts = st.text(max_size=12)
names = st.text(min_size=1, max_size=12).filter(
    lambda s: not s[0].isspace() and not s[-1].isspace()
)
uint32 = st.integers(0, 2**32 - 1)
custom_values = st.one_of(
    st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), texts
)
moments = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(timezone.utc)
)
traces = st.builds(sepp.TraceContext, names, st.none() | texts)
requests = st.builds(
    sepp.EnqueueRequest,
    names,
    names,
    payload=st.none()
    | st.builds(
        sepp.Payload,
        st.binary(min_size=1, max_size=300)
        # Around the size where a payload travels as a part of its own.
        | st.sampled_from([-1, 0, 1]).map(lambda d: b"p" * (wire_requests.SEPARATE_PART_BYTES + d)),
        names,
    ),
    idempotency_key=st.none() | names,
    priority=st.none() | st.integers(0, 9),
    max_attempts=st.none() | st.integers(1, 2**32 - 1),
    custom=st.dictionaries(names, custom_values, max_size=3),
    scheduled_at=st.none() | moments,
    trace_context=st.none() | traces,
)
durations = st.floats(0, 1e9, allow_nan=False)
retries = st.one_of(
    st.just(sepp.Retry.DEFAULT),
    st.just(sepp.Retry.DEAD_LETTER),
    st.builds(sepp.Retry.after, st.floats(0, 1e6)),
)


def same_bytes_or_message(ours: bytes, reference: bytes, cls: Any, ordered: bool) -> None:
    # upb writes a map's entries in its hash order: byte equality needs at most one entry.
    assert cls.FromString(ours) == cls.FromString(reference)
    if ordered:
        assert ours == reference


# -- requests -------------------------------------------------------------------------------


@given(st.lists(requests, min_size=1, max_size=4), st.none() | traces)
@example([sepp.EnqueueRequest("q", "t")], sepp.TraceContext("tp", ""))  # empty state: dropped
@example([sepp.EnqueueRequest("q", "t", trace_context=sepp.TraceContext("tp", ""))], None)
def test_enqueue_batches_encode_as_protobuf_does(
    jobs: list[sepp.EnqueueRequest], trace: sepp.TraceContext | None
) -> None:
    ours = wire_requests.enqueue_batch(jobs, trace)
    reference = protobuf_codec.enqueue_batch(jobs, trace)
    ordered = all(len(job.custom) <= 1 for job in jobs)
    same_bytes_or_message(joined(ours), reference, pb.EnqueueBatchRequest, ordered)
    big = [
        job.payload.data
        for job in jobs
        if job.payload is not None and len(job.payload.data) >= wire_requests.SEPARATE_PART_BYTES
    ]
    if not big:
        assert isinstance(ours, bytes)
    else:  # each big payload is a part of its own, the caller's bytes uncopied
        assert isinstance(ours, tuple)
        assert [part for part in ours if any(part is data for data in big)] == big


# A plain job (queue, job type, a payload, nothing else): its framing comes from a cache keyed
# by the payload's length, so the lengths are taken around each varint's width.
plain_requests = st.builds(
    sepp.EnqueueRequest,
    names,
    names,
    payload=st.builds(
        sepp.Payload,
        st.binary(min_size=1, max_size=300)
        | st.sampled_from([1, 127, 128, 16383, 16384, wire_requests.SEPARATE_PART_BYTES]).flatmap(
            lambda n: st.sampled_from([n - 1, n, n + 1]).filter(bool).map(lambda k: b"d" * k)
        ),
        names,
    ),
)


@given(st.lists(plain_requests | requests, min_size=1, max_size=8), st.none() | traces)
def test_plain_jobs_encode_as_protobuf_does_whether_their_framing_is_cached_or_not(
    jobs: list[sepp.EnqueueRequest], trace: sepp.TraceContext | None
) -> None:
    first = joined(wire_requests.enqueue_batch(jobs, trace))
    again = joined(wire_requests.enqueue_batch(jobs, trace))  # every framing from the cache
    wire_requests._PLAIN.clear()
    fresh = joined(wire_requests.enqueue_batch(jobs, trace))
    reference = protobuf_codec.enqueue_batch(jobs, trace)
    ordered = all(len(job.custom) <= 1 for job in jobs)
    same_bytes_or_message(first, reference, pb.EnqueueBatchRequest, ordered)
    assert again == first and fresh == first


def test_the_plain_framing_cache_stays_bounded() -> None:
    jobs = [
        sepp.EnqueueRequest("q", "t", payload=sepp.Payload.bytes(b"x" * n))
        for n in range(1, 2 * wire_requests._PLAIN_CACHED)
    ]
    body = joined(wire_requests.enqueue_batch(jobs))
    assert len(wire_requests._PLAIN) <= wire_requests._PLAIN_CACHED
    assert body == protobuf_codec.enqueue_batch(jobs)


def test_a_big_payload_travels_as_a_part_of_its_own() -> None:
    data = bytes(range(256)) * 4096  # 1 MiB
    job = sepp.EnqueueRequest("q", "t", payload=sepp.Payload.bytes(data), priority=3)
    parts = wire_requests.enqueue_batch([job, sepp.EnqueueRequest("q", "small")])
    assert isinstance(parts, tuple) and len(parts) == 3
    assert parts[1] is data
    assert b"".join(parts) == protobuf_codec.enqueue_batch([job, sepp.EnqueueRequest("q", "small")])


@given(st.lists(names, min_size=1, max_size=3), durations, durations, st.none() | names)
def test_reserves_encode_as_protobuf_does(
    queues: list[str], wait_s: float, lease_s: float, worker_id: str | None
) -> None:
    for max_jobs in (None, 1, 2**32 - 1):
        args = (queues, wait_s, lease_s, worker_id, max_jobs)
        assert wire_requests.reserve(*args) == protobuf_codec.reserve(*args)


@given(texts, uint32, st.none() | texts, st.none() | texts, retries, durations)
def test_lease_calls_encode_as_protobuf_does(
    job_id: str,
    attempt: int,
    worker_id: str | None,
    reason: str | None,
    retry: sepp.Retry,
    lease_s: float,
) -> None:
    for name, args in (
        ("ack", (job_id, attempt, worker_id)),
        ("nack", (job_id, attempt, reason, retry, worker_id)),
        ("extend", (job_id, attempt, lease_s, worker_id)),
    ):
        assert getattr(wire_requests, name)(*args) == getattr(protobuf_codec, name)(*args), name


@pytest.mark.parametrize("length", [1, 26, 36, 127, 128, 300])
@pytest.mark.parametrize("attempt", [0, 1, 127, 128, 2**32 - 1])
def test_server_like_leases_encode_as_protobuf_does_at_the_one_byte_edges(
    length: int, attempt: int
) -> None:
    # Ids of the server's kind (ASCII) and attempts each side of a one-byte length and varint.
    for job_id in ("0123456789abcdef" * 20)[:length], ("é" * length):
        for worker_id in (None, "w-1", "w" * 200):
            args = (job_id, attempt, worker_id)
            assert wire_requests.ack(*args) == protobuf_codec.ack(*args)
            assert wire_requests.extend(job_id, attempt, 30.0, worker_id) == protobuf_codec.extend(
                job_id, attempt, 30.0, worker_id
            )


@given(st.none() | names, st.integers(1, 2**32 - 1))
def test_drains_encode_as_protobuf_does(queue: str | None, max: int) -> None:
    assert wire_requests.drain_dead_letters(queue, max) == protobuf_codec.drain_dead_letters(
        queue, max
    )


def test_a_lone_surrogate_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(ValueError, match="UTF-8"):
        wire_requests.ack("j\ud800", 1, None)
    with pytest.raises(sepp.ValidationError):
        sepp.EnqueueRequest("q", "t\udfff")


def test_varints_round_trip_at_their_edges() -> None:
    for value in (0, 1, 127, 128, 300, 2**32 - 1, 2**63 - 1, 2**64 - 1):
        data = varint(value)
        assert read_varint(data, 0, len(data)) == (value, len(data))
    assert varint(-1) == b"\xff" * 9 + b"\x01"


# -- responses: random messages from protobuf, decoded by both -------------------------------


def _time(cls: Any) -> st.SearchStrategy[Any]:
    return st.builds(
        cls,
        seconds=st.integers(-(2**63), 2**63 - 1) | st.integers(-(10**11), 10**11),
        nanos=st.integers(-(2**31), 2**31 - 1) | st.integers(0, 999_999_999),
    )


timestamps = _time(pb.Job.DESCRIPTOR.fields_by_name["enqueued_at"].message_type._concrete_class)
pb_durations = _time(
    pb.ReserveRequest.DESCRIPTOR.fields_by_name["wait_timeout"].message_type._concrete_class
)
primitives = st.one_of(
    st.builds(pb.PrimitiveValue),
    st.builds(pb.PrimitiveValue, string_value=texts),
    st.builds(pb.PrimitiveValue, double_value=st.floats(allow_nan=False)),
    st.builds(pb.PrimitiveValue, int_value=st.integers(-(2**63), 2**63 - 1)),
    st.builds(pb.PrimitiveValue, bool_value=st.booleans()),
)


@st.composite
def pb_jobs(draw: st.DrawFn) -> Any:
    job = pb.Job(
        id=draw(texts),
        job_type=draw(texts),
        priority=draw(st.integers(0, 12) | uint32),
        attempt=draw(st.integers(0, 3) | uint32),
        max_attempts=draw(uint32),
        queue=draw(texts),
    )
    for name in ("enqueued_at", "lease_expires_at", "scheduled_at"):
        if draw(st.integers(0, 5)):
            getattr(job, name).CopyFrom(draw(timestamps))
    if draw(st.booleans()):
        job.payload.data = draw(st.binary(max_size=20))
        job.payload.encoding = draw(texts)
    if draw(st.booleans()):
        job.trace_context.traceparent = draw(texts)
        if draw(st.booleans()):
            job.trace_context.tracestate = draw(texts)
    for key, value in draw(st.dictionaries(texts, primitives, max_size=3)).items():
        job.custom[key].CopyFrom(value)
    return job


def _rejections() -> st.SearchStrategy[Any]:
    reasons = [st.builds(pb.JobRejection)]
    for field in pb.JobRejection.DESCRIPTOR.oneofs_by_name["reason"].fields:
        kwargs: dict[str, st.SearchStrategy[Any]] = {}
        for sub in field.message_type.fields:
            if sub.message_type is not None:
                kwargs[sub.name] = timestamps if sub.name == "actual" else pb_durations
            elif sub.type == sub.TYPE_STRING:
                kwargs[sub.name] = st.lists(texts, max_size=2) if _repeated(sub) else texts
            elif sub.type == sub.TYPE_UINT64:
                kwargs[sub.name] = st.integers(0, 2**64 - 1)
            else:
                kwargs[sub.name] = uint32
        reasons.append(st.builds(lambda n=field.name, **kw: pb.JobRejection(**{n: kw}), **kwargs))
    return st.one_of(reasons)


def _repeated(field: Any) -> bool:
    repeated = getattr(field, "is_repeated", None)  # protobuf 7; `label` before it
    return bool(repeated) if repeated is not None else field.label == field.LABEL_REPEATED


rejections = _rejections()
acks = st.builds(pb.EnqueueResponse, job_id=texts, deduplicated=st.booleans())
job_results = st.one_of(
    st.builds(pb.JobResult),
    st.builds(pb.JobResult, success=acks),
    st.builds(pb.JobResult, rejection=rejections),
)
records = st.builds(
    pb.DeadLetterRecord,
    job=pb_jobs(),
    cause=st.integers(-(2**31), 2**31 - 1) | st.integers(0, 5),
    failed_at=timestamps,
    final_attempt=uint32,
    last_reason=st.none() | texts,
)


@st.composite
def server_infos(draw: st.DrawFn) -> Any:
    info = pb.GetServerInfoResponse(
        server_version=draw(texts),
        supported_protocol_versions=draw(st.lists(texts, max_size=2)),
        restricts_encodings=draw(st.booleans()),
        allowed_encodings=draw(st.lists(texts, max_size=2)),
        max_payload_bytes=draw(st.integers(0, 2**64 - 1)),
        max_custom_entries=draw(uint32),
        strict_queues=draw(st.booleans()),
    )
    if draw(st.integers(0, 4)):
        info.server_time.CopyFrom(draw(timestamps))
    if draw(st.booleans()):
        info.max_lease_duration.CopyFrom(draw(pb_durations))
    return info


# Unknown fields, of every wire type, a group among them, between and after known fields.
unknown_fields = st.sampled_from(
    [b"", b"\xb8\x3e\x2a", b"\xb2\x3e\x03abc", b"\xb9\x3e" + bytes(8), b"\xbd\x3e" + bytes(4),
     b"\xbb\x3e\x08\x01\x12\x00\xbc\x3e", b"\xf8\xff\xff\xff\x0f\x05"]
)  # fmt: skip


def outcome(reader: Callable[[bytes], Any], body: bytes) -> tuple[str, Any]:
    """What a reader made of `body`, comparable across codecs."""
    try:
        return "ok", normal(reader(body))
    except DecodeError:
        return "unparsable", None
    except sepp.BatchValidationError as exc:
        return "refused", normal(exc.errors)
    except Exception as exc:  # Malformed, or whatever a conversion raised: both say malformed
        return "malformed", type(exc).__name__ if isinstance(exc, sepp.SeppError) else None


def normal(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return [normal(item) for item in value]
    if isinstance(value, sepp.Job):
        ctx = value.ctx
        return (
            value.payload,
            [getattr(ctx, f) for f in ("id", "queue", "job_type", "attempt", "max_attempts")],
            [ctx.priority, ctx.enqueued_at, ctx.scheduled_at, ctx.trace_context],
            [ctx.lease_expires_at, ctx.worker_id],
            sorted((k, repr(v)) for k, v in ctx.custom.items()),
        )
    if isinstance(value, sepp.DeadLetterRecord):
        return repr(value.__class__(**{**vars_of(value), "custom": {}})), sorted(
            (k, repr(v)) for k, v in value.custom.items()
        )
    return repr(value)


def vars_of(value: Any) -> dict[str, Any]:
    return {name: getattr(value, name) for name in value.__dataclass_fields__}


def both(read: Callable[[Any, bytes], Any], body: bytes) -> None:
    note(f"body: {body.hex()}")
    ours = outcome(lambda b: read(wire_responses, b), body)
    reference = outcome(lambda b: read(protobuf_codec, b), body)
    assert ours == reference


def _reserve(codec: Any, body: bytes) -> list[Any]:
    out = []
    for fields in codec.reserved_jobs(body):
        out.append(outcome(lambda f: codec.job(f, "w"), fields))
    return out


def _drain(codec: Any, body: bytes) -> list[Any]:
    return [outcome(codec.dead_letter, record) for record in codec.dead_letter_records(body)]


READERS: dict[str, Callable[[Any, bytes], Any]] = {
    "batch": lambda c, b: c.batch_results(b, 2),
    "single": lambda c, b: c.single_result(b),
    "atomic": lambda c, b: c.atomic_acks(b, 2),
    "reserve": _reserve,
    "ack": lambda c, b: c.ack_response(b),
    "nack": lambda c, b: c.nack_dead_lettered(b),
    "extend": lambda c, b: c.extended_until(b),
    "drain": _drain,
    "info": lambda c, b: c.server_info(b),
}
MESSAGES: dict[str, st.SearchStrategy[Any]] = {
    "batch": st.builds(pb.EnqueueBatchResponse, results=st.lists(job_results, max_size=3)),
    "single": st.builds(pb.EnqueueBatchResponse, results=st.lists(job_results, max_size=2)),
    "atomic": st.one_of(
        st.builds(pb.EnqueueAtomicResponse),
        st.builds(
            pb.EnqueueAtomicResponse,
            success=st.builds(pb.EnqueueAtomicSuccess, responses=st.lists(acks, max_size=3)),
        ),
        st.builds(
            pb.EnqueueAtomicResponse,
            rejection=st.builds(
                pb.BatchValidationFailure,
                errors=st.lists(
                    st.builds(pb.JobValidationError, index=uint32, rejection=rejections),
                    max_size=2,
                ),
            ),
        ),
    ),
    "reserve": st.builds(pb.ReserveResponse, jobs=st.lists(pb_jobs(), max_size=3)),
    "ack": st.builds(pb.AckResponse, job_id=texts),
    "nack": st.builds(pb.NackResponse, job_id=texts, dead_lettered=st.booleans()),
    "extend": st.one_of(
        st.builds(pb.ExtendResponse, job_id=texts),
        st.builds(pb.ExtendResponse, job_id=texts, lease_expires_at=timestamps),
    ),
    "drain": st.builds(pb.DrainDeadLettersResponse, records=st.lists(records, max_size=2)),
    "info": server_infos(),
}


@pytest.mark.parametrize("which", sorted(READERS))
@settings(max_examples=examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_protobufs_responses_decode_as_convert_makes_them(which: str, data: st.DataObject) -> None:
    message = data.draw(MESSAGES[which])
    body = message.SerializeToString()
    # Unknown fields before and after; and the message twice (protobuf merges the two).
    body = data.draw(unknown_fields) + body + data.draw(unknown_fields)
    if data.draw(st.booleans()):
        body += data.draw(MESSAGES[which]).SerializeToString()
    both(READERS[which], body)


server_ids = st.text(st.characters(max_codepoint=0x7F), min_size=1, max_size=40) | texts


@settings(max_examples=examples(150), suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.builds(pb.EnqueueResponse, job_id=server_ids, deduplicated=st.booleans()), max_size=120
    ),
    st.lists(st.tuples(st.integers(0, 120), job_results), max_size=2),
)
def test_batch_results_of_every_size_read_as_protobuf_reads_them(
    successes: list[Any], others: list[tuple[int, Any]]
) -> None:
    # Mostly successes with ASCII ids, as a server answers (read in place), now and then an
    # id that is not ASCII, a rejection or a result without outcome (read through the schema).
    results = [pb.JobResult(success=ack) for ack in successes]
    for at, result in others:
        results.insert(at, result)
    body = pb.EnqueueBatchResponse(results=results).SerializeToString()
    reads_batch_results_as_protobuf_does(body, len(results))


def reads_batch_results_as_protobuf_does(body: bytes, count: int) -> None:
    """Our reader's outcome is protobuf's, for the right count of results and a wrong one."""
    note(f"body: {body.hex()}")
    for expected in (count, count + 1):
        ours = outcome(lambda b, n=expected: wire_responses.batch_results(b, n), body)
        assert ours == outcome(lambda b, n=expected: protobuf_codec.batch_results(b, n), body)


def _successes(ids: list[str], deduplicated: int | None = None) -> bytes:
    results = [
        pb.JobResult(success=pb.EnqueueResponse(job_id=i, deduplicated=n == deduplicated))
        for n, i in enumerate(ids)
    ]
    return pb.EnqueueBatchResponse(results=results).SerializeToString()


ascii_ids_of_one_length = st.integers(0, 40).flatmap(
    lambda n: st.lists(
        st.text(st.characters(max_codepoint=0x7F), min_size=n, max_size=n), min_size=1, max_size=120
    )
)


@settings(max_examples=examples(300))
@given(ascii_ids_of_one_length, st.none() | st.integers(0, 119), st.data())
# Ids holding the frame.
@example(["\n\x10\n\x0e\n\x0cabcdef", "ab\n\x10\n\x0e\n\x0cdef"], None, None)
# An id ending in all of the frame but its last byte: the split takes that frame early, and
# only the lengths show it.
@example(["abcde\n\x0e\n\x0c\n", "abcdefghij"], None, None)
# An id that is one character, the frame, one character: twice the parts, all of one length.
@example(["a\n\x0c\n\n\n\x08b"], None, None)
def test_answers_whose_ids_have_one_length_read_as_protobuf_reads_them(
    ids: list[str], deduplicated: int | None, data: st.DataObject
) -> None:
    # The server's commonest answer (every job accepted, ids of one length) has a reader of its
    # own; ids that are empty or hold the frame, a deduplicated job, or a stray byte at the end
    # must still read as protobuf reads them.
    body = _successes(ids, deduplicated)
    if data is not None and data.draw(st.booleans()):
        body += data.draw(st.binary(min_size=1, max_size=3))
    reads_batch_results_as_protobuf_does(body, len(ids))


def test_the_server_s_answer_to_a_batch_is_read_without_a_python_loop_per_job() -> None:
    ids = [f"0193a7c4-{n:04d}-7000-8000-00000000{n:04d}" for n in range(100)]
    acks = wire_responses._uniform_acks(_successes(ids))
    assert acks == [sepp.EnqueueAck(i) for i in ids]
    assert wire_responses._uniform_acks(_successes(ids, deduplicated=3)) is None


@pytest.mark.needs("upb")  # the oracle: our codec reads as upb does
@pytest.mark.skipif(
    PROTOBUF_MAJOR < 7, reason="protobuf 6's upb reads edge cases differently (VERSION_DEPENDENT)"
)
@pytest.mark.parametrize("which", sorted(READERS))
@settings(max_examples=examples(200), suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_bytes_are_refused_exactly_when_protobuf_refuses(
    which: str, data: st.DataObject
) -> None:
    body = bytearray(data.draw(MESSAGES[which]).SerializeToString())
    for _ in range(data.draw(st.integers(1, 3))):
        how = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        at = data.draw(st.integers(0, len(body)))
        if how == "flip" and at < len(body):
            body[at] = data.draw(st.integers(0, 255))
        elif how == "cut":
            del body[at:]
        else:
            body[at:at] = data.draw(st.binary(min_size=1, max_size=4))
    both(READERS[which], bytes(body))


@pytest.mark.needs("upb")  # the oracle: our codec reads as upb does
@pytest.mark.skipif(
    PROTOBUF_MAJOR < 7, reason="protobuf 6's upb reads edge cases differently (VERSION_DEPENDENT)"
)
@given(st.binary(max_size=40))
def test_random_bytes_are_refused_exactly_when_protobuf_refuses(body: bytes) -> None:
    for read in READERS.values():
        both(read, body)


# -- malformed input: a table, with where protobuf's implementations disagree ---------------

# (name, bytes as an AckResponse, upb refuses, python protobuf refuses). Ours reads as upb.
EDGES = [
    ("truncated varint", b"\x08\xff", True, True),
    ("varint of 10 bytes", b"\x10" + b"\xff" * 9 + b"\x01", False, False),
    ("varint of 11 bytes", b"\x10" + b"\xff" * 10 + b"\x01", True, True),
    ("length past the end", b"\x0a\x05ab", True, True),
    ("length of 5 bytes", b"\x0a\x82\x80\x80\x80\x00ab", False, False),
    ("length of 6 bytes", b"\x0a\x82\x80\x80\x80\x80\x00ab", True, False),
    ("tag of 6 bytes", b"\x8a\x80\x80\x80\x80\x00\x02ab", True, False),
    ("field number 2**29", b"\x80\x80\x80\x80\x10\x01", True, False),
    ("field number 0", b"\x00\x01", True, True),
    ("field number 0 in a group", b"\x0b\x00\x01\x0c", False, False),
    ("wire type 6", b"\x0e", True, True),
    ("wire type 7", b"\x0f", True, True),
    ("end group outside a group", b"\x0c", True, True),
    ("end group of another field", b"\x0b\x08\x01\x14", True, True),
    ("group without its end", b"\x0b\x08\x01", True, True),
    ("groups 100 deep", b"\x0b" * 100 + b"\x0c" * 100, False, True),
    ("groups 101 deep", b"\x0b" * 101 + b"\x0c" * 101, True, True),
    ("fixed32 cut short", b"\x0d\x01\x02", True, True),
    ("fixed64 cut short", b"\x09\x01", True, True),
    ("invalid UTF-8", b"\x0a\x02\xc3\x28", True, True),
    ("an encoded surrogate", b"\x0a\x03\xed\xa0\x80", True, True),
    ("invalid UTF-8 in an unknown field", b"\x12\x02\xc3\x28", False, False),
    ("a known field with the wrong wire type", b"\x08\x01", False, False),
]
# Rows that protobuf's floor (6.30.2) reads differently from 7.x, on upb as in python (its
# upb accepts both): protobuf is checked against them only on 7.x.
VERSION_DEPENDENT = {"length of 6 bytes", "field number 0 in a group"}
# PyPy's own UTF-8 decoder accepts an encoded surrogate, and python protobuf relies on it
# there (ours checks for surrogates itself, so it refuses on PyPy too).
PYPY_DEPENDENT = {"an encoded surrogate"}


@pytest.mark.parametrize(("name", "body", "upb", "python"), EDGES, ids=[e[0] for e in EDGES])
def test_edge_cases_are_read_as_upb_reads_them(
    name: str, body: bytes, upb: bool, python: bool
) -> None:
    ours = outcome(wire_responses.ack_response, body)[0] != "ok"
    assert ours is upb
    if PROTOBUF_MAJOR < 7 and name in VERSION_DEPENDENT:
        return  # ours is checked above; protobuf 6 is not the oracle for these rows
    if UPB:
        assert (outcome(protobuf_codec.ack_response, body)[0] != "ok") is upb
    elif not (PYPY and name in PYPY_DEPENDENT):
        assert (outcome(protobuf_codec.ack_response, body)[0] != "ok") is python


@pytest.mark.parametrize("codec", mc.NAMES)
@pytest.mark.parametrize(
    ("read", "method"),
    [
        (lambda b: ops.read_enqueue_one(b), "EnqueueBatch"),
        (lambda b: ops.read_enqueue_batch(b, 1), "EnqueueBatch"),
        (lambda b: ops.read_enqueue_atomic(b, 1), "EnqueueAtomic"),
        (lambda b: ops.read_reserve(b, None, sepp_log()), "Reserve"),
        (ops.read_ack, "Ack"),
        (ops.read_nack, "Nack"),
        (ops.read_server_info, "GetServerInfo"),
        (lambda b: ops.read_drain_dead_letters(b, sepp_log()), "DrainDeadLetters"),
    ],
)
@pytest.mark.parametrize("body", [*[e[1] for e in EDGES if e[2] and e[3]][:8], b"\x0a\x01\xff"])
def test_malformed_responses_raise_malformed_response_error_naming_the_call(
    codec: str, read: Callable[[bytes], Any], method: str, body: bytes
) -> None:
    mc.select(codec)
    try:
        with pytest.raises(sepp.MalformedResponseError, match=f"^{method}: "):
            read(body)
    finally:
        mc.select("sepp")


def sepp_log() -> Any:
    from sepp._util.log import Log

    return Log(None)


def test_repeated_messages_merge_and_scalars_take_the_last() -> None:
    job = pb.Job(id="a", job_type="t", attempt=1, enqueued_at={"seconds": 5})
    later = pb.Job(id="b", attempt=2, enqueued_at={"nanos": 7000}, custom={"k": {"int_value": 1}})
    body = job.SerializeToString() + later.SerializeToString()
    ours = decode(body, wire_responses.JOB)
    assert ours["id"] == "b" and ours["job_type"] == "t" and ours["attempt"] == 2
    assert ours["enqueued_at"] == {"seconds": 5, "nanos": 7000}
    merged = pb.Job.FromString(body)
    assert merged.enqueued_at.seconds == 5 and merged.enqueued_at.nanos == 7000


@pytest.mark.parametrize(
    "body",
    [
        b"\x12\x02\x0a\x02\x12\x00\x0a\x02\x12\x00",  # a bad rejection, then a success
        b"\x0a\x02\x0a\x02" + b"\x0a\x02\x0a\x00",  # a bad occurrence the next one completes
    ],
)
def test_every_occurrence_of_a_message_must_parse_alone(body: bytes) -> None:
    with pytest.raises(DecodeError):
        protobuf_codec.atomic_acks(body, 1)
    with pytest.raises(DecodeError):
        wire_responses.atomic_acks(body, 1)


def test_map_entries_without_key_or_value_read_as_protobuf_does() -> None:
    entries = b"\x52\x00" + b"\x52\x03\x0a\x01k"  # an empty entry, then one with only a key
    body = pb.ReserveResponse(jobs=[pb.Job(id="j")]).SerializeToString()
    job = pb.Job.FromString(pb.Job(id="j").SerializeToString() + entries)
    assert dict(job.custom).keys() == {"", "k"}
    ours = decode(pb.Job(id="j").SerializeToString() + entries, wire_responses.JOB)
    assert [e.get("key", "") for e in ours["custom"]] == ["", "k"]
    assert body  # the whole response is covered by the differential tests above


@pytest.mark.parametrize(
    ("entry", "kept"),
    [
        (b"\x0a\x01k\x12\x02\x18\x01", True),
        (b"\x0a\x01k\x12\x04\x18\x01\x28\x01", True),  # the value's unknown field: kept
        (b"\x0a\x01k\x18\x05\x12\x02\x18\x01", False),  # the entry's own: dropped by upb
        (b"\x08\x00\x12\x02\x18\x01", False),  # a key of the wrong wire type is unknown
    ],
)
def test_a_map_entry_with_unknown_fields_is_dropped_as_upb_drops_it(
    entry: bytes, kept: bool
) -> None:
    body = pb.Job(id="j", job_type="t").SerializeToString() + b"\x52" + bytes([len(entry)]) + entry
    ours = wire_responses._custom(decode(body, wire_responses.JOB)["custom"])
    assert bool(ours) is kept
    reference = dict(pb.Job.FromString(body).custom)
    assert bool(reference) is (kept or not UPB)  # python protobuf keeps every entry


def test_a_rejection_of_a_reason_we_cannot_read_is_an_unknown_rejection() -> None:
    # Field 2 (payload_too_large) as a varint: an unknown field, so no reason is set.
    body = b"\x0a\x06\x12\x00\x12\x02\x10\x01"
    assert wire_responses.single_result(body) == sepp.UnknownRejection()
    assert protobuf_codec.single_result(body) == sepp.UnknownRejection()


def test_doubles_keep_their_bits() -> None:
    body = pb.PrimitiveValue(double_value=math.inf).SerializeToString()
    assert decode(body, wire_responses.PRIMITIVE) == {"double_value": math.inf}
    assert timedelta(seconds=1) == wire_responses._duration({"seconds": 1})


@pytest.mark.parametrize("upb", [True, False])
def test_the_default_reads_jobs_with_upb_where_present_and_the_rest_with_ours(
    monkeypatch: pytest.MonkeyPatch, upb: bool
) -> None:
    monkeypatch.setattr(mc, "upb_present", lambda: upb)
    mc.select(mc.DEFAULT)
    mc.preload()
    job_readers = ("reserved_jobs", "job", "dead_letter_records", "dead_letter")
    for name in [n for n in vars(mc.Responses) if not n.startswith("_")]:
        from_upb = upb and name in job_readers
        expected = protobuf_codec if from_upb else wire_responses
        assert getattr(mc.RESPONSES, name) is getattr(expected, name), name
    for name in [n for n in vars(mc.Requests) if not n.startswith("_")]:
        assert getattr(mc.REQUESTS, name) is getattr(wire_requests, name), name


def test_a_codec_named_explicitly_is_used_for_everything() -> None:
    for name, module in (("sepp", wire_responses), ("protobuf", protobuf_codec)):
        mc.select(name)
        mc.preload()
        assert mc.RESPONSES is module
    with pytest.raises(ValueError, match="one of auto, sepp, protobuf"):
        mc.select("upb")
