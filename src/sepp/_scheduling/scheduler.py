"""Scheduler: enqueues each occurrence of a Schedule ahead of time, with `scheduled_at` = the
occurrence and an idempotency key derived from it, so any number of schedulers produce every
occurrence once. Built only on the Client's public `enqueue` and `get_server_info`."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Protocol

from .._client.client_kind import refuse_a_blocking_client
from .._model import validate as v
from .._model.backoff import backoff_delay
from .._model.errors import JobRejectedError, SeppError, UnauthenticatedError, ValidationError
from .._model.types import EnqueueAck, EnqueueRequest, ServerInfo
from .._runtime.concurrency import (
    TASK_STATUS_IGNORED,
    CancelScope,
    RunHandle,
    ServiceRuntime,
    TaskStatus,
    current,
)
from .._runtime.shutdown_handle import ShutdownHandle
from .._util.log import Log, LoggerLike
from .schedule import (
    MISSED_POLICIES,
    Entry,
    Missed,
    Schedule,
    check_key_fits,
    first_overdue,
    format_occurrence,
    overdue_to_keep,
)

# The server's default max_schedule_horizon; the advertised one is checked at start.
DEFAULT_SCHEDULE_HORIZON = timedelta(days=30)
# The server's default dedup window (storage.dedup_window_ms); it is not advertised.
DEFAULT_DEDUP_WINDOW = timedelta(hours=24)
# How far our view of the server's clock may be off (round trip, drift between refreshes).
CLOCK_MARGIN_S = 5.0
# Re-read the server's clock this often, or this soon after a failed read.
CLOCK_REFRESH_S = 300.0
CLOCK_RETRY_S = 30.0
# Failed enqueues back off from the first step, doubling up to the cap, each sleep drawn from
# [0.5, 1.0) of the step so schedulers do not retry in lockstep.
BACKOFF_INITIAL_S = 1.0
BACKOFF_CAP_S = 30.0
MIN_SLEEP_S = 0.001


class SchedulerClient(Protocol):
    """The calls a Scheduler makes: `sepp.Client` has them."""

    async def enqueue(self, request: EnqueueRequest, /) -> EnqueueAck: ...

    async def get_server_info(self) -> ServerInfo: ...


class _RunState(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    DONE = "done"


class _ServerClock:
    """The server's time as seen from here: a server timestamp paired with the trio time it was
    read at, so MockClock tests are deterministic and a skewed host clock does not matter."""

    __slots__ = ("_current_time", "_server_time", "_trio_time")

    def __init__(
        self, server_time: datetime, trio_time: float, current_time: Callable[[], float]
    ) -> None:
        self._server_time = server_time
        self._trio_time = trio_time
        self._current_time = current_time

    def now(self) -> datetime:
        return self._server_time + timedelta(seconds=self._current_time() - self._trio_time)

    def trio_time_at(self, when: datetime) -> float:
        return self._trio_time + (when - self._server_time).total_seconds()


class _Enqueued(enum.Enum):
    NEW = "new"  # a job was created
    ALREADY = "already"  # some scheduler had enqueued it: the key deduplicated it
    REFUSED = "refused"  # this occurrence's own failure; retried with backoff
    OUTAGE = "outage"  # the server looks unreachable; every enqueue pauses


class _Track:
    """One entry's occurrences: those not planned yet, and those planned but not enqueued."""

    __slots__ = (
        "_upcoming",
        "entry",
        "failures",
        "missed_at_start",
        "next_occurrence",
        "pending",
        "retry_at",
        "unchecked",
    )

    def __init__(
        self, entry: Entry, after: datetime, overdue: list[datetime], *, check_missed: bool
    ) -> None:
        self.entry = entry
        self._upcoming: Iterator[datetime] = entry.rule.occurrences(after)
        self.next_occurrence = next(self._upcoming, None)
        # Ascending (planned in order); a dict so that settling one is O(1).
        self.pending = dict.fromkeys(overdue)
        self.failures: dict[datetime, int] = {}
        self.retry_at: dict[datetime, float] = {}
        # Past occurrences at start; the first one this start enqueues itself is logged.
        self.missed_at_start = frozenset(overdue)
        # missed="all": the start's overdue occurrences, of which those some scheduler already
        # enqueued are found with a few probes before the rest are replayed.
        self.unchecked = list(overdue) if check_missed and len(overdue) > 1 else []

    def plan_until(self, horizon: datetime) -> None:
        while self.next_occurrence is not None and self.next_occurrence <= horizon:
            self.pending[self.next_occurrence] = None
            self.next_occurrence = next(self._upcoming, None)

    def forget(self, occurrence: datetime) -> None:
        del self.pending[occurrence]
        self.failures.pop(occurrence, None)
        self.retry_at.pop(occurrence, None)


