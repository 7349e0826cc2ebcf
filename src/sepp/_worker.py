"""Worker: reserve → handle → ack/nack on trio, with bounded concurrency, lease keeping and a
bounded graceful shutdown. Built only on the Client's public methods."""

from __future__ import annotations

import collections
import contextvars
import enum
import heapq
import inspect
import logging
import os
import random
import secrets
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, TypeVar

import trio

from . import _otel
from . import _validate as v
from ._errors import (
    AttemptMismatchError,
    JobNotFoundError,
    SeppError,
    UnauthenticatedError,
    UnknownQueuesError,
    ValidationError,
)
from ._log import Log, LoggerLike
from ._types import Job, JobContext, Payload, Retry

if TYPE_CHECKING:
    from ._client import Client
    from ._router import Router

Handler = Callable[[Payload | None, JobContext], Awaitable[None]]
"""An async function `(payload, ctx) -> None` that processes one job."""

H = TypeVar("H", bound=Handler)

# Reserve failures back off from `reserve_error_backoff`, doubling up to this (or the base,
# if larger), with each sleep drawn from [0.5, 1.0) of the step so workers do not stampede.
RESERVE_BACKOFF_CAP_S = 10.0
# An empty reserve returning faster than min(this, wait/2) means the server is not long-polling
# (draining, or shutting down); pause before the next poll instead of spinning.
EARLY_EMPTY_THRESHOLD_S = 0.1
EARLY_EMPTY_PAUSE_S = 0.25
# A reserve sent less than this long before shutdown is let finish rather than cancelled: on a
# non-empty queue the server has most likely leased jobs for it already, and cancelling would
# strand them until their leases expire. Older ones are long-polling an empty queue.
RESERVE_SETTLE_S = 0.5
# Unknown job types are nacked with min(2**attempt, this) seconds of delay.
UNKNOWN_TYPE_MAX_DELAY_S = 60.0
# Lease keeping: extend once a third of what is left of the granted lease has passed (two
# thirds still remain), but wait at least the first floor; after a failed extend wait at least
# the second, so an outage costs a few retries per lease rather than hundreds.
EXTEND_MIN_WAIT_S = 0.001
EXTEND_RETRY_MIN_WAIT_S = 0.25
# Nack reasons are for humans reading dead letters; keep them bounded.
MAX_REASON_CHARS = 1000
SHUTDOWN_REASON = "worker shutdown"


class HandlerError(Exception):
    """Raise from a handler to choose how its job is nacked (not a SeppError: user code raises
    it). Build one with `retry`, `retry_after` or `permanent`."""

    def __init__(self, reason: str, directive: Retry = Retry.DEFAULT) -> None:
        if not isinstance(directive, Retry):
            raise ValidationError("directive", "must be a sepp.Retry")
        super().__init__(reason)
        self.reason = reason
        self.directive = directive

    @classmethod
    def retry(cls, reason: str) -> HandlerError:
        """Nack with the queue's retry policy."""
        return cls(reason, Retry.DEFAULT)

    @classmethod
    def retry_after(cls, reason: str, delay: float | timedelta) -> HandlerError:
        """Nack so the job comes back after `delay` (seconds or timedelta, ≥ 0)."""
        return cls(reason, Retry.after(delay))

    @classmethod
    def permanent(cls, reason: str) -> HandlerError:
        """Nack straight to the dead-letter store."""
        return cls(reason, Retry.DEAD_LETTER)

    def __repr__(self) -> str:
        return f"HandlerError({self.reason!r}, {self.directive!r})"


class DuplicateHandlerError(SeppError, ValueError):
    """A handler is already registered for `job_type` (None: the catch-all)."""

    def __init__(self, job_type: str | None) -> None:
        what = "a catch-all handler" if job_type is None else f"a handler for {job_type!r}"
        super().__init__(f"{what} is already registered")
        self.job_type = job_type


