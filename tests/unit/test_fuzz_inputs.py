"""Fuzzing the input edge: arbitrary values give a valid object or a ValidationError, never
anything else."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

import sepp

anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(),
    st.binary(),
    st.datetimes(),
    st.datetimes(timezones=st.timezones()) if hasattr(st, "timezones") else st.datetimes(),
    st.timedeltas(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(
        st.text(max_size=5), st.one_of(st.integers(), st.text(), st.none()), max_size=3
    ),
)


@given(
    queue=anything | st.text(),
    job_type=anything | st.text(),
    payload=st.none() | st.builds(sepp.Payload.bytes, st.binary(min_size=1)) | anything,
    idempotency_key=anything,
    priority=anything,
    max_attempts=anything,
    custom=anything,
    scheduled_at=anything,
    trace_context=st.none() | anything,
)
def test_enqueue_request_accepts_or_raises_validation_error(**kwargs: object) -> None:
    try:
        request = sepp.EnqueueRequest(**kwargs)  # type: ignore[arg-type]
    except sepp.ValidationError as exc:
        assert exc.field  # names what was wrong
        return
    assert isinstance(request.queue, str) and request.queue
    assert request.priority is None or 0 <= request.priority <= 9
    assert request.scheduled_at is None or request.scheduled_at.utcoffset() == timedelta(0)


@given(data=anything, encoding=anything)
def test_payload_accepts_or_raises_validation_error(data: object, encoding: object) -> None:
    try:
        payload = sepp.Payload(data, encoding)  # type: ignore[arg-type]
    except sepp.ValidationError:
        return
    assert isinstance(payload.data, bytes) and payload.data


@given(
    max_attempts=anything,
    initial_backoff=anything,
    max_backoff=anything,
    multiplier=anything,
)
def test_retry_policy_accepts_or_raises_validation_error(**kwargs: object) -> None:
    try:
        policy = sepp.RetryPolicy(**kwargs)  # type: ignore[arg-type]
    except sepp.ValidationError:
        return
    assert len(policy.delays()) == policy.max_attempts - 1


@given(
    lease_duration=anything,
    max_in_flight=anything,
    wait_timeout=anything,
    max_jobs=anything,
    shutdown_timeout=anything,
    reserve_error_backoff=anything,
    worker_id=anything,
)
def test_worker_settings_accept_or_raise_validation_error(**kwargs: object) -> None:
    try:
        sepp.Worker(object(), ["q"], **kwargs)  # type: ignore[arg-type]
    except sepp.ValidationError:
        pass
