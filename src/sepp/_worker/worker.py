"""Worker: reserve → handle → ack/nack on trio, with bounded concurrency (`slots`), lease
keeping (`lease_keeper`) and a bounded graceful shutdown. Built only on the client calls in
`client_calls.WorkerClient`."""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import random
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import trio

from .._client import otel as _otel
from .._model import settlement as outcomes
from .._model import validate as v
from .._model.errors import (
    AttemptMismatchError,
    JobNotFoundError,
    SeppError,
    UnauthenticatedError,
    UnknownQueuesError,
    ValidationError,
)
from .._model.settlement import HandlerError as HandlerError
from .._model.types import Job, JobContext, Retry, set_handler_context
from .._util.log import Log, LoggerLike
from .backoff import DEFAULT_BACKOFF, DEFAULT_UNKNOWN_TYPE_BACKOFF, Backoff
from .client_calls import WorkerClient
from .held_job import HeldJob, Phase
from .lease_keeper import LeaseKeeper
from .middleware import Middleware, checked_middleware, run_chain
from .monitor import WorkerMonitor
from .router import (
    BackoffSetting,
    H,
    Lifespan,
    Router,
    RouteSettings,
    TaskDecorator,
    TaskHandler,
    checked_backoff,
    lifespan_call,
    optional_timeout,
)
from .router import DuplicateHandlerError as DuplicateHandlerError
from .router import Handler as Handler
from .shutdown import ShutdownHandle as ShutdownHandle
from .slots import WorkerSlots
from .thread_handlers import SyncHandler

if TYPE_CHECKING:
    from .._payloads.task import Task

T = TypeVar("T")

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
# A job type without a handler is logged at ERROR at most once per this many seconds.
UNKNOWN_TYPE_LOG_INTERVAL_S = 60.0
UNKNOWN_TYPES_REMEMBERED = 1000  # the types whose last log time is kept (bounds the dict)
# How long the first dead letter's log waits for the server's retention setting.
SERVER_INFO_TIMEOUT_S = 5.0


