"""The Worker's reserve loop: ask for as many jobs as there are free slots, hand each one to
processing, and outlive every failure with a jittered backoff."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._runtime.concurrency import TRIO, Concurrency

if TYPE_CHECKING:
    from .._client.otel import WorkerMetrics
    from .._model.types import Job
    from .client_calls import WorkerClient
    from .events import WorkerEvents
    from .held_job import HeldJobs
    from .reporting import WorkerReport
    from .settings import WorkerSettings
    from .shutdown import WorkerShutdown

# Reserve failures back off from `reserve_error_backoff`, doubling up to this (or the base,
# if larger), with each sleep drawn from [0.5, 1.0) of the step so workers do not stampede.
RESERVE_BACKOFF_CAP_S = 10.0
# An empty reserve returning faster than min(this, wait/2) means the server is not long-polling
# (draining, or shutting down); pause before the next poll instead of spinning.
EARLY_EMPTY_THRESHOLD_S = 0.1
EARLY_EMPTY_PAUSE_S = 0.25
# A reserve sent less than this long before shutdown is let finish rather than cancelled: on a
# non-empty queue the server has most likely leased jobs for it already, and cancelling would
# strand them until their leases expire. Older ones are long-polling an empty queue, and so is
# one sent after a reserve that found the queues drained (see ReserveLoop.run).
RESERVE_SETTLE_S = 0.5


class ReserveLoop:
    """Reserves until the shutdown begins; `run` inside `scope`, which `stop` cancels (or lets
    a reserve just sent finish first)."""

    def __init__(
        self,
        client: WorkerClient,
        settings: WorkerSettings,
        *,
        held: HeldJobs,
        dispatch: Callable[[Job], None],
        shutdown: WorkerShutdown,
        report: WorkerReport,
        events: WorkerEvents | None,
        metrics: WorkerMetrics,
        cc: Concurrency = TRIO,
    ) -> None:
        self._client = client
        self._queues = list(settings.queues)  # as the client is given them, every time
        self._metric_queues = settings.queues
        self._lease_s = settings.lease_s
        self._wait_s = settings.wait_s
        self._max_in_flight = settings.max_in_flight
        self._max_jobs = settings.max_jobs
        self._worker_id = settings.worker_id
        self._backoff_s = settings.reserve_backoff_s
        self._held = held
        self._dispatch = dispatch
        self._shutdown = shutdown
        self._report = report
        self._events = events
        self._metrics = metrics
        self.use(cc)
        self._sent_at: float | None = None
        # The last reserve found the queues drained, so the pending one is long-polling.
        self._queues_drained = False
        self._largest_batch = 0  # the most jobs one reserve has returned

    def use(self, cc: Concurrency) -> None:
        """Run on `cc` (before the Worker's run)."""
        self._cc = cc
        self.scope = cc.cancel_scope()

    def stop(self) -> None:
        """The shutdown began: cancel the pending reserve, unless it was sent so recently that
        the server has most likely leased jobs for it already (then it may finish)."""
        sent_at = self._sent_at
        if (
            sent_at is not None
            and not self._queues_drained
            and self._cc.current_time() - sent_at < RESERVE_SETTLE_S
        ):
            self.scope.deadline = sent_at + RESERVE_SETTLE_S
        else:
            self.scope.cancel()

    async def run(self, mark_started: Callable[[], None]) -> None:
        cc = self._cc
        current_time = cc.current_time
        failures = 0
        early_empty_s = min(EARLY_EMPTY_THRESHOLD_S, self._wait_s / 2)
        held = self._held
        while self._reserving():
            # An over-generous server can leave us holding more than max_in_flight.
            while len(held) >= self._max_in_flight:
                await held.wait_for_change()
            want = self._max_in_flight - len(held)
            if self._max_jobs is not None:
                want = min(want, self._max_jobs)
            mark_started()
            began = self._sent_at = current_time()
            try:
                jobs = await self._client.reserve(
                    self._queues,
                    lease_duration=self._lease_s,
                    wait_timeout=self._wait_s,
                    max_jobs=want,
                    worker_id=self._worker_id,
                )
            except Exception as exc:  # the loop must outlive every reserve failure
                self._sent_at = None
                if self._events is not None:
                    self._events.reserve_done(current_time() - began, exc)
                self._queues_drained = False  # unknown again
                # Tuples: metric SDKs before 1.45 hash the attributes (a list raises TypeError).
                self._metrics.add("reserve_failed", 1, {"sepp.queues": self._metric_queues})
                failures += 1
                delay = self._backoff(failures)
                self._report.reserve_failed(exc, failures, delay)
                await cc.sleep(delay)
                continue
            self._sent_at = None
            if self._events is not None:
                self._events.reserve_done(current_time() - began, None)
            got = len(jobs or ())
            # Fewer than asked means drained, unless the server caps a batch below what we
            # ask: so fewer than it has sent at once before, too (when unsure, not drained).
            short = got < want
            self._queues_drained = got == 0 or (short and got < self._largest_batch)
            self._largest_batch = max(self._largest_batch, got)
            self._metrics.add(
                "reserve_completed", 1, {"sepp.queues": self._metric_queues, "sepp.jobs": got}
            )
            if failures:
                self._report.reserve_works_again(failures)
                failures = 0
            # No checkpoint between the reserve returning and here: a shutdown cannot slip
            # in and drop leased jobs.
            for job in jobs or ():
                self._dispatch(job)
            if not self._reserving():
                return
            if jobs and short:
                # The next reserve will most likely long-poll, so let the handlers just
                # spawned start first (latency): they run in the next scheduler pass, in an
                # order the scheduler picks, so this task waits for the pass after it. A full
                # batch means a backlog: ask again at once (throughput); the handlers start
                # meanwhile.
                await cc.checkpoint()
                await cc.checkpoint()
            if not jobs and current_time() - began < early_empty_s:
                await cc.sleep(EARLY_EMPTY_PAUSE_S)

    def _reserving(self) -> bool:
        # A method, not the attribute, so type checkers see that awaits can change it.
        return not self._shutdown.begun

    def _backoff(self, failures: int) -> float:
        cap = max(RESERVE_BACKOFF_CAP_S, self._backoff_s)
        step = min(self._backoff_s * 2.0 ** min(failures - 1, 62), cap)
        return step * random.uniform(0.5, 1.0)
