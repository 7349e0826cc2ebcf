"""Worker: reserve → handle → ack/nack on trio, with bounded concurrency (`_worker_slots`), lease
keeping (`_lease_keeper`) and a bounded graceful shutdown. Built only on the client calls in
`_worker_client.WorkerClient`."""

from __future__ import annotations

import enum
import logging
import os
import random
import secrets
import socket
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone

import trio

from . import _otel
from . import _outcomes as outcomes
from . import _validate as v
from ._errors import (
    AttemptMismatchError,
    JobNotFoundError,
    SeppError,
    UnauthenticatedError,
    UnknownQueuesError,
    ValidationError,
)
from ._held_job import HeldJob, Phase
from ._lease_keeper import LeaseKeeper
from ._log import Log, LoggerLike
from ._outcomes import HandlerError as HandlerError  # public as sepp.HandlerError
from ._router import DuplicateHandlerError as DuplicateHandlerError  # public as sepp.*
from ._router import H, Router
from ._router import Handler as Handler  # public as sepp.Handler
from ._types import Job, JobContext
from ._worker_client import WorkerClient
from ._worker_slots import WorkerSlots

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
# one sent after a reserve that found the queues drained (see _reserve_loop).
RESERVE_SETTLE_S = 0.5


class ShutdownHandle:
    """Asks a Worker to shut down gracefully. `shutdown()` is safe from any thread and from a
    signal handler, before, during or after `run()`."""

    __slots__ = ("_worker",)

    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    def shutdown(self) -> None:
        """Ask the worker to shut down gracefully (idempotent)."""
        self._worker._request_shutdown(from_task=False)

    @property
    def is_shutdown(self) -> bool:
        """Whether shutdown was requested."""
        return self._worker.is_shutdown

    def __repr__(self) -> str:
        return f"<sepp.ShutdownHandle of {self._worker!r}>"


class _RunState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    DONE = "done"


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


