"""sepp.testing.MemoryServer as users run it: the pytest fixture under a MockClock, the async
context manager on trio and asyncio, the blocking start/stop, a ManualClock, the dev-server
command; its HTTP/2 side (flow control, GOAWAY, grpc-timeout) and what it costs to start."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import trio
import trio.testing

import sepp
from sepp.testing import ManualClock, MemoryServer, memory_server

pytestmark = pytest.mark.memory_server


@pytest.fixture(params=["codec", "h2"])
def engine(request: pytest.FixtureRequest) -> str:
    """The memory server's HTTP/2 side: ours, and the reference on h2."""
    return str(request.param)


def job(queue: str = "q", job_type: str = "t", **kw: object) -> sepp.EnqueueRequest:
    return sepp.EnqueueRequest(queue, job_type, **kw)  # type: ignore[arg-type]


async def test_the_fixture_runs_in_virtual_time(
    memory_server: MemoryServer, autojump_clock: trio.testing.MockClock
) -> None:
    started_at = memory_server.now()
    async with sepp.open(memory_server.address) as client:
        await client.enqueue(job(scheduled_at=started_at + timedelta(days=30)))
        assert memory_server.depths("q").scheduled == 1
        await memory_server.advance(timedelta(days=30))
        assert memory_server.depths("q").ready == 1
        [reserved] = await client.reserve(["q"], lease_duration=60) or []
        assert reserved.ctx.scheduled_at == started_at + timedelta(days=30)
        await trio.sleep(61)  # the lease runs out in virtual time: redelivered
        [again] = await client.reserve(["q"], lease_duration=60) or []
        assert again.ctx.id == reserved.ctx.id and again.ctx.attempt == 2
        assert memory_server.now() - started_at >= timedelta(days=30, seconds=61)


async def test_a_worker_retries_with_backoff_in_virtual_time(
    memory_server: MemoryServer, autojump_clock: trio.testing.MockClock
) -> None:
    attempts: list[tuple[int, float]] = []
    router = sepp.Router()

    @router.handler("flaky")
    async def flaky(payload: object, ctx: sepp.JobContext) -> None:
        attempts.append((ctx.attempt, trio.current_time()))
        if ctx.attempt < 3:
            raise sepp.HandlerError.retry_after("not yet", timedelta(minutes=10))

    async with sepp.open(memory_server.address) as client:
        await client.enqueue(job(job_type="flaky"))
        for _ in range(3):
            await sepp.Worker(client, "q", handlers=router).run(until_idle=True)
            await memory_server.advance(timedelta(minutes=10))
    assert [attempt for attempt, _ in attempts] == [1, 2, 3]
    assert attempts[2][1] - attempts[0][1] >= 1200  # two ten-minute delays, virtual
    assert memory_server.depths("q") == sepp.testing.QueueDepths()


async def test_a_long_handler_keeps_its_lease_in_virtual_time(
    memory_server: MemoryServer, autojump_clock: trio.testing.MockClock
) -> None:
    # The Worker converts lease expiries with the run's wall clock, which the server shares:
    # a ten-minute handler on a 30 s lease is extended, never redelivered.
    runs: list[int] = []
    router = sepp.Router()

    @router.handler("slow")
    async def slow(payload: object, ctx: sepp.JobContext) -> None:
        runs.append(ctx.attempt)
        await trio.sleep(600)

    async with sepp.open(memory_server.address) as client:
        await client.enqueue(job(job_type="slow"))
        await sepp.Worker(client, "q", handlers=router, lease_duration=30).run(until_idle=True)
    assert runs == [1]
    assert memory_server.depths("q") == sepp.testing.QueueDepths()


async def test_a_lease_that_runs_out_cancels_the_handler_and_redelivers(
    memory_server: MemoryServer, autojump_clock: trio.testing.MockClock
) -> None:
    runs: list[int] = []
    router = sepp.Router()

    @router.handler("stuck")
    async def stuck(payload: object, ctx: sepp.JobContext) -> None:
        runs.append(ctx.attempt)
        if ctx.attempt == 1:
            await trio.sleep(600)

    async with sepp.open(memory_server.address) as client:
        await client.enqueue(job(job_type="stuck"))
        worker = sepp.Worker(client, "q", handlers=router, lease_duration=30, auto_extend=False)
        await worker.run(until_idle=True)
    assert runs == [1, 2]


async def test_a_waiting_reserve_wakes_on_enqueue_and_returns_empty_at_stop(engine: str) -> None:
    async with memory_server(wire_engine=engine) as server, sepp.open(server.address) as client:
        got: list[object] = []
        async with trio.open_nursery() as nursery:

            async def wait() -> None:
                got.append(await client.reserve(["q"], lease_duration=30, wait_timeout=60))

            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            await client.enqueue(job(job_type="wake"))
        assert [j.ctx.job_type for j in got[0]] == ["wake"]  # type: ignore[attr-defined]
    # A long poll pending when the server stops returns empty (GOAWAY follows).
    server = MemoryServer(wire_engine=engine)
    async with trio.open_nursery() as nursery:
        answers: list[object] = []
        stop, serving = trio.Event(), trio.Event()

        async def serve() -> None:
            async with server.serving():
                serving.set()
                await stop.wait()

        nursery.start_soon(serve)
        await serving.wait()
        async with sepp.open(server.address) as client:
            async with trio.open_nursery() as inner:

                async def wait_long() -> None:
                    answers.append(await client.reserve(["q"], lease_duration=30, wait_timeout=60))

                inner.start_soon(wait_long)
                await trio.testing.wait_all_tasks_blocked()
                stop.set()
        assert answers == [None]


