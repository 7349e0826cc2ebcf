"""A Worker's graceful shutdown once asked (`WorkerShutdown`); `ShutdownHandle`, which asks from
any thread or a signal handler, is `_runtime.shutdown_handle`'s (the Scheduler's too)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._runtime.concurrency import CancelScope, RunHandle, ServiceRuntime

if TYPE_CHECKING:
    from .held_job import HeldJobs
    from .reporting import WorkerReport


class WorkerShutdown:
    """A Worker's shutdown: requested from anywhere (`requested`, `stop_now`), begun in the run
    (`begun`: reserving stops, jobs waiting for a slot go back), then `drain`: the grace period
    for the running handlers, which `stop_now` ends at once. Made with the Worker, before the
    runtime of its run is known: what needs the runtime is given it."""

    __slots__ = (
        "_grace_cut",
        "began_at",
        "begun",
        "grace",
        "requested",
        "run",
        "stop_now",
        "timeout_s",
    )

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s  # the grace period, from the request
        # Set from any thread or signal handler; read by the Worker's run() when it starts.
        self.requested = False
        self.stop_now = False  # shutdown(now=True): no grace period for running handlers
        self.begun = False
        self.began_at = 0.0
        self.run = RunHandle()  # the run to begin the shutdown in, while the Worker runs
        self.grace: CancelScope | None = None  # the running handlers', once `drain` began
        self._grace_cut = False

    def begin(self, now: float) -> None:
        """In the run, at `now` (its runtime's time): the grace period starts."""
        self.begun = True
        self.began_at = now

    def cut_grace_short(self) -> None:
        """In the run: `stop_now` came; the running handlers get no grace (or none left)."""
        self._grace_cut = True
        if self.grace is not None:
            self.grace.cancel()

    async def drain(self, held: HeldJobs, report: WorkerReport, cc: ServiceRuntime) -> None:
        """After reserving stopped: the grace period, then cancel whatever still runs (the
        nursery around the caller waits for the cancelled jobs' nacks)."""
        if held:
            report.waiting_for_jobs(len(held), self.timeout_s)
        # The grace runs from the shutdown request, not from when reserving stopped.
        grace = self.grace = cc.cancel_scope(deadline=self.began_at + self.timeout_s)
        if self._grace_cut:
            grace.cancel()
        with grace:
            while held:
                await held.wait_for_change()
        if held:
            report.cancelling_jobs(len(held), told_to_stop_now=cc.current_time() < grace.deadline)
            held.stop(waiting_only=False)
