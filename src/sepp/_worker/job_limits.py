"""The Worker's `sepp.Limit`s: a gate per limit (`_limits.gate.LimitGate`), what each route's
jobs pass, the waiting room, and deferral (docs/limits.md, "Waiting costs nothing").

A job of a limited handler takes its slot as any job does (a Worker never holds more jobs than
`max_in_flight`, so a slot is always free for a held one), then asks its limits in order: at
once when each local one has room; else it waits, its lease kept, if the waiting room has a
place (at most `limit_waiting` held jobs wait at once, half of `max_in_flight` by default, so
the rest of the Worker's capacity always runs what can run), for at most `limit_patience`
seconds. A job that finds the room full, or whose patience runs out, is deferred: a copy with
the attempts it had left, scheduled later, then the original acked; it never costs an attempt
and is never dead-lettered for waiting. At shutdown every wait ends and its job is deferred
to run at once elsewhere. A global permit lost while its handler runs cancels the handler and
defers the job.

Nothing here runs for a handler without limits: its route's `limits` is None."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .._limits import deferral, waiting
from .._limits.admission import Admission
from .._limits.gate import LimitGate
from .._limits.limit import Limit
from .._model import settlement as outcomes
from .._model.errors import ValidationError
from .._model.limit_stats import LimitStats
from .._model.rejection_reasons import describe_job_rejection
from .._model.types import Job, JobContext, Retry
from .._runtime.concurrency import (
    TASK_STATUS_IGNORED,
    CancelScope,
    Event,
    Nursery,
    ServiceRuntime,
    TaskStatus,
)
from .._util.log import Log
from .events import LimitCounts
from .limit_uses import LimitUse

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from datetime import datetime

    from .events import WorkerEvents
    from .held_job import HeldJob

DEFERRED = "deferred"  # the outcome label of a deferred job
SHUTTING_DOWN = "the worker is shutting down"
# At most this many job types are named in an unnamed Router limit's label.
LABEL_TYPES = 4


class LimitEntry:
    """One limit in a Worker: its gate, the name logs and metrics show, and its counts (what
    `/metrics` says: this process's share for a global limit)."""

    __slots__ = (
        "admitted",
        "deferred",
        "gate",
        "label",
        "lost",
        "ready",
        "running",
        "waited_s",
        "waiting",
    )

    def __init__(self, gate: LimitGate, label: str) -> None:
        self.gate = gate
        self.label = label
        self.running = 0  # admitted, handler not ended
        self.waiting = 0  # held jobs waiting for it
        self.admitted = 0
        self.deferred = 0
        self.lost = 0
        self.waited_s = 0.0  # the admitted jobs' waits, summed
        self.ready: Event | None = None  # set once a global gate's run() started

    @property
    def limit(self) -> Limit:
        return self.gate.limit

    def counts(self) -> LimitCounts:
        limit = self.limit
        return LimitCounts(
            self.label,
            limit.scope,
            self.running,
            self.waiting,
            self.admitted,
            self.deferred,
            self.lost,
            self.waited_s,
            self.gate.keys_held,
        )

    def stats(self, key: str) -> LimitStats:
        (found,) = self.gate.stats(key)
        return found if found.name == self.label else replace(found, name=self.label)


class RouteLimits:
    """The limits one route's jobs pass, outermost first: each entry with the limit whose key
    function keys the job (one name's uses may key differently)."""

    __slots__ = ("parts",)

    def __init__(self, parts: Sequence[tuple[LimitEntry, Limit]]) -> None:
        self.parts = tuple(parts)

    def stats(self, keys: Sequence[str]) -> tuple[LimitStats, ...]:
        return tuple(entry.stats(key) for (entry, _), key in zip(self.parts, keys, strict=True))


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a job was not admitted (it is deferred), by which limit, and for how long."""

    entry: LimitEntry
    why: str
    delay_s: float


class JobAdmission:
    """A job's admissions through every limit of its route, held while its handler runs:
    `release()` after it. If a global permit is lost meanwhile, the handler's scope is
    cancelled and `lost` says which limit and why."""

    __slots__ = ("_limits", "_parts", "_scope", "lost", "released")

    def __init__(
        self,
        limits: JobLimits,
        parts: list[tuple[LimitEntry, Admission]],
        scope: CancelScope,
    ) -> None:
        self._limits = limits
        self._parts = parts
        self._scope = scope
        self.lost: tuple[LimitEntry, str] | None = None
        self.released = False
        for entry, admission in parts:
            if entry.limit.is_global:
                admission.on_lost(functools.partial(self._lose, entry))

    def _lose(self, entry: LimitEntry, why: str) -> None:
        if self.lost is not None or self.released:
            return
        self.lost = (entry, why)
        entry.lost += 1
        self._scope.cancel()
        self._limits.changed(entry)

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self._limits.release(self._parts)


@dataclass(frozen=True, slots=True)
class Deferring(outcomes.Outcome):
    """A job to defer rather than settle: its `refusal` says why and for how long."""

    job: Job | None = None
    refusal: Refusal | None = None


class JobLimits:
    """A Worker's limits: one gate per limit (by name, or by the Router whose limit it is),
    made as routes are built; `run()` keeps the global ones' background work in the Worker's
    nursery until `close()`."""

    def __init__(
        self,
        client: object,
        *,
        log: Log,
        events: WorkerEvents | None,
        worker_id: str,
        waiting_room: int,
        patience_s: float,
        now_utc: Callable[[], datetime],
        cc: ServiceRuntime,
    ) -> None:
        self._client = client
        self._log = log
        self._events = events
        self._worker_id = worker_id
        self._room = waiting.WaitingRoom(waiting_room)
        self._patience_s = patience_s
        self._now_utc = now_utc
        self._cc = cc
        self._entries: dict[object, LimitEntry] = {}
        self._waits: set[CancelScope] = set()  # the scopes of the jobs waiting now
        self._nursery: Nursery | None = None
        self._closed = cc.event()
        self._closing = False  # the shutdown began: no more waiting

    # -- building -----------------------------------------------------------------------------

    def route_limits(
        self, uses: tuple[LimitUse, ...], sharing: Mapping[object, Sequence[str]]
    ) -> RouteLimits:
        """The gates of `uses` (made for the first route that has them); `sharing`: the job
        types of each limit, which an unnamed Router limit's label names."""
        return RouteLimits([(self._entry(use, sharing), use.limit) for use in uses])

    def _entry(self, use: LimitUse, sharing: Mapping[object, Sequence[str]]) -> LimitEntry:
        entry = self._entries.get(use.identity)
        if entry is not None:
            return entry
        limit = use.limit
        client = self._client
        needs = ("enqueue_batch", "get_server_info") if limit.is_global else ("enqueue_batch",)
        missing = [name for name in needs if not hasattr(client, name)]
        if missing:
            raise ValidationError(
                "limit",
                f"{limit!r} needs a client with {' and '.join(missing)} (a sepp.Client): a job"
                " that waits too long is deferred by enqueueing a copy of it",
            )
        gate = LimitGate(
            limit,
            client=client if limit.is_global else None,  # type: ignore[arg-type]
            cc=self._cc,
            log=self._log,
            worker_id=self._worker_id,
        )
        entry = self._entries[use.identity] = LimitEntry(
            gate, _label(use, sharing.get(use.identity, ()))
        )
        if limit.is_global:
            entry.ready = self._cc.event()
            if self._nursery is not None:  # registered while the Worker runs
                self._nursery.start_soon(self._run_gate, entry)
        self.changed(entry)
        return entry

    # -- running ------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = TASK_STATUS_IGNORED) -> None:
        """The global limits' background work, until `close()`; started once each global
        gate has read the server's clock."""
        async with self._cc.open_nursery() as nursery:
            for entry in list(self._entries.values()):
                if entry.ready is not None:
                    await self._start_gate(nursery, entry)
            self._nursery = nursery
            task_status.started()
            await self._closed.wait()
            for entry in self._entries.values():
                entry.gate.close()
        self._nursery = None

    async def _run_gate(self, entry: LimitEntry) -> None:
        assert self._nursery is not None
        await self._start_gate(self._nursery, entry)

    async def _start_gate(self, nursery: Nursery, entry: LimitEntry) -> None:
        await nursery.start(entry.gate.run)
        assert entry.ready is not None
        entry.ready.set()

    def stop_waiting(self) -> None:
        """The shutdown began: every wait ends, and its job is deferred to run at once."""
        self._closing = True
        for scope in list(self._waits):
            scope.cancel()

    def close(self) -> None:
        """Every job has settled: the gates close, and `run()` ends once releases are sent."""
        self._closing = True
        self._closed.set()

    # -- admitting ----------------------------------------------------------------------------

    async def admit(self, held: HeldJob, limits: RouteLimits) -> JobAdmission | Refusal:
        """An admission through each of `limits` for `held`'s job (waiting if it must and may),
        or why not. A key function's error, or a global limit the server cannot hold, is
        raised: the job's failure."""
        ctx = held.job.ctx
        parts = limits.parts
        keys = [limit.key_of(ctx) for _, limit in parts]
        taken: list[tuple[LimitEntry, Admission]] = []
        for (entry, _), key in zip(parts, keys, strict=True):
            admission = entry.gate.try_admit(key)
            if admission is None:
                break
            self._admitted(entry, admission, taken)
        if len(taken) == len(parts):
            return self._admission(held, limits, keys, taken)
        entry = parts[len(taken)][0]
        if self._closing:
            self.release(taken)
            return Refusal(entry, SHUTTING_DOWN, 0.0)
        if not self._room.try_enter():
            self.release(taken)
            why = f"the waiting room is full ({self._room.capacity} jobs wait for limits)"
            return self._refusal(ctx, entry, keys[len(taken)], why)
        cc = self._cc
        scope = cc.cancel_scope()
        self._waits.add(scope)
        complete = False
        try:
            with scope:
                deadline = cc.current_time() + self._patience_s
                first = len(taken)
                for index in range(first, len(parts)):
                    entry, key = parts[index][0], keys[index]
                    if entry.ready is not None and not entry.ready.is_set():
                        await entry.ready.wait()  # a gate made while the Worker runs
                    entry.waiting += 1
                    self.changed(entry)
                    if index == first:
                        self._report_wait(ctx, entry, key)
                    try:
                        left = max(deadline - cc.current_time(), 0.0)
                        admission = await entry.gate.admit(key, patience_s=left)
                    finally:
                        entry.waiting -= 1
                        self.changed(entry)
                    if admission is None:
                        break
                    self._admitted(entry, admission, taken)
                complete = len(taken) == len(parts)
        finally:
            self._waits.discard(scope)
            self._room.leave()
            if not complete:
                self.release(taken)
        if complete:
            return self._admission(held, limits, keys, taken)
        if scope.cancelled_caught or self._closing:
            return Refusal(entry, SHUTTING_DOWN, 0.0)
        why = f"waited {self._patience_s:g}s for limit {entry.label!r}"
        return self._refusal(ctx, entry, key, why)

    def _admitted(
        self, entry: LimitEntry, admission: Admission, taken: list[tuple[LimitEntry, Admission]]
    ) -> None:
        taken.append((entry, admission))
        entry.running += 1
        entry.admitted += 1
        entry.waited_s += admission.waited_s
        self.changed(entry)

    def _admission(
        self,
        held: HeldJob,
        limits: RouteLimits,
        keys: list[str],
        taken: list[tuple[LimitEntry, Admission]],
    ) -> JobAdmission:
        # What the handler's ctx.limits reads (a job without limits has none set).
        held.job.ctx._lease.limits = functools.partial(limits.stats, keys)
        scope = held.scope
        assert scope is not None, "a limited job runs in a task of its own, in its own scope"
        return JobAdmission(self, taken, scope)

    def release(self, parts: list[tuple[LimitEntry, Admission]]) -> None:
        for entry, admission in parts:
            admission.release()
            entry.running -= 1
            self.changed(entry)
        parts.clear()

    def _refusal(self, ctx: JobContext, entry: LimitEntry, key: str, why: str) -> Refusal:
        hint = entry.gate.retry_after(key)
        return Refusal(entry, why, waiting.deferral_delay_s(deferral.deferrals(ctx), hint))

    def changed(self, entry: LimitEntry) -> None:
        if self._events is not None:
            self._events.limit_changed(entry.counts())

    # -- deferring ----------------------------------------------------------------------------

    def deferring(self, held: HeldJob, refusal: Refusal) -> Deferring:
        """The outcome of a job `refusal` turned away: deferred, not settled."""
        return Deferring(None, refusal.why, DEFERRED, job=held.job, refusal=refusal)

    def lost(self, held: HeldJob, admission: JobAdmission) -> Deferring:
        """The outcome of a job whose handler a lost permit cancelled: deferred too."""
        assert admission.lost is not None
        entry, why = admission.lost
        self._log.warning(
            "sepp: %s: limit %r could not keep its permit (%s); its handler was cancelled and"
            " the job is deferred",
            held.job.ctx,
            entry.label,
            why,
        )
        why = f"limit {entry.label!r} lost its permit"
        delay_s = waiting.deferral_delay_s(deferral.deferrals(held.job.ctx))
        return self.deferring(held, Refusal(entry, why, delay_s))

    async def defer(self, outcome: Deferring) -> bool | None:
        """Give the job back for later without costing an attempt: False once it is, None if
        it could not be (it comes back when its lease ends), True if the fallback's nack
        dead-lettered it."""
        job, refusal = outcome.job, outcome.refusal
        assert job is not None and refusal is not None
        ctx = job.ctx
        try:
            result = await deferral.defer(
                self._client,  # type: ignore[arg-type]  # checked to have enqueue_batch
                job,
                delay_s=refusal.delay_s,
                now=self._now_utc(),
            )
        except Exception as exc:
            self._log.warning(
                "sepp: deferring %s failed (%s); its lease brings it back",
                ctx,
                outcomes.describe(exc),
            )
            return None
        if result.rejection is not None:
            return await self._nack_instead(ctx, refusal, describe_job_rejection(result.rejection))
        entry = refusal.entry
        entry.deferred += 1
        self.changed(entry)
        self._log.info(
            "sepp: %s deferred: %s; back in %.3gs as job %s (attempt %d/%d kept, deferral %d)",
            ctx,
            refusal.why,
            refusal.delay_s,
            result.copy_id,
            ctx.logical_attempt,
            ctx.logical_max_attempts,
            deferral.deferrals(ctx) + 1,
            extra={"sepp_limit": entry.label, "sepp_deferred_as": result.copy_id},
        )
        return False

    async def _nack_instead(self, ctx: JobContext, refusal: Refusal, why: str) -> bool | None:
        """The copy was refused (the server's limits on custom entries, a full queue): the job
        goes back by a nack instead, which costs an attempt."""
        self._log.warning(
            "sepp: deferring %s was refused (%s); nacking it for %.3gs instead, which costs"
            " an attempt",
            ctx,
            why,
            refusal.delay_s,
        )
        try:
            return bool(
                await self._client.nack(  # type: ignore[attr-defined]
                    ctx,
                    reason=outcomes.clip_reason(refusal.why),
                    retry=Retry.after(refusal.delay_s),
                )
            )
        except Exception as exc:
            self._log.warning("sepp: nacking %s failed: %s", ctx, outcomes.describe(exc))
            return None

    # -- the log ------------------------------------------------------------------------------

    def _report_wait(self, ctx: JobContext, entry: LimitEntry, key: str) -> None:
        stats = entry.stats(key)  # before this job joins its waiters
        limit = entry.limit
        args = (
            ctx,
            entry.label,
            f" (key {key!r})" if key else "",
            stats.running,
            stats.waiting + 1,
            _describe(limit),
        )
        text = "sepp: %s waits for limit %r%s: %d running, %d waiting in this worker (%s)"
        # A global limit always asks the server: it is news only when it is busy here too.
        if not limit.is_global or stats.running or stats.waiting:
            self._log.info(text, *args, extra={"sepp_limit": entry.label})
        else:
            self._log.debug(text, *args)

    @property
    def waiting(self) -> int:
        """How many held jobs wait for limits now."""
        return self._room.waiting


def _label(use: LimitUse, job_types: Sequence[str]) -> str:
    if use.limit.name is not None:
        return use.limit.name
    shown = sorted(job_types)
    more = len(shown) - LABEL_TYPES
    text = "|".join(shown[:LABEL_TYPES]) + (f"|+{more}" if more > 0 else "")
    return f"router({text})"


def _describe(limit: Limit) -> str:
    parts = []
    if limit.concurrency is not None:
        parts.append(f"concurrency {limit.concurrency}")
    if limit.rate is not None:
        parts.append(f"rate {limit.rate}/{limit.per:g}s")
    parts.append(limit.scope)
    return ", ".join(parts)
