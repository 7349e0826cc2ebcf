"""Batches over the server's limits, against the real server: enqueue_batch splits them,
enqueue_atomic refuses them before sending."""

from __future__ import annotations

import pytest
from fixtures.counting import count_calls

import sepp
from sepp.testing import SeppServer, sepp_server

R = sepp.EnqueueRequest


async def reserve_all(client: sepp.Client, queue: str, count: int) -> list[sepp.Job]:
    jobs: list[sepp.Job] = []
    while len(jobs) < count:
        got = await client.reserve(queue, max_jobs=256, wait_timeout=2)
        assert got is not None, f"only {len(jobs)} of {count} jobs came back"
        jobs.extend(got)
    return jobs


async def test_enqueue_batch_of_300_jobs_is_split_and_keeps_the_callers_order(
    sepp_server: SeppServer,
) -> None:
    async with sepp.open(sepp_server.address) as client:
        assert (await client.get_server_info()).max_enqueue_batch == 256
        calls = count_calls(client)
        jobs = [R("big", "t", custom={"i": i}) for i in range(300)]
        results = await client.enqueue_batch(jobs)
        assert calls == ["EnqueueBatch", "EnqueueBatch"]
        acks = [r for r in results if isinstance(r, sepp.EnqueueAck)]
        assert len(acks) == 300 and len({a.job_id for a in acks}) == 300
        reserved = await reserve_all(client, "big", 300)
        position = {job.id: job.ctx.custom["i"] for job in reserved}
        assert [position[a.job_id] for a in acks] == list(range(300))


async def test_enqueue_batch_over_the_servers_message_size_is_split_by_bytes(
    sepp_server: SeppServer,
) -> None:
    # 18 jobs of 1,000,000 bytes: 18 MB, over the server's 16 MiB message cap in one call.
    payload = sepp.Payload.bytes(b"p" * 1_000_000)
    async with sepp.open(sepp_server.address) as client:
        calls = count_calls(client)
        results = await client.enqueue_batch([R("heavy", "t", payload=payload)] * 18)
        assert len(results) == 18
        assert all(isinstance(r, sepp.EnqueueAck) for r in results), results
        assert calls.count("EnqueueBatch") == 3  # 8 + 8 + 2 jobs of under 8 MiB each
        reserved = await reserve_all(client, "heavy", 18)
        assert {job.payload for job in reserved} == {payload}


async def test_a_servers_smaller_max_enqueue_batch_is_followed() -> None:
    config = {"admin": {"enabled": False}, "limits": {"max_enqueue_batch": 10}}
    async with sepp_server(config) as server, sepp.open(server.address) as client:
        assert (await client.get_server_info()).max_enqueue_batch == 10
        calls = count_calls(client)
        results = await client.enqueue_batch([R("ten", "t") for _ in range(25)])
        assert len(results) == 25 and all(isinstance(r, sepp.EnqueueAck) for r in results)
        assert calls == ["EnqueueBatch"] * 3
        with pytest.raises(sepp.ValidationError, match="at most 10 jobs") as info:
            await client.enqueue_atomic([R("ten", "t") for _ in range(11)])
        assert "max_enqueue_batch" in str(info.value)
        assert calls == ["EnqueueBatch"] * 3  # refused before anything was sent
        assert len(await client.enqueue_atomic([R("ten", "t") for _ in range(10)])) == 10


async def test_enqueue_atomic_over_256_jobs_is_refused_before_sending(
    sepp_server: SeppServer,
) -> None:
    async with sepp.open(sepp_server.address) as client:
        await client.get_server_info()
        calls = count_calls(client)
        with pytest.raises(sepp.ValidationError, match="at most 256 jobs"):
            await client.enqueue_atomic([R("atomic-big", "t") for _ in range(300)])
        assert calls == []


async def test_enqueue_atomic_over_the_servers_message_size_is_refused_before_sending(
    sepp_server: SeppServer,
) -> None:
    # 17 jobs of 1,000,000 bytes: 17 MB, over the 16 MiB the server decodes (it does not
    # advertise the cap, so the client knows it from the tested version).
    payload = sepp.Payload.bytes(b"p" * 1_000_000)
    async with sepp.open(sepp_server.address) as client:
        await client.get_server_info()
        calls = count_calls(client)
        with pytest.raises(sepp.ValidationError, match="message cap") as info:
            await client.enqueue_atomic([R("atomic-heavy", "t", payload=payload)] * 17)
        assert info.value.field == "jobs"
        assert calls == []
        # Just under the cap still goes out whole.
        acks = await client.enqueue_atomic([R("atomic-heavy", "t", payload=payload)] * 16)
        assert len(acks) == 16 and calls == ["EnqueueAtomic"]
