"""Global limits against the real server, within one test process: several gates (each as a
separate Worker process would hold it, on its own connection) share one limit. The
multi-process and SIGKILL proofs are in test_limits_processes_real.py."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

import sepp
from sepp._limits import permits
from sepp._limits.gate import LimitGate
from sepp._limits.global_pool import GlobalTuning
from sepp.testing import SeppServer, sepp_server

pytestmark = [pytest.mark.real_server]

HANG_GUARD_S = 120.0
BASE: dict[str, object] = {
    "admin": {"enabled": False},
    "storage": {"persist_mode": "buffer", "dead_letter_retention_ms": 600_000},
}
# Short epochs so that tests cross boundaries; the skew a loopback server needs.
QUICK = GlobalTuning(epoch_s=6.0, skew_s=0.2, poll_s=1.0, genesis_retry_s=2.0)


@asynccontextmanager
async def gates(
    server: SeppServer, limit: sepp.Limit, count: int, tuning: GlobalTuning = QUICK
) -> AsyncIterator[list[LimitGate]]:
    """`count` gates for `limit`, each on its own client, running for the block; closed at its
    end, after which each gate's run() returns once its releases are sent."""
    async with trio.open_nursery() as nursery:
        opened: list[LimitGate] = []
        ended: list[trio.Event] = []
        try:
            for _ in range(count):
                client = await nursery.start(_open_client, server.address)
                gate = LimitGate(limit, client=client, tuning=tuning)
                done = trio.Event()
                await nursery.start(_run_gate, gate, done)
                opened.append(gate)
                ended.append(done)
            yield opened
        finally:
            for gate in opened:
                gate.close()
            with trio.move_on_after(HANG_GUARD_S):
                for done in ended:
                    await done.wait()
            nursery.cancel_scope.cancel()


async def _run_gate(
    gate: LimitGate, done: trio.Event, *, task_status: trio.TaskStatus[None]
) -> None:
    try:
        await gate.run(task_status=task_status)
    finally:
        done.set()


async def _open_client(address: str, *, task_status: trio.TaskStatus[sepp.Client]) -> None:
    async with sepp.open(address) as client:
        task_status.started(client)
        await trio.sleep_forever()


def overlaps(intervals: list[tuple[float, float]]) -> int:
    """How many pairs of intervals overlap."""
    ordered = sorted(intervals)
    return sum(1 for n, (start, _) in enumerate(ordered) for _, end in ordered[:n] if start < end)


async def run_through(
    gate: LimitGate,
    key: str,
    record: list[tuple[float, float]],
    *,
    hold_s: float,
) -> None:
    admission = await gate.admit(key)
    assert admission is not None
    lost: list[str] = []
    admission.on_lost(lost.append)
    start = trio.current_time()
    await trio.sleep(hold_s)
    record.append((start, trio.current_time()))
    assert not lost
    admission.release()


async def run_many(
    shared: list[LimitGate],
    each: int,
    record: list[tuple[float, float]],
    *,
    key: str = "",
    hold_s: float,
) -> None:
    """`each` runs through every gate, all at once."""
    with trio.fail_after(HANG_GUARD_S):
        async with trio.open_nursery() as nursery:
            for gate in shared:
                for _ in range(each):
                    nursery.start_soon(
                        functools.partial(run_through, gate, key, record, hold_s=hold_s)
                    )


async def test_a_global_concurrency_of_one_never_overlaps_across_gates() -> None:
    limit = sepp.Limit(concurrency=1, scope="global", name="one", lease=5)
    async with sepp_server(BASE) as server, gates(server, limit, 3) as shared:
        record: list[tuple[float, float]] = []
        await run_many(shared, 8, record, hold_s=0.02)
        assert len(record) == 24
        assert overlaps(record) == 0


async def test_keys_are_independent_and_each_is_never_twice_at_once() -> None:
    limit = sepp.Limit(
        concurrency=1, scope="global", name="tenants", key=lambda c: c.custom["t"], lease=5
    )
    async with sepp_server(BASE) as server, gates(server, limit, 2) as shared:
        record: dict[str, list[tuple[float, float]]] = {"a": [], "b": []}
        with trio.fail_after(HANG_GUARD_S):
            async with trio.open_nursery() as nursery:
                for gate in shared:
                    for key in ("a", "b"):
                        for _ in range(5):
                            nursery.start_soon(
                                functools.partial(run_through, gate, key, record[key], hold_s=0.2)
                            )
        assert [len(record[k]) for k in "ab"] == [10, 10]
        assert overlaps(record["a"]) == 0 and overlaps(record["b"]) == 0
        # The two tenants did run side by side.
        assert overlaps(record["a"] + record["b"]) > 0


