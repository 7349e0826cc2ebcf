"""Stopping long-running commands: signal escalation, and the Worker's immediate shutdown that
a second signal asks for."""

from __future__ import annotations

import os
import signal

import pytest
import trio
from fixtures.fake_client import FakeClient, RecordingLogger
from trio.testing import MockClock

import sepp
from sepp import Retry
from sepp._cli._signals import run_until_signalled

# -- run_until_signalled (real signals, sent to this process) ----------------------------------


def kill_self(sig: signal.Signals) -> None:
    os.kill(os.getpid(), sig)


async def test_each_signal_takes_the_next_step_until_the_body_returns() -> None:
    seen: list[str] = []
    stopped = trio.Event()

    def graceful(sig: signal.Signals) -> None:
        seen.append(f"graceful {sig.name}")
        kill_self(signal.SIGINT)  # the operator insists

    def immediate(sig: signal.Signals) -> None:
        seen.append(f"immediate {sig.name}")
        stopped.set()

    async def body() -> None:
        kill_self(signal.SIGTERM)
        await stopped.wait()

    with trio.fail_after(10):
        hard_stopped = await run_until_signalled(body, [graceful, immediate])
    assert seen == ["graceful SIGTERM", "immediate SIGINT"]
    assert hard_stopped is False


async def test_a_signal_beyond_the_steps_cancels_the_body() -> None:
    cancelled = False

    async def body() -> None:
        nonlocal cancelled
        kill_self(signal.SIGTERM)
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled = True
            raise

    with trio.fail_after(10):
        hard_stopped = await run_until_signalled(body, [lambda sig: kill_self(sig)])
    assert hard_stopped is True and cancelled


async def test_the_bodys_error_comes_out_unwrapped() -> None:
    async def body() -> None:
        raise sepp.ConnectError("127.0.0.1:1", "refused")

    with pytest.raises(sepp.ConnectError):
        await run_until_signalled(body, [])


# -- Worker.shutdown(now=True) (what the second signal calls) ------------------------------------


def make_worker(fake: FakeClient) -> sepp.Worker:
    return sepp.Worker(
        fake,  # type: ignore[arg-type]
        ["q"],
        shutdown_timeout=30,
        logger=RecordingLogger(),
        _wall_clock=fake.now,
    )


async def test_ending_the_grace_period_cancels_handlers_and_nacks_their_jobs_now(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    worker = make_worker(fake)
    quick, slow = fake.add("quick"), fake.add("slow")

    @worker.handler("quick")
    async def handle_quick(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await trio.sleep(1.5)

    @worker.handler("slow")
    async def handle_slow(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await trio.sleep(100)

    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(1)
        worker.shutdown()  # first signal: graceful, 30 s
        await trio.sleep(1)
        worker.shutdown(now=True)  # second signal, at t=2
    assert trio.current_time() == 2
    assert [(c.job_id, c.at) for c in fake.acks] == [(quick, 1.5)]
    assert [(c.job_id, c.at, c.retry, c.reason) for c in fake.nacks] == [
        (slow, 2, Retry.after(0), "worker shutdown")
    ]
    assert worker.in_flight == 0 and fake.leased == []
    log = worker._log._target
    assert isinstance(log, RecordingLogger)
    assert log.matching("told to stop now; cancelling 1 job(s)")


@pytest.mark.parametrize(
    ("stop_now", "ended_at", "logged"),
    [
        (True, 1, "told to stop now; cancelling 1 job(s)"),
        (False, 31, "shutdown_timeout passed; cancelling 1 job(s)"),  # as before: the grace
    ],
)
async def test_ending_the_grace_period_first_shuts_down_at_once(
    autojump_clock: MockClock, stop_now: bool, ended_at: float, logged: str
) -> None:
    fake = FakeClient()
    worker = make_worker(fake)
    job = fake.add()

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await trio.sleep(100)

    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(1)
        if stop_now:
            worker.shutdown(now=True)
        else:
            worker.shutdown()
    assert trio.current_time() == ended_at and worker.is_shutdown
    assert [(c.job_id, c.at, c.reason) for c in fake.nacks] == [(job, ended_at, "worker shutdown")]
    log = worker._log._target
    assert isinstance(log, RecordingLogger)
    assert log.matching(logged)


async def test_a_shutdown_handle_stops_now_from_another_thread() -> None:
    fake = FakeClient()
    worker = make_worker(fake)
    job = fake.add()
    started = trio.Event()

    @worker.handler("work")
    async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        started.set()
        await trio.sleep_forever()

    handle = worker.shutdown_handle()
    with trio.fail_after(10):  # without now=True the 30 s grace would hold the run
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await started.wait()
            await trio.to_thread.run_sync(lambda: handle.shutdown(now=True))
    assert handle.is_shutdown
    assert [(c.job_id, c.reason) for c in fake.nacks] == [(job, "worker shutdown")]
