"""Jobs that lead to jobs against the real server: follow-ups exactly once across lost acks and
killed workers, a three-step chain across two worker processes, a thousand results awaited by
64 tasks through one reply queue, callers that give up or go away, failures that name their
chain and step; on trio, asyncio and blocking code.

Outcomes are counted from what the handlers and the workers recorded (the lines a worker
process prints, the jobs left in a queue), never from how long anything took."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
import trio
from fixtures import pipeline_tasks as tasks
from fixtures.fake_client import RecordingLogger

import sepp
from sepp._client import replies as replies_module
from sepp._model import pipelines as p
from sepp.testing import SeppServer, sepp_server

pytestmark = pytest.mark.real_server

GUARD_S = 60  # bounds a hung test only; never part of an assertion
FRONTS = ["trio", "asyncio"]
WORKER = Path(__file__).resolve().parents[1] / "fixtures" / "pipeline_worker.py"


async def on(front: str, scenario: Callable[[], Awaitable[None]]) -> None:
    """Run a scenario written on anyio in this trio test, or on asyncio in a thread."""
    if front == "trio":
        await scenario()
    else:
        await trio.to_thread.run_sync(asyncio.run, scenario())


@asynccontextmanager
async def working(worker: sepp.Worker) -> AsyncIterator[None]:
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await worker.wait_until_reserving()
        yield
        worker.shutdown()


async def drain(client: sepp.Client, queue: str) -> list[sepp.Job]:
    """Every job ready in `queue` now, acked."""
    taken: list[sepp.Job] = []
    while jobs := await client.reserve(queue, wait_timeout=0, max_jobs=256):
        for job in jobs:
            await client.ack(job.ctx)
        taken += jobs
    return taken


async def until(done: Callable[[], bool]) -> None:
    """Wait (on the running library's clock) until `done()`; the guard bounds a hang."""
    with anyio.fail_after(GUARD_S):
        while not done():  # noqa: ASYNC110 - polls state another thread or process changes
            await anyio.sleep(0.02)


# -- follow-ups, exactly once ------------------------------------------------------------------


class LosingAcks:
    """A worker's client whose first ack of each job is lost: before it reaches the server
    (`where="before"`: the job comes back when its lease runs out), or after (its answer
    lost: the server acked it)."""

    def __init__(self, client: sepp.Client, where: str) -> None:
        self._client = client
        self._where = where
        self.lost: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def ack(self, ctx: sepp.JobContext, *, timeout: float | timedelta | None = None) -> None:
        if ctx.id not in self.lost:
            self.lost.append(ctx.id)
            if self._where == "after":
                await self._client.ack(ctx, timeout=timeout)
            raise sepp.TransportError(
                "Ack: UNAVAILABLE: injected", code=sepp.StatusCode.UNAVAILABLE
            )
        await self._client.ack(ctx, timeout=timeout)


@pytest.mark.parametrize("front", FRONTS)
@pytest.mark.parametrize("where", ["before", "after"])
async def test_follow_ups_are_enqueued_once_when_acks_are_lost(
    sepp_server: SeppServer, front: str, where: str
) -> None:
    orders = 20
    runs: Counter[int] = Counter()

    async def scenario() -> None:
        async with sepp.open(sepp_server.address) as client:
            losing = LosingAcks(client, where)
            worker = sepp.Worker(losing, "orders", lease_duration=1, wait_timeout=1)

            @worker.task(tasks.order)
            async def order(n: int, ctx: sepp.JobContext) -> None:
                tasks.order_follow_ups(n, ctx)
                runs[n] += 1

            await client.enqueue_batch([tasks.order.request(n) for n in range(orders)])
            async with working(worker):
                # Every order acked: each lost ack's job ran again (before), or not (after).
                expected = 2 * orders if where == "before" else orders
                await until(lambda: sum(runs.values()) >= expected and len(losing.lost) == orders)
                await until(lambda: worker.in_flight == 0)
            shipped = await drain(client, "shipping")
            audited = await drain(client, tasks.AUDIT_QUEUE)
            assert sorted(j.payload.json() for j in shipped if j.payload) == sorted(
                f"ship {n}" for n in range(orders)
            )
            assert sorted(j.payload.json() for j in audited if j.payload) == list(range(orders))
            assert await client.reserve("orders", wait_timeout=0) is None  # all acked

    await on(front, scenario)
    assert set(runs.values()) == ({2} if where == "before" else {1})


class WorkerProcess:
    """`tests/fixtures/pipeline_worker.py` in a process of its own, and the lines it printed."""

    def __init__(self, address: str, mode: str, *queues: str) -> None:
        self.lines: list[list[str]] = []
        self._args = [sys.executable, str(WORKER), address, mode, *queues]
        self._process: trio.Process | None = None

    async def run(
        self, *, task_status: trio.TaskStatus[WorkerProcess] = trio.TASK_STATUS_IGNORED
    ) -> None:
        process = self._process = await trio.lowlevel.open_process(
            self._args, stdout=subprocess.PIPE
        )
        assert process.stdout is not None
        started = False
        buffer = b""
        try:
            while chunk := await process.stdout.receive_some(65536):
                buffer += chunk
                *done, buffer = buffer.split(b"\n")
                self.lines += [line.decode().split() for line in done]
                if not started and ["ready"] in self.lines:
                    started = True
                    task_status.started(self)
        finally:
            if process.returncode is None:
                process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    def said(self, word: str) -> list[list[str]]:
        return [line for line in self.lines if line and line[0] == word]

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)


