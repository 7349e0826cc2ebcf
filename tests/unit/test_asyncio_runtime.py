"""The asyncio runtime's own pieces: its cancel scopes, task group and parking, without a
server; and that under trio nothing of it (nor asyncio) is loaded."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from sepp._runtime.asyncio_runtime import ASYNCIO
from sepp.wire.drivers._asyncio_scopes import MoveOnAt, enclosing_deadline

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_a_scope_swallows_only_its_own_deadline() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        with MoveOnAt(loop.time() + 0.01) as scope:
            await asyncio.sleep(10)
        assert scope.cancelled_caught
        await asyncio.sleep(0)  # the task is not left cancelled
        task = asyncio.current_task()
        assert task is not None
        assert task.cancelling() == 0
        with MoveOnAt(loop.time() + 10) as untouched:
            await asyncio.sleep(0)
        assert not untouched.cancelled_caught

    run(main())


def test_a_cancellation_from_outside_goes_through_a_scope() -> None:
    async def inner(entered: asyncio.Event) -> None:
        with MoveOnAt(float("inf")):
            entered.set()
            await asyncio.sleep(10)

    async def main() -> None:
        entered = asyncio.Event()
        task = asyncio.ensure_future(inner(entered))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())


def test_cancel_ends_the_scope_body_at_once() -> None:
    async def main() -> None:
        with MoveOnAt(float("inf")) as scope:
            scope.cancel()
            await asyncio.sleep(10)
        assert scope.cancelled_caught

    run(main())


def test_a_task_group_waits_for_its_tasks_and_refuses_new_ones_once_closed() -> None:
    async def main() -> None:
        done: list[int] = []

        async def work(n: int) -> None:
            await asyncio.sleep(0.01 * n)
            done.append(n)

        async with ASYNCIO.open_task_group() as group:
            for n in (2, 1, 0):
                group.start_soon(work, n)
        assert sorted(done) == [0, 1, 2]
        with pytest.raises(RuntimeError):
            group.start_soon(work, 3)

    run(main())


def test_a_failing_task_cancels_the_others_and_the_group_raises_it() -> None:
    async def main() -> list[str]:
        ended: list[str] = []

        async def fails() -> None:
            raise ValueError("boom")

        async def sleeps() -> None:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                ended.append("cancelled")
                raise

        with pytest.raises(BaseExceptionGroup) as info:
            async with ASYNCIO.open_task_group() as group:
                group.start_soon(sleeps)
                group.start_soon(fails)
        assert [type(e) for e in info.value.exceptions] == [ValueError]
        return ended

    assert run(main()) == ["cancelled"]


def test_cancelling_the_owner_of_a_task_group_cancels_its_tasks_first() -> None:
    ended: list[str] = []

    async def sleeps() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            ended.append("child ended")

    async def owner(entered: asyncio.Event) -> None:
        async with ASYNCIO.open_task_group() as group:
            group.start_soon(sleeps)
            entered.set()
        ended.append("never")  # pragma: no cover - the owner is cancelled

    async def main() -> None:
        entered = asyncio.Event()
        task = asyncio.ensure_future(owner(entered))
        await entered.wait()
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert asyncio.all_tasks() == {asyncio.current_task()}

    run(main())
    assert ended == ["child ended"]


def test_a_parked_task_wakes_once_unparked_and_aborts_if_cancelled_first() -> None:
    async def main() -> list[str]:
        seen: list[str] = []
        waiters: list[Any] = []

        async def parks(name: str) -> None:
            waiters.append(ASYNCIO.waiter())
            await ASYNCIO.park(lambda _: seen.append(f"{name} aborted"))
            seen.append(f"{name} woken")

        woken = asyncio.ensure_future(parks("a"))
        await asyncio.sleep(0)
        ASYNCIO.unpark(waiters[0])
        await woken
        cancelled = asyncio.ensure_future(parks("b"))
        await asyncio.sleep(0)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        return seen

    assert run(main()) == ["a woken", "b aborted"]


def test_an_event_waits_as_trios_does_and_the_clients_wait_does_not_yield_once_set() -> None:
    async def main() -> list[str]:
        seen: list[str] = []

        async def other() -> None:
            seen.append("other ran")

        event = ASYNCIO.event()
        event.set()
        task = asyncio.ensure_future(other())
        await ASYNCIO.wait_event(event, float("inf"))  # set: returns without a checkpoint
        seen.append("client's wait returned")
        await event.wait()  # set: a checkpoint, which lets the other task run
        seen.append("wait returned")
        await task
        return seen

    assert run(main()) == ["client's wait returned", "other ran", "wait returned"]


def test_a_set_event_still_delivers_an_anyio_cancellation() -> None:
    import anyio

    async def main() -> bool:
        event = ASYNCIO.event()
        event.set()
        with anyio.CancelScope() as scope:
            scope.cancel()
            await event.wait()
        return scope.cancelled_caught

    assert run(main())


def test_a_call_from_another_thread_runs_in_the_loop_and_knows_where_it_is() -> None:
    import threading

    async def main() -> list[object]:
        call = ASYNCIO.call_soon_handle()
        seen: list[object] = [call.here()]
        ran = asyncio.Event()

        def in_loop() -> None:
            seen.append(call.here())
            ran.set()

        thread = threading.Thread(target=lambda: seen.append(call(in_loop)))
        thread.start()
        await ran.wait()
        thread.join()
        return seen

    assert run(main()) == [True, True, True]


def test_an_anyio_scope_gives_its_deadline_and_none_is_inf() -> None:
    import anyio

    async def main() -> tuple[float, float, float]:
        outside = enclosing_deadline()
        with anyio.CancelScope(deadline=anyio.current_time() + 5):
            deadline = enclosing_deadline()
            await asyncio.sleep(0)
        return outside, deadline, anyio.current_time()

    outside, deadline, now = run(main())
    assert outside == float("inf") and now < deadline <= now + 5


def test_opening_a_client_under_trio_loads_neither_asyncio_nor_its_runtime() -> None:
    code = (
        "import sys, trio, sepp\n"
        "async def main():\n"
        "    try:\n"
        "        async with sepp.open('127.0.0.1:1', connect_timeout=0.5): pass\n"
        "    except sepp.ConnectError: pass\n"
        "trio.run(main)\n"
        "print(sorted(m for m in ('asyncio', 'sepp._runtime.asyncio_runtime') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
