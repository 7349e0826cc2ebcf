"""The rules global permits follow (`sepp._limits.permits`, no I/O) and the epochs they live
in (`sepp._limits.timing`)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sepp import Job
from sepp._limits import permits as p
from sepp._limits.timing import Epochs, epochs_for
from sepp.testing import job_context

pytestmark = [pytest.mark.unit]


def permit(
    epoch: int, slot: int = 0, gen: int = 0, attempt: int = 1, max_attempts: int = 100
) -> p.Permit:
    job = Job(
        None,
        job_context(
            p.PERMIT_TYPE,
            queue="sepp-limit.x.c",
            attempt=attempt,
            max_attempts=max_attempts,
            custom={p.EPOCH: epoch, p.SLOT: slot, p.GENERATION: gen},
        ),
    )
    found = p.permit_of(job)
    assert found is not None
    return found


def test_queue_names_are_readable_without_a_key_and_digested_with_one() -> None:
    assert p.queue_name("c", "billing.sync", "") == "sepp-limit.billing.sync.c"
    keyed = p.queue_name("r", "billing.sync", "tenant 42 / €")
    prefix = "sepp-limit.billing.sync.r."
    assert keyed.startswith(prefix) and len(keyed) == len(prefix) + 32
    assert keyed != p.queue_name("r", "billing.sync", "tenant 43 / €")
    assert len(p.queue_name("c", "n" * 128, "k" * 10_000).encode()) <= 512


def test_a_permit_request_carries_its_identity_and_key() -> None:
    request = p.permit_request("q", 7, 2, 3)
    assert request.idempotency_key == "p:7:2:3"
    assert dict(request.custom) == {p.EPOCH: 7, p.SLOT: 2, p.GENERATION: 3}
    assert request.job_type == p.PERMIT_TYPE and request.scheduled_at is None
    marker = p.marker_request("q", "abc", 7, datetime.now(timezone.utc))
    assert marker.idempotency_key == "c:abc:7" and marker.job_type == p.MARKER_TYPE


def test_markers_and_malformed_jobs_are_no_permits() -> None:
    for custom in (
        {},
        {p.EPOCH: 1, p.SLOT: 0},
        {p.EPOCH: -1, p.SLOT: 0, p.GENERATION: 0},
        {p.EPOCH: "1", p.SLOT: 0, p.GENERATION: 0},
    ):
        job = Job(None, job_context(p.PERMIT_TYPE, custom=custom))
        assert p.permit_of(job) is None
    assert p.permit_of(Job(None, job_context(p.MARKER_TYPE))) is None
    assert p.on_reserved(None, 5) is p.Next.DISCARD


def test_only_a_current_permit_before_its_final_attempt_is_held() -> None:
    assert p.on_reserved(permit(5), 5) is p.Next.HOLD
    assert p.on_reserved(permit(6), 5) is p.Next.HOLD  # a later epoch: the skew
    assert p.on_reserved(permit(4), 5) is p.Next.HAND_OVER
    assert p.on_reserved(permit(5, attempt=99), 5) is p.Next.HOLD
    assert p.on_reserved(permit(5, attempt=100), 5) is p.Next.REFRESH


def test_a_release_nacks_until_the_attempts_run_low_then_refreshes() -> None:
    none: frozenset[int] = frozenset()
    assert p.on_released(permit(5, attempt=98), 5, none) is p.Next.NACK
    assert p.on_released(permit(5, attempt=99), 5, none) is p.Next.REFRESH
    assert p.on_released(permit(4), 5, none) is p.Next.HAND_OVER
    assert p.on_released(permit(4), 5, frozenset({5})) is p.Next.CONTINUE
    assert p.successor(permit(4, 3, 9), p.Next.HAND_OVER, 5) == (5, 3, 0)
    assert p.successor(permit(4, 3, 9), p.Next.CONTINUE, 5) == (5, 3, 1)
    assert p.successor(permit(5, 3, 9), p.Next.REFRESH, 5) == (5, 3, 10)
    with pytest.raises(ValueError):
        p.successor(permit(5), p.Next.NACK, 5)


@given(st.integers(min_value=2, max_value=100), st.integers(min_value=1, max_value=100))
def test_a_held_permit_can_never_be_dead_lettered_by_its_holders_crash(m: int, a: int) -> None:
    """Held at attempt a ≤ m-1: a crash expires it to a+1 ≤ m (no dead letter); released by
    nack only when the next holder gets it at ≤ m-1."""
    if a > m:
        return
    how = p.on_reserved(permit(1, attempt=a, max_attempts=m), 1)
    if how is p.Next.HOLD:
        assert a + 1 <= m
        if p.on_released(permit(1, attempt=a, max_attempts=m), 1, frozenset()) is p.Next.NACK:
            assert p.on_reserved(permit(1, attempt=a + 1, max_attempts=m), 1) is p.Next.HOLD


def plan(
    token: p.Permit, *, now_epoch: int = 5, end_epoch: int = 5, covers: bool = True
) -> p.TokenPlan:
    return p.on_token(
        token,
        epoch_now=now_epoch,
        epoch_of_cooldown_end=end_epoch,
        granted_at=1000.0,
        per_s=2.0,
        lease_covers_per=covers,
    )


def test_a_token_cools_down_on_its_lease_unless_it_must_move() -> None:
    assert plan(permit(5)).use is p.TokenUse.KEEP_LEASE
    assert plan(permit(5), covers=False).use is p.TokenUse.NACK_LATER
    crossing = plan(permit(5), end_epoch=6)
    assert (crossing.use, crossing.successor, crossing.successor_at) == (
        p.TokenUse.SUCCEED,
        (6, 0, 0),
        1002.0,
    )
    worn = plan(permit(5, gen=4, attempt=99))
    assert (worn.use, worn.successor) == (p.TokenUse.SUCCEED, (5, 0, 5))
    old = plan(permit(4, slot=3))
    assert (old.use, old.successor) == (p.TokenUse.HAND_OVER, (5, 3, 0))
    assert (
        p.on_token(
            None, epoch_now=1, epoch_of_cooldown_end=1, granted_at=0, per_s=1, lease_covers_per=True
        ).use
        is p.TokenUse.DISCARD
    )


def test_epochs_cut_the_servers_clock_and_open_genesis_after_the_claims() -> None:
    epochs = Epochs(length_s=600.0, skew_s=1.0, claim_s=11.0)
    assert epochs.of(1199.9) == 1 and epochs.of(1200.0) == 2 and epochs.start(2) == 1200.0
    assert epochs.genesis_delay_s == 13.0
    assert not epochs.genesis_open(1200.0)  # holders of epoch 1 are claiming epoch 2
    assert not epochs.genesis_open(1212.9)
    assert epochs.genesis_open(1213.0)
    assert epochs.genesis_open(1798.9) and not epochs.genesis_open(1799.0)
    assert epochs.claim_deadline(2) == 1212.0 < epochs.genesis_opens(2)
    assert epochs.next_genesis_window(1205.0) == 1213.0
    assert epochs.next_genesis_window(1300.0) == 1300.0
    assert epochs.next_genesis_window(1799.5) == 1813.0


def test_epochs_are_long_against_the_lease_and_the_window() -> None:
    assert epochs_for(lease_s=30, per_s=None).length_s == 600.0
    assert epochs_for(lease_s=300, per_s=None).length_s == 1200.0
    assert epochs_for(lease_s=30, per_s=3600).length_s > 2 * 3600
    short = epochs_for(lease_s=1, per_s=None, epoch_s=6, skew_s=0.2)
    assert short.length_s == 6 and short.genesis_delay_s < 1.5
