"""Protobuf ⇄ sepp types: round trips, and arbitrary server messages never raise anything
but our own errors."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from fixtures.fuzz import examples
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

import sepp
from sepp._model import convert as cv
from sepp._model.types import reserved_job
from sepp._pb import queue_pb2 as pb

# In the smoke selection of the emulated architectures' parts (tests/conftest.py).
pytestmark = pytest.mark.arch_smoke

UTC = timezone.utc
datetimes = st.datetimes(
    min_value=datetime(1970, 1, 1), max_value=datetime(9000, 1, 1), timezones=st.just(UTC)
)
texts = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=20)
custom_values = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=20),
)


@given(
    queue=texts.filter(lambda name: name == name.strip()),  # outer whitespace is refused
    job_type=texts,
    data=st.binary(min_size=1, max_size=64),
    priority=st.none() | st.integers(0, 9),
    max_attempts=st.none() | st.integers(1, 100),
    custom=st.dictionaries(texts, custom_values, max_size=5),
    scheduled_at=st.none() | datetimes,
    key=st.none() | texts,
)
def test_enqueue_request_survives_the_wire_as_a_job(
    queue: str,
    job_type: str,
    data: bytes,
    priority: int | None,
    max_attempts: int | None,
    custom: dict[str, sepp.CustomValue],
    scheduled_at: datetime | None,
    key: str | None,
) -> None:
    req = sepp.EnqueueRequest(
        queue,
        job_type,
        payload=sepp.Payload(data, "e"),
        idempotency_key=key,
        priority=priority,
        max_attempts=max_attempts,
        custom=custom,
        scheduled_at=scheduled_at,
    )
    wire = pb.EnqueueBatchRequest.FromString(cv.enqueue_batch_to_pb([req])).jobs[0]
    assert wire.HasField("priority") == (priority is not None)
    assert wire.HasField("idempotency_key") == (key is not None)
    assert not wire.HasField("trace_context")
    # What the server would hand back for it:
    job_msg = pb.Job(
        id="id-1",
        job_type=wire.job_type,
        payload=wire.payload,
        priority=wire.priority,
        attempt=1,
        max_attempts=wire.max_attempts or 3,
        queue=wire.queue,
    )
    job_msg.custom.MergeFrom(wire.custom)
    job_msg.enqueued_at.GetCurrentTime()
    job_msg.lease_expires_at.GetCurrentTime()
    if wire.HasField("scheduled_at"):
        job_msg.scheduled_at.CopyFrom(wire.scheduled_at)
    job = cv.job_from_pb(job_msg, None)
    assert job.payload == req.payload
    assert job.ctx.custom == req.custom
    assert {k: type(v) for k, v in job.ctx.custom.items()} == {
        k: type(v) for k, v in custom.items()
    }
    assert job.ctx.scheduled_at == scheduled_at
    assert (job.ctx.queue, job.ctx.job_type) == (queue, job_type)


@settings(max_examples=examples(100))
@given(
    data=st.none() | st.binary(max_size=40) | st.binary(min_size=1, max_size=40).map(bytearray),
    encoding=st.sampled_from(["", "application/json", "text/plain; charset=é"]),
    custom=st.dictionaries(texts, custom_values, max_size=3),
    scheduled_at=st.none() | datetimes,
    trace=st.none() | st.builds(sepp.TraceContext, texts, st.none() | texts),
    enqueued_at=datetimes,
    expires_at=datetimes,
)
def test_a_reserved_job_is_what_the_public_constructors_make_of_its_fields(
    data: bytes | bytearray | None,
    encoding: str,
    custom: dict[str, sepp.CustomValue],
    scheduled_at: datetime | None,
    trace: sepp.TraceContext | None,
    enqueued_at: datetime,
    expires_at: datetime,
) -> None:
    # What both readers build a reserved job with, skipping the checks the reader has made.
    fields = ("job-1", "q", "t", 2, 5, 7, custom, enqueued_at, scheduled_at, trace)
    made = reserved_job(data, encoding, *fields, expires_at, "w1", "the client")
    payload = sepp.Payload(bytes(data), encoding or "application/octet-stream") if data else None
    assert made.payload == payload
    assert made.payload is None or type(made.payload.data) is bytes
    assert tuple(getattr(made.ctx, name) for name in CONTEXT_FIELDS) == fields
    lease = ("lease_expires_at", "worker_id", "client", "state")
    assert [getattr(made.ctx, n) for n in lease] == [expires_at, "w1", "the client", None]


CONTEXT_FIELDS = (
    "id",
    "queue",
    "job_type",
    "attempt",
    "max_attempts",
    "priority",
    "custom",
    "enqueued_at",
    "scheduled_at",
    "trace_context",
)


def test_a_reserve_s_jobs_share_one_expiry_and_other_times_are_read_anew() -> None:
    first = cv.expiry_from_parts(1_800_000_000, 5_000)
    assert cv.expiry_from_parts(1_800_000_000, 5_000) is first
    assert first == cv.timestamp_from_parts(1_800_000_000, 5_000)
    later = cv.expiry_from_parts(1_800_000_000, 6_000)
    assert later == datetime(2027, 1, 15, 8, 0, tzinfo=UTC) + timedelta(microseconds=6)
    assert cv.expiry_from_parts(1_800_000_000, 5_000) == first


def test_missing_custom_value_and_bad_priority_are_malformed() -> None:
    msg = pb.Job(id="a", job_type="t", attempt=1, priority=10)
    msg.enqueued_at.GetCurrentTime()
    msg.lease_expires_at.GetCurrentTime()
    for mutate in (
        lambda m: None,
        lambda m: (setattr(m, "priority", 0), m.custom["k"].Clear()),
        lambda m: (setattr(m, "priority", 0), m.ClearField("lease_expires_at")),
        lambda m: (setattr(m, "priority", 0), setattr(m, "attempt", 0)),
    ):
        bad = pb.Job()
        bad.CopyFrom(msg)
        mutate(bad)
        try:
            cv.job_from_pb(bad, None)
        except cv.Malformed:
            continue
        raise AssertionError("expected Malformed")


def test_unknown_rejection_and_dead_letter_cause_degrade_gracefully() -> None:
    assert cv.rejection_from_pb(pb.JobRejection()) == sepp.UnknownRejection()
    record = pb.DeadLetterRecord(cause=99, final_attempt=2)  # type: ignore[arg-type]
    record.job.id, record.job.job_type, record.job.queue = "a", "t", "q"
    out = cv.dead_letter_from_pb(record)
    assert out.cause is sepp.DeadLetterCause.UNSPECIFIED and out.last_reason is None
    assert out.to_enqueue_request().max_attempts is None  # never sends max_attempts=0


def test_timestamps_keep_microseconds_and_timezone() -> None:
    when = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    ts = pb.Job().enqueued_at
    cv.timestamp_to_pb(when, ts)
    assert cv.timestamp_from_pb(ts) == when
    before_epoch = datetime(1960, 1, 1, 0, 0, 0, 500000, tzinfo=UTC)
    cv.timestamp_to_pb(before_epoch, ts)
    assert cv.timestamp_from_pb(ts) == before_epoch
    d = pb.ReserveRequest().lease_duration
    cv.duration_to_pb(1.25, d)
    assert cv.duration_from_pb(d) == timedelta(seconds=1.25)


# Arbitrary (valid-protobuf) server messages: conversion yields our types or Malformed/SeppError.
def _random_message(cls: type, blob: bytes) -> object:
    try:
        return cls.FromString(blob)  # type: ignore[attr-defined]
    except Exception:
        return None


@settings(max_examples=examples(300))
@given(st.binary(max_size=300))
def test_arbitrary_jobs_records_and_info_never_raise_foreign_errors(blob: bytes) -> None:
    for cls, convert in (
        (pb.Job, lambda m: cv.job_from_pb(m, "w")),
        (pb.DeadLetterRecord, cv.dead_letter_from_pb),
        (pb.GetServerInfoResponse, cv.server_info_from_pb),
        (pb.JobRejection, cv.rejection_from_pb),
    ):
        msg = _random_message(cls, blob)
        if msg is None:
            continue
        try:
            convert(msg)
        except (cv.Malformed, sepp.SeppError):
            pass


@settings(max_examples=examples(200))
@given(st.binary(max_size=300), st.integers(0, 3))
def test_arbitrary_batch_responses_parse_or_raise_malformed(blob: bytes, expected: int) -> None:
    try:
        results = cv.batch_results_from_pb(blob, expected)
    except (cv.Malformed, DecodeError):  # the client maps both to MalformedResponseError
        return
    assert len(results) == expected
    assert all(isinstance(r, (sepp.EnqueueAck, sepp.JobRejection)) for r in results)
