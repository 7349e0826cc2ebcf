"""Stopping a Worker or a Scheduler: `ShutdownHandle`, which asks from any thread or a signal
handler, and `WorkerShutdown`, a Worker's graceful shutdown once asked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .concurrency import TRIO, Concurrency, RunHandle

if TYPE_CHECKING:
    from .held_job import HeldJobs
    from .reporting import WorkerReport


class _Stoppable(Protocol):
    @property
    def is_shutdown(self) -> bool: ...

    def _request_shutdown(self, *, from_task: bool, now: bool = False) -> None: ...


class ShutdownHandle:
    """Asks a Worker or a Scheduler to shut down. `shutdown()` is safe from any thread and from
    a signal handler, before, during or after `run()`."""

    __slots__ = ("_target",)

    def __init__(self, target: _Stoppable) -> None:
        self._target = target

    def shutdown(self, *, now: bool = False) -> None:
        """Ask for a graceful shutdown (idempotent). `now=True` does not wait for a Worker's
        running handlers: they are cancelled and their jobs returned, as when the worker's
        `shutdown_timeout` passes. A Scheduler always stops at once."""
        self._target._request_shutdown(from_task=False, now=now)

    @property
    def is_shutdown(self) -> bool:
        """Whether shutdown was requested."""
        return self._target.is_shutdown

    def __repr__(self) -> str:
        return f"<sepp.ShutdownHandle of {self._target!r}>"


class WorkerShutdown:
    """A Worker's shutdown: requested from anywhere (`requested`, `stop_now`), begun in the run
    (`begun`: reserving stops, jobs waiting for a slot go back), then `drain`: the grace period
    for the running handlers, which `stop_now` ends at once."""

    __slots__ = ("began_at", "begun", "cc", "grace", "requested", "run", "stop_now", "timeout_s")

    def __init__(self, timeout_s: float, cc: Concurrency = TRIO) -> None:
        self.timeout_s = timeout_s  # the grace period, from the request
        # Set from any thread or signal handler; read by the Worker's run() when it starts.
        self.requested = False
        self.stop_now = False  # shutdown(now=True): no grace period for running handlers
        self.begun = False
        self.began_at = 0.0
        self.run = RunHandle()  # the run to begin the shutdown in, while the Worker runs
        self.use(cc)

    def use(self, cc: Concurrency) -> None:
        """Run on `cc` (before the Worker's run)."""
        self.cc = cc
        self.grace = cc.cancel_scope()  # cancelled early by shutdown(now=True)
        if self.stop_now:
            self.grace.cancel()

    def begin(self) -> None:
        self.begun = True
        self.began_at = self.cc.current_time()

    async def drain(self, held: HeldJobs, report: WorkerReport) -> None:
        """After reserving stopped: the grace period, then cancel whatever still runs (the
        nursery around the caller waits for the cancelled jobs' nacks)."""
        if held:
            report.waiting_for_jobs(len(held), self.timeout_s)
        # The grace runs from the shutdown request, not from when reserving stopped.
        self.grace.deadline = self.began_at + self.timeout_s
        with self.grace:
            while held:
                await held.wait_for_change()
        if held:
            report.cancelling_jobs(
                len(held), told_to_stop_now=self.cc.current_time() < self.grace.deadline
            )
            held.stop(waiting_only=False)
