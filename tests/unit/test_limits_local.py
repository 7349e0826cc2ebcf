"""`sepp.Limit` (validation, names, keys) and the in-process limiter (`scope="worker"`): a
semaphore and a rate of starts per key, on trio's MockClock; and the same under asyncio."""

from __future__ import annotations

import asyncio
import functools
import math
from datetime import timedelta

import pytest
import trio
import trio.lowlevel
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

import sepp
from sepp._limits.limit import Limit
from sepp._limits.local import SWEEP_AT_KEYS, LocalLimiter
from sepp._runtime import concurrency
from sepp.testing import job_context

pytestmark = [pytest.mark.unit]


# -- the value ------------------------------------------------------------------------------


def test_limit_is_public_and_immutable() -> None:
    limit = sepp.Limit(concurrency=2)
    assert limit is not None and sepp.Limit is Limit
    assert (limit.concurrency, limit.rate, limit.scope, limit.key, limit.name) == (
        2,
        None,
        "worker",
        None,
        None,
    )
    with pytest.raises(AttributeError):
        limit.concurrency = 3  # type: ignore[misc]
    assert limit == sepp.Limit(concurrency=2) and hash(limit) == hash(sepp.Limit(concurrency=2))
    assert limit != sepp.Limit(concurrency=2, scope="global")


