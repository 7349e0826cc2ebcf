"""Running and settling the jobs a Worker reserved: each one's handler in a slot, within its
lease and timeout, then its ack or nack.

A job that gets a slot as it arrives (almost every one) is run by a job runner: a task that
runs one such job after another, waiting for the next one in between, inside a cancel scope it
renews only after a run was cancelled; each job runs in a context of its own (`job_steps`).
Spawning a task and entering a cancel scope for every job cost about what the rest of the
job's work in the Worker does. Any other job (no slot free yet, a redelivery of a job still
running here, a type without a handler, a handler with limits, which may wait and whose lost
permit cancels its scope) gets a task and a scope of its own, as before."""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .._client import otel as _otel
from .._model import settlement as outcomes
from .._model.backoff import Backoff
from .._model.pipelines import REPLY_QUEUE, wants_more
from .._model.types import Job, JobContext, Retry, set_handler_context
from .._runtime.concurrency import CancelScope, ServiceRuntime, Spawner, TooSlowError
from .dead_letter_hooks import HookCall
from .failure_policy import FailurePolicy
from .followups import EncodeResult, FollowUps, default_encode_result
from .held_job import HeldJob, HeldJobs, Phase
from .job_limits import Deferring, JobAdmission, JobLimits, Refusal, RouteLimits
from .job_steps import JobCoroutine, drive, leave_runner_scope
from .middleware import run_chain
from .router import BackoffSetting, Handler, Router, RouteSettings, registered_handlers

if TYPE_CHECKING:
    from .client_calls import WorkerClient
    from .events import WorkerEvents
    from .lease_keeper import LeaseKeeper
    from .loop_watch import LoopWatch
    from .reporting import WorkerReport
    from .settings import UnknownTypes
    from .shutdown import WorkerShutdown
    from .slots import WorkerSlots