@pytest.mark.parametrize("mode", ["hang-before-ack", "hang-in-handler"])
async def test_follow_ups_are_enqueued_once_when_a_worker_is_killed(
    sepp_server: SeppServer, mode: str
) -> None:
    """Killed after its follow-ups went out and before its ack, or before its handler
    returned: either way the jobs come back, run again, and each follow-up is there once."""
    orders = 8
    async with sepp.open(sepp_server.address) as client:
        await client.enqueue_batch([tasks.order.request(n) for n in range(orders)])
        with trio.fail_after(GUARD_S):
            async with trio.open_nursery() as nursery:
                doomed = await nursery.start(WorkerProcess(sepp_server.address, mode, "orders").run)
                hung = "acking" if mode == "hang-before-ack" else "running"
                await until(lambda: len(doomed.said(hung)) == orders)
                doomed.kill()
                if mode == "hang-before-ack":
                    # It ran each order and sent its follow-ups: they are on the server.
                    assert len(doomed.said("ran")) == orders
                again = await nursery.start(
                    WorkerProcess(sepp_server.address, "normal", "orders").run
                )
                await until(lambda: len(again.said("acking")) == orders)
                nursery.cancel_scope.cancel()
        assert {line[3] for line in again.said("ran")} == {"2"}  # each a redelivery
        shipped = await drain(client, "shipping")
        audited = await drain(client, tasks.AUDIT_QUEUE)
        assert sorted(j.payload.json() for j in shipped if j.payload) == sorted(
            f"ship {n}" for n in range(orders)
        )
        assert sorted(j.payload.json() for j in audited if j.payload) == list(range(orders))


# -- chains ------------------------------------------------------------------------------------


async def test_a_three_step_chain_crosses_two_worker_processes(sepp_server: SeppServer) -> None:
    chains = 12
    async with sepp.open(sepp_server.address) as client:
        with trio.fail_after(GUARD_S):
            async with trio.open_nursery() as nursery:
                a = await nursery.start(WorkerProcess(sepp_server.address, "normal", "stage-a").run)
                b = await nursery.start(WorkerProcess(sepp_server.address, "normal", "stage-b").run)
                handles = [
                    await sepp.chain(tasks.first.job(n), tasks.second, tasks.third).submit(client)
                    for n in range(chains)
                ]
                results = [await handle.result() for handle in handles]
                # A step's line may still be in its pipe when the last result arrives.
                await until(lambda: len(a.said("ran")) + len(b.said("ran")) >= 3 * chains)
                nursery.cancel_scope.cancel()
    assert results == [tasks.chain_value(n) for n in range(chains)]
    steps = Counter((line[1], int(line[4])) for w in (a, b) for line in w.said("ran"))
    assert steps == {
        ("first", a.pid): chains,
        ("second", b.pid): chains,
        ("third", a.pid): chains,
    }


