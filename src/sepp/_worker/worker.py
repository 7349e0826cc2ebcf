"""Worker: reserve → handle → ack/nack, with bounded concurrency (`slots`), lease keeping
(`lease_keeper`) and a bounded graceful shutdown. Built only on the client calls in
`client_calls.WorkerClient`.

The Worker puts the parts together: its options are checked once (`settings`), the reserve
loop (`reserving`) hands each job to `processing`, which runs and settles it; `shutdown` stops
them, `reporting` writes the log lines, and a `WorkerMonitor` hears `events`."""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from .._client import otel as _otel
from .._client.client_kind import refuse_a_blocking_client
from .._model.backoff import Backoff
from .._model.errors import ValidationError
from .._model.settlement import HandlerError as HandlerError
from .._model.types import JobContext
from .._runtime.concurrency import (
    TASK_STATUS_IGNORED,
    Event,
    ServiceRuntime,
    TaskStatus,
    current,
)
from .._runtime.shutdown_handle import ShutdownHandle as ShutdownHandle
from .._util.log import LoggerLike
from .client_calls import WorkerClient
from .dead_letter_hooks import DeadLetterHook
from .events import WorkerEvents
from .held_job import HeldJobs
from .job_limits import JobLimits
from .lease_keeper import LeaseKeeper
from .limit_uses import LimitSetting
from .loop_watch import LoopWatch
from .middleware import Middleware
from .monitor import WorkerMonitor, feed_of
from .processing import JobProcessor
from .reporting import WorkerReport
from .reserving import ReserveLoop
from .router import (
    BackoffSetting,
    H,
    Lifespan,
    Router,
    TaskDecorator,
    TaskHandler,
    copy_handlers,
    lifespan_manager,
)
from .router import DuplicateHandlerError as DuplicateHandlerError
from .router import Handler as Handler
from .settings import DEFAULT_BACKOFF, DEFAULT_UNKNOWN_TYPE_BACKOFF, WorkerSettings
from .shutdown import WorkerShutdown
from .slots import WorkerSlots
from .thread_handlers import SyncHandler

if TYPE_CHECKING:
    from .._payloads.task import Task

T = TypeVar("T")
R = TypeVar("R")


class _RunState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class _Parts:
    """A Worker's parts that run on the runtime of its run (`cc`), made when run() starts."""

    cc: ServiceRuntime
    held: HeldJobs
    leases: LeaseKeeper
    report: WorkerReport
    jobs: JobProcessor
    reserver: ReserveLoop
    limits: JobLimits


