"""The waiting room and deferral delays (`sepp._limits.waiting`), and the copy a deferral
makes (`sepp._limits.deferral`), with no server."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sepp
from sepp._limits import deferral
from sepp._limits.waiting import WaitingRoom, default_room, deferral_delay_s
from sepp.testing import job_context

pytestmark = [pytest.mark.unit]


def test_the_room_holds_its_capacity_and_no_more() -> None:
    room = WaitingRoom(2)
    assert room.try_enter() and room.try_enter() and not room.try_enter()
    room.leave()
    assert room.try_enter() and room.waiting == 2
    room.leave()
    room.leave()
    with pytest.raises(RuntimeError):
        room.leave()
    with pytest.raises(ValueError):
        WaitingRoom(0)
    assert [default_room(n) for n in (1, 2, 16, 17)] == [1, 1, 8, 8]


@given(st.integers(min_value=0, max_value=200))
def test_deferral_delays_double_with_jitter_up_to_the_longest(n: int) -> None:
    step = min(1.0 * 2.0**n, 60.0)
    assert step / 2 <= deferral_delay_s(n) <= step
    assert deferral_delay_s(n, hint_s=2.5) == 2.5
    assert deferral_delay_s(n, hint_s=-1) == 0.0 and deferral_delay_s(n, hint_s=1e9) == 60.0


def test_the_copy_gives_back_the_attempts_left_including_this_one() -> None:
    ctx = job_context(
        "sync", queue="q", attempt=3, max_attempts=5, priority=4, custom={"tenant": "acme"}
    )
    job = sepp.Job(sepp.Payload.text("x"), ctx)
    request = deferral.deferral_request(job, scheduled_at=None)
    assert (request.queue, request.job_type, request.priority) == ("q", "sync", 4)
    assert request.max_attempts == 3 and request.payload == job.payload
    assert request.idempotency_key == f"sepp.defer:{ctx.id}"
    assert dict(request.custom) == {
        "tenant": "acme",
        deferral.ORIGIN: ctx.id,
        deferral.COUNT: 1,
        deferral.SPENT: 2,
    }
    # The copy, delivered at its attempt 1, counts as attempt 3 of 5.
    copy = job_context(
        "sync", attempt=1, max_attempts=request.max_attempts or 1, custom=request.custom
    )
    assert (deferral.logical_attempt(copy), deferral.logical_max_attempts(copy)) == (3, 5)
    assert deferral.origin_id(copy) == ctx.id and deferral.deferrals(copy) == 1
    # Deferring the copy on its attempt 2 keeps the origin and adds up what was spent.
    second = job_context(
        "sync", attempt=2, max_attempts=request.max_attempts or 1, custom=request.custom
    )
    again = deferral.deferral_request(sepp.Job(None, second), scheduled_at=None)
    assert again.custom[deferral.ORIGIN] == ctx.id and again.custom[deferral.COUNT] == 2
    assert again.custom[deferral.SPENT] == 3 and again.max_attempts == 2


def test_a_job_never_deferred_counts_as_itself() -> None:
    ctx = job_context(attempt=2, max_attempts=3, custom={deferral.SPENT: "junk"})
    assert deferral.logical_attempt(ctx) == 2 and deferral.deferrals(ctx) == 0
    assert deferral.origin_id(ctx) == ctx.id
