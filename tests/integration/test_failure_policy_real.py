"""Failure policy by exception (`retry_on`, `give_up_on`) and the `on_dead_letter` hook against
the real server: every branch of the policy, for `async def` handlers on trio and on asyncio
and for `def` handlers (in worker threads) on both, counted by the attempts each job had, the
dead letters the server keeps and the hook's calls.

Each scenario is written once on anyio and run by the trio test itself, or by asyncio in a
thread of its own, as an application would run its worker."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import trio
from fixtures.fake_client import RecordingLogger

import sepp
from sepp.testing import SeppServer
from tests.integration.test_def_handlers_real import on

GUARD_S = 30  # bounds a hung test only; never part of an assertion
QUEUE = "policy"
COMBOS = [("trio", "async"), ("trio", "def"), ("asyncio", "async"), ("asyncio", "def")]


@dataclasses.dataclass
class Order:
    number: int


class Tally:
    """What the handlers and hooks saw, from any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.attempts: Counter[str] = Counter()  # handler calls per job type
        self.hooked: list[tuple[str, str, int, str | None]] = []  # id, type, attempt, exc
        self.acked = threading.Event()
        self.changed = threading.Condition(self.lock)

    def ran(self, job_type: str) -> None:
        with self.lock:
            self.attempts[job_type] += 1

    def hook(self, ctx: sepp.JobContext, exc: Exception | None) -> None:
        with self.changed:
            name = None if exc is None else type(exc).__name__
            self.hooked.append((ctx.id, ctx.job_type, ctx.attempt, name))
            self.changed.notify_all()

    def wait_for_hooks(self, count: int) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: len(self.hooked) >= count, GUARD_S)


