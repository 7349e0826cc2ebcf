"""`sepp.testing.job_context`: unit-test a handler without a server or private types."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import sepp
import sepp.testing
from sepp.testing import job_context, set_lease_expires_at

T0 = datetime(2030, 1, 1, tzinfo=timezone.utc)


async def test_a_handler_can_be_called_with_a_built_context() -> None:
    seen: list[tuple[Any, str, int, bool]] = []

    async def send_welcome(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        assert payload is not None
        seen.append((payload.json()["user"], ctx.job_type, ctx.attempt, ctx.is_final_attempt))

    await send_welcome(
        sepp.Payload.json({"user": 42}),
        job_context("send_welcome", attempt=3, max_attempts=3),
    )
    assert seen == [(42, "send_welcome", 3, True)]


def test_every_field_can_be_set() -> None:
    trace = sepp.TraceContext("00-" + "1" * 32 + "-" + "2" * 16 + "-01")
    ctx = job_context(
        "t",
        queue="emails",
        job_id="j-1",
        attempt=2,
        max_attempts=7,
        priority=9,
        custom={"tenant": "acme", "n": 1, "x": 1.5, "b": True},
        enqueued_at=T0,
        scheduled_at=T0 + timedelta(hours=1),
        trace_context=trace,
        lease_expires_at=T0 + timedelta(minutes=5),
        worker_id="w1",
    )
    assert isinstance(ctx, sepp.JobContext)
    assert (ctx.id, ctx.queue, ctx.job_type, ctx.attempt, ctx.max_attempts, ctx.priority) == (
        "j-1",
        "emails",
        "t",
        2,
        7,
        9,
    )
    assert dict(ctx.custom) == {"tenant": "acme", "n": 1, "x": 1.5, "b": True}
    assert (ctx.enqueued_at, ctx.scheduled_at) == (T0, T0 + timedelta(hours=1))
    assert ctx.trace_context == trace
    assert (ctx.lease_expires_at, ctx.worker_id) == (T0 + timedelta(minutes=5), "w1")
    assert str(ctx) == "t[j-1] on emails (2/7)"
    job = sepp.Job(sepp.Payload.text("hi"), ctx)  # a Job needs nothing private either
    assert job.id == "j-1"


def test_defaults_are_a_fresh_first_attempt_with_a_30_second_lease() -> None:
    first, second = job_context(), job_context()
    assert uuid.UUID(first.id) and first.id != second.id
    assert (first.job_type, first.queue, first.attempt, first.max_attempts, first.priority) == (
        "test",
        "test",
        1,
        3,
        0,
    )
    assert first.enqueued_at.tzinfo is not None
    assert first.lease_expires_at - first.enqueued_at == timedelta(seconds=30)
    assert (first.custom, first.scheduled_at, first.trace_context, first.worker_id) == (
        {},
        None,
        None,
        None,
    )


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"job_type": ""}, "job_type"),
        ({"queue": ""}, "queue"),
        ({"job_id": ""}, "job_id"),
        ({"attempt": 0}, "attempt"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"priority": 10}, "priority"),
        ({"priority": True}, "priority"),
        ({"custom": {"k": object()}}, "custom['k']"),
        ({"enqueued_at": datetime(2030, 1, 1)}, "enqueued_at"),
        ({"lease_expires_at": datetime(2030, 1, 1)}, "lease_expires_at"),
        ({"trace_context": "00-abc"}, "trace_context"),
        ({"worker_id": ""}, "worker_id"),
    ],
)
def test_bad_values_raise_validation_error(options: dict[str, Any], field: str) -> None:
    with pytest.raises(sepp.ValidationError) as info:
        job_context(**options)
    assert info.value.field == field


def test_set_lease_expires_at_moves_the_lease_like_extend() -> None:
    ctx = job_context(lease_expires_at=T0)
    set_lease_expires_at(ctx, T0 + timedelta(seconds=90))
    assert ctx.lease_expires_at == T0 + timedelta(seconds=90)
    with pytest.raises(sepp.ValidationError):
        set_lease_expires_at(ctx, datetime(2030, 1, 1))
    with pytest.raises(sepp.ValidationError):
        set_lease_expires_at("not a ctx", T0)  # type: ignore[arg-type]
    assert ctx.lease_expires_at == T0 + timedelta(seconds=90)


def test_the_factories_are_public() -> None:
    assert {"job_context", "set_lease_expires_at"} <= set(sepp.testing.__all__)


def test_sync_job_context_is_the_ctx_a_def_handler_gets() -> None:
    from sepp.testing import sync_job_context

    class FakeBlocking:
        def __init__(self) -> None:
            self.sent: list[str] = []

        def enqueue(self, queue: str, job_type: str) -> None:
            self.sent.append(job_type)

    def order(payload: sepp.Payload | None, ctx: sepp.SyncJobContext) -> None:
        ctx.client.enqueue("shipping", "ship")

    fake = FakeBlocking()
    ctx = job_context("order", client=fake, state={"db": 1})
    threaded = sync_job_context(ctx)
    order(None, threaded)
    assert fake.sent == ["ship"] and isinstance(threaded, sepp.SyncJobContext)
    assert (threaded.id, threaded.state, threaded.client) == (ctx.id, {"db": 1}, fake)
    set_lease_expires_at(ctx, ctx.lease_expires_at + timedelta(minutes=1))
    assert threaded.lease_expires_at == ctx.lease_expires_at  # one lease
    with pytest.raises(sepp.ValidationError):
        sync_job_context("not a ctx")  # type: ignore[arg-type]