async def test_a_global_rate_never_grants_more_than_r_per_window() -> None:
    limit = sepp.Limit(rate=3, per=1.0, scope="global", name="paced")
    async with sepp_server(BASE) as server, gates(server, limit, 3) as shared:
        starts: list[float] = []

        async def start(gate: LimitGate) -> None:
            admission = await gate.admit("")
            assert admission is not None
            starts.append(trio.current_time())

        with trio.fail_after(HANG_GUARD_S):
            async with trio.open_nursery() as nursery:
                for gate in shared:
                    for _ in range(7):
                        nursery.start_soon(start, gate)
        assert len(starts) == 21
        starts.sort()
        # The server grants at most 3 in any second; a start follows its grant by the time an
        # answer takes to arrive and be read, so the windows are taken a little shorter.
        window = 1.0 - 0.25
        assert max(sum(1 for s in starts if t <= s < t + window) for t in starts) <= 3
        assert starts[-1] - starts[0] >= 6 * 0.99  # 21 starts at 3 a second: 6 windows


async def test_a_permit_held_across_epoch_boundaries_is_claimed_and_not_doubled() -> None:
    """A handler that runs over two epoch boundaries (6 s epochs) while other gates wait and
    make each new epoch's permits: nobody runs beside it."""
    limit = sepp.Limit(concurrency=1, scope="global", name="straddle", lease=1.5)
    async with sepp_server(BASE) as server, gates(server, limit, 3) as shared:
        record: list[tuple[float, float]] = []
        with trio.fail_after(HANG_GUARD_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    functools.partial(run_through, shared[0], "", record, hold_s=13.0)
                )
                await trio.sleep(0.5)
                for gate in shared[1:]:
                    for _ in range(3):
                        nursery.start_soon(
                            functools.partial(run_through, gate, "", record, hold_s=0.4)
                        )
        assert len(record) == 7
        assert overlaps(record) == 0
        # The slot lives on: one more run gets it.
        again: list[tuple[float, float]] = []
        with trio.fail_after(HANG_GUARD_S):
            await run_through(shared[2], "", again, hold_s=0.0)
        assert len(again) == 1


class FailingExtends:
    """A client whose extends fail as if the network to the server were cut."""

    def __init__(self, inner: sepp.Client) -> None:
        self._inner = inner
        self.cut = False

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def extend(self, ctx: sepp.JobContext, lease: float, **kw: object) -> object:
        if self.cut:
            raise sepp.TransportError("cut off (test)")
        return await self._inner.extend(ctx, lease, **kw)  # type: ignore[arg-type]


async def test_a_holder_that_cannot_extend_is_fenced_before_another_gets_the_permit() -> None:
    limit = sepp.Limit(concurrency=1, scope="global", name="fenced", lease=2.0)
    async with sepp_server(BASE) as server, trio.open_nursery() as nursery:
        inner = await nursery.start(_open_client, server.address)
        other_client = await nursery.start(_open_client, server.address)
        cut = FailingExtends(inner)
        holder = LimitGate(limit, client=cut, tuning=QUICK)  # type: ignore[arg-type]
        other = LimitGate(limit, client=other_client, tuning=QUICK)
        await nursery.start(holder.run)
        await nursery.start(other.run)
        with trio.fail_after(HANG_GUARD_S):
            held = await holder.admit("")
            assert held is not None
            lost_at: list[float] = []
            held.on_lost(lambda why: lost_at.append(trio.current_time()))
            cut.cut = True
            got = await other.admit("")
            got_at = trio.current_time()
        assert got is not None
        assert lost_at and lost_at[0] <= got_at  # fenced first: never two holders
        held.release()  # a lost permit is not touched again
        got.release()
        holder.close()
        other.close()
        await trio.sleep(0.5)
        nursery.cancel_scope.cancel()


async def test_permits_are_refreshed_before_their_attempts_run_out() -> None:
    config = {**BASE, "queues": [{"name": "sepp-limit.worn.c", "max_attempts_ceiling": 3}]}
    limit = sepp.Limit(concurrency=1, scope="global", name="worn", lease=5)
    async with sepp_server(config) as server:
        async with gates(server, limit, 2) as shared:
            record: list[tuple[float, float]] = []
            await run_many(shared, 10, record, hold_s=0.01)
            assert len(record) == 20 and overlaps(record) == 0
        async with sepp.open(server.address) as client:
            dead = await client.drain_dead_letters(queue="sepp-limit.worn.c", max=100)
            assert dead == []  # no permit ever reached its last attempt's nack
            jobs = await client.reserve(["sepp-limit.worn.c"], wait_timeout=0, max_jobs=10)
            live = [j for j in jobs or () if j.ctx.job_type == permits.PERMIT_TYPE]
            assert len(live) == 1 and live[0].ctx.custom[permits.GENERATION] >= 5


