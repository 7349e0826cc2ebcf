"""A job the Worker holds a lease on, from the reserve that returned it until it settles."""

from __future__ import annotations

import enum
from collections.abc import Callable
from datetime import datetime

import trio

from ._types import Job


class Phase(enum.Enum):
    WAITING = "waiting for a slot"
    RUNNING = "running"  # holds a slot
    SETTLING = "settling"


class HeldJob:
    """One held job: its phase, the cancel scope its handler runs in, and its lease state."""

    __slots__ = (
        "_deadline",
        "_seen_expiry",
        "forced",
        "job",
        "keeper_scope",
        "lease_lost",
        "phase",
        "scope",
        "slot_granted",
    )

    def __init__(self, job: Job) -> None:
        self.job = job
        self.phase = Phase.WAITING
        self.slot_granted = trio.Event()
        # Covers the wait for a slot and the handler; lease loss and shutdown cancel it.
        self.scope = trio.CancelScope()
        self.lease_lost: str | None = None
        # Cancels this job's lease keeper (if one was started) once the handler is done.
        self.keeper_scope = trio.CancelScope()
        self.forced = False
        self._seen_expiry: datetime | None = None
        self._deadline = 0.0

    def lease_deadline(self, now_utc: Callable[[], datetime], cap_s: float) -> float:
        """The granted expiry as a trio deadline, re-read whenever extend (ours or the
        handler's) moved it. Capped at `cap_s` from the conversion so a server clock running
        ahead of ours cannot make us extend late."""
        expiry = self.job.ctx.lease_expires_at
        if expiry != self._seen_expiry:
            left_s = (expiry - now_utc()).total_seconds()
            self._deadline = trio.current_time() + min(left_s, cap_s)
            self._seen_expiry = expiry
        return self._deadline

    def stop(self) -> None:
        """Shutdown: cancel the handler (or the wait for a slot); the job is nacked unless the
        handler still returns."""
        if self.phase is not Phase.SETTLING:
            self.forced = True
            self.scope.cancel()
