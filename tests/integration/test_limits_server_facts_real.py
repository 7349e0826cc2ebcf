"""The server facts `sepp._limits` is built on, proved against the real server (sepp 0.1.1).

Each test states one fact that docs/limits-design.md relies on; the source it comes from is
the server's `src/storage.rs` (apply_nack, apply_sweep, check_dedup, insert_job) and
`src/queue_server.rs` (reserve, get_server_info). None bounds a wall-clock time from above: a
wake-up is told from a missed one by a long-poll wait far longer than the hang guard.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
import trio

import sepp
from sepp.testing import job_context, sepp_server

pytestmark = [pytest.mark.real_server]

# A long poll that was not woken would end only after LONG_POLL_S; the guard ends the test
# long before that, so "woken" is an ordering fact, not a speed one.
LONG_POLL_S = 240.0
HANG_GUARD_S = 60.0
BASE: dict[str, object] = {
    "admin": {"enabled": False},
    "storage": {"persist_mode": "buffer", "dead_letter_retention_ms": 600_000},
}


def config(**sections: dict[str, object]) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, values in BASE.items():
        assert isinstance(values, dict)
        out[name] = dict(values)
    for name, values in sections.items():
        old = out.get(name)
        out[name] = {**old, **values} if isinstance(old, dict) else values
    return out


async def reserve_one(
    client: sepp.Client, queue: str, *, lease: float = 30.0, wait: float = 5.0
) -> sepp.Job:
    jobs = await client.reserve([queue], lease_duration=lease, wait_timeout=wait)
    assert jobs is not None and len(jobs) == 1, jobs
    return jobs[0]


async def test_a_nack_with_delay_zero_wakes_a_waiting_long_poll_at_once() -> None:
    """A released permit (nack, delay 0) is ready at once and wakes a waiting acquirer."""
    async with sepp_server(BASE) as server:
        async with sepp.open(server.address) as holder, sepp.open(server.address) as waiter:
            await holder.enqueue("permits", "permit")
            held = await reserve_one(holder, "permits")
            got: list[sepp.Job] = []

            async def wait_for_it() -> None:
                jobs = await waiter.reserve(
                    ["permits"], lease_duration=30, wait_timeout=LONG_POLL_S
                )
                got.extend(jobs or ())

            with trio.fail_after(HANG_GUARD_S):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(wait_for_it)
                    await trio.sleep(0.2)  # the long poll is parked on the server
                    assert not got
                    dead = await holder.nack(held.ctx, retry=sepp.Retry.after(0))
            assert dead is False
            assert [j.id for j in got] == [held.id]
            assert got[0].ctx.attempt == 2  # the release cost one attempt


async def test_attempt_counts_every_nack_and_every_lease_expiry() -> None:
    async with sepp_server(BASE) as server:
        async with sepp.open(server.address) as client:
            await client.enqueue("q", "t", max_attempts=5)
            first = await reserve_one(client, "q")
            assert (first.ctx.attempt, first.ctx.max_attempts) == (1, 5)
            await client.nack(first.ctx, retry=sepp.Retry.after(0))
            second = await reserve_one(client, "q", lease=0.3)
            assert second.ctx.attempt == 2
            # Lease expiry: requeued at once (no retry delay), one attempt more.
            third = await reserve_one(client, "q", wait=HANG_GUARD_S)
            assert third.id == first.id and third.ctx.attempt == 3
            with pytest.raises(sepp.AttemptMismatchError):
                await client.ack(second.ctx)  # the expired delivery is fenced off
            await client.nack(third.ctx, retry=sepp.Retry.after(0))
            fourth = await reserve_one(client, "q")
            assert fourth.ctx.attempt == 4 and not fourth.ctx.is_final_attempt


async def test_the_final_attempt_dead_letters_on_nack_and_on_lease_expiry() -> None:
    async with sepp_server(BASE) as server:
        async with sepp.open(server.address) as client:
            await client.enqueue("nacked", "t", max_attempts=2)
            await client.enqueue("expired", "t", max_attempts=2)
            job = await reserve_one(client, "nacked")
            assert await client.nack(job.ctx, retry=sepp.Retry.after(0)) is False
            job = await reserve_one(client, "nacked")
            assert job.ctx.is_final_attempt
            # Any nack on the final attempt dead-letters, even one asking for a delay.
            assert await client.nack(job.ctx, retry=sepp.Retry.after(0)) is True

            job = await reserve_one(client, "expired", lease=0.3)
            again = await reserve_one(client, "expired", lease=0.3, wait=HANG_GUARD_S)
            assert again.ctx.attempt == 2 and again.ctx.is_final_attempt
            with trio.fail_after(HANG_GUARD_S):
                records: list[sepp.DeadLetterRecord] = []
                while len(records) < 2:
                    records += await client.drain_dead_letters(max=10)
                    await trio.sleep(0.1)
            causes = {r.queue: r.cause for r in records}
            assert causes == {
                "nacked": sepp.DeadLetterCause.ATTEMPTS_EXHAUSTED,
                "expired": sepp.DeadLetterCause.LEASE_EXPIRED,
            }
            assert await client.reserve(["expired"], wait_timeout=0) is None


async def test_a_nacked_job_keeps_its_place_in_the_queue() -> None:
    """A node nacked back (or redelivered) is reserved before jobs enqueued after it."""
    async with sepp_server(BASE) as server:
        async with sepp.open(server.address) as client:
            older = await client.enqueue("q", "t")
            # The place is the enqueue time in milliseconds (ties go by job id): a later one.
            await trio.sleep(0.005)
            await client.enqueue("q", "t")
            job = await reserve_one(client, "q")
            assert job.id == older.job_id
            await client.nack(job.ctx, retry=sepp.Retry.after(0))
            assert (await reserve_one(client, "q")).id == older.job_id


async def test_a_dedup_hit_returns_the_original_id_after_it_was_acked() -> None:
    async with sepp_server(BASE) as server:
        async with sepp.open(server.address) as client:
            first = await client.enqueue("q", "t", idempotency_key="succ:abc")
            job = await reserve_one(client, "q")
            await client.ack(job.ctx)
            again = await client.enqueue("q", "t", idempotency_key="succ:abc")
            assert again == sepp.EnqueueAck(first.job_id, deduplicated=True)
            assert await client.reserve(["q"], wait_timeout=0) is None  # nothing new
            # Keys are per queue.
            other = await client.enqueue("q2", "t", idempotency_key="succ:abc")
            assert other.deduplicated is False
            # A hit inside an enqueue_batch also answers with the original id, per job.
            acks = await client.enqueue_batch(
                [
                    sepp.EnqueueRequest("q", "t", idempotency_key="succ:abc"),
                    sepp.EnqueueRequest("q", "t", idempotency_key="succ:new"),
                ]
            )
            assert isinstance(acks[0], sepp.EnqueueAck) and acks[0].job_id == first.job_id
            assert acks[0].deduplicated and isinstance(acks[1], sepp.EnqueueAck)
            assert not acks[1].deduplicated


async def test_the_dedup_window_ends_and_is_not_advertised() -> None:
    async with sepp_server(config(storage={"dedup_window_ms": 1_000})) as server:
        async with sepp.open(server.address) as client:
            info = await client.get_server_info()
            assert not any("dedup" in name for name in type(info).__dataclass_fields__)
            first = await client.enqueue("q", "t", idempotency_key="k")
            await trio.sleep(1.5)
            second = await client.enqueue("q", "t", idempotency_key="k")
            assert second.deduplicated is False and second.job_id != first.job_id


async def test_scheduled_delivery_wakes_a_waiting_long_poll_when_due() -> None:
    async with sepp_server(BASE) as server:
        async with sepp.open(server.address) as client, sepp.open(server.address) as waiter:
            info = await client.get_server_info()
            due = info.server_time + timedelta(seconds=1)
            ack = await client.enqueue("q", "t", scheduled_at=due)
            assert await waiter.reserve(["q"], wait_timeout=0) is None  # not before
            with trio.fail_after(HANG_GUARD_S):
                jobs = await waiter.reserve(["q"], wait_timeout=LONG_POLL_S)
            assert jobs is not None and [j.id for j in jobs] == [ack.job_id]
            after = await client.get_server_info()
            assert after.server_time >= due
            # A nack with a delay is the same timer: it comes back when due, woken too.
            await client.nack(jobs[0].ctx, retry=sepp.Retry.after(1.0))
            with trio.fail_after(HANG_GUARD_S):
                back = await waiter.reserve(["q"], wait_timeout=LONG_POLL_S)
            assert back is not None and back[0].ctx.attempt == 2


async def test_the_granted_expiry_minus_the_lease_is_the_servers_time() -> None:
    """How a limiter reads the server's clock from any reserve (no extra call)."""
    async with sepp_server(BASE) as server:
        async with sepp.open(server.address) as client:
            await client.enqueue("q", "t")
            before = (await client.get_server_info()).server_time
            job = await reserve_one(client, "q", lease=20.0)
            after = (await client.get_server_info()).server_time
            reserved_at = job.ctx.lease_expires_at - timedelta(seconds=20)
            assert before <= reserved_at <= after
            # Clamped leases: the granted expiry says so.
            await client.enqueue("q", "t")
            info = await client.get_server_info()
            long = await reserve_one(client, "q", lease=10_000.0)
            granted = long.ctx.lease_expires_at - info.server_time
            assert granted <= info.max_lease_duration + timedelta(seconds=5)