class Worker:
    """Reserves jobs from `queues` and runs the registered handler for each, at most
    `max_in_flight` at once, inside a nursery owned by `run()`.

    A handler that returns acks its job; one that raises `HandlerError` nacks it as the error
    says; any other exception nacks it with the queue's retry policy. With `auto_extend` the
    worker extends each lease before it runs out and, if the lease is lost anyway, cancels the
    handler and neither acks nor nacks.

    `shutdown()` stops reserving at once (a long-poll is cancelled; a reserve sent under half a
    second earlier may finish, since the server has most likely leased its jobs already, unless
    the one before it found the queues drained), and returns jobs still waiting for a slot.
    Running handlers get `shutdown_timeout` seconds; then they are cancelled and their jobs
    nacked for immediate retry. `run()` returns when every job it held is settled. Cancelling
    `run()` itself is the hard stop: nothing is acked or nacked and held jobs return when their
    leases expire.

    Durations are seconds (float) or `timedelta`. The worker needs only the client's public
    `reserve`, `ack`, `nack` and `extend` (any object with those, typed as `WorkerClient`).
    `handlers` registers a `sepp.Router`'s handlers.
    """

    def __init__(
        self,
        client: WorkerClient,
        queues: Sequence[str] | str,
        *,
        lease_duration: float | timedelta = 30.0,
        max_in_flight: int = 16,
        auto_extend: bool = True,
        wait_timeout: float | timedelta = 30.0,
        max_jobs: int | None = None,
        worker_id: str | None = None,
        shutdown_timeout: float | timedelta = 30.0,
        reserve_error_backoff: float | timedelta = 1.0,
        logger: LoggerLike | None = None,
        handlers: Router | None = None,
        _wall_clock: Callable[[], datetime] | None = None,
    ) -> None:
        names = [queues] if isinstance(queues, str) else list(queues)
        if not names:
            raise ValidationError("queues", "must name at least one queue")
        for index, name in enumerate(names):
            v.utf8_text(f"queues[{index}]", name)
        self._client = client
        self._queues = names
        self._lease_s = v.seconds("lease_duration", lease_duration)
        self._wait_s = v.seconds("wait_timeout", wait_timeout)
        self._max_in_flight = v.whole_number(
            "max_in_flight", max_in_flight, low=1, high=v.UINT32_MAX
        )
        self._max_jobs = (
            None
            if max_jobs is None
            else v.whole_number("max_jobs", max_jobs, low=1, high=v.UINT32_MAX)
        )
        self._shutdown_timeout_s = v.seconds("shutdown_timeout", shutdown_timeout, allow_zero=True)
        self._reserve_backoff_s = v.seconds("reserve_error_backoff", reserve_error_backoff)
        if not isinstance(auto_extend, bool):
            raise ValidationError("auto_extend", "must be a bool")
        self._auto_extend = auto_extend
        self._worker_id = (
            _default_worker_id() if worker_id is None else v.utf8_text("worker_id", worker_id)
        )
        self._log = Log(logger if logger is not None else logging.getLogger("sepp.worker"))
        self._now_utc = _wall_clock or _utc_now

        self._router = Router()
        if handlers is not None:
            if not isinstance(handlers, Router):
                raise ValidationError(
                    "handlers", f"must be a sepp.Router, got {type(handlers).__name__}"
                )
            self._router.include(handlers)

        self._state = _RunState.NEW
        # Set from any thread or signal handler; read by run() when it starts.
        self._shutdown_requested = False
        self._shutting_down = False
        self._shutdown_began_at = 0.0
        # The grace period of shutdown; cancelled early by _end_grace_period.
        self._grace_scope = trio.CancelScope()
        self._token: trio.lowlevel.TrioToken | None = None
        self._reserve_scope = trio.CancelScope()
        self._reserve_sent_at: float | None = None
        # The last reserve found the queues drained, so the pending one is long-polling.
        self._queues_drained = False
        self._largest_batch = 0  # the most jobs one reserve has returned
        self._held: dict[int, HeldJob] = {}
        self._held_changed = trio.lowlevel.ParkingLot()  # unparked whenever _held shrinks
        self._leases = LeaseKeeper(
            client, lease_s=self._lease_s, now_utc=self._now_utc, log=self._log
        )
        self._reserving_ended = False
        self._slots = WorkerSlots(self._max_in_flight)
        self._jobs_nursery: trio.Nursery | None = None
        self._metrics = _otel.WorkerMetrics()

    def __repr__(self) -> str:
        return (
            f"<sepp.Worker {self._worker_id} queues={self._queues} {self._state.value}"
            f" in_flight={len(self._held)}/{self._max_in_flight}>"
        )

    # -- registration -----------------------------------------------------------------------

    def handle(self, job_type: str, fn: Handler) -> Worker:
        """Register `fn` for `job_type`; returns the worker so calls chain. A second
        registration for the same type raises DuplicateHandlerError."""
        self._router.handle(job_type, fn)
        return self

    def handler(self, job_type: str) -> Callable[[H], H]:
        """Decorator form of `handle`."""
        return self._router.handler(job_type)

    def catch_all(self, fn: H) -> H:
        """Run `fn` for job types without a handler (usable as a decorator). Only one."""
        return self._router.catch_all(fn)

    # -- state --------------------------------------------------------------------------------

    @property
    def worker_id(self) -> str:
        """The id sent with every reserve (given, or made from host, pid and random bits)."""
        return self._worker_id

    @property
    def in_flight(self) -> int:
        """Jobs held right now: waiting for a slot, running, or being acked/nacked."""
        return len(self._held)

    @property
    def is_shutdown(self) -> bool:
        """Whether shutdown was requested (it may still be draining)."""
        return self._shutdown_requested

    # -- shutdown -----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Shut down gracefully; idempotent. Call it from a task; from another thread or a
        signal handler use `shutdown_handle().shutdown()`."""
        self._request_shutdown(from_task=True)

    def shutdown_handle(self) -> ShutdownHandle:
        """A handle whose `shutdown()` is safe from another thread or a signal handler."""
        return ShutdownHandle(self)

    def _request_shutdown(self, *, from_task: bool) -> None:
        # Flag first, token second; run() stores the token first and reads the flag second,
        # so at least one side sees the other and no request is lost.
        self._shutdown_requested = True
        token = self._token
        if token is None:
            return
        if from_task and _current_token() is token:
            self._begin_shutdown()
            return
        try:
            token.run_sync_soon(self._begin_shutdown, idempotent=True)
        except trio.RunFinishedError:
            pass

    def _end_grace_period(self) -> None:
        """Shut down without waiting for running handlers: cancel them and nack their jobs,
        as when `shutdown_timeout` passes (the command line's second signal). From a task."""
        self._request_shutdown(from_task=True)
        self._grace_scope.cancel()

    def _begin_shutdown(self) -> None:
        """In the run's thread: stop reserving, return jobs that have not started."""
        self._shutdown_requested = True
        if self._shutting_down or self._state is not _RunState.RUNNING:
            return
        self._shutting_down = True
        self._shutdown_began_at = trio.current_time()
        sent_at = self._reserve_sent_at
        if (
            sent_at is not None
            and not self._queues_drained
            and trio.current_time() - sent_at < RESERVE_SETTLE_S
        ):
            self._reserve_scope.deadline = sent_at + RESERVE_SETTLE_S
        else:
            self._reserve_scope.cancel()
        for held in list(self._held.values()):
            if held.phase is Phase.WAITING:
                held.stop()
        self._signal_held_changed()

    # -- running ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Reserve and process jobs until `shutdown()`; returns once every held job is
        settled. With `nursery.start(worker.run)`, start returns once the worker is reserving.
        A worker runs once."""
        if self._state is not _RunState.NEW:
            raise RuntimeError("Worker.run() can only be called once; create a new Worker")
        self._state = _RunState.RUNNING
        self._token = trio.lowlevel.current_trio_token()
        started = False

        def mark_started() -> None:
            nonlocal started
            if not started:
                started = True
                task_status.started()

        try:
            async with trio.open_nursery() as nursery:
                self._jobs_nursery = nursery
                if self._auto_extend:
                    nursery.start_soon(self._leases.run, nursery)
                if self._shutdown_requested:
                    self._begin_shutdown()
                else:
                    with self._reserve_scope:
                        await self._reserve_loop(mark_started)
                self._reserving_ended = True  # no job can arrive any more
                mark_started()
                await self._drain()
                self._stop_lease_keeping_if_idle()
        finally:
            self._state = _RunState.DONE
            self._token = None
            self._jobs_nursery = None

    async def _drain(self) -> None:
        """After reserving stopped: the grace period, then cancel whatever still runs."""
        if self._held:
            self._log.info(
                "sepp: worker %s shutting down; waiting up to %.3gs for %d job(s)",
                self._worker_id,
                self._shutdown_timeout_s,
                len(self._held),
            )
        # The grace runs from the shutdown request, not from when reserving stopped.
        self._grace_scope.deadline = self._shutdown_began_at + self._shutdown_timeout_s
        with self._grace_scope:
            while self._held:
                await self._held_changed.park()
        if self._held:
            early = trio.current_time() < self._grace_scope.deadline
            why = "told to stop now" if early else "shutdown_timeout passed"
            self._log.warning(
                "sepp: worker %s: %s; cancelling %d job(s) and returning them to the queue",
                self._worker_id,
                why,
                len(self._held),
            )
            for held in list(self._held.values()):
                held.stop()
        # The nursery around us waits for the cancelled jobs' nacks.

    async def _reserve_loop(self, mark_started: Callable[[], None]) -> None:
        failures = 0
        early_empty_s = min(EARLY_EMPTY_THRESHOLD_S, self._wait_s / 2)
        while self._reserving():
            # An over-generous server can leave us holding more than max_in_flight.
            while len(self._held) >= self._max_in_flight:
                await self._held_changed.park()
            want = self._max_in_flight - len(self._held)
            if self._max_jobs is not None:
                want = min(want, self._max_jobs)
            mark_started()
            began = self._reserve_sent_at = trio.current_time()
            try:
                jobs = await self._client.reserve(
                    self._queues,
                    lease_duration=self._lease_s,
                    wait_timeout=self._wait_s,
                    max_jobs=want,
                    worker_id=self._worker_id,
                )
            except Exception as exc:  # the loop must outlive every reserve failure
                self._reserve_sent_at = None
                self._queues_drained = False  # unknown again
                # Tuples: metric SDKs before 1.45 hash the attributes (a list raises TypeError).
                self._metrics.add("reserve_failed", 1, {"sepp.queues": tuple(self._queues)})
                failures += 1
                delay = self._reserve_backoff(failures)
                self._log_reserve_failure(exc, failures, delay)
                await trio.sleep(delay)
                continue
            self._reserve_sent_at = None
            got = len(jobs or ())
            # Fewer than asked means drained, unless the server caps a batch below what we
            # ask: so fewer than it has sent at once before, too (when unsure, not drained).
            short = got < want
            self._queues_drained = got == 0 or (short and got < self._largest_batch)
            self._largest_batch = max(self._largest_batch, got)
            self._metrics.add(
                "reserve_completed", 1, {"sepp.queues": tuple(self._queues), "sepp.jobs": got}
            )
            if failures:
                self._log.info(
                    "sepp: worker %s: reserve works again after %d failure(s)",
                    self._worker_id,
                    failures,
                )
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
                # order trio picks, so this task waits for the pass after it. A full batch
                # means a backlog: ask again at once (throughput); the handlers start meanwhile.
                await trio.lowlevel.checkpoint()
                await trio.lowlevel.checkpoint()
            if not jobs and trio.current_time() - began < early_empty_s:
                await trio.sleep(EARLY_EMPTY_PAUSE_S)

    def _reserving(self) -> bool:
        # A method, not the attribute, so type checkers see that awaits can change it.
        return not self._shutting_down

    def _reserve_backoff(self, failures: int) -> float:
        cap = max(RESERVE_BACKOFF_CAP_S, self._reserve_backoff_s)
        step = min(self._reserve_backoff_s * 2.0 ** min(failures - 1, 62), cap)
        return step * random.uniform(0.5, 1.0)

    def _log_reserve_failure(self, exc: Exception, failures: int, delay: float) -> None:
        if isinstance(exc, (UnauthenticatedError, UnknownQueuesError)):
            # Not transient: a wrong key or an undeclared queue needs a person; say so each time.
            self._log.error(
                "sepp: worker %s cannot reserve from %s: %s (failure %d; retrying in %.2fs)",
                self._worker_id,
                self._queues,
                outcomes.describe(exc),
                failures,
                delay,
            )
        elif isinstance(exc, SeppError):
            self._log.warning(
                "sepp: worker %s: reserve failed: %s (failure %d; retrying in %.2fs)",
                self._worker_id,
                outcomes.describe(exc),
                failures,
                delay,
            )
        else:
            self._log.error(
                "sepp: worker %s: reserve raised an unexpected %s (failure %d; retrying in %.2fs)",
                self._worker_id,
                outcomes.describe(exc),
                failures,
                delay,
                exc_info=exc,
            )

    def _dispatch(self, job: Job) -> None:
        assert self._jobs_nursery is not None
        ctx = job.ctx
        held = HeldJob(job)
        self._held[id(held)] = held
        fn = self._router.lookup(ctx.job_type)
        if fn is not None:
            self._slots.queue(held)
            if self._shutting_down and held.phase is Phase.WAITING:
                held.stop()
        # Type and id name the task well enough, and cost less than str(ctx).
        name = f"sepp job {ctx.job_type}[{ctx.id}]"
        self._jobs_nursery.start_soon(self._process, held, fn, name=name)

    def _signal_held_changed(self) -> None:
        if self._held_changed:  # anyone parked: mostly nobody, or the reserve loop alone
            self._held_changed.unpark_all()

    # -- one job ------------------------------------------------------------------------------

    async def _process(self, held: HeldJob, fn: Handler | None) -> None:
        try:
            ctx = held.job.ctx
            # The lease keeper, the handler and the ack/nack all run inside this span, so
            # their own spans nest under it (trio tasks inherit the spawner's context).
            with _otel.process_span(held.job, self._worker_id) as span:
                if fn is None:
                    held.phase = Phase.SETTLING
                    outcome: outcomes.Outcome | None = self._unknown_type(ctx)
                else:
                    if self._auto_extend:
                        self._leases.watch(held)
                    try:
                        outcome = await self._run_handler(held, fn)
                    finally:
                        if self._auto_extend:
                            self._leases.release(held)
                if outcome is None:
                    span.set("sepp.outcome", "lease_lost")
                    span.fail(held.lease_lost or "lease lost")
                else:
                    span.set("sepp.outcome", outcome.label)
                    if outcome.failure is not None:
                        span.fail(outcome.failure)
                    await self._settle(ctx, outcome)
        finally:
            del self._held[id(held)]
            self._signal_held_changed()
            self._stop_lease_keeping_if_idle()

    def _stop_lease_keeping_if_idle(self) -> None:
        if self._reserving_ended and not self._held:
            self._leases.stop()

    def _unknown_type(self, ctx: JobContext) -> outcomes.Outcome:
        delay = outcomes.unknown_type_delay_s(ctx)
        known = ", ".join(sorted(self._router.job_types)) or "none"
        self._log.warning(
            "sepp: worker %s has no handler for job type %r (job %s); returning it in %gs"
            " (registered: %s)",
            self._worker_id,
            ctx.job_type,
            ctx.id,
            delay,
            known,
        )
        return outcomes.unknown_type(ctx)

    async def _run_handler(self, held: HeldJob, fn: Handler) -> outcomes.Outcome | None:
        ctx = held.job.ctx
        returned = False
        error: Exception | None = None
        attributes = _job_attributes(ctx) if self._metrics.enabled else None
        started: float | None = None
        try:
            with held.scope:
                await held.wait_for_slot()
                if attributes is not None:
                    started = trio.current_time()
                    self._metrics.add("in_flight", 1, attributes)
                await fn(held.job.payload, ctx)
                returned = True
        except Exception as exc:  # the handler's failure is the job's outcome, not ours
            error = exc
        finally:
            self._slots.release(held)
            held.phase = Phase.SETTLING
            if attributes is not None and started is not None:
                self._metrics.add("in_flight", -1, attributes)
                self._metrics.record("duration", trio.current_time() - started, attributes)
        if held.lease_lost is not None:
            return None  # someone else may own the job now; logged by _lose_lease
        if returned:
            return outcomes.ACK
        if held.forced or error is None:
            return outcomes.SHUTDOWN
        requested = outcomes.requested(error)
        if requested is not None:
            return requested
        self._log.error(
            "sepp: handler for %s raised %s; nacking with the queue's retry policy",
            ctx,
            outcomes.describe(error),
            exc_info=error,
        )
        return outcomes.failed(error)

    async def _settle(self, ctx: JobContext, outcome: outcomes.Outcome) -> None:
        verb = "ack" if outcome.retry is None else "nack"
        try:
            if outcome.retry is None:
                await self._client.ack(ctx)
                if self._metrics.enabled:
                    self._metrics.add("processed", 1, _job_attributes(ctx))
            else:
                await self._client.nack(ctx, reason=outcome.reason, retry=outcome.retry)
                if self._metrics.enabled:
                    attributes = {**_job_attributes(ctx), "sepp.outcome": outcome.label}
                    self._metrics.add("nacked", 1, attributes)
        except JobNotFoundError as exc:
            self._log.warning(
                "sepp: %s of %s found no lease (%s): it expired and was swept, or an earlier"
                " try of this %s already succeeded; if the former, the job runs again",
                verb,
                ctx,
                exc,
                verb,
            )
        except AttemptMismatchError as exc:
            self._log.warning(
                "sepp: %s of %s was refused (%s): the lease was lost and the job redelivered"
                " as a newer attempt; this result is discarded",
                verb,
                ctx,
                exc,
            )
        except SeppError as exc:
            self._log.warning(
                "sepp: %s of %s failed: %s; unless it reached the server, the job is"
                " redelivered when its lease expires",
                verb,
                ctx,
                outcomes.describe(exc),
            )
        except Exception as exc:
            self._log.error(
                "sepp: %s of %s raised an unexpected %s; the job is redelivered when its lease"
                " expires",
                verb,
                ctx,
                outcomes.describe(exc),
                exc_info=exc,
            )


def _job_attributes(ctx: JobContext) -> dict[str, str]:
    return {"sepp.queue": ctx.queue, "sepp.job_type": ctx.job_type}


def _current_token() -> trio.lowlevel.TrioToken | None:
    try:
        return trio.lowlevel.current_trio_token()
    except RuntimeError:
        return None