class ShutdownHandle:
    """Asks a Worker to shut down gracefully. `shutdown()` is safe from any thread and from a
    signal handler, before, during or after `run()`."""

    __slots__ = ("_worker",)

    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    def shutdown(self) -> None:
        self._worker._request_shutdown(from_task=False)

    @property
    def is_shutdown(self) -> bool:
        return self._worker.is_shutdown

    def __repr__(self) -> str:
        return f"<sepp.ShutdownHandle of {self._worker!r}>"


class _Phase(enum.Enum):
    WAITING = "waiting for a slot"
    RUNNING = "running"  # holds a slot
    SETTLING = "settling"


@dataclass(frozen=True, slots=True)
class _Outcome:
    """What to tell the server about a job: ack (retry None) or nack."""

    retry: Retry | None = None
    reason: str | None = None
    label: str = "ack"  # for spans and metrics
    failure: str | None = None  # set when the handler failed: marks the process span


_ACK = _Outcome()


class _HeldJob:
    """A job the worker holds a lease on, from the reserve that returned it until it settles."""

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
        self.phase = _Phase.WAITING
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
        if self.phase is not _Phase.SETTLING:
            self.forced = True
            self.scope.cancel()


class _RunState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    DONE = "done"


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def _reason(text: str) -> str:
    # Handlers build reasons from arbitrary exceptions: keep them short and valid UTF-8.
    clipped = text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"
    return clipped.encode("utf-8", "replace").decode("utf-8")


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Worker:
    """Reserves jobs from `queues` and runs the registered handler for each, at most
    `max_in_flight` at once, inside a nursery owned by `run()`.

    A handler that returns acks its job; one that raises `HandlerError` nacks it as the error
    says; any other exception nacks it with the queue's retry policy. With `auto_extend` the
    worker extends each lease before it runs out and, if the lease is lost anyway, cancels the
    handler and neither acks nor nacks.

    `shutdown()` stops reserving at once (a long-poll is cancelled; a reserve sent under half a
    second earlier may finish, since the server has most likely leased its jobs already), and
    returns jobs still waiting for a slot. Running handlers get `shutdown_timeout` seconds; then
    they are cancelled and their jobs nacked for immediate retry. `run()` returns when every
    job it held is settled. Cancelling `run()` itself is the hard stop: nothing is acked or
    nacked and held jobs return when their leases expire.

    Durations are seconds (float) or `timedelta`. The worker needs only the client's public
    `reserve`, `ack`, `nack` and `extend`. `handlers` registers a `sepp.Router`'s handlers.
    """

    def __init__(
        self,
        client: Client,
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

        self._handlers: dict[str, Handler] = {}
        self._catch_all: Handler | None = None
        if handlers is not None:
            self._take_router(handlers)

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
        self._held: dict[int, _HeldJob] = {}
        self._held_changed = trio.Event()
        # Lease keeping is deferred: most jobs finish before their first extend is due, so a
        # keeper task is only started (by one scheduler) for jobs still held by then.
        self._lease_queue: list[tuple[float, int, _HeldJob, contextvars.Context]] = []
        self._lease_queue_changed = trio.Event()
        self._lease_scheduler_scope = trio.CancelScope()
        self._reserving_ended = False
        # Slots go to waiting jobs in the order the server returned them (its priority order).
        self._waiting: collections.deque[_HeldJob] = collections.deque()
        self._running = 0
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
        v.utf8_text("job_type", job_type)
        _check_handler(fn)
        if job_type in self._handlers:
            raise DuplicateHandlerError(job_type)
        self._handlers[job_type] = fn
        return self

    def handler(self, job_type: str) -> Callable[[H], H]:
        """Decorator form of `handle`."""
        v.utf8_text("job_type", job_type)

        def register(fn: H) -> H:
            self.handle(job_type, fn)
            return fn

        return register

    def catch_all(self, fn: H) -> H:
        """Run `fn` for job types without a handler (usable as a decorator). Only one."""
        _check_handler(fn)
        if self._catch_all is not None:
            raise DuplicateHandlerError(None)
        self._catch_all = fn
        return fn

    def _take_router(self, router: Router) -> None:
        from ._router import Router  # _router imports this module

        if not isinstance(router, Router):
            raise ValidationError("handlers", f"must be a sepp.Router, got {type(router).__name__}")
        for job_type, fn in router._handlers.items():
            self.handle(job_type, fn)
        if router._catch_all is not None:
            self.catch_all(router._catch_all)

    # -- state --------------------------------------------------------------------------------

    @property
    def worker_id(self) -> str:
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
        if sent_at is not None and trio.current_time() - sent_at < RESERVE_SETTLE_S:
            self._reserve_scope.deadline = sent_at + RESERVE_SETTLE_S
        else:
            self._reserve_scope.cancel()
        for held in list(self._held.values()):
            if held.phase is _Phase.WAITING:
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
                    nursery.start_soon(self._lease_scheduler)
                if self._shutdown_requested:
                    self._begin_shutdown()
                else:
                    with self._reserve_scope:
                        await self._reserve_loop(mark_started)
                self._reserving_ended = True  # no job can arrive any more
                mark_started()
                await self._drain()
                self._stop_lease_scheduler_if_idle()
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
                await self._held_changed.wait()
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
                await self._held_changed.wait()
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
                self._metrics.add("reserve_failed", 1, {"sepp.queues": self._queues})
                failures += 1
                delay = self._reserve_backoff(failures)
                self._log_reserve_failure(exc, failures, delay)
                await trio.sleep(delay)
                continue
            self._reserve_sent_at = None
            self._metrics.add(
                "reserve_completed", 1, {"sepp.queues": self._queues, "sepp.jobs": len(jobs or ())}
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
            if jobs:
                # Let the handlers just spawned start before the next reserve is built and sent.
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
                _describe(exc),
                failures,
                delay,
            )
        elif isinstance(exc, SeppError):
            self._log.warning(
                "sepp: worker %s: reserve failed: %s (failure %d; retrying in %.2fs)",
                self._worker_id,
                _describe(exc),
                failures,
                delay,
            )
        else:
            self._log.error(
                "sepp: worker %s: reserve raised an unexpected %s (failure %d; retrying in %.2fs)",
                self._worker_id,
                _describe(exc),
                failures,
                delay,
                exc_info=exc,
            )

    def _dispatch(self, job: Job) -> None:
        assert self._jobs_nursery is not None
        held = _HeldJob(job)
        self._held[id(held)] = held
        fn = self._handlers.get(job.ctx.job_type, self._catch_all)
        if fn is not None:
            self._waiting.append(held)
            self._grant_slots()
            if self._shutting_down and held.phase is _Phase.WAITING:
                held.stop()
        self._jobs_nursery.start_soon(self._process, held, fn, name=f"sepp job {job.ctx}")

    def _grant_slots(self) -> None:
        while self._running < self._max_in_flight and self._waiting:
            held = self._waiting.popleft()
            if held.scope.cancel_called:
                continue  # returned at shutdown or lease lost while it waited
            self._running += 1
            held.phase = _Phase.RUNNING
            held.slot_granted.set()

    def _release_slot(self, held: _HeldJob) -> None:
        if held.phase is _Phase.RUNNING:
            self._running -= 1
            self._grant_slots()
        elif held.phase is _Phase.WAITING:
            try:
                self._waiting.remove(held)
            except ValueError:
                pass

    def _signal_held_changed(self) -> None:
        changed, self._held_changed = self._held_changed, trio.Event()
        changed.set()

    # -- one job ------------------------------------------------------------------------------

    async def _process(self, held: _HeldJob, fn: Handler | None) -> None:
        try:
            ctx = held.job.ctx
            # The lease keeper, the handler and the ack/nack all run inside this span, so
            # their own spans nest under it (trio tasks inherit the spawner's context).
            with _otel.process_span(held.job, self._worker_id) as span:
                if fn is None:
                    held.phase = _Phase.SETTLING
                    outcome: _Outcome | None = self._unknown_type(ctx)
                else:
                    if self._auto_extend:
                        self._schedule_lease_keeper(held)
                    try:
                        outcome = await self._run_handler(held, fn)
                    finally:
                        held.keeper_scope.cancel()
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
            self._stop_lease_scheduler_if_idle()

    def _unknown_type(self, ctx: JobContext) -> _Outcome:
        delay = min(2.0**ctx.attempt, UNKNOWN_TYPE_MAX_DELAY_S)
        known = ", ".join(sorted(self._handlers)) or "none"
        self._log.warning(
            "sepp: worker %s has no handler for job type %r (job %s); returning it in %gs"
            " (registered: %s)",
            self._worker_id,
            ctx.job_type,
            ctx.id,
            delay,
            known,
        )
        reason = _reason(f"no handler registered for job type {ctx.job_type!r} on this worker")
        return _Outcome(Retry.after(delay), reason, "unknown_type", reason)

    async def _run_handler(self, held: _HeldJob, fn: Handler) -> _Outcome | None:
        ctx = held.job.ctx
        returned = False
        error: Exception | None = None
        attributes = {"sepp.queue": ctx.queue, "sepp.job_type": ctx.job_type}
        started: float | None = None
        try:
            with held.scope:
                await held.slot_granted.wait()
                started = trio.current_time()
                self._metrics.add("in_flight", 1, attributes)
                await fn(held.job.payload, ctx)
                returned = True
        except Exception as exc:  # the handler's failure is the job's outcome, not ours
            error = exc
        finally:
            self._release_slot(held)
            held.phase = _Phase.SETTLING
            if started is not None:
                self._metrics.add("in_flight", -1, attributes)
                self._metrics.record("duration", trio.current_time() - started, attributes)
        if held.lease_lost is not None:
            return None  # someone else may own the job now; logged by _lose_lease
        if returned:
            return _ACK
        if held.forced or error is None:
            return _Outcome(Retry.after(0), SHUTDOWN_REASON, "shutdown")
        if isinstance(error, HandlerError):
            label = {"default": "retry", "delay": "retry_after"}.get(
                error.directive.kind, "permanent"
            )
            return _Outcome(error.directive, _reason(error.reason), label, _reason(error.reason))
        self._log.error(
            "sepp: handler for %s raised %s; nacking with the queue's retry policy",
            ctx,
            _describe(error),
            exc_info=error,
        )
        reason = _reason(f"handler raised {_describe(error)}")
        return _Outcome(Retry.DEFAULT, reason, "error", reason)

    async def _settle(self, ctx: JobContext, outcome: _Outcome) -> None:
        verb = "ack" if outcome.retry is None else "nack"
        attributes = {"sepp.queue": ctx.queue, "sepp.job_type": ctx.job_type}
        try:
            if outcome.retry is None:
                await self._client.ack(ctx)
                self._metrics.add("processed", 1, attributes)
            else:
                await self._client.nack(ctx, reason=outcome.reason, retry=outcome.retry)
                self._metrics.add("nacked", 1, {**attributes, "sepp.outcome": outcome.label})
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
                _describe(exc),
            )
        except Exception as exc:
            self._log.error(
                "sepp: %s of %s raised an unexpected %s; the job is redelivered when its lease"
                " expires",
                verb,
                ctx,
                _describe(exc),
                exc_info=exc,
            )

    def _first_extend_at(self, held: _HeldJob) -> float:
        left_s = held.lease_deadline(self._now_utc, self._lease_s) - trio.current_time()
        return trio.current_time() + max(left_s / 3, min(EXTEND_MIN_WAIT_S, left_s), 0.0)

    def _schedule_lease_keeper(self, held: _HeldJob) -> None:
        # The context is the job's (its process span is current), so the keeper's extend
        # spans nest under sepp.process like the handler's.
        entry = (self._first_extend_at(held), id(held), held, contextvars.copy_context())
        heapq.heappush(self._lease_queue, entry)
        if self._lease_queue[0] is entry:
            changed, self._lease_queue_changed = self._lease_queue_changed, trio.Event()
            changed.set()

    async def _lease_scheduler(self) -> None:
        """Starts a job's lease keeper when its first extend falls due, if it is still held."""
        assert self._jobs_nursery is not None
        with self._lease_scheduler_scope:
            while True:
                changed = self._lease_queue_changed
                if not self._lease_queue:
                    await changed.wait()
                    continue
                due, _, held, context = self._lease_queue[0]
                if held.phase is _Phase.SETTLING or held.keeper_scope.cancel_called:
                    heapq.heappop(self._lease_queue)
                    continue
                if trio.current_time() < due:
                    with trio.move_on_at(due):
                        await changed.wait()
                    continue
                heapq.heappop(self._lease_queue)
                context.run(self._jobs_nursery.start_soon, self._keep_lease, held, True)

    def _stop_lease_scheduler_if_idle(self) -> None:
        if self._reserving_ended and not self._held:
            self._lease_scheduler_scope.cancel()

    async def _keep_lease(self, held: _HeldJob, first_extend_due: bool = False) -> None:
        """Extend the lease from the granted expiry until cancelled or the lease is lost."""
        with held.keeper_scope:
            await self._extend_until_lost(held, first_extend_due)

    async def _extend_until_lost(self, held: _HeldJob, first_extend_due: bool) -> None:
        ctx = held.job.ctx
        last_failure: Exception | None = None
        while True:
            deadline = held.lease_deadline(self._now_utc, self._lease_s)
            left_s = deadline - trio.current_time()
            floor_s = EXTEND_MIN_WAIT_S if last_failure is None else EXTEND_RETRY_MIN_WAIT_S
            if first_extend_due:
                first_extend_due = False  # the scheduler already waited the first third
            else:
                await trio.sleep(max(left_s / 3, min(floor_s, left_s), 0.0))
            deadline = held.lease_deadline(self._now_utc, self._lease_s)
            if trio.current_time() >= deadline:
                why = "the lease expired" + (
                    f" (last extend failed: {_describe(last_failure)})" if last_failure else ""
                )
                self._lose_lease(held, why)
                return
            # An extend still pending at the expiry could not have saved the lease.
            with trio.move_on_at(deadline) as attempt:
                try:
                    await self._client.extend(ctx, self._lease_s)
                except (JobNotFoundError, AttemptMismatchError) as exc:
                    self._lose_lease(held, f"extend refused: {_describe(exc)}")
                    return
                except Exception as exc:
                    last_failure = exc
                    self._log.warning(
                        "sepp: extending the lease of %s failed: %s; retrying while it lasts",
                        ctx,
                        _describe(exc),
                    )
                else:
                    last_failure = None
            if attempt.cancelled_caught:
                self._lose_lease(held, "the lease expired while an extend was pending")
                return

    def _lose_lease(self, held: _HeldJob, why: str) -> None:
        if held.phase is _Phase.SETTLING or held.lease_lost is not None:
            return
        held.lease_lost = why
        held.scope.cancel()
        self._log.error(
            "sepp: lost the lease of %s: %s; cancelling its handler; it is neither acked nor"
            " nacked (the server redelivers it)",
            held.job.ctx,
            why,
        )


def _check_handler(fn: object) -> None:
    # A plain `def` would only fail at the first job; refuse it now. (Other callables, e.g.
    # partials or objects with an async __call__, are trusted.)
    if inspect.isfunction(fn) and not inspect.iscoroutinefunction(fn):
        raise ValidationError("handler", f"{fn.__qualname__} must be `async def`")
    if not callable(fn):
        raise ValidationError("handler", f"must be an async function, got {type(fn).__name__}")


def _current_token() -> trio.lowlevel.TrioToken | None:
    try:
        return trio.lowlevel.current_trio_token()
    except RuntimeError:
        return None