async def test_strict_mode_is_server_wide_and_declared_queues_pass() -> None:
    strict = config(server={"strict_queues": True})
    strict["queues"] = [{"name": "declared"}]
    async with sepp_server(strict) as server:
        async with sepp.open(server.address) as client:
            info = await client.get_server_info()
            assert info.strict_queues is True
            ack = await client.enqueue("declared", "t")
            assert ack.job_id
            results = await client.enqueue_batch([sepp.EnqueueRequest("sepp-limit.x", "t")])
            assert isinstance(results[0], sepp.UnknownQueue)
            with pytest.raises(sepp.UnknownQueuesError):
                await client.reserve(["declared", "sepp-limit.x"], wait_timeout=0)


async def test_max_attempts_is_clamped_to_a_ceiling_serverinfo_does_not_advertise() -> None:
    capped = config()
    capped["queues"] = [{"name": "low", "max_attempts_ceiling": 4}]
    async with sepp_server(capped) as server:
        async with sepp.open(server.address) as client:
            info = await client.get_server_info()
            assert not any("attempt" in name for name in type(info).__dataclass_fields__)
            await client.enqueue("q", "t", max_attempts=1_000_000)
            await client.enqueue("low", "t", max_attempts=1_000_000)
            assert (await reserve_one(client, "q")).ctx.max_attempts == 100
            assert (await reserve_one(client, "low")).ctx.max_attempts == 4


async def test_lease_calls_on_a_foreign_id_tell_in_flight_from_not() -> None:
    """NOT_FOUND: not in flight (ready, scheduled, acked or never); FAILED_PRECONDITION: in
    flight under another attempt."""
    async with sepp_server(BASE) as server:
        async with sepp.open(server.address) as client:
            await client.enqueue("q", "t")
            job = await reserve_one(client, "q")
            await client.nack(job.ctx, retry=sepp.Retry.after(0))
            with pytest.raises(sepp.JobNotFoundError):
                await client.extend(job.ctx, 10)  # ready again: not in flight
            again = await reserve_one(client, "q")
            with pytest.raises(sepp.AttemptMismatchError):
                await client.extend(job.ctx, 10)  # in flight under attempt 2
            await client.ack(again.ctx)
            with pytest.raises(sepp.JobNotFoundError):
                await client.ack(again.ctx)
            stranger = job_context(job_id=str(uuid.uuid4()), queue="q")
            with pytest.raises(sepp.JobNotFoundError):
                await client.extend(stranger, 10)