class Scheduler:
    """Enqueues every occurrence of `schedule` once it is within `lookahead` of now, with
    `scheduled_at` = the occurrence and the idempotency key
    `sepp-schedule:<name>:<occurrence as UTC ISO 8601>`. Run as many schedulers as you like
    (one per host, say): the server deduplicates the keys, so each occurrence becomes one job,
    and the server, not a scheduler's wake-up, makes it ready on time.

    Time is the server's (`get_server_info().server_time`, re-read every few minutes).

    `missed` says what happens to occurrences that are past and not enqueued (the scheduler was
    down, or the server was): "latest" enqueues only the newest, "all" every one, "skip" none,
    except those less than `grace` old. None older than `dedup_window - lookahead` (less a
    small clock margin) is enqueued, since the key that would show whether it already was may
    have expired; `dedup_window` must match the server's `storage.dedup_window_ms` (24 h by
    default), which the server does not advertise.

    Failed enqueues are logged and retried with backoff (1 s doubling to 30 s, jittered) while
    the policy keeps the occurrence; the loop outlives every failure. `run()` returns after
    `shutdown()`; with `nursery.start(scheduler.run)`, start returns once the scheduler has
    read the server's clock and limits (a key longer than the server's
    `max_idempotency_key_bytes` or a lookahead beyond its `max_schedule_horizon` raises
    ValidationError there).
    """

    def __init__(
        self,
        client: SchedulerClient,
        schedule: Schedule,
        *,
        lookahead: float | timedelta = 60.0,
        missed: Missed = "latest",
        grace: float | timedelta = 60.0,
        dedup_window: float | timedelta = DEFAULT_DEDUP_WINDOW,
        logger: LoggerLike | None = None,
    ) -> None:
        if not isinstance(schedule, Schedule):
            raise ValidationError(
                "schedule", f"must be a sepp.Schedule, got {type(schedule).__name__}"
            )
        if not len(schedule):
            raise ValidationError("schedule", "has no entries")
        if missed not in MISSED_POLICIES:
            raise ValidationError("missed", f"must be one of {MISSED_POLICIES}, got {missed!r}")
        self._lookahead_s = v.seconds("lookahead", lookahead)
        if self._lookahead_s > DEFAULT_SCHEDULE_HORIZON.total_seconds():
            raise ValidationError(
                "lookahead",
                f"occurrences {self._lookahead_s:g}s ahead are beyond the server's default"
                f" schedule horizon ({DEFAULT_SCHEDULE_HORIZON})",
            )
        self._grace_s = v.seconds("grace", grace, allow_zero=True)
        window_s = v.seconds("dedup_window", dedup_window)
        # How old an occurrence may be and still be safely retried: its key was first written
        # no earlier than `lookahead` before it, and lives `dedup_window` from then.
        self._oldest_s = window_s - self._lookahead_s - CLOCK_MARGIN_S
        if self._oldest_s <= self._grace_s:
            raise ValidationError(
                "dedup_window",
                f"{window_s:g}s leaves no room for a {self._lookahead_s:g}s lookahead, a"
                f" {self._grace_s:g}s grace and a {CLOCK_MARGIN_S:g}s clock margin",
            )
        refuse_a_blocking_client(client, "sepp.Scheduler")
        self._client = client
        self._missed = missed
        self._entries = tuple(schedule._entries.values())
        self._log = Log(logger if logger is not None else logging.getLogger("sepp.scheduler"))

        self._state = _RunState.NEW
        self._shutdown_requested = False
        self._run = RunHandle()
        # The runtime of the run (given by run() when it starts), and the run's scope that
        # shutdown() cancels, made then.
        self._cc: ServiceRuntime
        self._scope: CancelScope | None = None
        self._clock: _ServerClock | None = None
        self._clock_refresh_at = 0.0
        self._tracks: list[_Track] = []
        # Failures that look like the server (not one job) is the problem pause every enqueue.
        self._outage_failures = 0
        self._outage_until = -float("inf")

    def __repr__(self) -> str:
        names = [entry.name for entry in self._entries]
        return f"<sepp.Scheduler {names} missed={self._missed!r} {self._state.value}>"

    @property
    def is_shutdown(self) -> bool:
        """Whether shutdown was requested."""
        return self._shutdown_requested

    def shutdown(self) -> None:
        """Stop the scheduler: `run()` returns promptly (an enqueue in flight is abandoned; its
        occurrence is safe to enqueue again, by the key). Idempotent; call it from a task of the
        same trio run or asyncio loop, before or during `run()`; from another thread or a signal
        handler use `shutdown_handle().shutdown()`."""
        self._shutdown_requested = True
        self._cancel_run()

    def _cancel_run(self) -> None:
        if self._scope is not None:
            self._scope.cancel()

    def shutdown_handle(self) -> ShutdownHandle:
        """A handle whose `shutdown()` is safe from another thread or a signal handler."""
        return ShutdownHandle(self)

    def _request_shutdown(self, *, from_task: bool, now: bool = False) -> None:
        # Flag first, the run second; run() enters the run first and reads the flag second.
        self._shutdown_requested = True
        self._run.call(self._cancel_run, from_task=False)

    async def run(self, *, task_status: TaskStatus[None] = TASK_STATUS_IGNORED) -> None:
        """Enqueue occurrences until `shutdown()`. A scheduler runs once."""
        if self._state is not _RunState.NEW:
            raise RuntimeError("Scheduler.run() can only be called once; create a new Scheduler")
        cc = self._cc = current()
        scope = self._scope = cc.cancel_scope()
        self._state = _RunState.RUNNING
        self._run.enter(cc)
        if self._shutdown_requested:
            scope.cancel()
        started = False
        try:
            with scope:
                info = await self._first_sync()
                self._check_server_limits(info)
                self._start_tracks()
                task_status.started()
                started = True
                await self._loop()
        finally:
            self._state = _RunState.DONE
            self._run.leave()
        if not started:
            task_status.started()  # shut down before it ever started

    # -- the server's clock -------------------------------------------------------------------

    async def _read_server_clock(self) -> ServerInfo:
        sent = self._cc.current_time()
        info = await self._client.get_server_info()
        # The server read its clock somewhere during the call: assume the middle.
        self._clock = _ServerClock(
            info.server_time, (sent + self._cc.current_time()) / 2, self._cc.current_time
        )
        self._clock_refresh_at = self._cc.current_time() + CLOCK_REFRESH_S
        return info

    async def _first_sync(self) -> ServerInfo:
        failures = 0
        while True:
            try:
                return await self._read_server_clock()
            except Exception as exc:  # the server may not be up yet: keep trying
                failures += 1
                delay = _backoff(failures)
                self._log_failure("cannot read the server's clock and limits", exc, delay)
                await self._cc.sleep(delay)

    async def _refresh_clock(self) -> None:
        try:
            await self._read_server_clock()
        except Exception as exc:
            self._clock_refresh_at = self._cc.current_time() + CLOCK_RETRY_S
            self._log_failure("cannot re-read the server's clock", exc, CLOCK_RETRY_S)

    def _server_now(self) -> datetime:
        assert self._clock is not None
        return self._clock.now()

    def _check_server_limits(self, info: ServerInfo) -> None:
        for entry in self._entries:
            check_key_fits(entry, info.max_idempotency_key_bytes, "the server's")
        if self._lookahead_s > info.max_schedule_horizon.total_seconds():
            raise ValidationError(
                "lookahead",
                f"occurrences {self._lookahead_s:g}s ahead are beyond the server's schedule"
                f" horizon ({info.max_schedule_horizon})",
            )

    # -- planning -----------------------------------------------------------------------------

    def _oldest(self, now: datetime) -> datetime:
        return now - timedelta(seconds=self._oldest_s)

    def _start_tracks(self) -> None:
        now = self._server_now()
        grace = timedelta(seconds=self._grace_s)
        for entry in self._entries:
            overdue = first_overdue(
                entry.rule, self._missed, now, grace=grace, oldest=self._oldest(now)
            )
            self._tracks.append(_Track(entry, now, overdue, check_missed=self._missed == "all"))
        self._log.info(
            "sepp: scheduler started at server time %s: %d entries, missed=%r enqueues %d past"
            " occurrence(s)",
            format_occurrence(now),
            len(self._tracks),
            self._missed,
            sum(len(track.pending) for track in self._tracks),
        )

    def _plan(self) -> None:
        now = self._server_now()
        horizon = now + timedelta(seconds=self._lookahead_s)
        for track in self._tracks:
            track.plan_until(horizon)
            overdue = [occurrence for occurrence in track.pending if occurrence <= now]
            if not overdue:
                continue
            keep = overdue_to_keep(
                self._missed,
                overdue,
                now,
                grace=timedelta(seconds=self._grace_s),
                oldest=self._oldest(now),
            )
            kept = set(keep)
            dropped = [occurrence for occurrence in overdue if occurrence not in kept]
            for occurrence in dropped:
                track.forget(occurrence)
            if dropped:
                self._log.warning(
                    "sepp: scheduler: %d occurrence(s) of %r from %s to %s could not be enqueued"
                    " in time and are dropped (missed=%r)",
                    len(dropped),
                    track.entry.name,
                    format_occurrence(dropped[0]),
                    format_occurrence(dropped[-1]),
                    self._missed,
                )

    # -- enqueueing ---------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            if self._cc.current_time() >= self._clock_refresh_at:
                await self._refresh_clock()
            self._plan()
            await self._enqueue_due()
            # Never spin: a wake-up computed in the past (time passed during the enqueues, or
            # a rounding of the clock mapping) waits a millisecond.
            await self._cc.sleep_until(
                max(self._next_wake(), self._cc.current_time() + MIN_SLEEP_S)
            )

    def _next_wake(self) -> float:
        assert self._clock is not None
        wake = self._clock_refresh_at
        lookahead = timedelta(seconds=self._lookahead_s)
        for track in self._tracks:
            if track.next_occurrence is not None:
                wake = min(wake, self._clock.trio_time_at(track.next_occurrence - lookahead))
            for occurrence in track.pending:
                retry_at = track.retry_at.get(occurrence, -float("inf"))
                wake = min(wake, max(retry_at, self._outage_until))
        return wake

    async def _enqueue_due(self) -> None:
        now = self._cc.current_time()
        if now < self._outage_until:
            return
        for track in self._tracks:
            if track.unchecked and not await self._skip_already_enqueued(track):
                return
        due = sorted(
            (occurrence, index)
            for index, track in enumerate(self._tracks)
            for occurrence in track.pending
            if track.retry_at.get(occurrence, -float("inf")) <= now
        )
        for occurrence, index in due:
            if await self._enqueue(self._tracks[index], occurrence) is _Enqueued.OUTAGE:
                return  # the server looks unreachable: the rest would fail the same way

    async def _skip_already_enqueued(self, track: _Track) -> bool:
        """missed="all" at start: drop the overdue occurrences some scheduler already enqueued,
        so a restart replays only what was missed, not the whole dedup window. Schedulers
        enqueue in order, so those form a prefix: probe the newest, then bisect (each probe
        is an enqueue; one that creates a job has found a missed occurrence, enqueued a little
        ahead of older missed ones). False when the server looks unreachable."""
        unchecked = [occurrence for occurrence in track.unchecked if occurrence in track.pending]
        low, high = 0, len(unchecked)  # the first missed occurrence is in [low, high]
        probe = high - 1
        while low < high:
            outcome = await self._enqueue(track, unchecked[probe])
            if outcome is _Enqueued.OUTAGE:
                return False
            if outcome is _Enqueued.REFUSED:
                break  # its own retries take over; the rest are replayed, deduplicated
            if outcome is _Enqueued.ALREADY:
                low = probe + 1
            else:
                high = probe
            probe = (low + high) // 2
        else:
            for occurrence in unchecked[:low]:
                if occurrence in track.pending:
                    track.forget(occurrence)
            self._log.info(
                "sepp: scheduler: %d of %d past occurrence(s) of %r were enqueued before this"
                " start; replaying the %d missed (missed='all')",
                low,
                len(unchecked),
                track.entry.name,
                len(unchecked) - low,
            )
        track.unchecked = []
        return True

    async def _enqueue(self, track: _Track, occurrence: datetime) -> _Enqueued:
        """Try one occurrence (it is settled unless the outcome is REFUSED or OUTAGE)."""
        name = track.entry.name
        try:
            ack = await self._client.enqueue(track.entry.request(occurrence))
        except (JobRejectedError, ValidationError) as exc:
            failures = track.failures[occurrence] = track.failures.get(occurrence, 0) + 1
            delay = _backoff(failures)
            track.retry_at[occurrence] = self._cc.current_time() + delay
            self._log_failure(
                f"occurrence {format_occurrence(occurrence)} of {name!r} was refused",
                exc,
                delay,
                failures,
            )
            return _Enqueued.REFUSED
        except Exception as exc:  # the loop must outlive every failure
            self._outage_failures += 1
            delay = _backoff(self._outage_failures)
            self._outage_until = self._cc.current_time() + delay
            self._log_failure(
                f"enqueueing occurrence {format_occurrence(occurrence)} of {name!r} failed",
                exc,
                delay,
                self._outage_failures,
            )
            return _Enqueued.OUTAGE
        track.forget(occurrence)
        if self._outage_failures:
            self._log.info(
                "sepp: scheduler: enqueue works again after %d failure(s)", self._outage_failures
            )
            self._outage_failures = 0
        self._log.debug(
            "sepp: scheduler: occurrence %s of %r is job %s%s",
            format_occurrence(occurrence),
            name,
            ack.job_id,
            " (already enqueued)" if ack.deduplicated else "",
        )
        if ack.deduplicated:
            return _Enqueued.ALREADY
        if occurrence in track.missed_at_start:
            # No scheduler enqueued it in time: on a first deploy this runs a past occurrence
            # now, which "latest" (the default) means to do; say so where it can be seen.
            track.missed_at_start = frozenset()
            self._log.warning(
                "sepp: scheduler: occurrence %s of %r was due before this start and no scheduler"
                " had enqueued it: enqueued now, as missed=%r says%s",
                format_occurrence(occurrence),
                name,
                self._missed,
                " (missed='skip' waits for the next one)" if self._missed != "skip" else "",
            )
        return _Enqueued.NEW

    def _log_failure(self, what: str, exc: Exception, delay: float, failures: int = 0) -> None:
        count = f" (failure {failures})" if failures else ""
        if not isinstance(exc, SeppError):
            self._log.error(
                "sepp: scheduler: %s: unexpected %s: %s%s; retrying in %.2fs",
                what,
                type(exc).__name__,
                exc,
                count,
                delay,
                exc_info=exc,
            )
            return
        # A rejection or a wrong key needs a person; a transport error or a full queue usually
        # passes by itself.
        needs_a_person = isinstance(exc, (ValidationError, UnauthenticatedError)) or (
            isinstance(exc, JobRejectedError) and not exc.rejection.retryable
        )
        log = self._log.error if needs_a_person else self._log.warning
        log("sepp: scheduler: %s: %s%s; retrying in %.2fs", what, exc, count, delay)


def _backoff(failures: int) -> float:
    return backoff_delay(
        failures, initial=BACKOFF_INITIAL_S, multiplier=2.0, cap=BACKOFF_CAP_S, jitter=0.5
    )