def failing_handlers(tally: Tally, kind: str) -> dict[str, Callable[..., Any]]:
    """One handler per branch; each raises what its job type says (as `async def` or `def`)."""

    def body(job_type: str, ctx: sepp.JobContext) -> None:
        tally.ran(job_type)
        if job_type in ("give_up", "nearest"):
            raise KeyError("no such account")  # a LookupError: the worker gives up on those
        if job_type in ("retried", "not_listed"):
            raise (ConnectionError if job_type == "retried" else ValueError)("boom")
        if job_type == "flaky":
            if ctx.attempt == 1:
                raise ConnectionResetError("the first try fails")
            tally.acked.set()
            return
        if job_type == "asks_retry":
            raise sepp.HandlerError.retry("come back")
        if job_type == "asks_permanent":
            raise sepp.HandlerError.permanent("never")
        if job_type == "group":
            raise ExceptionGroup("two failed", [ValueError("a"), KeyError("b")])
        raise AssertionError(job_type)

    def make(job_type: str) -> Callable[..., Any]:
        if kind == "def":

            def plain(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
                body(job_type, ctx)

            return plain

        async def coroutine(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
            await anyio.lowlevel.checkpoint()
            body(job_type, ctx)

        return coroutine

    names = ["give_up", "nearest", "retried", "not_listed", "flaky", "asks_retry"]
    return {name: make(name) for name in [*names, "asks_permanent", "group"]}


# job type -> (attempts its handler runs, attempt its job is dead-lettered at; None: acked)
EXPECTED: dict[str, tuple[int, int | None]] = {
    "give_up": (1, 1),  # KeyError, a LookupError: the worker's give_up_on
    "nearest": (3, 3),  # the same, but its registration's give_up_on=() clears the worker's
    "retried": (3, 3),  # in its retry_on: retried until the final attempt
    "not_listed": (1, 1),  # ValueError, not in its retry_on: dead-lettered at once
    "flaky": (2, None),  # ConnectionResetError, an OSError in its retry_on: retried, then acked
    "asks_retry": (3, 3),  # HandlerError.retry retries, though give_up_on=(Exception,)
    "asks_permanent": (1, 1),  # HandlerError.permanent dead-letters, though retry_on=(Exception,)
    "group": (1, 1),  # a KeyError among the group's leaves: given up
    "typed": (0, 1),  # a payload that does not decode (poison): the handler never runs
    "unknown": (0, 1),  # no handler: unknown_types="dead_letter"
}


@pytest.mark.parametrize(("front", "kind"), COMBOS)
async def test_every_branch_of_the_failure_policy_and_one_hook_call_per_dead_letter(
    sepp_server: SeppServer, front: str, kind: str
) -> None:
    tally = Tally()
    handlers = failing_handlers(tally, kind)
    hook: Callable[..., Any]
    if kind == "def":
        threads: set[int] = set()

        def hook(ctx: sepp.SyncJobContext, exc: Exception | None) -> None:
            threads.add(threading.get_ident())
            assert isinstance(ctx, sepp.SyncJobContext)
            tally.hook(ctx, exc)

    else:

        async def hook(ctx: sepp.JobContext, exc: Exception | None) -> None:
            await anyio.lowlevel.checkpoint()
            tally.hook(ctx, exc)

    seen_loop: list[int] = []

    async def scenario() -> None:
        seen_loop.append(threading.get_ident())
        async with sepp.open(sepp_server.address) as client:
            worker = sepp.Worker(
                client,
                QUEUE,
                wait_timeout=1,
                backoff=sepp.Retry.DEFAULT,  # the server's: immediate retries
                give_up_on=LookupError,
                unknown_types="dead_letter",
                on_dead_letter=hook,
                logger=RecordingLogger(),
            )
            worker.handle("give_up", handlers["give_up"])
            worker.handle("nearest", handlers["nearest"], give_up_on=())
            worker.handle("retried", handlers["retried"], retry_on=(ConnectionError,))
            worker.handle("not_listed", handlers["not_listed"], retry_on=[ConnectionError])
            worker.handle("flaky", handlers["flaky"], retry_on=OSError)
            worker.handle("asks_retry", handlers["asks_retry"], give_up_on=(Exception,))
            worker.handle("asks_permanent", handlers["asks_permanent"], retry_on=(Exception,))
            worker.handle("group", handlers["group"])

            def typed(order: Order, ctx: sepp.JobContext) -> None:
                tally.ran("typed")

            worker.handle("typed", typed)
            requests = [sepp.EnqueueRequest(QUEUE, job_type) for job_type in EXPECTED]
            requests[list(EXPECTED).index("typed")] = sepp.EnqueueRequest(
                QUEUE, "typed", payload=sepp.Payload.json({"number": "seven"})
            )
            acks = await client.enqueue_batch(requests)
            ids = {ack.job_id: job_type for ack, job_type in zip(acks, EXPECTED, strict=True)}  # type: ignore[union-attr]
            dead = sum(1 for _, at in EXPECTED.values() if at is not None)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(worker.run)
                await worker.wait_until_reserving()
                assert await anyio.to_thread.run_sync(tally.wait_for_hooks, dead)
                assert await anyio.to_thread.run_sync(tally.acked.wait, GUARD_S)
                worker.shutdown()
            records = await client.drain_dead_letters(QUEUE, max=100)
            assert sorted(ids[r.job_id] for r in records) == sorted(
                job_type for job_type, (_, at) in EXPECTED.items() if at is not None
            )
            for record in records:
                assert record.final_attempt == EXPECTED[ids[record.job_id]][1], record
            assert await client.reserve(QUEUE, wait_timeout=0) is None  # nothing left
            tally.ids = ids  # type: ignore[attr-defined]

    await on(front, scenario)
    ids: dict[str, str] = tally.ids  # type: ignore[attr-defined]
    ran = {job_type: tally.attempts[job_type] for job_type in EXPECTED}
    assert ran == {job_type: runs for job_type, (runs, _) in EXPECTED.items()}
    # Once per dead-lettered job, on the attempt that dead-lettered it; never for the acked one.
    assert Counter(job_id for job_id, *_ in tally.hooked) == Counter(
        job_id for job_id, job_type in ids.items() if EXPECTED[job_type][1] is not None
    )
    hooked = {job_type: (attempt, exc) for _, job_type, attempt, exc in tally.hooked}
    assert hooked == {
        "give_up": (1, "KeyError"),
        "nearest": (3, "KeyError"),
        "retried": (3, "ConnectionError"),
        "not_listed": (1, "ValueError"),
        "asks_retry": (3, "HandlerError"),
        "asks_permanent": (1, "HandlerError"),
        "group": (1, "ExceptionGroup"),
        "typed": (1, "PoisonPayload"),
        "unknown": (1, None),
    }
    if kind == "def":
        assert seen_loop[0] not in threads  # the def hook ran in worker threads


async def test_the_reasons_name_the_rule_and_the_router_and_worker_hooks_both_run(
    sepp_server: SeppServer,
) -> None:
    calls: list[tuple[str, str]] = []
    log = RecordingLogger()

    async def worker_hook(ctx: sepp.JobContext, exc: Exception | None) -> None:
        calls.append(("worker", ctx.job_type))

    def broken_hook(ctx: sepp.JobContext, exc: Exception | None) -> None:
        calls.append(("broken", ctx.job_type))
        raise RuntimeError("the hook itself fails")

    async def billing_hook(ctx: sepp.JobContext, exc: Exception | None) -> None:
        calls.append(("billing", ctx.job_type))

    billing = sepp.Router(retry_on=(TimeoutError,), on_dead_letter=billing_hook)

    @billing.handler("charge")
    async def charge(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        raise ValueError("card declined")

    inner = sepp.Router(on_dead_letter=broken_hook)

    @inner.handler("refund", give_up_on=ValueError)
    async def refund(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        raise ValueError("x" * 2000)  # a long message: the reason keeps the rule whole

    billing.include(inner)
    async with sepp.open(sepp_server.address) as client:
        worker = sepp.Worker(
            client, QUEUE, handlers=billing, on_dead_letter=worker_hook, logger=log
        )
        await client.enqueue(QUEUE, "charge")
        await client.enqueue(QUEUE, "refund")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(GUARD_S):  # each job's hooks, then its dead-letter line
                while len([m for m in log.at("error") if "dead-lettered: its" in m]) < 2:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            worker.shutdown()
        records = {r.job_type: r for r in await client.drain_dead_letters(QUEUE)}
    # The Worker's hook first, then each router's from the outermost in; a failing hook is
    # logged with its traceback and the next one still runs.
    assert sorted(calls) == sorted(
        [
            ("worker", "charge"),
            ("billing", "charge"),
            ("worker", "refund"),
            ("billing", "refund"),
            ("broken", "refund"),
        ]
    )
    assert [who for who, job_type in calls if job_type == "refund"] == [
        "worker",
        "billing",
        "broken",
    ]
    charge_reason = records["charge"].last_reason or ""
    assert charge_reason == (
        "handler raised ValueError: card declined (not in retry_on (TimeoutError): not retried)"
    )
    refund_reason = records["refund"].last_reason or ""
    assert refund_reason.endswith("(ValueError is in give_up_on: not retried)")
    assert len(refund_reason) <= 1000
    assert records["charge"].final_attempt == records["refund"].final_attempt == 1
    failed = log.matching("the on_dead_letter hook")
    assert len(failed) == 1 and failed[0][0] == "error"
    assert "broken_hook" in failed[0][1] and "RuntimeError: the hook itself fails" in failed[0][1]
    dead = [m for m in log.at("error") if "dead-lettered: its failure policy" in m]
    assert len(dead) == 2


async def test_a_job_redelivered_after_a_lost_lease_is_told_to_the_hook_once(
    sepp_server: SeppServer,
) -> None:
    calls: list[tuple[str, int]] = []
    attempts: list[int] = []
    done = trio.Event()

    async def hook(ctx: sepp.JobContext, exc: Exception | None) -> None:
        calls.append((ctx.id, ctx.attempt))
        done.set()

    async def slow_then_failing(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            await trio.sleep_forever()  # its lease ends: cancelled, neither acked nor nacked
        raise ConnectionError("still down")

    async with sepp.open(sepp_server.address) as client:
        worker = sepp.Worker(
            client,
            QUEUE,
            lease_duration=1,
            auto_extend=False,
            wait_timeout=1,
            on_dead_letter=hook,
            logger=RecordingLogger(),
        )
        worker.handle("sync", slow_then_failing)
        ack = await client.enqueue(QUEUE, "sync", max_attempts=2)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(GUARD_S):
                await done.wait()
            worker.shutdown()
        (record,) = await client.drain_dead_letters(QUEUE)
    assert attempts == [1, 2]
    assert calls == [(ack.job_id, 2)]
    assert record.job_id == ack.job_id and record.final_attempt == 2