@pytest.mark.parametrize(
    ("spelling", "rate", "per"),
    [
        ("10/s", 10, 1.0),
        ("100/m", 100, 60.0),
        ("1000/h", 1000, 3600.0),
        ("5/d", 5, 86400.0),
        ("10/5s", 10, 5.0),
        (" 3 / 0.5s ", 3, 0.5),
    ],
)
def test_a_rate_is_an_int_per_window_or_celerys_spelling(
    spelling: str, rate: int, per: float
) -> None:
    limit = sepp.Limit(rate=spelling)
    assert (limit.rate, limit.per) == (rate, per)
    assert sepp.Limit(rate=rate, per=timedelta(seconds=per)) == limit


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "concurrency"),
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"concurrency": 2.0}, "concurrency"),
        ({"concurrency": 2000, "scope": "global"}, "concurrency"),
        ({"rate": 0}, "rate"),
        ({"rate": "ten a second"}, "rate"),
        ({"rate": "10/x"}, "rate"),
        ({"rate": 1.5}, "rate"),
        ({"rate": "10/s", "per": 2}, "per"),
        ({"rate": 10, "per": 0}, "per"),
        ({"rate": 10, "per": -1}, "per"),
        ({"concurrency": 1, "per": 5}, "per"),
        ({"rate": 1, "per": 7 * 3600, "scope": "global"}, "per"),
        ({"concurrency": 1, "key": "tenant"}, "key"),
        ({"concurrency": 1, "scope": "fleet"}, "scope"),
        ({"concurrency": 1, "name": ""}, "name"),
        ({"concurrency": 1, "name": "has space"}, "name"),
        ({"concurrency": 1, "name": "x" * 129}, "name"),
        ({"concurrency": 1, "lease": 0.1}, "lease"),
        ({"concurrency": 1, "lease": "30"}, "lease"),
    ],
)
def test_bad_values_raise_a_validation_error_naming_the_field(
    kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(sepp.ValidationError) as info:
        sepp.Limit(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_the_default_name_is_the_job_type_or_a_readable_digest_of_it() -> None:
    limit = sepp.Limit(concurrency=1, scope="global")
    assert limit.named("billing.sync").name == "billing.sync"
    assert limit.named("billing.sync").named("other").name == "billing.sync"
    odd = limit.named("sync tenant/€")
    assert odd.name is not None and odd.name.startswith("sync_tenant_")
    assert odd.name != limit.named("sync tenant/$").name
    long = limit.named("t" * 300)
    assert long.name is not None and len(long.name) <= 128
    assert sepp.Limit(concurrency=1, name="mine").named("x").name == "mine"


def test_the_key_is_the_functions_result_as_text() -> None:
    ctx = job_context(custom={"tenant": "acme", "n": 7})
    assert sepp.Limit(concurrency=1).key_of(ctx) == ""
    assert sepp.Limit(concurrency=1, key=lambda c: c.custom["tenant"]).key_of(ctx) == "acme"
    assert sepp.Limit(concurrency=1, key=lambda c: c.custom["n"]).key_of(ctx) == "7"
    with pytest.raises(KeyError):
        sepp.Limit(concurrency=1, key=lambda c: c.custom["missing"]).key_of(ctx)


def test_repr_says_what_the_limit_is() -> None:
    def tenant(ctx: sepp.JobContext) -> str:
        return str(ctx.custom["tenant"])

    text = repr(sepp.Limit(concurrency=1, rate=5, per=2, key=tenant, scope="global", lease=10))
    assert text == (
        "sepp.Limit(concurrency=1, rate=5, per=2, key=test_repr_says_what_the_limit_is."
        "<locals>.tenant, scope='global', lease=10)"
    )


@given(st.integers(min_value=1, max_value=10_000), st.sampled_from("smhd"))
def test_every_celery_rate_parses_to_the_same_limit_as_its_numbers(count: int, unit: str) -> None:
    window = {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    assert sepp.Limit(rate=f"{count}/{unit}") == sepp.Limit(rate=count, per=window)


# -- the local limiter ----------------------------------------------------------------------


async def test_concurrency_admits_at_most_n_and_the_rest_in_arrival_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = LocalLimiter(Limit(concurrency=2))
    running: list[int] = []
    most = 0
    waited: dict[int, float] = {}

    async def job(n: int) -> None:
        nonlocal most
        admission = await limiter.admit("")
        assert admission is not None
        waited[n] = admission.waited_s
        running.append(n)
        most = max(most, len(running))
        await trio.sleep(1)
        running.remove(n)
        admission.release()

    async with trio.open_nursery() as nursery:
        for n in range(10):
            nursery.start_soon(job, n)
            await trio.lowlevel.checkpoint()  # arrival order is start order
    assert most == 2
    # Granted in arrival order: two at a time, a second each.
    assert [round(waited[n], 6) for n in range(10)] == [n // 2 for n in range(10)]
    assert limiter.keys_held == 0  # nothing left behind once idle


async def test_keys_are_independent(autojump_clock: trio.testing.MockClock) -> None:
    limiter = LocalLimiter(Limit(concurrency=1, key=lambda c: c.custom["t"]))
    a = limiter.try_admit("a")
    b = limiter.try_admit("b")
    assert a is not None and b is not None
    assert limiter.try_admit("a") is None
    assert [s.running for s in limiter.stats()] == [1, 1]
    a.release()
    a.release()  # idempotent
    again = limiter.try_admit("a")
    assert again is not None
    assert [(s.key, s.running, s.waiting) for s in limiter.stats("a")] == [("a", 1, 0)]


async def test_a_rate_allows_a_burst_of_r_then_one_per_token_returned(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = LocalLimiter(Limit(rate=3, per=10))
    starts: list[float] = []

    async def job() -> None:
        admission = await limiter.admit("")
        assert admission is not None
        starts.append(trio.current_time())
        admission.release()  # a rate-only admission has nothing to give back

    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(job)
    offsets = [round(s - t0, 6) for s in starts]
    assert offsets == [0, 0, 0, 10, 10, 10, 20, 20]
    # No window of length `per` ever holds more than `rate` starts.
    assert all(sum(1 for s in starts if x <= s < x + 10) <= 3 for x in starts)


async def test_concurrency_and_rate_together(autojump_clock: trio.testing.MockClock) -> None:
    limiter = LocalLimiter(Limit(concurrency=1, rate=2, per=5))
    log: list[tuple[float, str]] = []

    async def job() -> None:
        admission = await limiter.admit("")
        assert admission is not None
        log.append((trio.current_time(), "in"))
        await trio.sleep(1)
        log.append((trio.current_time(), "out"))
        admission.release()

    t0 = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(4):
            nursery.start_soon(job)
    ins = [round(t - t0, 6) for t, what in log if what == "in"]
    assert ins == [0, 1, 5, 6]  # one at a time, and two starts per 5 s
    depth = 0
    for _, what in log:
        depth += 1 if what == "in" else -1
        assert depth <= 1


async def test_patience_runs_out_and_the_place_is_given_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = LocalLimiter(Limit(concurrency=1))
    held = limiter.try_admit("")
    assert held is not None
    t0 = trio.current_time()
    assert await limiter.admit("", patience_s=3) is None
    assert trio.current_time() - t0 == pytest.approx(3)
    assert limiter.stats("")[0].waiting == 0
    # One that gave up does not stand in the way of the next.
    got: list[sepp.JobContext | None] = []

    async def wait_long() -> None:
        admission = await limiter.admit("")
        got.append(job_context() if admission is not None else None)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_long)
        await trio.sleep(1)
        assert limiter.stats("")[0].waiting == 1
        held.release()
    assert len(got) == 1 and got[0] is not None


async def test_a_cancelled_wait_leaves_no_ghost(autojump_clock: trio.testing.MockClock) -> None:
    limiter = LocalLimiter(Limit(concurrency=1))
    held = limiter.try_admit("")
    assert held is not None
    with trio.move_on_after(2):
        await limiter.admit("")
    assert limiter.stats("")[0].waiting == 0
    held.release()
    assert limiter.keys_held == 0
    assert limiter.try_admit("") is not None


async def test_a_grant_racing_a_cancel_is_either_returned_or_given_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = LocalLimiter(Limit(concurrency=1))
    for cancel_first in (False, True):
        held = limiter.try_admit("")
        assert held is not None
        got: list[object] = []

        async def wait_for_one(into: list[object]) -> None:
            into.append(await limiter.admit(""))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_for_one, got)
            await trio.sleep(1)
            if cancel_first:
                nursery.cancel_scope.cancel()
                held.release()
            else:
                held.release()  # grants the waiter ...
                nursery.cancel_scope.cancel()  # ... cancelled before it runs again
        # Whoever did not get it back as a result holds nothing.
        assert limiter.stats("")[0].running == len(got)
        for admission in got:
            assert isinstance(admission, type(held))
            admission.release()
        assert limiter.keys_held == 0


async def test_the_head_blocked_only_by_the_rate_wakes_on_the_clock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = LocalLimiter(Limit(concurrency=5, rate=1, per=4))
    first = limiter.try_admit("")
    assert first is not None
    t0 = trio.current_time()
    second = await limiter.admit("")
    assert second is not None and trio.current_time() - t0 == pytest.approx(4)
    assert limiter.retry_after("") == pytest.approx(4)
    second.release()
    first.release()
    assert limiter.retry_after("unknown") == 0.0
    blocked = LocalLimiter(Limit(concurrency=1))
    assert blocked.try_admit("") is not None
    assert blocked.retry_after("") is None  # waits for a running one to end: unknown


async def test_idle_keys_are_swept_so_state_stays_bounded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limiter = LocalLimiter(Limit(rate=1, per=1, key=lambda c: c.id))
    for n in range(SWEEP_AT_KEYS):
        assert limiter.try_admit(str(n)) is not None
    assert limiter.keys_held == SWEEP_AT_KEYS  # each key's start still counts
    await trio.sleep(2)
    assert limiter.try_admit("new") is not None
    assert limiter.keys_held == 1


async def test_waiting_counts_show_in_the_stats(autojump_clock: trio.testing.MockClock) -> None:
    limiter = LocalLimiter(Limit(concurrency=1, name="sync"))
    held = limiter.try_admit("t")
    assert held is not None
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(functools.partial(limiter.admit, "t", patience_s=math.inf))
        await trio.sleep(1)
        (stats,) = limiter.stats("t")
        assert (stats.name, stats.scope, stats.running, stats.waiting) == ("sync", "worker", 1, 3)
        nursery.cancel_scope.cancel()
    held.release()


def test_the_local_limiter_runs_under_asyncio() -> None:
    async def main() -> None:
        limiter = LocalLimiter(Limit(concurrency=2, rate=100, per=1), concurrency.current())
        most = 0
        running = 0
        admitted = 0

        async def job() -> None:
            nonlocal most, running, admitted
            admission = await limiter.admit("")
            assert admission is not None
            running += 1
            admitted += 1
            most = max(most, running)
            for _ in range(3):
                await asyncio.sleep(0)
            running -= 1
            admission.release()

        await asyncio.gather(*(job() for _ in range(20)))
        assert most == 2 and admitted == 20

    asyncio.run(main())


async def test_the_gate_admits_through_a_local_limit_by_the_jobs_key(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from sepp._limits.gate import LimitGate

    gate = LimitGate(sepp.Limit(concurrency=1, key=lambda c: c.custom["t"]))
    await gate.run()  # a local limit has nothing to run in the background
    a = job_context(custom={"t": "a"})
    first = gate.try_admit(a)
    assert first is not None and first.key == "a"
    assert gate.try_admit(a) is None and gate.retry_after(a) is None
    assert await gate.admit(a, patience_s=1) is None
    other = await gate.admit(job_context(custom={"t": "b"}))
    assert other is not None
    assert sorted((s.key, s.running) for s in gate.stats()) == [("a", 1), ("b", 1)]
    first.release()
    other.release()
    assert gate.keys_held == 0
    gate.close()


def test_a_global_gate_needs_a_client_and_a_name() -> None:
    from sepp._limits.gate import LimitGate

    limit = sepp.Limit(concurrency=1, scope="global")
    with pytest.raises(ValueError, match="client"):
        LimitGate(limit.named("t"))
    with pytest.raises(ValueError, match="name"):
        LimitGate(limit, client=object())  # type: ignore[arg-type]
    gate = LimitGate(limit.named("t"), client=object())  # type: ignore[arg-type]
    assert gate.try_admit("") is None and gate.retry_after("") is None
