"""The Worker's reserve loop: ask for as many jobs as there are free slots, hand each one to
processing, and outlive every failure with a jittered backoff."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .._model.backoff import backoff_delay
from .._runtime.concurrency import CancelScope, ServiceRuntime

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
# A long poll pending at shutdown is cancelled only after this many scheduler passes: an
# answer already in the socket when the shutdown began is read meanwhile (the connection's
# reader wakes on the next I/O poll and takes two steps; the caller then returns it, which a
# cancel after that no longer stops), so the jobs the server leased for it are not stranded.
# Passes, not seconds: a handler holding the loop (CPU-bound) delays both alike.
READ_PASSES = 4


class ReserveLoop:
    """Reserves until the shutdown begins; `run` inside `scope`. A cancelled reserve whose
    jobs the server leased strands them until their leases expire, so a reserve the server
    answers at once is never cancelled: one that does not wait (`wait_timeout` 0), sent
    first and after each reserve that found more work. Only after one found the queues
    drained does the loop long-poll, and `stop` cancels that one (once an answer already on
    its way has been read). A pause (`pause_wanted`, then `pause_changed`) stops it the same
    way, parked instead of ended, until the pause is lifted."""

    def __init__(
        self,
        client: WorkerClient,
        settings: WorkerSettings,
        *,
        held: HeldJobs,
        dispatch: Callable[[Job, float], None],
        shutdown: WorkerShutdown,
        report: WorkerReport,
        events: WorkerEvents | None,
        metrics: WorkerMetrics,
        cc: ServiceRuntime,
        pause_wanted: Callable[[], bool] = lambda: False,
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
        self._cc = cc
        self.scope = cc.cancel_scope()
        self._stopping = cc.event()  # set by stop() while a long poll is pending
        # Pausing: asked for from any thread (read at each decision); the loop parks in
        # `_unpaused` while paused, and a long poll pending when the pause came is cancelled
        # in `_poll_scope`, by a task woken through `_pausing`.
        self._pause_wanted = pause_wanted
        self._unpaused = cc.parking_lot()
        self._pausing = cc.parking_lot()
        self._poll_scope: CancelScope | None = None
        self._sent_at: float | None = None  # while a reserve is pending
        # The last reserve found the queues drained: the next one long-polls. Not known yet
        # (the first one, or after a failure): it does not wait.
        self._queues_drained = False
        self._long_polling = False  # the pending reserve is a long poll
        self._largest_batch = 0  # the most jobs one reserve has returned
        # Burst mode (`run(until_idle=True)`): never long-poll; once the queues are found
        # drained with nothing held, call this (it begins the shutdown) and end.
        self.on_idle: Callable[[], None] | None = None

    def stop(self) -> None:
        """The shutdown began (or, with `stop_now`, has to end now): end the loop. A reserve
        the server answers at once is let finish (its jobs are dispatched), within the grace
        period; a long poll is cancelled once an answer already on its way has been read;
        with no reserve pending, or told to stop now, at once."""
        shutdown = self._shutdown
        if self._sent_at is None or shutdown.stop_now:
            self.scope.cancel()
        elif self._long_polling:
            self._stopping.set()
        else:  # answered at once, unless the server or the network hangs: the grace bounds it
            self.scope.deadline = shutdown.began_at + shutdown.timeout_s

    def pause_changed(self) -> None:
        """In the run, after `pause_wanted` changed: a paused loop wakes to reserve again; a
        long poll pending as the pause came is cancelled once an answer already on its way
        has been read (as at shutdown), and a reserve answered at once is let finish (its jobs
        run). The loop sends no reserve while paused."""
        if self._pause_wanted():
            if self._poll_scope is not None:
                self._pausing.unpark_all()
            self._held.changed()  # a loop waiting for a free slot pauses now
        else:
            self._unpaused.unpark_all()

    async def run(self, mark_started: Callable[[], None]) -> None:
        async with self._cc.open_nursery() as nursery:
            nursery.start_soon(self._cancel_long_poll_when_stopping)
            nursery.start_soon(self._cancel_long_poll_when_pausing)
            await self._reserve_until_stopped(mark_started)
            nursery.cancel_scope.cancel()

    async def _cancel_long_poll_when_pausing(self) -> None:
        while True:
            await self._pausing.park()
            for _ in range(READ_PASSES):
                await self._cc.checkpoint()
            if self._pause_wanted() and self._poll_scope is not None:
                self._poll_scope.cancel()

    async def _sit_out_pause(self) -> None:
        """Paused, with no reserve pending: park until resumed (a shutdown cancels it)."""
        if self._events is not None:
            self._events.paused()
        self._report.paused(len(self._held))
        while self._pause_wanted():
            await self._unpaused.park()
        if self._events is not None:
            self._events.resumed()
        self._report.resumed()

    async def _long_poll(self, want: int) -> list[Job] | None:
        """A reserve that waits; a pause cancels it (None, as an empty answer)."""
        scope = self._poll_scope = self._cc.cancel_scope()
        try:
            with scope:
                return await self._client.reserve(
                    self._queues,
                    lease_duration=self._lease_s,
                    wait_timeout=self._wait_s,
                    max_jobs=want,
                    worker_id=self._worker_id,
                )
            return None
        finally:
            self._poll_scope = None

    async def _cancel_long_poll_when_stopping(self) -> None:
        await self._stopping.wait()
        for _ in range(READ_PASSES):
            await self._cc.checkpoint()
        self.scope.cancel()

    async def _reserve_until_stopped(self, mark_started: Callable[[], None]) -> None:
        cc = self._cc
        current_time = cc.current_time
        failures = 0
        early_empty_s = min(EARLY_EMPTY_THRESHOLD_S, self._wait_s / 2)
        held = self._held
        pause_wanted = self._pause_wanted
        while self._reserving():
            if pause_wanted():
                mark_started()  # the run has started: paused, not reserving
                await self._sit_out_pause()
                continue
            # An over-generous server can leave us holding more than max_in_flight.
            if len(held) >= self._max_in_flight:
                while len(held) >= self._max_in_flight and not pause_wanted():
                    await held.wait_for_change()
                if pause_wanted():
                    continue  # paused as it waited for a free slot
            if not self._reserving():
                # The shutdown began as a slot freed, before this task ran again: its cancel
                # found no reserve pending, and under asyncio it lands only once the next one
                # was sent, after the server had leased its jobs.
                return
            want = self._max_in_flight - len(held)
            if self._max_jobs is not None:
                want = min(want, self._max_jobs)
            mark_started()
            long_poll = self._long_polling = self._queues_drained and self.on_idle is None
            began = self._sent_at = current_time()
            try:
                if long_poll:
                    jobs = await self._long_poll(want)
                else:
                    jobs = await self._client.reserve(
                        self._queues,
                        lease_duration=self._lease_s,
                        wait_timeout=0.0,
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
                if not self._reserving():
                    return  # it failed as the shutdown began: no backoff to sit out
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
            if jobs:
                dispatched_at = current_time()  # one reading for the batch: their waits start
                for job in jobs:
                    self._dispatch(job, dispatched_at)
            if not self._reserving():
                return
            if self.on_idle is not None and not jobs:
                if not held:
                    self.on_idle()  # nothing ready, nothing held: the burst is done
                    return
                await held.wait_for_change()  # a job still held may come back (a retry)
                continue
            if jobs and short:
                # The next reserve will most likely long-poll, so let the handlers just
                # spawned start first (latency): they run in the next scheduler pass, in an
                # order the scheduler picks, so this task waits for the pass after it. A full
                # batch means a backlog: ask again at once (throughput); the handlers start
                # meanwhile.
                await cc.checkpoint()
                await cc.checkpoint()
            if (
                long_poll
                and not jobs
                and current_time() - began < early_empty_s
                and not (
                    pause_wanted()  # cut short by the pause
                )
            ):
                await cc.sleep(EARLY_EMPTY_PAUSE_S)

    def _reserving(self) -> bool:
        # A method, not the attribute, so type checkers see that awaits can change it.
        return not self._shutdown.begun

    def _backoff(self, failures: int) -> float:
        cap = max(RESERVE_BACKOFF_CAP_S, self._backoff_s)
        return backoff_delay(failures, initial=self._backoff_s, multiplier=2.0, cap=cap, jitter=0.5)