async def test_a_long_poll_given_up_by_its_caller_is_dropped(engine: str) -> None:
    async with memory_server(wire_engine=engine) as server, sepp.open(server.address) as client:
        with trio.move_on_after(0.2):  # sent as grpc-timeout; the cancel resets the stream
            await client.reserve(["q"], lease_duration=30, wait_timeout=30)
        # The abandoned long poll took nothing: the next reserve gets the job.
        await client.enqueue(job())
        jobs = await client.reserve(["q"], lease_duration=30)
        assert jobs is not None and len(jobs) == 1


async def test_big_messages_go_through_flow_control_both_ways(engine: str) -> None:
    config = {"limits": {"max_payload_bytes": 1 << 20, "max_reserve_batch": 64}}
    async with (
        memory_server(config, wire_engine=engine) as server,
        sepp.open(server.address) as client,
    ):
        big = sepp.Payload(os.urandom(900_000), "application/octet-stream")
        await client.enqueue(job(payload=big))
        chunks = [sepp.Payload(bytes([n]) * 100_000, "x") for n in range(30)]
        await client.enqueue_batch([job(payload=p) for p in chunks])
        jobs = await client.reserve(["q"], lease_duration=30, max_jobs=64) or []
        assert [j.payload for j in jobs] == [big, *chunks]  # 3.9 MB in one response


async def test_on_asyncio_too(engine: str) -> None:
    def main() -> list[str]:
        async def body() -> list[str]:
            async with (
                memory_server(wire_engine=engine) as server,
                sepp.open(server.address) as client,
            ):
                await client.enqueue(job(job_type="a"))
                await client.enqueue(job(job_type="b", priority=9))
                jobs = await client.reserve(["q"], lease_duration=30, max_jobs=5) or []
                for reserved in jobs:
                    await client.ack(reserved.ctx)
                return [j.ctx.job_type for j in jobs]

        return asyncio.run(body())

    assert await trio.to_thread.run_sync(main) == ["b", "a"]


def test_blocking_start_stop_and_a_restart_that_keeps_the_jobs() -> None:
    server = MemoryServer({"storage": {"dead_letter_retention_ms": 60_000}}).start()
    try:
        with sepp.SyncClient(server.address) as client:
            client.enqueue(job(job_type="kept"))
            [held] = client.reserve(["q"], lease_duration=60) or []
        address = server.address
        server.stop()
        assert not server.running
        server.start()  # the same port, the same jobs: a restart
        assert server.address == address
        with sepp.SyncClient(server.address) as client:
            client.ack(held.ctx)  # the lease outlived the restart
            assert client.reserve(["q"], lease_duration=1, wait_timeout=0) is None
    finally:
        server.stop()


async def test_a_manual_clock_decides_leases_and_schedules() -> None:
    clock = ManualClock()
    handled: list[int] = []
    router = sepp.Router()

    @router.handler("t")
    async def handle(payload: object, ctx: sepp.JobContext) -> None:
        handled.append(ctx.attempt)

    async with memory_server(clock=clock) as server, sepp.open(server.address) as client:
        await client.enqueue(job(scheduled_at=clock.now() + timedelta(days=2)))
        await sepp.Worker(client, "q", handlers=router).run(until_idle=True)
        assert handled == []  # not due
        await server.advance(timedelta(days=2))
        await sepp.Worker(client, "q", handlers=router).run(until_idle=True)
        assert handled == [1]
        assert server.now() == clock.now().replace(
            microsecond=clock.now().microsecond // 1000 * 1000
        )


async def test_the_dev_server_command() -> None:
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "sepp", "dev-server", "--listen", "127.0.0.1:0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        seen = b""
        with trio.fail_after(60):
            while b"queue server listening" not in seen:
                seen += await process.stderr.receive_some(4096)
        address = re.search(rb"addr=(\S+)", seen).group(1).decode()  # type: ignore[union-attr]
        async with sepp.open(address) as client:
            await client.enqueue(job())
            assert (await client.get_server_info()).server_version == "0.1.1"
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(60):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_the_clients_own_schedule_check_follows_virtual_time(
    memory_server: MemoryServer, autojump_clock: trio.testing.MockClock
) -> None:
    # The client checks a schedule against the server's horizon locally, with the run's wall
    # clock: after 20 virtual days, "29 days from the server's now" is within the horizon.
    async with sepp.open(memory_server.address) as client:
        await client.get_server_info()  # the limits are cached at the start
        await memory_server.advance(timedelta(days=20))
        await client.enqueue(job(scheduled_at=memory_server.now() + timedelta(days=29)))
        with pytest.raises(sepp.JobRejectedError, match="horizon"):
            await client.enqueue(job(scheduled_at=memory_server.now() + timedelta(days=31)))
    assert memory_server.depths("q").scheduled == 1


async def test_the_wall_clock_runs_with_a_mock_clock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from sepp._runtime import wall_clock

    assert wall_clock.virtual()
    before = wall_clock.utc_now()
    await trio.sleep(3600)
    assert wall_clock.utc_now() - before == timedelta(hours=1)


async def test_the_wall_clock_is_the_systems_on_trios_own_clock() -> None:
    from sepp._runtime import wall_clock

    assert not wall_clock.virtual()
    before = time.time_ns()
    read = wall_clock.wall_ns()
    assert before <= read <= time.time_ns()  # read between two readings of the system's
