"""`limit=` on a Worker's and a Router's registrations, against the scripted FakeClient on
trio's MockClock (autojump): what registration accepts and refuses, a waiting job's place in
the waiting room, deferral when the room is full, when patience runs out and at shutdown (a
copy with the attempts left, never a nack), the fallback when the copy is refused, the
attempt counted across copies, `ctx.limits`, and the monitor's families. A handler without a
limit has no limit state at all. The limits' own arithmetic is tests/unit/test_limits_local.py;
against the real server, tests/integration/test_worker_limits_real.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import trio
from fixtures.fake_client import FakeClient
from trio.testing import MockClock

import sepp
from sepp import Retry
from sepp._limits import deferral
from sepp._worker.limit_uses import LimitUse
from sepp._worker.router import registered_handlers
from tests.unit.test_worker import log_of, running
from tests.unit.test_worker import make_worker as worker_on

pytestmark = pytest.mark.fixture  # a scripted FakeClient


def make_worker(fake: FakeClient, **options: Any) -> sepp.Worker:
    options.setdefault("wait_timeout", 1.0)
    return worker_on(fake, **options)


async def wait_until(condition: Any) -> None:
    while not condition():  # noqa: ASYNC110 - the fake's records have no event
        await trio.sleep(0.1)


async def noop(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
    pass


ONE = sepp.Limit(concurrency=1)


# -- registration ------------------------------------------------------------------------------


def limits_of(router: sepp.Router) -> dict[str | None, list[LimitUse]]:
    return {e.job_type: list(e.settings.limits) for e in registered_handlers(router)}


def test_each_registration_takes_a_limit_named_after_its_job_type() -> None:
    task = sepp.Task("q", "t", dict)
    router = sepp.Router()
    router.handle("a", noop, limit=ONE)
    router.handler("b", limit=[ONE, sepp.Limit(rate="5/s"), sepp.Limit(rate=1, key=len)])(noop)
    router.task(task, limit=ONE)(noop)
    found = limits_of(router)
    assert [u.limit.name for u in found["a"]] == ["a"]
    names = [(u.limit.name, u.limit.rate) for u in found["b"]]
    assert names == [("b", None), ("b.2", 5), ("b.3", 1)]  # one name, one limit
    assert [u.limit.name for u in found["t"]] == ["t"]
    worker = make_worker(FakeClient())
    worker.handle("w", noop, limit=ONE)
    worker.handler("x", limit=ONE)(noop)
    worker.task(task, limit=sepp.Limit(concurrency=3, name="shared"))(noop)
    found = limits_of(worker._router)
    assert [u.limit.name for u in found["w"] + found["x"] + found["t"]] == ["w", "x", "shared"]
    assert all(u.router is None for u in found["w"])


def test_a_routers_limit_is_one_for_all_its_handlers_and_comes_first() -> None:
    outer = sepp.Router(limit=sepp.Limit(concurrency=4))
    inner = sepp.Router(limit=sepp.Limit(concurrency=2, name="crm"))
    inner.handle("sync", noop, limit=ONE)
    inner.handle("push", noop)
    outer.include(inner)
    outer.handle("own", noop)
    found = limits_of(outer)
    assert [u.limit.name for u in found["sync"]] == [None, "crm", "sync"]
    assert [u.limit.name for u in found["push"]] == [None, "crm"]
    assert [u.limit.name for u in found["own"]] == [None]
    # One limit: the same use (the outer router's) on every handler.
    assert {u.identity for u in (found["sync"][0], found["push"][0], found["own"][0])} == {outer}


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: sepp.Router(limit=sepp.Limit(concurrency=1, scope="global")), "limit"),
        (lambda: sepp.Router(limit=[ONE, 3]), "limit[1]"),
        (lambda: sepp.Router(limit="10/s"), "limit"),
        (lambda: sepp.Router().handle("a", noop, limit=2), "limit"),
        (lambda: sepp.Router().handler("a", limit=object()), "limit"),
    ],
)
def test_what_limit_refuses(make: Any, field: str) -> None:
    with pytest.raises(sepp.ValidationError) as info:
        make()
    assert info.value.field == field


def test_one_name_is_one_limit_and_other_values_are_refused() -> None:
    router = sepp.Router()
    router.handle("a", noop, limit=sepp.Limit(concurrency=1, name="crm"))
    router.handle("b", noop, limit=sepp.Limit(concurrency=1, name="crm", key=lambda c: c.id))
    with pytest.raises(sepp.ValidationError, match="'crm' is given twice"):
        router.handle("c", noop, limit=sepp.Limit(concurrency=2, name="crm"))
    other = sepp.Router()
    other.handle("d", noop, limit=sepp.Limit(concurrency=3, name="crm"))
    with pytest.raises(sepp.ValidationError, match="'crm' is given twice"):
        router.include(other)
    with pytest.raises(sepp.ValidationError, match="'a' is given twice"):
        sepp.Router(limit=sepp.Limit(concurrency=1, name="a")).handle(
            "x", noop, limit=sepp.Limit(concurrency=2, name="a")
        )
    assert router.job_types == ("a", "b")  # nothing copied on the refusal


# -- waiting, and deferring ----------------------------------------------------------------------


async def test_a_job_waits_in_the_room_and_one_that_finds_it_full_is_deferred(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    ids = [fake.add("slow", max_attempts=3) for _ in range(3)]
    worker = make_worker(fake, max_in_flight=4, limit_waiting=1)
    ran: list[tuple[str, int, int, float]] = []
    release = trio.Event()

    @worker.handler("slow", limit=ONE)
    async def slow(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        ran.append((deferral.origin_id(ctx), ctx.attempt, ctx.logical_attempt, trio.current_time()))
        if len(ran) == 1:
            await release.wait()

    async with running(worker):
        await trio.sleep(0.2)  # before the copy is due (half a second at the earliest)
        # One runs, one waits (its lease kept), the third found the room full: deferred.
        assert len(ran) == 1 and len(fake.enqueued) == 1
        (copy,) = fake.enqueued
        assert copy.custom[deferral.ORIGIN] in ids and copy.custom[deferral.SPENT] == 0
        assert copy.idempotency_key == f"sepp.defer:{copy.custom[deferral.ORIGIN]}"
        assert copy.max_attempts == 3 and copy.scheduled_at is not None
        release.set()
        await wait_until(lambda: len(ran) == 3)
    assert sorted(origin for origin, *_ in ran) == sorted(ids)
    assert [(a, logical) for _, a, logical, _ in ran] == [(1, 1)] * 3
    assert fake.nacks == []  # waiting never nacks
    log = log_of(worker)
    assert log.matching("waits for limit 'slow'")
    (line,) = [text for _, text in log.matching(" deferred: ")]
    assert "the waiting room is full (1 jobs wait for limits)" in line
    assert "attempt 1/3 kept, deferral 1" in line


async def test_a_job_whose_patience_runs_out_is_deferred_with_its_attempts_left(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    fake.add("slow", max_attempts=5, attempt=2)  # each on its third delivery
    fake.add("slow", max_attempts=5, attempt=2)
    worker = make_worker(fake, limit_patience=2.5)
    seen: list[tuple[int, int, int, int]] = []
    release = trio.Event()

    @worker.handler("slow", limit=ONE)
    async def slow(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        seen.append((ctx.attempt, ctx.max_attempts, ctx.logical_attempt, ctx.logical_max_attempts))
        if len(seen) == 1:
            await release.wait()

    async with running(worker):
        await trio.sleep(3)  # past the second one's patience
        (copy,) = fake.enqueued
        # Its third delivery waited and never ran: it is given back with the rest.
        assert (copy.max_attempts, copy.custom[deferral.SPENT]) == (3, 2)
        release.set()
        await wait_until(lambda: len(seen) == 2)
    # The copy is a new job, attempt 1 of the 3 left; counted across, attempt 3 of 5 still.
    assert seen == [(3, 5, 3, 5), (1, 3, 3, 5)]
    assert "waited 2.5s for limit 'slow'" in log_of(worker).matching(" deferred: ")[0][1]


async def test_at_shutdown_a_waiting_job_is_deferred_to_run_at_once_and_never_nacked(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    fake.add("slow")
    fake.add("slow")
    worker = make_worker(fake, limit_patience=None, shutdown_timeout=100)
    started = trio.Event()

    @worker.handler("slow", limit=ONE)
    async def slow(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        started.set()
        await trio.sleep(10)

    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await started.wait()
        await trio.sleep(1)
        assert worker.in_flight == 2
        worker.shutdown()
    # Back at once, for another worker (a copy the last reserve brought back in the meantime
    # went the same way: every copy stands for the first job).
    assert fake.enqueued and all(c.scheduled_at is None for c in fake.enqueued)
    assert {c.custom[deferral.ORIGIN] for c in fake.enqueued} == {fake.acks[0].job_id}
    assert fake.ready == 1 and fake.nacks == []
    assert "the worker is shutting down" in log_of(worker).matching(" deferred: ")[0][1]


async def test_a_refused_copy_falls_back_to_a_nack_that_says_so(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    fake.add("slow")
    fake.add("slow")
    fake.enqueue_rejections = [sepp.QueueFull("q", 1)]
    worker = make_worker(fake, max_in_flight=2, limit_waiting=1, limit_patience=0)
    release = trio.Event()

    @worker.handler("slow", limit=ONE)
    async def slow(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        await release.wait()

    async with running(worker):
        await trio.sleep(1)
        release.set()
    (nack,) = fake.nacks
    assert nack.retry is not None and nack.retry.kind == "delay"
    assert log_of(worker).matching("was refused (")


async def test_a_failed_copy_backs_off_by_its_attempt_counted_across_deferrals(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    (copy_id,) = [
        ack.job_id
        for ack in await fake.enqueue_batch(
            [sepp.EnqueueRequest("q", "fails", custom={deferral.SPENT: 3}, max_attempts=2)]
        )
    ]
    worker = make_worker(fake, backoff=sepp.Backoff(1.0, multiplier=2.0, max=1000, jitter=0))

    @worker.handler("fails", limit=ONE)
    async def fails(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        raise RuntimeError("no")

    async with running(worker):
        await wait_until(lambda: fake.nacks)
    (nack,) = fake.nacks
    assert nack.job_id == copy_id
    assert nack.retry == Retry.after(8.0)  # attempt 4 overall: 1 · 2³


async def test_a_key_function_that_raises_fails_its_job(autojump_clock: MockClock) -> None:
    fake = FakeClient()
    fake.add("keyed")
    worker = make_worker(fake)
    worker.handle("keyed", noop, limit=sepp.Limit(concurrency=1, key=lambda c: c.custom["t"]))
    async with running(worker):
        await wait_until(lambda: fake.nacks)
    assert "KeyError" in (fake.nacks[0].reason or "")


async def test_a_deferred_copys_follow_ups_are_keyed_by_the_first_job_as_its_own_would_be(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    (copy,) = await fake.enqueue_batch(
        [sepp.EnqueueRequest("q", "step", custom={deferral.ORIGIN: "first-id", deferral.COUNT: 1})]
    )
    fake.add("step")
    worker = make_worker(fake)

    @worker.handler("step", limit=ONE)
    async def step(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        ctx.then(sepp.EnqueueRequest("q", "next"))

    async with running(worker):
        await wait_until(lambda: len(fake.acks) == 2)
    keys = sorted(r.idempotency_key or "" for r in fake.enqueued if r.job_type == "next")
    first = next(c.job_id for c in fake.acks if c.job_id != copy.job_id)
    assert keys == sorted(["sepp.then/first-id/0", f"sepp.then/{first}/0"])


# -- what shows ----------------------------------------------------------------------------------


async def test_ctx_limits_and_the_monitor_say_how_each_limit_stands(
    autojump_clock: MockClock,
) -> None:
    fake = FakeClient()
    tenants = [{"tenant": t} for t in ("a", "a", "b")]
    await fake.enqueue_batch([sepp.EnqueueRequest("q", "sync", custom=c) for c in tenants])
    fake.add("plain")
    monitor = sepp.WorkerMonitor()
    router = sepp.Router(limit=sepp.Limit(rate=100))
    contexts: dict[str, sepp.JobContext] = {}
    hold = trio.Event()

    @router.handler("sync", limit=sepp.Limit(concurrency=1, key=lambda c: c.custom["tenant"]))
    async def sync(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        contexts.setdefault(str(ctx.custom["tenant"]), ctx)
        await hold.wait()

    @router.handler("plain")
    async def plain(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        assert [s.name for s in ctx.limits] == ["router(plain|sync)"]

    worker = make_worker(fake, handlers=router, monitor=monitor)

    @worker.handler("free")
    async def free(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
        contexts["free"] = ctx

    fake.add("free")
    async with running(worker):
        await trio.sleep(1)
        a_limits, b_limits = contexts["a"].limits, contexts["b"].limits
        text = monitor.prometheus_text()
        hold.set()
    assert contexts["free"].limits == ()
    assert getattr(contexts["free"]._lease, "limits", None) is None  # nothing set for it
    assert (
        [s.name for s in a_limits] == [s.name for s in b_limits] == ["router(plain|sync)", "sync"]
    )
    assert dataclasses.astuple(a_limits[1]) == ("sync", "worker", "a", 1, 1, 1, None, 1.0)
    assert dataclasses.astuple(b_limits[1]) == ("sync", "worker", "b", 1, 0, 1, None, 1.0)
    assert (a_limits[0].key, a_limits[0].rate, a_limits[0].concurrency) == ("", 100, None)
    assert 'sepp_worker_limit_running{limit="sync",scope="worker"} 2' in text
    assert 'sepp_worker_limit_waiting{limit="sync",scope="worker"} 1' in text
    assert 'sepp_worker_limit_admitted_total{limit="router(plain|sync)",scope="worker"} 4' in text
    assert 'sepp_worker_limit_keys{limit="sync",scope="worker"} 2' in text
    assert 'sepp_worker_jobs_deferred_total{queue="q",job_type="sync"} 0' in text


async def test_a_client_that_cannot_defer_is_refused_when_the_worker_starts(
    autojump_clock: MockClock,
) -> None:
    class Bare:  # reserve, ack, nack and extend only
        def __init__(self, fake: FakeClient) -> None:
            self.reserve, self.ack, self.nack = fake.reserve, fake.ack, fake.nack
            self.extend = fake.extend

    worker = sepp.Worker(Bare(FakeClient()), "q")  # type: ignore[arg-type]
    worker.handle("a", noop, limit=ONE)
    with pytest.raises(sepp.ValidationError, match="needs a client with enqueue_batch"):
        await worker.run()
