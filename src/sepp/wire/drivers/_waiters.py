"""Callers parked on their calls' results, and the deadlines that end them early.

A call costs its caller one task switch: the caller parks with trio's low-level
`wait_task_rescheduled`, and the connection's reader reschedules it with the result, with no
Event per call. A call's own deadline (its timeout, `rpc_timeout` by default) is kept in one
heap per connection, checked by one task, instead of a cancel scope per call; the caller's
enclosing cancel scopes still reach it through the abort callback.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import trio

from .._events import CallFinished


class Waiter:
    """One call in flight: its parked task, and its result once it has one."""

    __slots__ = ("deadline", "done", "parked", "result", "stream_id", "task")

    def __init__(self, stream_id: int, deadline: float) -> None:
        self.stream_id = stream_id
        self.deadline = deadline
        self.task = trio.lowlevel.current_task()
        self.result: CallFinished | None = None  # None when its own deadline passed
        self.done = False
        # Whether the caller is parked yet: a call can finish before (its connection dying as
        # the caller writes the request), and a task that is running must not be rescheduled.
        self.parked = False

    async def park(self, abort: Callable[[object], trio.lowlevel.Abort]) -> CallFinished | None:
        """Wait for `finish` (at once if it already came); `abort` as for trio's
        wait_task_rescheduled."""
        if not self.done:
            self.parked = True
            await trio.lowlevel.wait_task_rescheduled(abort)
        return self.result

    def finish(self, result: CallFinished | None) -> None:
        """Hand the caller its result (None: its deadline passed) and wake it."""
        if not self.done:
            self.done = True
            self.result = result
            if self.parked:
                trio.lowlevel.reschedule(self.task)


class Deadlines:
    """The own deadlines of a connection's calls, earliest first, and the task that expires
    them. Finished calls are dropped lazily, and the heap is rebuilt from the live calls when
    stale entries outnumber them, so it stays proportional to the calls in flight."""

    def __init__(self, expire: Callable[[Waiter], None]) -> None:
        self._heap: list[tuple[float, int, Waiter]] = []
        self._added = 0
        self._expire = expire
        self._scope = trio.CancelScope(deadline=math.inf)

    def add(self, waiter: Waiter, live: int) -> None:
        """Track `waiter`'s deadline; `live` is how many calls are in flight."""
        if waiter.deadline == math.inf:
            return
        heap = self._heap
        if len(heap) > 64 and len(heap) > 4 * live:
            self._heap = heap = [entry for entry in heap if not entry[2].done]
            heapq.heapify(heap)
        self._added += 1
        heapq.heappush(heap, (waiter.deadline, self._added, waiter))
        if waiter.deadline < self._scope.deadline:
            self._scope.deadline = waiter.deadline  # wakes the keeper to sleep less

    async def keep(self) -> None:
        """Expire calls as their deadlines pass; runs for the connection's life."""
        while True:
            with self._scope:
                await trio.sleep_forever()
            heap = self._heap
            now = trio.current_time()
            while heap and (heap[0][0] <= now or heap[0][2].done):
                _, _, waiter = heapq.heappop(heap)
                if not waiter.done:
                    self._expire(waiter)
            self._scope = trio.CancelScope(deadline=heap[0][0] if heap else math.inf)
