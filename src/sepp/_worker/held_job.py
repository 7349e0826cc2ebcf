"""A job the Worker holds a lease on, from the reserve that returned it until it settles, and
the set of those it holds."""

from __future__ import annotations

import contextvars
import enum
from collections.abc import Callable
from datetime import datetime

from .._model.types import Job
from .._runtime.concurrency import CancelScope, Event, ServiceRuntime


class Phase(enum.Enum):
    WAITING = "waiting for a slot"
    RUNNING = "running"  # holds a slot
    SETTLING = "settling"
    TELLING = "telling its on_dead_letter hooks"  # after settling; a forced stop cancels them


class HeldJob:
    """One held job: its phase, the cancel scope its handler runs in, and its lease state."""

    __slots__ = (
        "_deadline",
        "_seen_expiry",
        "_slot_granted",
        "cc",
        "context",
        "dispatched_at",
        "earlier",
        "ended",
        "forced",
        "job",
        "keeper_scope",
        "lease_context",
        "lease_lost",
        "phase",
        "returned",  # see __init__
        "run_s",
        "scope",
        "started_at",
        "wait_s",
        "watch_key",
    )

    def __init__(self, job: Job, cc: ServiceRuntime) -> None:
        self.job = job
        self.cc = cc
        self.phase = Phase.WAITING
        # Made only if the job has to wait for its slot: most get one at once.
        self._slot_granted: Event | None = None
        # Covers the handler (and, in a task of the job's own, the wait for a slot); lease
        # loss and shutdown cancel it. A job runner's, while the runner runs this job's
        # handler; a scope of the job's own, made when the job gets a task of its own.
        self.scope: CancelScope | None = None
        # The job's own context, when a job runner runs it (a task of its own has its own).
        self.context: contextvars.Context | None = None
        self.lease_lost: str | None = None
        # The lease keeper's task scope, once one runs (most jobs settle before).
        self.keeper_scope: CancelScope | None = None
        # The job's context as its handler starts, for the keeper's extends (a runner's job:
        # its lease is kept only once its handler waits).
        self.lease_context: contextvars.Context | None = None
        self.watch_key = -1  # the LeaseKeeper's key while it watches this job
        self.forced = False
        # A run of the same job id still going in this worker (its lease ran out): this
        # delivery waits for it to end; `ended` is set when this one ends, if one waits.
        self.earlier: HeldJob | None = None
        self.ended: Event | None = None
        self._seen_expiry: datetime | None = None
        self._deadline = 0.0
        # On the run's clock: when the worker took the job from the reserve's answer, and when
        # its handler function itself started (after the slot and the middleware before it).
        self.dispatched_at = 0.0
        self.started_at: float | None = None
        # `returned` (what the handler returned, behind middleware) is set when it returns;
        # unset before, and read only for a job that asked for follow-ups or a result.
        self.returned: object
        self.run_s: float | None = None  # from the handler's start to the chain's end
        self.wait_s = 0.0  # from the dispatch to the handler's start (or the end, if never)

    def handler_started(self) -> None:
        """The handler function itself starts now (the middleware chain's innermost step)."""
        self.started_at = self.cc.current_time()

    @property
    def cancelled(self) -> bool:
        """Whether shutdown or lease loss cancelled `scope` (both set their flag first)."""
        return self.forced or self.lease_lost is not None

    async def wait_for_slot(self) -> None:
        """Return once the job holds a slot; without yielding if it already does (a
        cancellation of `scope` still raises here)."""
        if self.phase is Phase.RUNNING:
            await self.cc.checkpoint_if_cancelled()
            return
        if self._slot_granted is None:
            self._slot_granted = self.cc.event()
        await self._slot_granted.wait()

    def grant_slot(self) -> None:
        self.phase = Phase.RUNNING
        if self._slot_granted is not None:
            self._slot_granted.set()

    def lease_deadline(self, now_utc: Callable[[], datetime], cap_s: float) -> float:
        """The granted expiry as a deadline (on `current_time()`'s clock), re-read whenever
        extend (ours or the handler's) moved it. Capped at `cap_s` from the conversion so a
        server clock running ahead of ours cannot make us extend late."""
        if self.job.ctx.lease_expires_at != self._seen_expiry:
            now = self.cc.current_time()
            return self.convert_lease(now_utc(), now, now, cap_s)
        return self._deadline

    def convert_lease(self, wall: datetime, wall_at: float, now: float, cap_s: float) -> float:
        """Convert the granted expiry with a wall-clock reading `wall` taken at time `wall_at`
        (≤ `now`, so one reading can serve many jobs); returns `lease_deadline`."""
        expiry = self.job.ctx.lease_expires_at
        return self.remember_lease(
            expiry, min(wall_at + (expiry - wall).total_seconds(), now + cap_s)
        )

    def remember_lease(self, expiry: datetime, deadline: float) -> float:
        """`expiry` (the granted one) converted is `deadline`, until extend moves it."""
        self._deadline = deadline
        self._seen_expiry = expiry
        return deadline

    def stop(self) -> None:
        """Shutdown: cancel the handler (or the wait for a slot); the job is nacked unless the
        handler still returns. After its nack, its on_dead_letter hooks are cancelled."""
        if self.phase is not Phase.SETTLING:
            self.forced = True
            if self.scope is not None:  # else it has not started: it never will
                self.scope.cancel()


class HeldJobs:
    """The jobs a Worker holds, each delivery once; the latest delivery of each job id (a
    redelivery waits for the earlier run); and a wake-up for whoever waits for the set to
    shrink (the reserve loop when it is full, the shutdown while it drains)."""

    __slots__ = ("_by_delivery", "_latest", "_parked", "_shrunk", "_wakes", "cc")

    def __init__(self, cc: ServiceRuntime) -> None:
        self._by_delivery: dict[HeldJob, None] = {}  # by identity, in arrival order
        self._latest: dict[str, HeldJob] = {}
        self._parked = 0  # tasks in wait_for_change() since the last wake-up
        self._wakes = 0
        self.cc = cc
        self._shrunk = cc.parking_lot()

    def __len__(self) -> int:
        return len(self._by_delivery)

    def add(self, held: HeldJob) -> HeldJob | None:
        """Hold `held`; returns the earlier delivery of its job still held here, if any."""
        self._by_delivery[held] = None
        job_id = held.job.ctx.id
        earlier = self._latest.get(job_id)
        self._latest[job_id] = held
        return earlier

    def remove(self, held: HeldJob) -> None:
        """`held` has settled: let a redelivery waiting for it start, and wake the waiters."""
        del self._by_delivery[held]
        job_id = held.job.ctx.id
        if self._latest.get(job_id) is held:
            del self._latest[job_id]
        if held.ended is not None:
            held.ended.set()
        self.changed()

    def changed(self) -> None:
        if self._parked:  # mostly nobody, or the reserve loop alone (a count: no call)
            self._parked = 0
            self._wakes += 1
            self._shrunk.unpark_all()

    async def wait_for_change(self) -> None:
        wakes = self._wakes
        self._parked += 1
        try:
            await self._shrunk.park()
        except BaseException:
            if self._wakes == wakes:  # cancelled while still parked: still counted
                self._parked -= 1
            raise

    def stop(self, *, waiting_only: bool) -> None:
        """Shutdown: cancel the jobs waiting for a slot (and with `waiting_only` False, the
        running ones too: they are nacked unless their handlers still return)."""
        for held in list(self._by_delivery):
            if not waiting_only or held.phase is Phase.WAITING:
                held.stop()
