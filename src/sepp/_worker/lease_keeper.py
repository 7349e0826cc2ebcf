"""Lease keeping for a Worker's running jobs: extend before expiry, cancel on loss."""

from __future__ import annotations

import contextvars
import heapq
import itertools
import math
from collections.abc import Callable
from datetime import datetime

from .._model.errors import AttemptMismatchError, JobNotFoundError
from .._model.settlement import describe
from .._runtime.concurrency import Nursery, ServiceRuntime
from .._util.log import Log
from .client_calls import WorkerClient
from .held_job import HeldJob, Phase

# Extend once a third of what is left of the granted lease has passed (two thirds still
# remain), but wait at least the first floor; after a failed extend wait at least the second,
# so an outage costs a few retries per lease rather than hundreds.
EXTEND_MIN_WAIT_S = 0.001
EXTEND_RETRY_MIN_WAIT_S = 0.25
# Released jobs' heap entries are dropped in a rebuild once they outnumber the watched ones
# (plus this), which bounds the heap by the jobs held, not by the rate times a third of a lease.
REBUILD_SLACK = 64
# Watching a job converts its expiry with a wall-clock reading up to this old (plus the time
# since), rather than reading the wall clock for every job.
WALL_READING_MAX_AGE_S = 1.0


class LeaseKeeper:
    """Extends each watched job's lease from the *granted* expiry until the job settles;
    when the lease is lost (refused, or expired without a successful extend) it cancels the
    job's handler and marks it `lease_lost`, so it is neither acked nor nacked.

    Keeping is deferred: most jobs finish before their first extend is due, so `run()` (one
    task) starts a keeper task only for jobs still held by then. With `extend=False` it only
    cuts jobs off when their leases end (an extend made by the handler moves the cutoff).
    """

    def __init__(
        self,
        client: WorkerClient,
        *,
        lease_s: float,
        now_utc: Callable[[], datetime],
        log: Log,
        extend: bool = True,
        cc: ServiceRuntime,
    ) -> None:
        self._extend = extend
        self._client = client
        self._lease_s = lease_s
        self._now_utc = now_utc
        self._log = log
        # First extends by time: (due, key). A released job's entry stays until it comes up
        # or the heap is rebuilt, so releasing is O(1); the job itself is in `_watched` only,
        # so a settled job (and its payload) is not kept alive by its stale entry.
        self._due: list[tuple[float, int]] = []
        # Entries not in the heap yet: watching appends (cheaper than a push), and run()
        # pushes those still watched when it wakes. None is due before run() wakes by
        # itself (`_sleeping_until`): one due earlier wakes it.
        self._new: list[tuple[float, int]] = []
        self._watched: dict[int, tuple[float, HeldJob, contextvars.Context]] = {}
        self._keys = itertools.count()
        self._wall: datetime | None = None  # a wall-clock reading, taken at time _wall_at
        self._wall_at = 0.0
        # The last expiry converted with that reading, and the deadline it converted to.
        self._expiry: datetime | None = None
        self._expiry_at = 0.0
        # When run() wakes by itself: a job due earlier wakes it (-inf: awake, or not
        # waiting yet, so it looks at the heap anyway).
        self._sleeping_until = -math.inf
        self._cc = cc
        self._due_changed = cc.event()
        self._scope = cc.cancel_scope()

    def watch(
        self, held: HeldJob, now: float | None = None, context: contextvars.Context | None = None
    ) -> None:
        """Keep `held`'s lease from its first extend on, until `release(held)`, `now` being
        `current_time()`; call from the job's own task, or give the job's `context` as it was
        when its handler started (a runner's job, watched once its handler waits)."""
        if now is None:
            now = self._cc.current_time()
        expiry = held.job.ctx.lease_expires_at
        if self._wall is None or now - self._wall_at >= WALL_READING_MAX_AGE_S:
            self._wall, self._wall_at = self._now_utc(), now
            self._expiry = None
        if expiry != self._expiry:  # a reserve's jobs share theirs: converted once
            self._expiry = expiry
            self._expiry_at = self._wall_at + (expiry - self._wall).total_seconds()
        # What held.convert_lease would say (an earlier `now` caps it lower: never later).
        # Comparisons, not min() and max(): a call of those costs more than this whole line.
        deadline = self._expiry_at
        if deadline > now + self._lease_s:
            deadline = now + self._lease_s
        held.remember_lease(expiry, deadline)
        if deadline <= now:
            due = now
        elif self._extend:  # a third of what is left, at least the floor
            left_s = deadline - now
            wait_s = left_s / 3
            if wait_s < EXTEND_MIN_WAIT_S:
                wait_s = EXTEND_MIN_WAIT_S if EXTEND_MIN_WAIT_S < left_s else left_s
            due = now + wait_s
        else:
            due = deadline
        # The context as it is now, the job's (its process span is current, and no span the
        # handler opens later), so the keeper's extend spans nest under sepp.process like the
        # handler's.
        key = held.watch_key = next(self._keys)
        self._watched[key] = (due, held, contextvars.copy_context() if context is None else context)
        self._new.append((due, key))
        if due < self._sleeping_until:
            self._wake()

    def _watch_until(
        self, key: int, due: float, held: HeldJob, context: contextvars.Context
    ) -> None:
        self._watched[key] = (due, held, context)
        self._new.append((due, key))
        if due < self._sleeping_until:
            self._wake()

    def release(self, held: HeldJob) -> None:
        """The job is settling: no more extends (a keeper already running is cancelled)."""
        if held.keeper_scope is not None:
            held.keeper_scope.cancel()
        if self._watched.pop(held.watch_key, None) is None:
            return
        if len(self._due) + len(self._new) > 2 * len(self._watched) + REBUILD_SLACK:
            # No wake-up: the head can only move later, and the run finds that out when it
            # wakes for the earlier one.
            self._due = [(due, key) for key, (due, _, _) in self._watched.items()]
            heapq.heapify(self._due)
            self._new = []

    def stop(self) -> None:
        """End `run()`; keepers already started end with their jobs."""
        self._scope.cancel()

    def _wake(self) -> None:
        changed, self._due_changed = self._due_changed, self._cc.event()
        self._sleeping_until = -math.inf  # awake: it reads the heap before it sleeps again
        changed.set()

    async def run(self, nursery: Nursery) -> None:
        """Starts a job's keeper in `nursery` when its first extend falls due, if it is still
        held. Runs until `stop()`."""
        cc = self._cc
        with self._scope:
            while True:
                changed = self._due_changed
                if self._new:  # watched since it last looked: most have settled already
                    watched = self._watched
                    for entry in self._new:
                        if entry[1] in watched:
                            heapq.heappush(self._due, entry)
                    self._new = []
                if not self._due:
                    self._sleeping_until = math.inf
                    await changed.wait()
                    self._sleeping_until = -math.inf
                    continue
                due, key = self._due[0]
                if key not in self._watched:
                    heapq.heappop(self._due)  # released
                    continue
                if cc.current_time() < due:
                    self._sleeping_until = due
                    with cc.cancel_scope(deadline=due):
                        await changed.wait()
                    self._sleeping_until = -math.inf
                    continue
                heapq.heappop(self._due)
                _, held, context = self._watched.pop(key)
                if self._extend:
                    context.run(nursery.start_soon, self._keep_lease, held)
                else:
                    self._cut_off(key, held, context)

    def _cut_off(self, key: int, held: HeldJob, context: contextvars.Context) -> None:
        """Without auto-extend: the lease has ended, unless the handler extended it."""
        deadline = held.lease_deadline(self._now_utc, self._lease_s)
        if self._cc.current_time() < deadline:
            self._watch_until(key, deadline, held, context)
        else:
            self._lose_lease(held, "the lease ran out (auto_extend is off)")

    async def _keep_lease(self, held: HeldJob) -> None:
        """Extend the lease from the granted expiry until released or the lease is lost."""
        if held.phase is Phase.SETTLING:
            return  # released between being scheduled and starting
        with self._cc.cancel_scope() as held.keeper_scope:
            await self._extend_until_lost(held, first_extend_due=True)

    async def _extend_until_lost(self, held: HeldJob, first_extend_due: bool) -> None:
        ctx = held.job.ctx
        cc = self._cc
        last_failure: Exception | None = None
        while True:
            deadline = held.lease_deadline(self._now_utc, self._lease_s)
            left_s = deadline - cc.current_time()
            floor_s = EXTEND_MIN_WAIT_S if last_failure is None else EXTEND_RETRY_MIN_WAIT_S
            if first_extend_due:
                first_extend_due = False  # the scheduler already waited the first third
            else:
                await cc.sleep(max(left_s / 3, min(floor_s, left_s), 0.0))
            deadline = held.lease_deadline(self._now_utc, self._lease_s)
            if cc.current_time() >= deadline:
                why = "the lease expired" + (
                    f" (last extend failed: {describe(last_failure)})" if last_failure else ""
                )
                self._lose_lease(held, why)
                return
            # An extend still pending at the expiry could not have saved the lease.
            with cc.cancel_scope(deadline=deadline) as attempt:
                try:
                    await self._client.extend(ctx, self._lease_s)
                except (JobNotFoundError, AttemptMismatchError) as exc:
                    self._lose_lease(held, f"extend refused: {describe(exc)}")
                    return
                except Exception as exc:
                    last_failure = exc
                    self._log.warning(
                        "sepp: extending the lease of %s failed: %s; retrying while it lasts",
                        ctx,
                        describe(exc),
                    )
                else:
                    last_failure = None
            if attempt.cancelled_caught:
                self._lose_lease(held, "the lease expired while an extend was pending")
                return

    def _lose_lease(self, held: HeldJob, why: str) -> None:
        if held.phase is Phase.SETTLING or held.lease_lost is not None:
            return
        held.lease_lost = why
        if held.scope is not None:  # else its handler has not started: it never will
            held.scope.cancel()
        self._log.error(
            "sepp: lost the lease of %s: %s; cancelling its handler; it is neither acked nor"
            " nacked (the server redelivers it)",
            held.job.ctx,
            why,
        )