class HandlerTimeoutError(trio.TooSlowError):
    """A handler ran past its `timeout` and was cancelled (middleware sees a TooSlowError)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"the handler ran past its {timeout_s:g}s timeout and was cancelled")


def _with_timeout(fn: Handler, timeout_s: float) -> Handler:
    async def timed(payload: Any, ctx: JobContext) -> None:
        with trio.move_on_after(timeout_s) as limit:
            await fn(payload, ctx)
        if limit.cancelled_caught:
            raise HandlerTimeoutError(timeout_s)

    return timed


class _Route:
    """A handler as the Worker runs it: the function (within its timeout), its middleware
    chain, and the backoff its failures retry with."""

    __slots__ = ("backoff", "fn", "middleware")

    def __init__(self, fn: Handler, settings: RouteSettings) -> None:
        timeout_s = settings.timeout_s
        self.fn = fn if timeout_s is None else _with_timeout(fn, timeout_s)
        self.middleware = settings.middleware
        assert settings.backoff is not None  # the Worker's own settings always have one
        self.backoff: BackoffSetting = settings.backoff


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
    says; any other exception nacks it for a retry after `backoff`'s delay. With `auto_extend`
    the worker extends each lease before it runs out and, if the lease is lost anyway, cancels
    the handler and neither acks nor nacks; without it, the handler is cancelled when its lease
    ends. A redelivery of a job still running in this worker waits for that run to end.

    `shutdown()` stops reserving at once (a long-poll is cancelled; a reserve sent under half a
    second earlier may finish, since the server has most likely leased its jobs already, unless
    the one before it found the queues drained), and returns jobs still waiting for a slot.
    Running handlers get `shutdown_timeout` seconds; then they are cancelled and their jobs
    nacked for immediate retry. `run()` returns when every job it held is settled. Cancelling
    `run()` itself is the hard stop: nothing is acked or nacked and held jobs return when their
    leases expire.

    Durations are seconds (float) or `timedelta`. The worker needs only the client's public
    `reserve`, `ack`, `nack` and `extend` (any object with those, typed as `WorkerClient`;
    `get_server_info`, if it has it, to say when a dead-lettered job is gone for good).
    `handlers` registers a `sepp.Router`'s handlers (and takes its lifespan); `task`
    registers a `sepp.Task`'s.

    Handlers see the client as `ctx.client` and what `lifespan` yielded as `ctx.state`.
    `lifespan(worker)` (or `lifespan()`) returns an async context manager, entered before the
    first reserve and exited after the last job settled. `middleware` (see
    `sepp.Middleware`) wraps every handler call, outside the routers' own. A failed job (any
    exception, a `HandlerError.retry`, a `timeout`) is nacked for a retry after `backoff`'s delay
    (`sepp.Retry.DEFAULT`: the queue's policy); `timeout` (None: no limit) is the handlers'
    default time limit. A job type without a handler goes back to the queue after
    `unknown_types`' delay, or to the dead letters at once with "dead_letter". A payload that
    does not decode into a typed handler's type is dead-lettered at once (see `sepp.Router`).
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
        lifespan: Lifespan | None = None,
        middleware: Iterable[Middleware] = (),
        timeout: float | timedelta | None = None,
        backoff: BackoffSetting = DEFAULT_BACKOFF,
        unknown_types: Backoff | Literal["dead_letter"] = DEFAULT_UNKNOWN_TYPE_BACKOFF,
        monitor: WorkerMonitor | None = None,
        _wall_clock: Callable[[], datetime] | None = None,
    ) -> None:
        names = [queues] if isinstance(queues, str) else list(queues)
        if not names:
            raise ValidationError("queues", "must name at least one queue")
        for index, name in enumerate(names):
            v.queue_name(f"queues[{index}]", name)
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

        own_backoff = checked_backoff("backoff", backoff)
        if own_backoff is None:
            raise ValidationError("backoff", "must be a sepp.Backoff or sepp.Retry.DEFAULT")
        self._own = RouteSettings(
            checked_middleware("middleware", middleware), optional_timeout(timeout), own_backoff
        )
        if unknown_types != "dead_letter" and not isinstance(unknown_types, Backoff):
            raise ValidationError(
                "unknown_types", f'must be a sepp.Backoff or "dead_letter", got {unknown_types!r}'
            )
        self._unknown_types = unknown_types
        if monitor is not None and not isinstance(monitor, WorkerMonitor):
            raise ValidationError(
                "monitor", f"must be a sepp.WorkerMonitor, got {type(monitor).__name__}"
            )
        self._monitor = monitor
        self._unknown_logged_at: dict[str, float] = {}
        self._router = Router()
        if handlers is not None:
            if not isinstance(handlers, Router):
                raise ValidationError(
                    "handlers", f"must be a sepp.Router, got {type(handlers).__name__}"
                )
            if handlers.lifespan is not None:
                if lifespan is not None:
                    raise ValidationError(
                        "lifespan", "given twice: to the Worker and to its handlers' Router"
                    )
                lifespan = handlers.lifespan
            self._router._include(handlers)
        self._lifespan = None if lifespan is None else lifespan_call(lifespan)
        self._lifespan_state: Any = None
        # The handlers as they run, rebuilt at each registration (rare): a job's costs one get.
        self._routes: dict[str, _Route] = {}
        self._catch_all_route: _Route | None = None
        self._build_routes()
        self._keeps_dead_letters: bool | None = None  # the server's, once asked
        self._server_info_lock = trio.Lock()

        self._state = _RunState.NEW
        # Set from any thread or signal handler; read by run() when it starts.
        self._shutdown_requested = False
        self._stop_now = False  # shutdown(now=True): no grace period for running handlers
        self._shutting_down = False
        self._shutdown_began_at = 0.0
        # The grace period of shutdown; cancelled early by shutdown(now=True).
        self._grace_scope = trio.CancelScope()
        self._token: trio.lowlevel.TrioToken | None = None
        self._reserve_scope = trio.CancelScope()
        self._reserve_sent_at: float | None = None
        # The last reserve found the queues drained, so the pending one is long-polling.
        self._queues_drained = False
        self._largest_batch = 0  # the most jobs one reserve has returned
        self._held: dict[int, HeldJob] = {}
        # The latest delivery of each held job id: a redelivery waits for the earlier run.
        self._held_by_job_id: dict[str, HeldJob] = {}
        self._held_changed = trio.lowlevel.ParkingLot()  # unparked whenever _held shrinks
        self._leases = LeaseKeeper(
            client,
            lease_s=self._lease_s,
            now_utc=self._now_utc,
            log=self._log,
            extend=self._auto_extend,
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

    def handle(
        self,
        job_type: str,
        fn: Callable[[Any, JobContext], Awaitable[None]] | SyncHandler,
        *,
        timeout: float | timedelta | None = None,
        backoff: BackoffSetting | None = None,
    ) -> Worker:
        """Register `fn` for `job_type`; returns the worker so calls chain. A second
        registration for the same type raises DuplicateHandlerError. `timeout` and `backoff`
        override the worker's for this handler."""
        self._router.handle(job_type, fn, timeout=timeout, backoff=backoff)
        self._build_routes()
        return self

    def handler(
        self,
        job_type: str,
        *,
        timeout: float | timedelta | None = None,
        backoff: BackoffSetting | None = None,
    ) -> Callable[[H], H]:
        """Decorator form of `handle`."""
        register = self._router.handler(job_type, timeout=timeout, backoff=backoff)

        def register_here(fn: H) -> H:
            register(fn)
            self._build_routes()
            return fn

        return register_here

    def task(
        self,
        task: Task[T],
        *,
        timeout: float | timedelta | None = None,
        backoff: BackoffSetting | None = None,
    ) -> TaskDecorator[T]:
        """Decorator: register the handler of `task` (see `Router.task`)."""
        register = self._router.task(task, timeout=timeout, backoff=backoff)

        def register_here(fn: TaskHandler[T]) -> TaskHandler[T]:
            register(fn)
            self._build_routes()
            return fn

        return register_here  # type: ignore[return-value]  # TaskDecorator's overloads

    def catch_all(self, fn: H) -> H:
        """Run `fn` for job types without a handler (usable as a decorator). Only one."""
        self._router.catch_all(fn)
        self._build_routes()
        return fn

    def _build_routes(self) -> None:
        router = self._router
        self._routes = {
            job_type: _Route(fn, router._route_settings(job_type).inside(self._own))
            for job_type, fn in router._handlers.items()
        }
        catch_all = router._catch_all
        self._catch_all_route = (
            None
            if catch_all is None
            else _Route(catch_all, router._route_settings("").inside(self._own))
        )

    # -- state --------------------------------------------------------------------------------

    @property
    def client(self) -> WorkerClient:
        """The client the worker reserves with (handlers see it as `ctx.client`)."""
        return self._client

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

    def shutdown(self, *, now: bool = False) -> None:
        """Shut down gracefully: stop reserving, return the jobs that have not started and
        wait up to `shutdown_timeout` for the running ones. `now=True` does not wait: running
        handlers are cancelled and their jobs returned (the command line's second signal).
        Idempotent. Call it from a task; from another thread or a signal handler use
        `shutdown_handle().shutdown()`."""
        self._request_shutdown(from_task=True, now=now)

    def shutdown_handle(self) -> ShutdownHandle:
        """A handle whose `shutdown()` is safe from another thread or a signal handler."""
        return ShutdownHandle(self)

    def _request_shutdown(self, *, from_task: bool, now: bool = False) -> None:
        # Flag first, token second; run() stores the token first and reads the flag second,
        # so at least one side sees the other and no request is lost.
        if now:
            self._stop_now = True
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

    def _begin_shutdown(self) -> None:
        """In the run's thread: stop reserving, return jobs that have not started (and with
        `now`, end the grace period)."""
        self._shutdown_requested = True
        if self._stop_now:
            self._grace_scope.cancel()
        if self._shutting_down or self._state is not _RunState.RUNNING:
            return
        self._shutting_down = True
        if self._monitor is not None:
            self._monitor._shutting_down()
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
        if self._monitor is not None:
            # Types without a handler of their own are one "other" in the metrics' labels.
            self._monitor._attach(self._router.job_types)
        started = False

        def mark_started() -> None:
            nonlocal started
            if not started:
                started = True
                if self._monitor is not None:
                    self._monitor._reserving()
                task_status.started()

        try:
            async with contextlib.AsyncExitStack() as lifespan:
                if self._lifespan is not None:
                    self._lifespan_state = await lifespan.enter_async_context(self._lifespan(self))
                async with trio.open_nursery() as nursery:
                    self._jobs_nursery = nursery
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
            if self._monitor is not None:
                self._monitor._stopped()
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
                if self._monitor is not None:
                    self._monitor._reserve_done(trio.current_time() - began, exc)
                self._queues_drained = False  # unknown again
                # Tuples: metric SDKs before 1.45 hash the attributes (a list raises TypeError).
                self._metrics.add("reserve_failed", 1, {"sepp.queues": tuple(self._queues)})
                failures += 1
                delay = self._reserve_backoff(failures)
                self._log_reserve_failure(exc, failures, delay)
                await trio.sleep(delay)
                continue
            self._reserve_sent_at = None
            if self._monitor is not None:
                self._monitor._reserve_done(trio.current_time() - began, None)
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
        set_handler_context(ctx, self._client, self._lifespan_state)
        held = HeldJob(job)
        self._held[id(held)] = held
        earlier = self._held_by_job_id.get(ctx.id)
        self._held_by_job_id[ctx.id] = held
        route = self._routes.get(ctx.job_type, self._catch_all_route)
        if route is not None:
            if earlier is None:
                self._slots.queue(held)
            else:
                self._wait_for_earlier_run(held, earlier)
            if self._shutting_down and held.phase is Phase.WAITING:
                held.stop()
        # Type and id name the task well enough, and cost less than str(ctx).
        name = f"sepp job {ctx.job_type}[{ctx.id}]"
        self._jobs_nursery.start_soon(self._process, held, route, name=name)

    def _wait_for_earlier_run(self, held: HeldJob, earlier: HeldJob) -> None:
        """A redelivery of a job this worker still runs (its lease ran out, the handler has
        not ended yet): it runs once the earlier run ended, never beside it."""
        held.earlier = earlier
        if earlier.ended is None:
            earlier.ended = trio.Event()
        self._log.warning(
            "sepp: %s was redelivered while its attempt %d still runs in this worker; it"
            " starts when that run ends",
            held.job.ctx,
            earlier.job.ctx.attempt,
        )

    def _signal_held_changed(self) -> None:
        if self._held_changed:  # anyone parked: mostly nobody, or the reserve loop alone
            self._held_changed.unpark_all()

    # -- one job ------------------------------------------------------------------------------

    async def _process(self, held: HeldJob, route: _Route | None) -> None:
        ctx = held.job.ctx
        try:
            # The lease keeper, the handler and the ack/nack all run inside this span, so
            # their own spans nest under it (trio tasks inherit the spawner's context).
            with _otel.process_span(held.job, self._worker_id) as span:
                if route is None:
                    held.phase = Phase.SETTLING
                    outcome: outcomes.Outcome | None = self._unknown_type(ctx)
                else:
                    self._leases.watch(held)
                    try:
                        outcome = await self._run_handler(held, route)
                    finally:
                        self._leases.release(held)
                if outcome is None:
                    span.set("sepp.outcome", "lease_lost")
                    span.fail(held.lease_lost or "lease lost")
                    self._finished(held, None, None)
                else:
                    span.set("sepp.outcome", outcome.label)
                    if outcome.failure is not None:
                        span.fail(outcome.failure)
                    dead_lettered = await self._settle(ctx, outcome)
                    self._finished(held, outcome.label, dead_lettered)
                    if outcome.retry is not None:
                        await self._log_nack(ctx, outcome, dead_lettered)
        finally:
            del self._held[id(held)]
            if self._held_by_job_id.get(ctx.id) is held:
                del self._held_by_job_id[ctx.id]
            if held.ended is not None:
                held.ended.set()
            self._signal_held_changed()
            self._stop_lease_keeping_if_idle()

    def _finished(self, held: HeldJob, label: str | None, dead_lettered: bool | None) -> None:
        """Count a settled job, and log it at INFO (with its fields for structured logs)."""
        ctx = held.job.ctx
        if self._monitor is not None:
            self._monitor._job_settled(ctx, label, dead_lettered)
        if label == "unknown_type":
            return  # logged by _unknown_type
        outcome = "lease_lost" if label is None else label
        if dead_lettered:
            outcome += ", dead-lettered"
        self._log.info(
            "sepp: %s finished: %s in %.3fs",
            ctx,
            outcome,
            held.run_s or 0.0,
            extra={"sepp_outcome": outcome, "sepp_duration_s": held.run_s},
        )

    def _stop_lease_keeping_if_idle(self) -> None:
        if self._reserving_ended and not self._held:
            self._leases.stop()

    def _unknown_type(self, ctx: JobContext) -> outcomes.Outcome:
        policy = self._unknown_types
        delay_s = None if policy == "dead_letter" else policy.delay(ctx.attempt)
        now = trio.current_time()
        logged_at = self._unknown_logged_at.get(ctx.job_type)
        if logged_at is None or now - logged_at >= UNKNOWN_TYPE_LOG_INTERVAL_S:
            if len(self._unknown_logged_at) >= UNKNOWN_TYPES_REMEMBERED:
                self._unknown_logged_at.clear()
            self._unknown_logged_at[ctx.job_type] = now
            log: Callable[..., None] = self._log.error
        else:
            log = self._log.debug
        if delay_s is None:
            action = "dead-lettering it"
        elif ctx.is_final_attempt:
            action = "its final attempt: it is dead-lettered"
        else:
            action = f"returning it to the queue for {delay_s:.3g}s"
        log(
            "sepp: worker %s has no handler for job type %r (job %s, attempt %d/%d); %s;"
            " this worker handles: %s (logged once a minute per type)",
            self._worker_id,
            ctx.job_type,
            ctx.id,
            ctx.attempt,
            ctx.max_attempts,
            action,
            ", ".join(sorted(self._router.job_types)) or "nothing",
        )
        return outcomes.unknown_type(ctx, delay_s)

    async def _run_handler(self, held: HeldJob, route: _Route) -> outcomes.Outcome | None:
        ctx = held.job.ctx
        returned = False
        error: Exception | None = None
        attributes = _job_attributes(ctx) if self._metrics.enabled else None
        monitor = self._monitor
        started: float | None = None
        try:
            with held.scope:
                if held.earlier is not None:
                    await self._after_earlier_run(held, held.earlier)
                await held.wait_for_slot()
                started = trio.current_time()
                if monitor is not None:
                    monitor._job_started(ctx)
                if attributes is not None:
                    self._metrics.add("in_flight", 1, attributes)
                if route.middleware:
                    await run_chain(held.job, route.middleware, route.fn)
                else:
                    await route.fn(held.job.payload, ctx)
                returned = True
        except Exception as exc:  # the handler's failure is the job's outcome, not ours
            error = exc
        finally:
            self._slots.release(held)
            held.phase = Phase.SETTLING
            if started is not None:
                held.run_s = run_s = trio.current_time() - started
                if monitor is not None:
                    monitor._job_ended(ctx, run_s)
                if attributes is not None:
                    self._metrics.add("in_flight", -1, attributes)
                    self._metrics.record("duration", run_s, attributes)
        if held.lease_lost is not None:
            return None  # someone else may own the job now; logged by _lose_lease
        if returned:
            return outcomes.ACK
        if held.forced or error is None:
            return outcomes.SHUTDOWN
        outcome = outcomes.requested(error)
        if outcome is None:
            label = "timeout" if isinstance(error, HandlerTimeoutError) else "error"
            outcome = outcomes.failed(error, label)
        if outcome.retry is not Retry.DEFAULT or route.backoff is Retry.DEFAULT:
            return outcome
        assert isinstance(route.backoff, Backoff)
        delay_s = route.backoff.delay(ctx.attempt)
        return outcomes.with_backoff(outcome, Retry.after(delay_s), delay_s)

    async def _after_earlier_run(self, held: HeldJob, earlier: HeldJob) -> None:
        assert earlier.ended is not None
        await earlier.ended.wait()
        held.earlier = None  # let the earlier one go
        self._slots.queue(held)

    async def _settle(self, ctx: JobContext, outcome: outcomes.Outcome) -> bool | None:
        """Ack or nack; returns whether a nack dead-lettered the job (None: it failed)."""
        verb = "ack" if outcome.retry is None else "nack"
        try:
            if outcome.retry is None:
                await self._client.ack(ctx)
                if self._metrics.enabled:
                    self._metrics.add("processed", 1, _job_attributes(ctx))
                return False
            dead_lettered = await self._client.nack(ctx, reason=outcome.reason, retry=outcome.retry)
            if self._metrics.enabled:
                attributes = {**_job_attributes(ctx), "sepp.outcome": outcome.label}
                self._metrics.add("nacked", 1, attributes)
            return bool(dead_lettered)
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
        return None

    async def _log_nack(
        self, ctx: JobContext, outcome: outcomes.Outcome, dead_lettered: bool | None
    ) -> None:
        """One line per nacked job: ERROR "dead-lettered" when the nack ended it, else what
        failed and when the job comes back (unknown types log by themselves)."""
        label = outcome.label
        error = outcome.error
        if dead_lettered:
            if label == "permanent":
                why = f"the handler gave up on it: {outcome.reason}"
            elif label == "unknown_type":
                why = "no handler for its type"
            elif label == "shutdown":
                why = "its final attempt was cut short by a worker shutdown"
            else:
                why = f"{_what_failed(outcome)} on its final attempt"
            self._log.error(
                "sepp: %s dead-lettered: %s%s",
                ctx,
                why,
                await self._dead_letter_note(),
                exc_info=outcomes.logged_traceback(outcome),
            )
            return
        if label in ("shutdown", "unknown_type"):
            return
        if dead_lettered is None:
            if error is None or isinstance(error, HandlerError):
                return  # the failed nack said it all
            when = "its nack failed (see above)"
        elif outcome.delay_s is not None:
            when = f"retrying in {outcome.delay_s:.3g}s"
        elif outcome.retry is not None and outcome.retry.delay is not None:
            when = f"retrying in {outcome.retry.delay.total_seconds():.3g}s"
        else:
            when = "retrying with the queue's retry policy"
        self._log.warning(
            "sepp: %s %s; %s",
            ctx,
            _what_failed(outcome),
            when,
            exc_info=outcomes.logged_traceback(outcome),
        )

    async def _dead_letter_note(self) -> str:
        """Says so when the server keeps no dead letters (asked once, on the first)."""
        async with self._server_info_lock:
            get_server_info = getattr(self._client, "get_server_info", None)
            if self._keeps_dead_letters is None and get_server_info is not None:
                with trio.move_on_after(SERVER_INFO_TIMEOUT_S):
                    try:
                        info = await get_server_info()
                        self._keeps_dead_letters = bool(info.dead_letter_retention_enabled)
                    except Exception as exc:
                        self._log.debug("sepp: get_server_info failed: %s", exc)
        if self._keeps_dead_letters is False:
            return (
                " (this server keeps no dead letters, dead_letter_retention_ms is 0: the job"
                " is gone)"
            )
        return ""


def _what_failed(outcome: outcomes.Outcome) -> str:
    if outcome.label == "timeout":
        return "timed out"
    if outcome.label == "retry":
        return f"asked for a retry: {outcome.reason}"
    if outcome.label == "retry_after":
        return f"asked for a retry later: {outcome.reason}"
    assert outcome.error is not None
    return f"failed: the handler raised {outcomes.describe(outcome.error)}"


def _job_attributes(ctx: JobContext) -> dict[str, str]:
    return {"sepp.queue": ctx.queue, "sepp.job_type": ctx.job_type}


def _current_token() -> trio.lowlevel.TrioToken | None:
    try:
        return trio.lowlevel.current_trio_token()
    except RuntimeError:
        return None
