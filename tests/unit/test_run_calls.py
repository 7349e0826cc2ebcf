"""`RunCalls`, the engine of a blocking client whose calls run in another thread's event loop
(a portal's `SyncClient`, a `def` handler's `ctx.client`): when the owner of its task group
cancels a call (the worker gave the handler up), the calls after it are refused at once; they
are never started, only to be cancelled in turn. Paced by events, never by sleeps."""

from __future__ import annotations

import threading

import trio

import sepp
from sepp._client.sync import RunCalls
from sepp._runtime import concurrency

BOUND_S = 30  # only a bound on a hung test; never part of an assertion


class Client:
    def __init__(self) -> None:
        self.started: list[str] = []

    async def wait(self) -> None:
        self.started.append("wait")
        await trio.sleep_forever()

    async def quick(self) -> int:
        self.started.append("quick")  # no checkpoint: it would finish even in a cancelled group
        return 1


async def test_a_call_its_owner_cancels_ends_the_calls_after_it_at_once() -> None:
    client = Client()
    said: list[object] = []
    thread_done = threading.Event()

    async with trio.open_nursery() as outer:
        with trio.CancelScope() as owner:  # the handler's scope, which its timeout cancels
            async with trio.open_nursery() as tasks:
                calls = RunCalls(
                    concurrency.current(),  # type: ignore[arg-type]
                    client,
                    tasks,
                    closed="closed",
                    cancelled="cancelled",
                    given_up="given up",
                )

                def handler_thread() -> None:
                    try:
                        for method in (Client.wait, Client.quick):
                            try:
                                said.append(calls.run(method))  # type: ignore[arg-type]
                            except sepp.ClientError as exc:
                                said.append(str(exc))
                    finally:
                        thread_done.set()

                outer.start_soon(trio.to_thread.run_sync, handler_thread)
                with trio.fail_after(BOUND_S):
                    while client.started != ["wait"]:  # noqa: ASYNC110 (another thread's call)
                        await trio.sleep(0.01)
                owner.cancel()
                # The group stays open until the thread is done (as the handler's does while
                # its thread returns): its next call meets a group that is still there.
                with trio.CancelScope(shield=True):
                    assert await trio.to_thread.run_sync(thread_done.wait, BOUND_S)
    assert said == ["cancelled", "given up"]
    assert client.started == ["wait"]  # the second call never started