@pytest.mark.parametrize("front", ["trio", "asyncio", "blocking"])
async def test_a_step_that_fails_for_good_stops_its_chain_and_names_it(
    sepp_server: SeppServer, front: str
) -> None:
    errors: list[sepp.JobFailedError] = []
    told: list[tuple[object, object]] = []  # what on_dead_letter heard: the step's place
    never = tasks.third

    async def tell(ctx: sepp.JobContext, error: Exception | None) -> None:
        told.append((ctx.custom.get(p.CHAIN_STEP), type(error).__name__))

    async def scenario() -> None:
        async with sepp.open(sepp_server.address) as client:
            worker = sepp.Worker(
                client, ["stage-a", "stage-b"], wait_timeout=1, on_dead_letter=tell
            )
            worker.task(tasks.first)(first)
            worker.task(tasks.second)(refuse)
            worker.task(never)(third)
            async with working(worker):
                if front == "blocking":
                    await anyio.to_thread.run_sync(in_blocking_code, sepp_server.address)
                else:
                    handle = await sepp.chain(tasks.first.job(1), tasks.second, never).submit(
                        client
                    )
                    with pytest.raises(sepp.JobFailedError) as caught:
                        await handle.result()
                    errors.append(caught.value)
            (record,) = await client.drain_dead_letters("stage-b")
            assert record.job_type == "second" and record.cause is sepp.DeadLetterCause.REJECTED
            assert record.last_reason == "no second step for 2"
            error = errors[0]
            assert record.custom[p.CHAIN_ID] == error.chain_id
            assert (record.custom[p.CHAIN_STEP], record.custom[p.CHAIN_STEPS]) == (2, 3)
            assert p.CHAIN_NEXT in record.custom  # what was left of the chain, to replay it
            assert await client.reserve("stage-a", wait_timeout=0) is None  # no third step

    async def first(n: int, ctx: sepp.JobContext) -> int:
        return n + 1

    async def refuse(n: int, ctx: sepp.JobContext) -> int:
        raise sepp.HandlerError.permanent(f"no second step for {n}")

    async def third(n: int, ctx: sepp.JobContext) -> str:
        raise AssertionError("a stopped chain ran its next step")

    def in_blocking_code(address: str) -> None:
        with sepp.SyncClient(address) as client:
            handle = sepp.chain(tasks.first.job(1), tasks.second, never).submit(client)
            with pytest.raises(sepp.JobFailedError) as caught:
                handle.result()
            errors.append(caught.value)

    await on("trio" if front == "blocking" else front, scenario)
    (error,) = errors
    assert (error.job_type, error.queue, error.step, error.steps) == ("second", "stage-b", 2, 3)
    assert error.reason == "no second step for 2" and error.chain_id
    assert "step 2 of 3 of chain" in str(error)
    assert told == [(2, "HandlerError")]  # a step's dead letter reaches the hook as any does


async def test_a_group_is_enqueued_all_or_none() -> None:
    config = {"queues": [{"name": "strict", "allowed_job_types": ["first"]}]}
    refused = sepp.Task("strict", "second", int)
    async with sepp_server(config) as server, sepp.open(server.address) as client:
        with pytest.raises(sepp.BatchValidationError) as caught:
            await sepp.group(tasks.first.job(1, queue="strict"), refused.job(2)).enqueue(client)
        assert [e.index for e in caught.value.errors] == [1]
        assert await client.reserve("strict", wait_timeout=0) is None  # the first one neither
        acks = await sepp.group(*(tasks.first.job(n, queue="strict") for n in range(3))).enqueue(
            client
        )
        assert len({ack.job_id for ack in acks}) == 3


# -- results -----------------------------------------------------------------------------------

square = sepp.Task("squares", "square", int, result=int)


def square_worker(client: Any, seen: list[tuple[int, str]] | None = None) -> sepp.Worker:
    """A worker squaring numbers; `seen` gets each job's number and reply queue."""
    worker = sepp.Worker(client, "squares", wait_timeout=1, max_in_flight=64)

    @worker.task(square)
    async def do_square(n: int, ctx: sepp.JobContext) -> int:
        if seen is not None:
            seen.append((n, str(ctx.custom.get(p.REPLY_QUEUE))))
        return n * n

    return worker


@pytest.mark.parametrize("front", FRONTS)
async def test_a_thousand_results_awaited_by_64_tasks_share_one_reply_queue(
    sepp_server: SeppServer, front: str
) -> None:
    per_task = [range(i, 1000, 64) for i in range(64)]  # 1000 jobs in all
    got: dict[int, int] = {}
    seen: list[tuple[int, str]] = []

    async def scenario() -> None:
        async with sepp.open(sepp_server.address) as client:
            worker = square_worker(client, seen)

            async def caller(numbers: range) -> None:
                handles = [(n, await square.submit(client, n)) for n in numbers]
                for n, handle in handles:
                    got[n] = await handle.result()

            async with working(worker), anyio.create_task_group() as callers:
                for numbers in per_task:
                    callers.start_soon(caller, numbers)
            replies = client._replies
            assert replies is not None and len(replies._waiters) == 0  # none left behind
            assert replies.dropped == 0

    await on(front, scenario)
    assert got == {n: n * n for n in range(1000)}
    assert len({queue for _, queue in seen}) == 1  # one reply queue for all of the callers


