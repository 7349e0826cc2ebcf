"""A Worker's graceful shutdown once asked (`WorkerShutdown`); `ShutdownHandle`, which asks from
any thread or a signal handler, is `_runtime.shutdown_handle`'s (the Scheduler's too)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._runtime.concurrency import TRIO, RunHandle, ServiceRuntime

if TYPE_CHECKING:
    from .held_job import HeldJobs
    from .reporting import WorkerReport


class WorkerShutdown:
    """A Worker's shutdown: requested from anywhere (`requested`, `stop_now`), begun in the run
    (`begun`: reserving stops, jobs waiting for a slot go back), then `drain`: the grace period
    for the running handlers, which `stop_now` ends at once."""

    __slots__ = ("began_at", "begun", "cc", "grace", "requested", "run", "stop_now", "timeout_s")

    def __init__(self, timeout_s: float, cc: ServiceRuntime = TRIO) -> None:
        self.timeout_s = timeout_s  # the grace period, from the request
        # Set from any thread or signal handler; read by the Worker's run() when it starts.
        self.requested = False
        self.stop_now = False  # shutdown(now=True): no grace period for running handlers
        self.begun = False
        self.began_at = 0.0
        self.run = RunHandle()  # the run to begin the shutdown in, while the Worker runs
        self.use(cc)

    def use(self, cc: ServiceRuntime) -> None:
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
