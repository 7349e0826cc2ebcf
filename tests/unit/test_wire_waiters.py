"""Parked calls and their deadlines (wire/_waiters.py), on trio's MockClock."""

from __future__ import annotations

import math

import trio
import trio.testing

from sepp.wire.drivers._waiters import Deadlines, Waiter


async def test_deadlines_expire_in_order_at_their_time(autojump_clock: trio.abc.Clock) -> None:
    expired: list[tuple[int, float]] = []

    def expire(waiter: Waiter) -> None:
        waiter.done = True
        expired.append((waiter.stream_id, trio.current_time()))

    deadlines = Deadlines(expire)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(deadlines.keep)
        start = trio.current_time()
        for stream_id, after in [(1, 30.0), (3, 10.0), (5, 20.0)]:
            deadlines.add(Waiter(stream_id, start + after), live=stream_id)
        await trio.sleep(5)
        deadlines.add(Waiter(7, start + 6.0), live=4)  # earlier than all: wakes the keeper
        await trio.sleep(40)
        nursery.cancel_scope.cancel()
    assert [(sid, at - start) for sid, at in expired] == [
        (7, 6.0),
        (3, 10.0),
        (5, 20.0),
        (1, 30.0),
    ]


async def test_finished_calls_never_expire(autojump_clock: trio.abc.Clock) -> None:
    expired: list[int] = []
    deadlines = Deadlines(lambda w: expired.append(w.stream_id))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(deadlines.keep)
        now = trio.current_time()
        done = Waiter(1, now + 1)
        pending = Waiter(3, now + 2)
        deadlines.add(done, live=1)
        deadlines.add(pending, live=2)
        done.done = True
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert expired == [3]


async def test_no_deadline_means_never_tracked() -> None:
    deadlines = Deadlines(lambda w: None)
    deadlines.add(Waiter(1, math.inf), live=1)
    assert deadlines._heap == []


async def test_the_heap_stays_proportional_to_the_calls_in_flight() -> None:
    deadlines = Deadlines(lambda w: None)
    live: list[Waiter] = []
    biggest = 0
    for stream_id in range(1, 20_001, 2):  # 10,000 calls, at most 10 in flight at once
        waiter = Waiter(stream_id, 1e9 + stream_id)
        live.append(waiter)
        deadlines.add(waiter, live=len(live))
        if len(live) == 10:
            for finished in live:
                finished.done = True
            live.clear()
        biggest = max(biggest, len(deadlines._heap))
    assert biggest <= 4 * 10 + 64 + 1


async def test_finish_wakes_the_parked_task_once() -> None:
    async with trio.open_nursery() as nursery:
        results: list[object] = []

        async def parked(task_status: trio.TaskStatus[Waiter]) -> None:
            waiter = Waiter(1, math.inf)
            task_status.started(waiter)
            results.append(await waiter.park(lambda _: trio.lowlevel.Abort.FAILED))

        waiter = await nursery.start(parked)
        waiter.finish(None)
        waiter.finish(None)  # a second result is ignored, not a second wake-up (trio would fail)
        await trio.testing.wait_all_tasks_blocked()
    assert results == [None]


async def test_a_call_finished_before_its_caller_parks_leaves_the_running_task_alone() -> None:
    """A connection can die inside the caller's own task (its write fails), finishing the call
    before the caller parks: the result is kept, and the running task is not rescheduled
    (which trio reports as TrioInternalError at its next checkpoint)."""
    from sepp.wire._events import CallFinished
    from sepp.wire._status import StatusCode

    waiter = Waiter(1, math.inf)
    result = CallFinished(1, StatusCode.UNAVAILABLE, "gone", None, None)
    waiter.finish(result)
    assert waiter.done and waiter.result is result
    await trio.lowlevel.checkpoint()  # trio would find this task scheduled twice
    waiter.finish(None)  # a second verdict (the deadline keeper's) changes nothing
    assert waiter.result is result