async def test_a_thousand_results_awaited_by_64_threads_of_blocking_code(
    sepp_server: SeppServer,
) -> None:
    got: dict[int, int] = {}
    lock = threading.Lock()

    def caller(client: sepp.SyncClient, numbers: range) -> None:
        handles = [(n, square.submit(client, n)) for n in numbers]
        for n, handle in handles:
            value = handle.result()
            with lock:
                got[n] = value

    def blocking(address: str) -> None:
        with sepp.SyncClient(address) as client:
            threads = [
                threading.Thread(target=caller, args=(client, range(i, 1000, 64)))
                for i in range(64)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            replies = client._replies
            assert replies is not None and len(replies._waiters) == 0

    async with sepp.open(sepp_server.address) as client, working(square_worker(client)):
        await trio.to_thread.run_sync(blocking, sepp_server.address)
    assert got == {n: n * n for n in range(1000)}


@pytest.mark.parametrize("front", FRONTS)
async def test_a_caller_that_gives_up_leaves_nothing_behind(
    sepp_server: SeppServer, front: str
) -> None:
    async def scenario() -> None:
        async with sepp.open(sepp_server.address) as client:
            handle = await square.submit(client, 7)
            with pytest.raises(sepp.ResultTimeoutError):
                await handle.result(timeout=0.05)  # no worker runs yet
            handle.forget()  # the caller gives up
            replies = client._replies
            assert replies is not None and len(replies._waiters) == 0
            kept = await square.submit(client, 8)
            async with working(square_worker(client)):
                assert await kept.result() == 64  # a result still awaited comes
                await until(lambda: replies.dropped == 1)  # the other is dropped on arrival
            with pytest.raises(sepp.ResultTimeoutError):  # a timeout is not the end: ...
                await handle.result(timeout=0)
            assert await kept.result(timeout=0) == 64  # ... and a result once read is kept

    await on(front, scenario)


async def test_no_result_is_sent_past_its_ttl_or_to_a_client_that_closed(
    sepp_server: SeppServer,
) -> None:
    async with sepp.open(sepp_server.address) as producer:
        expiring = await square.submit(producer, 2, result_ttl=0.2)
        with pytest.raises(sepp.ResultUnavailableError, match="result_ttl"):
            await expiring.result()  # no worker ran within the ttl: given up for good
        async with sepp.open(sepp_server.address) as leaving:
            await square.submit(leaving, 3)
        # `leaving` closed (its beacon acked); a third job has a live awaiter:
        alive = await square.submit(producer, 4)
        async with sepp.open(sepp_server.address) as client:
            counting = tasks.CountingReplies(client)
            seen: list[tuple[int, str]] = []
            worker = square_worker(counting, seen)
            async with working(worker):
                assert await alive.result() == 16
                await until(lambda: len(seen) == 3 and worker.in_flight == 0)
            assert await client.reserve("squares", wait_timeout=0) is None  # all three acked
        assert [r.custom[p.REPLY_ID] for r in counting.replies] == [
            alive._results._waiters[0].reply_id
        ]


CRASHED_CLIENT = """
import sys, trio, sepp
from sepp._client import replies
replies.LEASE_S, replies.EXTEND_S, replies.CHECK_S = 2.0, 0.5, 1.0
square = sepp.Task("squares", "square", int, result=int)

async def main():
    async with sepp.open(sys.argv[1]) as client:
        await square.submit(client, 1)
        print(client._replies.queue, flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


async def test_the_reply_queue_of_a_client_that_died_is_cleared_by_another(
    sepp_server: SeppServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client SIGKILLed while it awaited results leaves its queue (its beacon, replies sent
    before its lease ran out); another client awaiting results clears it, from the directory
    entry it left, once its beacon is no longer in flight."""
    monkeypatch.setattr(replies_module, "LEASE_S", 2.0)
    monkeypatch.setattr(replies_module, "EXTEND_S", 0.5)
    monkeypatch.setattr(replies_module, "CHECK_S", 1.0)
    log = RecordingLogger()
    process = await trio.lowlevel.open_process(
        [sys.executable, "-c", CRASHED_CLIENT, sepp_server.address], stdout=subprocess.PIPE
    )
    assert process.stdout is not None
    with trio.fail_after(GUARD_S):
        line = b""
        while not line.endswith(b"\n"):
            line += await process.stdout.receive_some(1024)
    dead_queue = line.decode().strip()
    process.kill()  # SIGKILL: its beacon's lease runs out, nobody acks it
    await process.wait()
    async with sepp.open(sepp_server.address, logger=log) as client:
        for n in range(3):  # replies that reached its queue before the end was known
            await client.enqueue(dead_queue, p.RESULT_JOB_TYPE, custom={p.REPLY_ID: f"r{n}"})
        async with working(square_worker(client)):
            # Any client awaiting results checks the directory, and clears that queue.
            assert await (await square.submit(client, 9)).result() == 81
            await until(lambda: any(dead_queue in line for line in log.at("info")))
        cleared = [line for line in log.at("info") if dead_queue in line]
        # The three, the beacon, and the reply to its own job if the worker sent it while the
        # beacon's lease still ran (a worker sends none once it is not in flight).
        assert cleared[0].split()[2] in ("4", "5"), cleared
        assert await client.reserve(dead_queue, wait_timeout=0) is None
