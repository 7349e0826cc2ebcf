"""The runtimes the shared client code runs on: the blocking one never suspends (and says so,
with a typed error, if an operation would), and `run_concurrently` runs as many copies of a
worker as each runtime can."""

from __future__ import annotations

import types
from collections.abc import Callable, Generator

import pytest

import sepp
from sepp._model.errors import ClientInternalError
from sepp._runtime.blocking_runtime import BLOCKING, run_blocking
from sepp._runtime.protocol import Runtime
from sepp._runtime.trio_runtime import TRIO


@types.coroutine
def suspend() -> Generator[str, None, None]:
    """What awaiting anything that needs an event loop does: yield to it."""
    yield "suspended"


def test_run_blocking_returns_what_an_operation_that_never_suspends_returns() -> None:
    async def operation() -> int:
        await BLOCKING.sleep(0)
        await BLOCKING.wait_event(BLOCKING.event(), until=BLOCKING.current_time())
        return 42

    assert run_blocking(operation()) == 42


def test_an_operation_that_would_suspend_under_the_blocking_runtime_is_a_typed_error() -> None:
    ended: list[str] = []

    async def operation() -> None:
        try:
            await suspend()
        finally:
            ended.append("closed")

    with pytest.raises(ClientInternalError) as info:
        run_blocking(operation())
    assert str(info.value) == "sepp internal error: a blocking operation tried to suspend"
    assert isinstance(info.value, sepp.ClientError)  # what `except sepp.ClientError` catches
    assert info.value.code is None
    assert ended == ["closed"]  # the coroutine was closed, not left suspended


@pytest.mark.parametrize(
    "needs_a_loop",
    [
        lambda: BLOCKING.waiter(),
        lambda: BLOCKING.unpark(object()),
        lambda: BLOCKING.move_on_at(0.0),
        lambda: BLOCKING.open_task_group(),
        lambda: BLOCKING.call_soon_handle(),
    ],
)
def test_what_needs_an_event_loop_is_an_internal_error_under_the_blocking_runtime(
    needs_a_loop: Callable[[], object],
) -> None:
    with pytest.raises(ClientInternalError, match="needs an event loop"):
        needs_a_loop()


class Workers:
    """Copies of one worker taking items from a shared source, counting how many run at once."""

    def __init__(self, runtime: Runtime, items: int) -> None:
        self._runtime = runtime
        self._source = iter(range(items))
        self.done: list[int] = []
        self.started = 0
        self.running = 0
        self.most = 0

    async def worker(self) -> None:
        self.started += 1
        self.running += 1
        self.most = max(self.most, self.running)
        for item in self._source:
            await self._runtime.sleep(0)  # under trio, the other copies run here
            self.done.append(item)
        self.running -= 1


async def test_under_trio_at_most_copies_run_at_once_and_share_the_work() -> None:
    workers = Workers(TRIO, 10)
    await TRIO.run_concurrently(workers.worker, at_most=3)
    assert (workers.started, workers.most) == (3, 3)
    assert sorted(workers.done) == list(range(10))
    assert workers.running == 0


def test_the_blocking_runtime_runs_one_copy_which_does_all_the_work() -> None:
    workers = Workers(BLOCKING, 10)
    run_blocking(BLOCKING.run_concurrently(workers.worker, at_most=3))
    assert (workers.started, workers.most) == (1, 1)
    assert workers.done == list(range(10))