class Worker:
    """Reserves jobs from `queues` and runs the registered handler for each, at most
    `max_in_flight` at once, inside a nursery owned by `run()`.

    A handler that returns acks its job; one that raises `HandlerError` nacks it as the error
    says; any other exception nacks it for a retry after `backoff`'s delay. With `auto_extend`
    the worker extends each lease before it runs out and, if the lease is lost anyway, cancels
    the handler and neither acks nor nacks; without it, the handler is cancelled when its lease
    ends. A redelivery of a job still running in this worker waits for that run to end.

    `shutdown()` stops reserving at once and returns jobs still waiting for a slot. A reserve
    the server answers at once (the first, and each after one that found more work: they do
    not wait) is let finish within the grace period, and its jobs run or go back; a long-poll,
    sent only after the queues were found drained, is cancelled once an answer already on its
    way has been read. So no job the server leased to the worker is left to its lease.
    Running handlers get `shutdown_timeout` seconds; then they are cancelled and their jobs
    nacked for immediate retry. `run()` returns when every job it held is settled. Cancelling
    `run()` itself is the hard stop: nothing is acked or nacked and held jobs return when their
    leases expire.

    Durations are seconds (float) or `timedelta`. The worker needs only the client's public
    `reserve`, `ack`, `nack` and `extend` (any object with those, typed as `WorkerClient`;
    `get_server_info`, if it has it, to say when a dead-lettered job is gone for good).
    `handlers` registers a `sepp.Router`'s handlers (and takes its lifespan); `task`
    registers a `sepp.Task`'s.

    Handlers see the client as `ctx.client` (a `def` handler, run in a worker thread: a
    blocking `sepp.SyncClient` bound to it, see `sepp.SyncJobContext`) and what `lifespan`
    yielded as `ctx.state`.
    `lifespan(worker)` (or `lifespan()`) returns an async context manager, entered before the
    first reserve and exited after the last job settled. `middleware` (see
    `sepp.Middleware`) wraps every handler call, outside the routers' own. A failed job (any
    exception, a `HandlerError.retry`, a `timeout`) is nacked for a retry after `backoff`'s delay
    (`sepp.Retry.DEFAULT`: the queue's policy); `timeout` (None: no limit) is the handlers'
    default time limit.

    The failure policy, by exception class (subclasses match, and any leaf of an exception
    group): an exception in `give_up_on` dead-letters its job at once; with `retry_on` given,
    only those exceptions retry and every other one dead-letters at once (`retry_on=()`:
    nothing retries). A `HandlerError` keeps its meaning whatever they say, and a handler's or
    router's own `retry_on` and `give_up_on` win over the worker's. They see what the chain of
    middleware and handler raised; a `timeout` is a `trio.TooSlowError` to them (on asyncio
    too). `on_dead_letter` (see `sepp.DeadLetterHook`) is called once for each job this
    worker's nack dead-lettered (a permanent error, a failure on its final attempt, the
    failure policy, an unknown type, a payload that does not decode), its failure logged.

    An `async def` handler that holds the event loop (runs without
    awaiting) for more than `loop_block_warning` seconds is logged at WARNING with its job's
    type and id, at most once a minute (None: never; a thread of the run's watches). A job type
    without a handler goes back to the queue after
    `unknown_types`' delay, or to the dead letters at once with "dead_letter". A payload that
    does not decode into a typed handler's type is dead-lettered at once (see `sepp.Router`).

    Limits (`limit=` of a registration or a Router, see `sepp.Limit`): a job whose limit has
    no room waits for it, its lease kept, holding its place among the `max_in_flight` jobs the
    worker holds; at most `limit_waiting` held jobs wait at once (None: half of
    `max_in_flight`, at least one), so the rest always run jobs that can. A job that finds that
    full, or has waited `limit_patience` seconds (None: no end), is deferred: given back as a
    copy scheduled for later with the attempts it had left, so waiting never costs an attempt
    and never dead-letters a job (`ctx.logical_attempt` counts across the copies). At shutdown
    the waiting jobs are deferred to run at once elsewhere.
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
        retry_on: type[Exception] | tuple[type[Exception], ...] | None = None,
        give_up_on: type[Exception] | tuple[type[Exception], ...] | None = None,
        unknown_types: Backoff | Literal["dead_letter"] = DEFAULT_UNKNOWN_TYPE_BACKOFF,
        on_dead_letter: DeadLetterHook | None = None,
        monitor: WorkerMonitor | None = None,
        loop_block_warning: float | timedelta | None = 1.0,
        limit_waiting: int | None = None,
        limit_patience: float | timedelta | None = 5.0,
        _wall_clock: Callable[[], datetime] | None = None,
    ) -> None:
        settings = WorkerSettings.parse(
            queues,
            lease_duration=lease_duration,
            max_in_flight=max_in_flight,
            auto_extend=auto_extend,
            wait_timeout=wait_timeout,
            max_jobs=max_jobs,
            worker_id=worker_id,
            shutdown_timeout=shutdown_timeout,
            reserve_error_backoff=reserve_error_backoff,
            logger=logger,
            handlers=handlers,
            lifespan=lifespan,
            middleware=middleware,
            timeout=timeout,
            backoff=backoff,
            retry_on=retry_on,
            give_up_on=give_up_on,
            unknown_types=unknown_types,
            on_dead_letter=on_dead_letter,
            monitor=monitor,
            loop_block_warning=loop_block_warning,
            wall_clock=_wall_clock,
            limit_waiting=limit_waiting,
            limit_patience=limit_patience,
        )
        refuse_a_blocking_client(client, "sepp.Worker")
        self._settings = settings
        self._client = client
        self._log = settings.log
        self._router = Router()
        if settings.handlers is not None:
            copy_handlers(self._router, settings.handlers)
        events: WorkerEvents | None = (
            None if settings.monitor is None else feed_of(settings.monitor)
        )
        self._events = events
        self._state = _RunState.NEW
        self._reserving = False  # run() has sent its first reserve (or has ended)
        self._reserving_event: Event | None = None  # made by the first wait_until_reserving()
        self._pause_wanted = False  # set by pause() and resume() from anywhere; read in the run
        self._shutdown = WorkerShutdown(settings.shutdown_timeout_s)
        self._metrics = _otel.WorkerMetrics()
        self._loop_watch = (
            None
            if settings.loop_block_warning_s is None
            else LoopWatch(settings.loop_block_warning_s, self._log, settings.worker_id)
        )
        self._parts: _Parts | None = None  # made by run(), on the runtime it runs on

    def _parts_on(self, cc: ServiceRuntime) -> _Parts:
        """The parts that run on `cc` (once, when run() starts)."""
        settings, client, events = self._settings, self._client, self._events
        held = HeldJobs(cc)
        leases = LeaseKeeper(
            client,
            lease_s=settings.lease_s,
            now_utc=settings.now_utc,
            log=self._log,
            extend=settings.auto_extend,
            cc=cc,
        )
        report = WorkerReport(self._log, settings.worker_id, list(settings.queues), client, cc)
        limits = JobLimits(
            client,
            log=self._log,
            events=events,
            worker_id=settings.worker_id,
            waiting_room=settings.limit_waiting,
            patience_s=settings.limit_patience_s,
            now_utc=settings.now_utc,
            cc=cc,
        )
        jobs = JobProcessor(
            client,
            worker_id=settings.worker_id,
            unknown_types=settings.unknown_types,
            held=held,
            slots=WorkerSlots(settings.max_in_flight),
            leases=leases,
            shutdown=self._shutdown,
            report=report,
            events=events,
            metrics=self._metrics,
            loop_watch=self._loop_watch,
            limits=limits,
            cc=cc,
        )
        jobs.use_routes(self._router, settings.own)
        reserver = ReserveLoop(
            client,
            settings,
            held=held,
            dispatch=jobs.dispatch,
            shutdown=self._shutdown,
            report=report,
            events=events,
            metrics=self._metrics,
            cc=cc,
            pause_wanted=lambda: self._pause_wanted,
        )
        return _Parts(cc, held, leases, report, jobs, reserver, limits)

    def __repr__(self) -> str:
        settings = self._settings
        return (
            f"<sepp.Worker {settings.worker_id} queues={list(settings.queues)}"
            f" {self._state.value} in_flight={self.in_flight}/{settings.max_in_flight}>"
        )

    # -- registration -----------------------------------------------------------------------

    def handle(
        self,
        job_type: str,
        fn: Callable[[Any, JobContext], Awaitable[object]] | SyncHandler,
        *,
        timeout: float | timedelta | None = None,
        backoff: BackoffSetting | None = None,
        middleware: Iterable[Middleware] = (),
        retry_on: type[Exception] | tuple[type[Exception], ...] | None = None,
        give_up_on: type[Exception] | tuple[type[Exception], ...] | None = None,
        limit: LimitSetting = None,
    ) -> Worker:
        """Register `fn` for `job_type`; returns the worker so calls chain. A second
        registration for the same type raises DuplicateHandlerError. `timeout`, `backoff`,
        `retry_on` and `give_up_on` override the worker's for this handler; `middleware` wraps
        it alone, inside the worker's; `limit` (a `sepp.Limit`, or a list of them) limits it
        (see `Router.handle`)."""
        self._router.handle(
            job_type,
            fn,
            timeout=timeout,
            backoff=backoff,
            middleware=middleware,
            retry_on=retry_on,
            give_up_on=give_up_on,
            limit=limit,
        )
        self._build_routes()
        return self

    def handler(
        self,
        job_type: str,
        *,
        timeout: float | timedelta | None = None,
        backoff: BackoffSetting | None = None,
        middleware: Iterable[Middleware] = (),
        retry_on: type[Exception] | tuple[type[Exception], ...] | None = None,
        give_up_on: type[Exception] | tuple[type[Exception], ...] | None = None,
        limit: LimitSetting = None,
    ) -> Callable[[H], H]:
        """Decorator form of `handle`."""
        register = self._router.handler(
            job_type,
            timeout=timeout,
            backoff=backoff,
            middleware=middleware,
            retry_on=retry_on,
            give_up_on=give_up_on,
            limit=limit,
        )

        def register_here(fn: H) -> H:
            register(fn)
            self._build_routes()
            return fn

        return register_here

    def task(
        self,
        task: Task[T, R],
        *,
        timeout: float | timedelta | None = None,
        backoff: BackoffSetting | None = None,
        middleware: Iterable[Middleware] = (),
        retry_on: type[Exception] | tuple[type[Exception], ...] | None = None,
        give_up_on: type[Exception] | tuple[type[Exception], ...] | None = None,
        limit: LimitSetting = None,
    ) -> TaskDecorator[T, R]:
        """Decorator: register the handler of `task` (see `Router.task`)."""
        register = self._router.task(
            task,
            timeout=timeout,
            backoff=backoff,
            middleware=middleware,
            retry_on=retry_on,
            give_up_on=give_up_on,
            limit=limit,
        )

        def register_here(fn: TaskHandler[T, R]) -> TaskHandler[T, R]:
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
        # Before run() the routes are built when it starts; while it runs, at once.
        if self._parts is not None:
            self._parts.jobs.use_routes(self._router, self._settings.own)

    # -- state --------------------------------------------------------------------------------

    @property
    def client(self) -> WorkerClient:
        """The client the worker reserves with (handlers see it as `ctx.client`)."""
        return self._client

    @property
    def worker_id(self) -> str:
        """The id sent with every reserve (given, or made from host, pid and random bits)."""
        return self._settings.worker_id

    @property
    def in_flight(self) -> int:
        """Jobs held right now: waiting for a slot, running, or being acked/nacked."""
        return 0 if self._parts is None else len(self._parts.held)

    @property
    def is_shutdown(self) -> bool:
        """Whether shutdown was requested (it may still be draining)."""
        return self._shutdown.requested

    async def wait_until_reserving(self) -> None:
        """Return once `run()`, started in another task, is reserving (or has ended): what
        `await nursery.start(worker.run)` waits for, for a plain `asyncio.create_task(worker.run())`
        or any task that did not start it. At once if it already is."""
        if self._reserving:
            return
        if self._reserving_event is None:
            self._reserving_event = current().event()
        await self._reserving_event.wait()

    def _mark_reserving(self) -> None:
        self._reserving = True
        if self._reserving_event is not None:
            self._reserving_event.set()

    # -- pausing ------------------------------------------------------------------------------

    def pause(self) -> None:
        """Stop reserving, and keep the rest going: the jobs the worker holds run (those
        waiting for a slot too), their leases kept, and are acked or nacked as ever; nothing
        more is reserved until `resume()`. A long poll pending is cancelled (once an answer
        already on its way has been read: its jobs run); a reserve the server answers at once
        is let finish. The monitor says "paused" once no reserve is pending (`/readyz` answers
        503 then, `sepp_worker_paused` is 1). Idempotent; before `run()` too (it starts
        paused); a shutdown ends a pause. Call it from any task or thread, or a signal
        handler."""
        self._pause_wanted = True
        self._shutdown.run.call(self._pause_changed, from_task=False)

    def resume(self) -> None:
        """Reserve again after `pause()` (idempotent; from anywhere, as `pause`)."""
        self._pause_wanted = False
        self._shutdown.run.call(self._pause_changed, from_task=False)

    @property
    def is_paused(self) -> bool:
        """Whether `pause()` was called and `resume()` has not been since."""
        return self._pause_wanted

    def _pause_changed(self) -> None:
        # In the run, soon after the flag changed (the reserve loop reads it itself too).
        parts = self._parts
        if parts is not None and self._state is _RunState.RUNNING:
            parts.reserver.pause_changed()

    # -- shutdown -----------------------------------------------------------------------------

    def shutdown(self, *, now: bool = False) -> None:
        """Shut down gracefully: stop reserving, return the jobs that have not started and
        wait up to `shutdown_timeout` for the running ones. `now=True` does not wait: running
        handlers are cancelled and their jobs returned (the command line's second signal).
        Idempotent. Call it from any task or thread (of the worker's trio run or asyncio loop,
        or any other); from a signal handler use `shutdown_handle().shutdown()`."""
        self._request_shutdown(from_task=True, now=now)

    def shutdown_handle(self) -> ShutdownHandle:
        """A handle whose `shutdown()` is safe from another thread or a signal handler."""
        return ShutdownHandle(self)

    def _request_shutdown(self, *, from_task: bool, now: bool = False) -> None:
        # Flags first, the run second; run() enters the run first and reads the flags second,
        # so at least one side sees the other and no request is lost.
        shutdown = self._shutdown
        if now:
            shutdown.stop_now = True
        shutdown.requested = True
        shutdown.run.call(self._begin_shutdown, from_task=from_task)

    def _begin_shutdown(self) -> None:
        """In the run: stop reserving, return jobs that have not started (and with `now`, end
        the grace period)."""
        parts = self._parts
        assert parts is not None, "called in the run only, once it has its parts"
        shutdown = self._shutdown
        shutdown.requested = True
        if shutdown.stop_now:
            shutdown.cut_grace_short()
            if shutdown.begun:
                parts.reserver.stop()  # a reserve let finish is cancelled now
        if shutdown.begun or self._state is not _RunState.RUNNING:
            return
        shutdown.begin(parts.cc.current_time())
        if self._events is not None:
            self._events.shutting_down()
        parts.reserver.stop()
        parts.held.stop(waiting_only=True)
        parts.limits.stop_waiting()  # the jobs waiting for limits are deferred
        parts.held.changed()

    # -- running ------------------------------------------------------------------------------

    async def run(
        self, *, until_idle: bool = False, task_status: TaskStatus[None] = TASK_STATUS_IGNORED
    ) -> None:
        """Reserve and process jobs until `shutdown()`; returns once every held job is
        settled. With `nursery.start(worker.run)`, start returns once the worker is reserving.
        A worker runs once.

        `until_idle=True` is burst mode (for tests and batch runs): the worker never long-polls
        and shuts down by itself once its queues have nothing ready and it holds nothing (a
        job retried at once is worked again; one scheduled for later is not waited for)."""
        if self._state is not _RunState.NEW:
            raise RuntimeError("Worker.run() can only be called once; create a new Worker")
        if not isinstance(until_idle, bool):
            raise ValidationError("until_idle", "must be a bool")
        cc = current()
        parts = self._parts = self._parts_on(cc)
        if until_idle:
            parts.reserver.on_idle = self._begin_shutdown
        self._state = _RunState.RUNNING
        shutdown = self._shutdown
        shutdown.run.enter(cc)
        events = self._events
        jobs = parts.jobs
        if events is not None:
            # Types without a handler of their own are one "other" in the metrics' labels.
            events.worker_started(self._router.job_types)
        started = False
        loop_watch = self._loop_watch
        if loop_watch is not None:
            loop_watch.start()

        def mark_started() -> None:
            nonlocal started
            if not started:
                started = True
                if events is not None:
                    events.reserving()
                self._mark_reserving()
                task_status.started()

        try:
            async with contextlib.AsyncExitStack() as lifespan:
                if self._settings.lifespan is not None:
                    jobs.lifespan_state = await lifespan.enter_async_context(
                        lifespan_manager(self._settings.lifespan, self)
                    )
                async with cc.open_nursery() as nursery:
                    nursery.start_soon(parts.leases.run, nursery)
                    await nursery.start(parts.limits.run)  # a global limit reads the clock
                    async with cc.open_job_tasks(nursery) as job_tasks:
                        jobs.nursery = job_tasks
                        if shutdown.requested:
                            self._begin_shutdown()
                        else:
                            with parts.reserver.scope:
                                await parts.reserver.run(mark_started)
                        jobs.reserving_ended()  # no job can arrive any more
                        mark_started()
                        await shutdown.drain(parts.held, parts.report, cc)
                    jobs.stop_lease_keeping_if_idle()
                    parts.limits.close()  # once their releases are sent
        finally:
            if loop_watch is not None:
                loop_watch.stop()
            self._state = _RunState.DONE
            self._mark_reserving()  # nobody waits for a run that has ended
            if events is not None:
                events.stopped()
            shutdown.run.leave()
            jobs.nursery = None
