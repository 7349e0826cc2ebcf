"""Deferral against the real server: a job given back for later costs no attempt and is never
dead-lettered by it, and a crash between the copy's enqueue and the original's ack leaves
exactly one job runnable once the original is deferred again."""

from __future__ import annotations

from datetime import timedelta

import pytest
import trio

import sepp
from sepp._limits import deferral
from sepp.testing import sepp_server

pytestmark = [pytest.mark.real_server]

HANG_GUARD_S = 60.0
BASE: dict[str, object] = {
    "admin": {"enabled": False},
    "storage": {"persist_mode": "buffer", "dead_letter_retention_ms": 600_000},
}
TRACE = sepp.TraceContext("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")


async def reserve_one(client: sepp.Client, *, lease: float = 30.0, wait: float = 5.0) -> sepp.Job:
    with trio.fail_after(HANG_GUARD_S):
        jobs = await client.reserve(["q"], lease_duration=lease, wait_timeout=wait)
    assert jobs is not None and len(jobs) == 1
    return jobs[0]


async def all_runnable(client: sepp.Client) -> list[sepp.Job]:
    jobs = await client.reserve(["q"], wait_timeout=0, max_jobs=100)
    return jobs or []


async def test_a_deferred_job_keeps_everything_and_its_attempts_even_on_the_final_one() -> None:
    async with sepp_server(BASE) as server, sepp.open(server.address) as client:
        first = await client.enqueue(
            "q",
            "sync",
            payload=sepp.Payload.json({"tenant": "acme"}),
            max_attempts=2,
            priority=7,
            custom={"tenant": "acme"},
            trace_context=TRACE,
        )
        job = await reserve_one(client)
        await client.nack(job.ctx, retry=sepp.Retry.after(0))
        job = await reserve_one(client)
        assert job.ctx.is_final_attempt
        done = await deferral.defer(client, job)
        assert done.original_acked and not done.deduplicated and done.copy_id != job.id
        copy = await reserve_one(client)
        assert copy.id == done.copy_id
        ctx = copy.ctx
        assert (ctx.job_type, ctx.priority, ctx.trace_context) == ("sync", 7, TRACE)
        assert copy.payload == job.payload and ctx.custom["tenant"] == "acme"
        # The final attempt was given back, not spent: one attempt of one, shown as 2 of 2.
        assert (ctx.attempt, ctx.max_attempts) == (1, 1)
        assert (deferral.logical_attempt(ctx), deferral.logical_max_attempts(ctx)) == (2, 2)
        assert deferral.origin_id(ctx) == first.job_id and deferral.deferrals(ctx) == 1
        # Deferred again, it still runs once more, and keeps its origin.
        again = await deferral.defer(client, copy, delay_s=0.5)
        assert again.original_acked
        third = await reserve_one(client, wait=HANG_GUARD_S)
        assert deferral.origin_id(third.ctx) == first.job_id
        assert deferral.deferrals(third.ctx) == 2 and deferral.logical_attempt(third.ctx) == 2
        await client.ack(third.ctx)
        assert await client.drain_dead_letters(max=10) == []


async def test_a_crash_between_copy_and_ack_leaves_one_job_after_the_dedup_hit() -> None:
    async with sepp_server(BASE) as server, sepp.open(server.address) as client:
        await client.enqueue("q", "sync", max_attempts=5)
        job = await reserve_one(client, lease=0.5)
        # The deferring process dies after the copy's enqueue (deferred 2 s), before the ack.
        later = (await client.get_server_info()).server_time + timedelta(seconds=2)
        (copy,) = await client.enqueue_batch([deferral.deferral_request(job, scheduled_at=later)])
        assert isinstance(copy, sepp.EnqueueAck)
        # Its lease expires; the original comes back (attempt 2) before the copy is due.
        back = await reserve_one(client, wait=HANG_GUARD_S)
        assert back.id == job.id and back.ctx.attempt == 2
        done = await deferral.defer(client, back, scheduled_at=later)
        assert done.deduplicated and done.copy_id == copy.job_id and done.original_acked
        due = await reserve_one(client, wait=HANG_GUARD_S)  # the copy, when due
        assert due.id == copy.job_id
        assert deferral.logical_attempt(due.ctx) == 1  # the first copy's count stands
        assert await all_runnable(client) == []  # and nothing else


async def test_a_crash_on_the_final_attempt_dead_letters_the_original_and_the_copy_runs() -> None:
    async with sepp_server(BASE) as server, sepp.open(server.address) as client:
        await client.enqueue("q", "sync", max_attempts=1)
        job = await reserve_one(client, lease=0.5)
        (copy,) = await client.enqueue_batch([deferral.deferral_request(job, scheduled_at=None)])
        assert isinstance(copy, sepp.EnqueueAck)
        with trio.fail_after(HANG_GUARD_S):
            records: list[sepp.DeadLetterRecord] = []
            while not records:
                records = await client.drain_dead_letters(max=10)
                await trio.sleep(0.1)
        assert [(r.job_id, r.cause) for r in records] == [
            (job.id, sepp.DeadLetterCause.LEASE_EXPIRED)
        ]
        assert [j.id for j in await all_runnable(client)] == [copy.job_id]


async def test_a_refused_copy_leaves_the_original_held() -> None:
    config = {**BASE, "limits": {"max_custom_entries": 2}}
    async with sepp_server(config) as server, sepp.open(server.address) as client:
        await client.enqueue("q", "sync", custom={"a": 1, "b": 2})
        job = await reserve_one(client)
        done = await deferral.defer(client, job)
        assert done.copy_id is None and isinstance(done.rejection, sepp.CustomEntriesTooMany)
        await client.extend(job.ctx, 30)  # still ours
        await client.ack(job.ctx)


async def test_a_lost_lease_while_deferring_is_said_and_the_copy_stands() -> None:
    async with sepp_server(BASE) as server, sepp.open(server.address) as client:
        await client.enqueue("q", "sync")
        job = await reserve_one(client, lease=0.3)
        back = await reserve_one(client, wait=HANG_GUARD_S)  # expired and redelivered
        done = await deferral.defer(client, job)  # the stale delivery defers
        assert done.copy_id is not None and not done.original_acked
        again = await deferral.defer(client, back)  # the live one: the copy's key hits
        assert again.deduplicated and again.copy_id == done.copy_id and again.original_acked
        assert [j.id for j in await all_runnable(client)] == [done.copy_id]