class HandlerTimeoutError(TooSlowError):
    """A handler ran past its `timeout` and was cancelled (middleware sees a TooSlowError)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"the handler ran past its {timeout_s:g}s timeout and was cancelled")


def _with_timeout(fn: Handler, timeout_s: float, cc: ServiceRuntime) -> Handler:
    move_on_after = cc.move_on_after

    async def timed(payload: Any, ctx: JobContext) -> object:
        returned: object = None
        with move_on_after(timeout_s) as limit:
            returned = await fn(payload, ctx)
        if limit.cancelled_caught:
            raise HandlerTimeoutError(timeout_s)
        return returned

    return timed


class Route:
    """A handler as the Worker runs it: the function (within its timeout), its middleware
    chain, the backoff its failures retry with, its failure policy (None: every failure
    retries), the hooks its dead-lettered jobs are told to, how its result is encoded (a
    task's codec, or JSON) for a chain's next step or an awaiting client, and the limits its
    jobs pass (None: none). What a failure, a dead letter or a limit needs is made here, once,
    so that a job that succeeds pays nothing for them (and a job without limits nothing for
    those)."""

    __slots__ = (
        "backoff",
        "dead_letter_hooks",
        "encode_result",
        "fn",
        "limits",
        "middleware",
        "policy",
    )

    def __init__(self, fn: Handler, settings: RouteSettings, cc: ServiceRuntime) -> None:
        self.encode_result: EncodeResult = getattr(fn, "sepp_encode_result", default_encode_result)
        timeout_s = settings.timeout_s
        self.fn = fn if timeout_s is None else _with_timeout(fn, timeout_s, cc)
        self.middleware = settings.middleware
        assert settings.backoff is not None  # the Worker's own settings always have one
        self.backoff: BackoffSetting = settings.backoff
        retry_on, give_up_on = settings.retry_on, settings.give_up_on
        self.policy = (
            None if retry_on is None and not give_up_on else FailurePolicy(retry_on, give_up_on)
        )
        self.dead_letter_hooks = settings.on_dead_letter
        self.limits: RouteLimits | None = None


RUNNER_NAME = "sepp job runner"


class _Runner:
    """A job runner waiting for its next job: `held` and `route` are set when it is woken
    (`held` None: no job will come, the runner ends)."""

    __slots__ = ("_jobs", "held", "route", "waiter")

    def __init__(self, jobs: JobProcessor) -> None:
        self._jobs = jobs
        self.held: HeldJob | None = None
        self.route: Route | None = None
        self.waiter: Any = None

    def wake(self, held: HeldJob | None, route: Route | None) -> None:
        self.held, self.route = held, route
        self._jobs._cc.unpark(self.waiter)

    def abort(self, raise_cancel: object) -> object:
        """Cancelled while it waited: no job may be given to it any more."""
        idle = self._jobs._idle
        if self in idle:
            idle.remove(self)
        return self._jobs._cc.park_aborted


class JobProcessor:
    """Takes each job a reserve returned (`dispatch`) and sees it through in a task of its own,
    in `nursery`: waits for a slot (or for an earlier run of the same job), runs the handler
    under lease keeping, settles the job, and tells the report and the events."""

    def __init__(
        self,
        client: WorkerClient,
        *,
        worker_id: str,
        unknown_types: UnknownTypes,
        held: HeldJobs,
        slots: WorkerSlots,
        leases: LeaseKeeper,
        shutdown: WorkerShutdown,
        report: WorkerReport,
        events: WorkerEvents | None,
        metrics: _otel.WorkerMetrics,
        loop_watch: LoopWatch | None = None,
        limits: JobLimits,
        cc: ServiceRuntime,
    ) -> None:
        self._cc = cc
        self._limits = limits
        self._client = client
        self._worker_id = worker_id
        self._unknown_types = unknown_types
        self._held = held
        self._slots = slots
        self._leases = leases
        self._shutdown = shutdown
        self._report = report
        self._events = events
        self._metrics = metrics
        self._loop_watch = loop_watch
        self._follow_ups = FollowUps(client, report.log)
        # The handlers as they run, rebuilt at each registration (rare): a job's costs one get.
        self._routes: dict[str, Route] = {}
        self._catch_all: Route | None = None
        self._handled: tuple[str, ...] = ()  # the job types with a handler of their own
        self._unknown_type_hooks: tuple[HookCall, ...] = ()  # the Worker's own
        self.nursery: Spawner | None = None  # the jobs' tasks', while the Worker runs
        self.lifespan_state: Any = None  # every handler's ctx.state
        self._reserving_ended = False
        self._idle: list[_Runner] = []  # job runners waiting for a job, the latest last

    def use_routes(self, router: Router, own: RouteSettings) -> None:
        """Run `router`'s handlers, with the Worker's settings `own` around theirs."""
        routes: dict[str, Route] = {}
        catch_all = None
        entries = [(entry, entry.settings.inside(own)) for entry in registered_handlers(router)]
        sharing: dict[object, list[str]] = {}  # the job types of each limit, for its label
        for entry, settings in entries:
            for use in settings.limits:
                sharing.setdefault(use.identity, []).append(entry.job_type or "*")
        for entry, settings in entries:
            route = Route(entry.handler, settings, self._cc)
            if settings.limits:
                route.limits = self._limits.route_limits(settings.limits, sharing)
            if entry.job_type is None:
                catch_all = route
            else:
                routes[entry.job_type] = route
        self._routes, self._catch_all, self._handled = routes, catch_all, tuple(routes)
        self._unknown_type_hooks = own.on_dead_letter

    def reserving_ended(self) -> None:
        """No job can arrive any more: the idle job runners end, and lease keeping stops once
        the last job settles."""
        self._reserving_ended = True
        idle, self._idle = self._idle, []
        for runner in idle:
            runner.wake(None, None)

    def stop_lease_keeping_if_idle(self) -> None:
        if self._reserving_ended and not self._held:
            self._leases.stop()

    # -- taking a job ---------------------------------------------------------------------------

    def dispatch(self, job: Job, dispatched_at: float) -> None:
        """Take `job`, which the worker took from a reserve's answer at `dispatched_at` (on the
        run's clock): its wait for its handler starts there."""
        nursery = self.nursery
        assert nursery is not None
        ctx = job.ctx
        set_handler_context(ctx, self._client, self.lifespan_state)
        held = HeldJob(job, self._cc)
        held.dispatched_at = dispatched_at
        earlier = self._held.add(held)
        route = self._routes.get(ctx.job_type, self._catch_all)
        if (
            route is not None
            and earlier is None
            and route.limits is None
            and self._slots.take(held)
        ):
            # A job runner's, in a context of its own as a task of its own would have.
            held.context = contextvars.copy_context()
            if self._idle:
                self._idle.pop().wake(held, route)
            else:
                nursery.start_soon(self._run_jobs, held, route, name=RUNNER_NAME)
            return
        held.scope = self._cc.cancel_scope()
        if route is not None:
            if earlier is None:
                self._slots.queue(held)
            else:
                self._wait_for_earlier_run(held, earlier)
            if self._shutdown.begun and held.phase is Phase.WAITING:
                held.stop()
        # Type and id name the task well enough, and cost less than str(ctx).
        name = f"sepp job {ctx.job_type}[{ctx.id}]"
        nursery.start_soon(self._process, held, route, None, name=name)

    def _wait_for_earlier_run(self, held: HeldJob, earlier: HeldJob) -> None:
        """A redelivery of a job this worker still runs (its lease ran out, the handler has
        not ended yet): it runs once the earlier run ended, never beside it."""
        held.earlier = earlier
        if earlier.ended is None:
            earlier.ended = self._cc.event()
        self._report.redelivered_while_running(held.job.ctx, earlier.job.ctx.attempt)

    # -- one job --------------------------------------------------------------------------------

    async def _run_jobs(self, held: HeldJob | None, route: Route | None) -> None:
        """A job runner: runs `held`, then each job it is given, until none will come. Its
        cancel scope is the running job's (`held.scope`); once a run was cancelled, the job
        settles in the next scope, and the next jobs run there."""
        cc = self._cc
        watch = self._loop_watch
        leases = self._leases
        now = cc.clock()  # this run's clock, read directly
        runner = _Runner(self)
        cancelled: HeldJob | None = None
        rest: JobCoroutine | None = None
        while True:
            with cc.cancel_scope() as scope:
                if cancelled is not None and rest is not None:
                    await drive(cancelled, rest, watch, None)
                    cancelled = rest = None
                while True:
                    if held is None:  # wait for the next job, or for the end
                        if self._reserving_ended:
                            return
                        runner.waiter = cc.waiter()
                        self._idle.append(runner)
                        await cc.park(runner.abort)
                        held, route = runner.held, runner.route
                        if held is None:
                            return
                        runner.held = runner.route = None
                    held.scope = scope
                    rest = await drive(held, self._process(held, route, scope, now), watch, leases)
                    if rest is not None:  # cancelled: it settles outside this scope
                        cancelled, held = held, None
                        break
                    held = None

    async def _process(
        self,
        held: HeldJob,
        route: Route | None,
        runner_scope: CancelScope | None,
        now: Callable[[], float] | None = None,
    ) -> None:
        """One job, from its slot to its settling: in a task of its own (`runner_scope`
        None), or in a job runner's, whose scope is `runner_scope` (and `now` its clock)."""
        if now is None:
            now = self._cc.current_time
        ctx = held.job.ctx
        try:
            # The lease keeper, the handler and the ack/nack all run inside this span, so
            # their own spans nest under it (tasks inherit the spawner's context).
            with _otel.process_span(held.job, self._worker_id) as span:
                traced = span is not _otel.NOOP_SPAN
                # Whether metrics are on, once a job: their attributes, or None.
                attributes = _job_attributes(ctx) if self._metrics.enabled else None
                if route is None:
                    held.phase = Phase.SETTLING
                    outcome: outcomes.Outcome | None = self._unknown_type(ctx)
                else:
                    started = now()
                    if runner_scope is None:
                        self._leases.watch(held, started)
                    else:
                        # Its lease is kept once the handler first waits (job_steps.drive):
                        # nothing can act on it before. What the keeper's extends run in.
                        held.lease_context = contextvars.copy_context()
                    try:
                        outcome = await self._run_handler(
                            held, route, runner_scope, now, started, attributes
                        )
                    finally:
                        if held.watch_key >= 0:
                            self._leases.release(held)
                    if runner_scope is not None and (held.forced or held.lease_lost is not None):
                        await leave_runner_scope()  # nothing can be awaited in it now
                if outcome is None:
                    label: str | None = None
                    dead_lettered: bool | None = None
                    if traced:
                        span.set("sepp.outcome", "lease_lost")
                        span.fail(held.lease_lost or "lease lost")
                else:
                    label = outcome.label
                    if traced:
                        span.set("sepp.outcome", label)
                        if outcome.failure is not None:
                            span.fail(outcome.failure)
                    if outcome is outcomes.ACK:
                        try:
                            await self._client.ack(ctx)
                            dead_lettered = False
                            if attributes is not None:
                                self._metrics.add("processed", 1, attributes)
                        except Exception as exc:
                            self._report.settle_failed("ack", ctx, exc)
                            dead_lettered = None
                    else:
                        dead_lettered = await self._settle(ctx, outcome, attributes)
                        if dead_lettered and ctx.custom and REPLY_QUEUE in ctx.custom:
                            await self._follow_ups.dead_lettered(ctx, outcome)  # awaited job
                if self._events is not None:
                    self._events.job_settled(ctx, label, dead_lettered)
                self._report.finished(ctx, label, dead_lettered, held.run_s, held.wait_s)
                if outcome is not None and dead_lettered:
                    hooks = self._unknown_type_hooks if route is None else route.dead_letter_hooks
                    if hooks:
                        error = outcome.error  # the handler's: an Exception, if any
                        error = error if isinstance(error, Exception) else None
                        await self._after_dead_letter(held, hooks, error)
                if outcome is not None and outcome.retry is not None:
                    await self._report.nacked(ctx, outcome, dead_lettered)
        finally:
            self._held.remove(held)
            if self._reserving_ended and not self._held:
                self._leases.stop()

    def _unknown_type(self, ctx: JobContext) -> outcomes.Outcome:
        policy = self._unknown_types
        delay_s = None if policy == "dead_letter" else policy.delay(ctx.attempt)
        self._report.unknown_type(ctx, delay_s, self._handled)
        return outcomes.unknown_type(ctx, delay_s)

    async def _run_handler(
        self,
        held: HeldJob,
        route: Route,
        runner_scope: CancelScope | None,
        now: Callable[[], float],
        at: float,
        attributes: dict[str, str] | None,
    ) -> outcomes.Outcome | None:
        job = held.job
        ctx = job.ctx
        returned = False
        error: Exception | None = None
        metrics = self._metrics
        events = self._events
        slotted = False
        admission: JobAdmission | None = None
        try:
            if runner_scope is None:
                assert held.scope is not None
                with held.scope:
                    if held.earlier is not None:
                        await self._after_earlier_run(held, held.earlier)
                    await held.wait_for_slot()
                    if route.limits is not None:  # only ever a task of its own's
                        admitted = await self._limits.admit(held, route.limits)
                        if type(admitted) is Refusal:
                            return self._limits.deferring(held, admitted)
                        admission = admitted  # type: ignore[assignment]
                    slotted = True
                    if events is not None:
                        events.job_started(ctx)
                    if attributes is not None:
                        metrics.add("in_flight", 1, attributes)
                    call = self._call(held, route, now)
                    watch = self._loop_watch
                    value = await (call if watch is None else watch.stepping(ctx, call))
                    custom = ctx.custom
                    if ctx._lease.follow_ups is not None or (custom and wants_more(custom)):
                        await self._send_follow_ups(held, route, value)
                    returned = True
            elif not held.forced and held.lease_lost is None:  # else it never starts
                # Each step is stamped for the loop watch by the runner (job_steps.drive).
                slotted = True
                if events is not None:
                    events.job_started(ctx)
                if attributes is not None:
                    metrics.add("in_flight", 1, attributes)
                value = None
                if route.middleware:  # it says when the handler starts, and what it returned
                    await run_chain(job, route.middleware, route.fn, held)
                else:
                    held.started_at = at
                    value = await route.fn(job.payload, ctx)
                custom = ctx.custom
                if ctx._lease.follow_ups is not None or (custom and wants_more(custom)):
                    await self._send_follow_ups(held, route, value)
                returned = True
        except Exception as exc:  # the handler's failure is the job's outcome, not ours
            error = exc
        except BaseException as exc:
            # The runner's scope was cancelled for this job (its own scope swallows it);
            # anything else goes on out.
            if runner_scope is None or not held.cancelled or not self._cc.is_cancellation(exc):
                raise
        finally:
            self._slots.release(held)
            if admission is not None:
                admission.release()
            held.phase = Phase.SETTLING
            ended = now()
            started = held.started_at
            if started is None:  # never started (a middleware skipped it, or it was stopped)
                held.wait_s = ended - held.dispatched_at
            else:
                held.run_s = ended - started
                held.wait_s = started - held.dispatched_at
            if slotted:
                run_s = held.run_s or 0.0
                if events is not None:
                    events.job_ended(ctx, run_s)
                if attributes is not None:
                    metrics.add("in_flight", -1, attributes)
                    metrics.record("duration", run_s, attributes)
        if held.lease_lost is not None:
            return None  # someone else may own the job now; logged by the lease keeper
        if returned:
            return outcomes.ACK
        if admission is not None and admission.lost is not None:
            return self._limits.lost(held, admission)
        if held.forced or error is None:
            return outcomes.SHUTDOWN
        outcome = outcomes.requested(error)
        if outcome is None:
            label = "timeout" if isinstance(error, HandlerTimeoutError) else "error"
            why = None if route.policy is None else route.policy.gives_up(error)
            if why is not None:
                return outcomes.given_up(error, why)
            outcome = outcomes.failed(error, label)
        if outcome.retry is not Retry.DEFAULT or route.backoff is Retry.DEFAULT:
            return outcome
        assert isinstance(route.backoff, Backoff)
        delay_s = route.backoff.delay(ctx.logical_attempt)  # counted across deferrals
        return outcomes.with_backoff(outcome, Retry.after(delay_s), delay_s)

    async def _send_follow_ups(self, held: HeldJob, route: Route, value: object) -> None:
        """The handler returned `value`: its follow-ups, its chain's next step or its result,
        before the ack."""
        if route.middleware:  # unset if a middleware skipped the handler
            value = getattr(held, "returned", None)
        await self._follow_ups.succeeded(held.job.ctx, value, route.encode_result)

    @staticmethod
    def _call(held: HeldJob, route: Route, now: Callable[[], float]) -> Awaitable[object]:
        """The handler's call, inside its middleware (which says when the handler starts)."""
        job = held.job
        if route.middleware:
            return run_chain(job, route.middleware, route.fn, held)
        held.started_at = now()
        return route.fn(job.payload, job.ctx)

    async def _after_dead_letter(
        self, held: HeldJob, hooks: tuple[HookCall, ...], error: Exception | None
    ) -> None:
        """Tell `hooks` that the nack dead-lettered the job, one after the other, each one's
        failure logged and its own: the job's outcome is settled already. The job stays held
        meanwhile (a shutdown waits for its hooks, as for a handler), in a cancel scope of its
        own that a forced stop cancels."""
        ctx = held.job.ctx
        held.scope = scope = self._cc.cancel_scope()
        held.phase = Phase.TELLING
        with scope:
            for hook in hooks:
                try:
                    await hook.call(ctx, error)
                except Exception as exc:  # a hook's failure is logged, never the loop's
                    self._report.hook_failed(hook.name, ctx, exc)
        held.phase = Phase.SETTLING
        if scope.cancelled_caught:
            self._report.hooks_cancelled(ctx)

    async def _after_earlier_run(self, held: HeldJob, earlier: HeldJob) -> None:
        assert earlier.ended is not None
        await earlier.ended.wait()
        held.earlier = None  # let the earlier one go
        self._slots.queue(held)

    async def _settle(
        self, ctx: JobContext, outcome: outcomes.Outcome, attributes: dict[str, str] | None
    ) -> bool | None:
        """Ack or nack (a plain ack is `_process`'s own); returns whether a nack
        dead-lettered the job (None: it failed)."""
        try:
            if outcome.retry is None:
                if type(outcome) is Deferring:  # a plain ack never comes here
                    return await self._limits.defer(outcome)
                await self._client.ack(ctx)
                if attributes is not None:
                    self._metrics.add("processed", 1, attributes)
                return False
            dead_lettered = await self._client.nack(ctx, reason=outcome.reason, retry=outcome.retry)
            if attributes is not None:
                self._metrics.add("nacked", 1, {**attributes, "sepp.outcome": outcome.label})
            return bool(dead_lettered)
        except Exception as exc:
            self._report.settle_failed("ack" if outcome.retry is None else "nack", ctx, exc)
        return None


def _job_attributes(ctx: JobContext) -> dict[str, str]:
    return {"sepp.queue": ctx.queue, "sepp.job_type": ctx.job_type}
