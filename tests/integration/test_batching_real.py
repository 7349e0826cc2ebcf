"""Opt-in auto-batching of single enqueues, against the real server."""

from __future__ import annotations

import pytest
import trio
from fixtures.counting import count_calls
from trio.testing import wait_all_tasks_blocked

import sepp
from sepp.testing import SeppServer


async def test_concurrent_enqueues_share_batches_and_keep_own_results(
    sepp_server: SeppServer,
) -> None:
    batching = sepp.Batching(max_batch=64, max_delay=0.05)
    async with sepp.open(sepp_server.address, enqueue_batching=batching) as client:
        calls = count_calls(client)
        acks: dict[int, sepp.EnqueueAck] = {}
        rejected: dict[int, sepp.JobRejection] = {}

        async def one(i: int) -> None:
            big = sepp.Payload.bytes(b"x" * 1_100_000) if i % 50 == 7 else None
            try:
                acks[i] = await client.enqueue("auto", "t", payload=big, custom={"i": i})
            except sepp.JobRejectedError as exc:
                rejected[i] = exc.rejection

        async with trio.open_nursery() as nursery:
            for i in range(200):
                nursery.start_soon(one, i)
        assert sorted(rejected) == [7, 57, 107, 157]
        assert all(isinstance(r, sepp.PayloadTooLarge) for r in rejected.values())
        assert len({a.job_id for a in acks.values()}) == 196
        assert 4 <= len(calls) <= 20, calls  # 200 jobs, 64 per batch; bytes split the big ones
        jobs = await client.reserve("auto", max_jobs=256, wait_timeout=1)
        assert jobs is not None
        assert {j.id: j.ctx.custom["i"] for j in jobs} == {a.job_id: i for i, a in acks.items()}


async def test_cancelled_caller_job_is_withdrawn_before_sending(sepp_server: SeppServer) -> None:
    # Ordered by events, not by racing timeouts: the batch fills (3 live jobs) only after the
    # cancelled caller's job was withdrawn, long before max_delay. No eager calls, so that the
    # first job waits in the batch.
    batching = sepp.Batching(max_batch=3, max_delay=5, eager_calls=0)
    address = sepp_server.address
    async with sepp.open(address, enqueue_batching=batching, validate_locally=False) as client:
        kept: list[sepp.EnqueueAck] = []

        async def enqueue(job_type: str, task_status: trio.TaskStatus[None]) -> None:
            task_status.started()
            kept.append(await client.enqueue("withdraw", job_type))

        async with trio.open_nursery() as nursery:
            await nursery.start(enqueue, "keep")
            with trio.CancelScope() as cancelled:
                async with trio.open_nursery() as doomed:
                    await doomed.start(enqueue, "cancelled")
                    await wait_all_tasks_blocked()  # both wait in the batch
                    cancelled.cancel()
            await nursery.start(enqueue, "fill-1")
            await nursery.start(enqueue, "fill-2")  # three live jobs: the batch goes out
        assert len(kept) == 3
        jobs = await client.reserve("withdraw", max_jobs=10, wait_timeout=0.5)
        assert jobs is not None
        assert sorted(j.ctx.job_type for j in jobs) == ["fill-1", "fill-2", "keep"]


async def test_a_lone_enqueue_does_not_wait_for_max_delay(sepp_server: SeppServer) -> None:
    batching = sepp.Batching(max_delay=3600)
    async with sepp.open(sepp_server.address, enqueue_batching=batching) as client:
        calls = count_calls(client)
        with trio.fail_after(60):  # far below max_delay: the job went out at once
            for i in range(3):
                assert (await client.enqueue("lone", "t", custom={"i": i})).job_id
        assert calls.count("EnqueueBatch") == 3  # one call per job: none waited for another


async def test_whole_batch_failure_raises_typed_error_in_each_caller(
    sepp_server: SeppServer,
) -> None:
    batching = sepp.Batching(max_batch=10, max_delay=0.2)
    async with sepp.open(sepp_server.address, enqueue_batching=batching) as client:
        await client.get_server_info()
        await sepp_server.stop()
        errors: list[BaseException] = []

        async def one() -> None:
            try:
                await client.enqueue("down", "t")
            except sepp.ClientError as exc:
                errors.append(exc)

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(one)
        assert len(errors) == 5
        assert all(isinstance(e, (sepp.ConnectError, sepp.TransportError)) for e in errors)
        assert len({id(e) for e in errors}) == 5  # each caller gets its own exception object
        await sepp_server.start()
        assert (await client.enqueue("down", "t")).job_id


async def test_batching_options_are_validated() -> None:
    with pytest.raises(sepp.ValidationError):
        sepp.Batching(max_batch=0)
    with pytest.raises(sepp.ValidationError):
        sepp.Batching(max_delay=-1)
    with pytest.raises(sepp.ValidationError):
        sepp.Batching(eager_calls=-1)


@pytest.mark.parametrize("batching", [None, sepp.Batching()], ids=["direct", "batched"])
async def test_a_closed_client_raises_one_error_with_one_code(
    batching: sepp.Batching | None, sepp_server: SeppServer
) -> None:
    async with sepp.open(sepp_server.address, enqueue_batching=batching) as client:
        assert (await client.enqueue("closing", "t")).job_id
    with pytest.raises(sepp.TransportError) as info:
        await client.enqueue("closing", "t")
    error = info.value
    # A direct enqueue names what the caller called; batched callers share an EnqueueBatch.
    method = "Enqueue" if batching is None else "EnqueueBatch"
    assert (error.code, error.details, str(error)) == (
        sepp.StatusCode.UNAVAILABLE,
        "the client is closed",
        f"{method}: UNAVAILABLE: the client is closed",
    )