async def test_a_strict_server_that_does_not_declare_the_queue_is_a_clear_error() -> None:
    config = {**BASE, "server": {"strict_queues": True}, "queues": [{"name": "work"}]}
    limit = sepp.Limit(concurrency=1, scope="global", name="undeclared", lease=5)
    async with sepp_server(config) as server, gates(server, limit, 1) as (gate,):
        from sepp._limits.errors import GlobalLimitError

        with trio.fail_after(HANG_GUARD_S), pytest.raises(GlobalLimitError, match="strict"):
            await gate.admit("")
        with pytest.raises(GlobalLimitError):
            await gate.admit("")
    declared = {**config, "queues": [{"name": "sepp-limit.undeclared.c"}]}
    async with sepp_server(declared) as server, gates(server, limit, 1) as (gate,):
        with trio.fail_after(HANG_GUARD_S):
            admission = await gate.admit("")
        assert admission is not None
        admission.release()


async def test_the_gate_counts_running_and_waiting_per_key() -> None:
    limit = sepp.Limit(concurrency=1, scope="global", name="counted", lease=5)
    async with sepp_server(BASE) as server, gates(server, limit, 1) as (gate,):
        with trio.fail_after(HANG_GUARD_S):
            held = await gate.admit("k")
            assert held is not None
            async with trio.open_nursery() as nursery:
                for _ in range(2):
                    nursery.start_soon(gate.admit, "k")
                await trio.sleep(0.3)
                (stats,) = gate.stats("k")
                assert (stats.running, stats.waiting, stats.scope) == (1, 2, "global")
                nursery.cancel_scope.cancel()
            assert gate.stats("k")[0].waiting == 0
            assert await gate.admit("k", patience_s=0.5) is None  # still held
            held.release()


async def test_a_holder_that_dies_after_claiming_an_epoch_gives_the_slot_back_in_it() -> None:
    """The claim marker at work: a holder crashes just after it claimed the new epoch for its
    slot; the permit it held comes back when its lease expires (attempt 2, an old epoch), and
    whoever gets it finds the claim was that holder's, so the slot goes on in the same epoch
    instead of waiting for the next epoch's genesis."""
    tuning = GlobalTuning(epoch_s=20.0, skew_s=0.2, poll_s=1.0, genesis_retry_s=2.0)
    limit = sepp.Limit(concurrency=1, scope="global", name="claimed", lease=1.5)
    async with sepp_server(BASE) as server, gates(server, limit, 1, tuning) as (survivor,):
        assert survivor._global is not None
        epochs, clock = survivor._global.epochs, survivor._global.clock
        async with trio.open_nursery() as outer:
            client = await outer.start(_open_client, server.address)
            doomed = LimitGate(limit, client=client, tuning=tuning)
            with trio.fail_after(HANG_GUARD_S):
                async with trio.open_nursery() as crashable:
                    await crashable.start(doomed.run)
                    held = await doomed.admit("")
                    assert held is not None
                    held_in = epochs.of(clock.now())
                    waiting = outer.start_soon  # the survivor waits from now on
                    got: list[int] = []
                    admitted = trio.Event()

                    async def wait_on_survivor() -> None:
                        admission = await survivor.admit("")
                        assert admission is not None
                        got.append(epochs.of(clock.now()))
                        admission.release()
                        admitted.set()

                    waiting(wait_on_survivor)
                    await trio.sleep_until(clock.local_deadline(epochs.start(held_in + 1)))
                    await trio.sleep(limit.lease)  # the holder claims the new epoch
                    crashed_in = epochs.of(clock.now())
                    crashable.cancel_scope.cancel()  # as SIGKILL: nothing released
                await admitted.wait()
            outer.cancel_scope.cancel()
        assert got == [crashed_in]


def test_a_global_limit_holds_under_asyncio() -> None:
    """The same gates on asyncio (through anyio, the Worker's primitives there)."""
    import asyncio

    import anyio
    from fixtures.asyncio_front import server_in_thread

    from sepp._runtime import concurrency

    limit = sepp.Limit(concurrency=1, rate=50, per=1, scope="global", name="aio", lease=3)

    async def main(address: str) -> list[tuple[float, float]]:
        cc = concurrency.current()
        record: list[tuple[float, float]] = []
        async with sepp.open(address) as one, sepp.open(address) as two:
            shared = [LimitGate(limit, client=c, cc=cc, tuning=QUICK) for c in (one, two)]
            async with anyio.create_task_group() as background:
                for gate in shared:
                    await background.start(gate.run)

                async def run(gate: LimitGate) -> None:
                    admission = await gate.admit("")
                    assert admission is not None
                    start = anyio.current_time()
                    await asyncio.sleep(0.02)
                    record.append((start, anyio.current_time()))
                    admission.release()

                with anyio.fail_after(HANG_GUARD_S):
                    async with anyio.create_task_group() as jobs:
                        for gate in shared:
                            for _ in range(6):
                                jobs.start_soon(run, gate)
                for gate in shared:
                    gate.close()
        return record

    with server_in_thread(BASE) as address:
        record = asyncio.run(main(address))
    assert len(record) == 12 and overlaps(record) == 0
