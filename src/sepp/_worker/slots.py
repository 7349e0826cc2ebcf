"""The Worker's handler slots: at most `max_in_flight` handlers run at once."""

from __future__ import annotations

import collections

from .held_job import HeldJob, Phase


class WorkerSlots:
    """Grants slots to waiting jobs in the order the server returned them (its priority
    order); a job whose scope was cancelled while it waited is skipped."""

    __slots__ = ("_max_in_flight", "_running", "_waiting")

    def __init__(self, max_in_flight: int) -> None:
        self._max_in_flight = max_in_flight
        self._waiting: collections.deque[HeldJob] = collections.deque()
        self._running = 0

    def queue(self, held: HeldJob) -> None:
        """Wait for a slot; it is granted (maybe at once) when one is free."""
        if not self._waiting and self._running < self._max_in_flight:
            self._running += 1
            held.grant_slot()
            return
        self._waiting.append(held)
        self._grant()

    def take(self, held: HeldJob) -> bool:
        """Grant `held` a slot if one is free and no job waits for one; else False."""
        if self._waiting or self._running >= self._max_in_flight:
            return False
        self._running += 1
        held.phase = Phase.RUNNING
        return True

    def release(self, held: HeldJob) -> None:
        """The job's handler is done (or never started): free its slot or its place."""
        if held.phase is Phase.RUNNING:
            self._running -= 1
            if self._waiting:
                self._grant()
        elif held.phase is Phase.WAITING:
            try:
                self._waiting.remove(held)
            except ValueError:
                pass

    def _grant(self) -> None:
        while self._running < self._max_in_flight and self._waiting:
            held = self._waiting.popleft()
            if held.cancelled:
                continue  # returned at shutdown or lease lost while it waited
            self._running += 1
            held.grant_slot()
