"""Results that come back: a client's own reply queue, read by one listener for every result
the client awaits, and the beacon and directory that let any client clear the reply queue of
one that went away. Written once over the client's calls (a `Client`'s, or a `SyncClient`'s
as coroutines that never suspend) and a `Runtime`.

How it holds together, with nothing beside the server:

- A client that awaits its first result makes its reply queue (`sepp.replies.<random>`) by
  enqueueing a *beacon* job there, reserves that job and keeps its lease (an extend every
  `EXTEND_S`): while the client lives, its beacon is in flight. It also puts an *entry* in the
  shared directory queue `sepp.replies`, scheduled `CHECK_S` ahead.
- Its listener long-polls its queue and the directory in one Reserve: replies (job type
  `sepp.result`) go to the waiter they name and are acked; the beacon comes back to it if its
  lease ever lapsed; a directory entry that fell due is checked.
- A check probes the entry's beacon with an extend of an attempt no job ever has: the server
  answers FAILED_PRECONDITION while the beacon is in flight (its client is alive: the entry is
  put back, `CHECK_S` ahead) and NOT_FOUND once it is not (the client closed, acking it, or
  died and its lease ran out): the checker then empties that queue, and checks once more
  `CHECK_S` later (for a reply in flight meanwhile) before dropping the entry.
- A worker sends a result only to a client whose beacon it finds in flight, and only before the
  time the awaiting handle gives up (`sepp.reply.until`); replies nobody waits for any more
  (a handle dropped or forgotten, a caller that gave up) are acked and dropped on arrival.

So the client holds a result only for a handle that is still alive, and the server holds
replies for a client that went away for at most about two `CHECK_S`, once any other client
awaiting results runs.
"""

from __future__ import annotations

import math
import threading
import uuid
import weakref
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .._model import pipelines as p
from .._model.backoff import backoff_delay
from .._model.errors import (
    AttemptMismatchError,
    JobNotFoundError,
    JobRejectedError,
    ResultTimeoutError,
    ResultUnavailableError,
    SeppError,
    UnknownQueuesError,
)
from .._model.types import (
    EnqueueRequest,
    Job,
    JobContext,
    Payload,
    reserved_job,
)
from .._model.validate import UINT32_MAX
from .._runtime.protocol import EventLike, Runtime
from .._runtime.wall_clock import utc_now
from .._util.log import Log
from .calls import JobsClient

DIRECTORY = "sepp.replies"  # the queue of every reply queue's entry
QUEUE_PREFIX = "sepp.replies."
BEACON_TYPE = "sepp.reply.beacon"
ENTRY_TYPE = "sepp.reply.queue"

LEASE_S = 60.0  # the beacon's (and every reserved reply's) lease
EXTEND_S = 20.0  # how often the beacon's lease is extended
CHECK_S = 300.0  # how far ahead a directory entry falls due
WAIT_S = 20.0  # the longest long-poll (an extend comes due at most this far apart)
ERROR_BACKOFF_S = 1.0  # the first wait after the listener's calls failed, doubling up to:
MAX_ERROR_BACKOFF_S = 10.0
BEACON_ATTEMPTS = 100  # a lapse costs the beacon an attempt (the server clamps to its ceiling)
REGISTER_WAIT_S = 10.0  # to reserve the beacon just enqueued
CLOSE_TIMEOUT_S = 2.0  # to release the beacon as the client closes


@dataclass(frozen=True, slots=True)
class Reply:
    """What came back for one waiter: the result's payload, or the failure."""

    payload: Payload | None
    failure: p.Failure | None = None


class Waiter:
    """One awaited result: set once, by the listener (or by the client closing)."""

    __slots__ = ("__weakref__", "deadline", "event", "outcome", "reply_id")

    def __init__(self, reply_id: str, event: EventLike, deadline: float) -> None:
        self.reply_id = reply_id
        self.event = event
        self.deadline = deadline  # on the runtime's clock: the handle's result_ttl ends here
        self.outcome: Reply | ResultUnavailableError | None = None

    def settle(self, outcome: Reply | ResultUnavailableError) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.event.set()


async def probe_beacon(calls: JobsClient, beacon_id: str) -> bool | None:
    """Whether the client owning beacon `beacon_id` is alive (its beacon in flight): an extend
    for an attempt no job ever has is refused FAILED_PRECONDITION then, NOT_FOUND once it is
    not, and changes nothing either way. None: the server could not tell (a failed call)."""
    probe = reserved_job(
        None,
        "",
        id=beacon_id,
        queue=DIRECTORY,
        job_type=BEACON_TYPE,
        attempt=UINT32_MAX,
        max_attempts=UINT32_MAX,
        priority=0,
        custom={},
        enqueued_at=utc_now(),
        scheduled_at=None,
        trace_context=None,
        lease_expires_at=utc_now(),
        worker_id=None,
        client=None,
    ).ctx
    try:
        await calls.extend(probe, 0.001)
    except AttemptMismatchError:
        return True
    except JobNotFoundError:
        return False
    except SeppError:
        return None
    return True  # (an attempt of UINT32_MAX in flight: alive, if improbable)


class Replies:
    """A client's reply queue and its listener (see the module's docstring): `expect` makes a
    waiter, `address` where its result goes, `wait` waits for it; `register`, `run` and
    `close` are the listener's life, which its client drives."""

    def __init__(self, rt: Runtime, log: Log, *, queue: str | None = None) -> None:
        self._rt = rt
        self._log = log
        self.queue = queue or f"{QUEUE_PREFIX}{uuid.uuid4().hex}"
        self._waiters: weakref.WeakValueDictionary[str, Waiter] = weakref.WeakValueDictionary()
        # A SyncClient's callers and its listener thread share the waiters (no GIL on 3.13t).
        self._waiters_lock = threading.Lock()
        self._beacon: JobContext | None = None
        self._entry_generation = 0
        self._extend_at = math.inf
        self._stopping = False
        self.closed: ResultUnavailableError | None = None
        # Set once registered (or failed to): the callers that asked meanwhile wait for it.
        self.ready = rt.event()
        self.dropped = 0  # replies that came when nobody waited for them any more

    def __repr__(self) -> str:
        return f"<sepp replies {self.queue}: {len(self._waiters)} waiting>"

    # -- waiters --------------------------------------------------------------------------------

    def expect(self, ttl_s: float) -> Waiter:
        """A new waiter, for a result due within `ttl_s`."""
        if self.closed is not None:
            raise self.closed
        waiter = Waiter(uuid.uuid4().hex, self._rt.event(), self._rt.current_time() + ttl_s)
        with self._waiters_lock:
            self._waiters[waiter.reply_id] = waiter
        return waiter

    def address(self, waiter: Waiter, ttl_s: float) -> p.ReplyAddress:
        """Where `waiter`'s result goes (the beacon exists: `register` has run)."""
        assert self._beacon is not None
        until = p.epoch_ms(utc_now() + timedelta(seconds=ttl_s))
        return p.ReplyAddress(self.queue, waiter.reply_id, self._beacon.id, until)

    def forget(self, waiter: Waiter) -> None:
        """Nobody waits for `waiter` any more: its result is dropped when it comes."""
        with self._waiters_lock:
            self._waiters.pop(waiter.reply_id, None)

    async def wait(self, waiter: Waiter, timeout_s: float | None) -> Reply:
        """`waiter`'s reply, within `timeout_s` (None: until its deadline). Raises
        ResultUnavailableError (no reply will come) or ResultTimeoutError (none yet)."""
        if waiter.outcome is None:
            until = waiter.deadline
            if timeout_s is not None:
                until = min(until, self._rt.current_time() + timeout_s)
            await self._rt.wait_event(waiter.event, until)
        outcome = waiter.outcome
        if isinstance(outcome, Reply):
            return outcome
        if outcome is not None:
            raise outcome
        if self._rt.current_time() >= waiter.deadline:
            self.forget(waiter)
            raise ResultUnavailableError(
                "the result_ttl of this handle has passed: no worker sends its result any more"
            )
        raise ResultTimeoutError(f"no result within {timeout_s:g}s (it may still come)")

    def _fail_waiting(self, error: ResultUnavailableError) -> None:
        with self._waiters_lock:
            waiting = list(self._waiters.values())
            self._waiters.clear()
        for waiter in waiting:
            waiter.settle(error)

    def _fail_all(self, error: ResultUnavailableError) -> None:
        self.closed = error
        self._fail_waiting(error)

    # -- the listener's life --------------------------------------------------------------------

    async def register(self, calls: JobsClient) -> None:
        """Make the reply queue: its beacon (reserved and held) and its directory entry.
        ResultUnavailableError if the server refuses them (strict_queues)."""
        try:
            ack = await calls.enqueue(
                EnqueueRequest(self.queue, BEACON_TYPE, max_attempts=BEACON_ATTEMPTS)
            )
            deadline = self._rt.current_time() + REGISTER_WAIT_S
            while self._beacon is None:
                if self._rt.current_time() >= deadline:
                    raise ResultUnavailableError(
                        f"the beacon of reply queue {self.queue} did not come back within"
                        f" {REGISTER_WAIT_S:g}s"
                    )
                jobs = await calls.reserve(
                    self.queue, lease_duration=LEASE_S, wait_timeout=1.0, max_jobs=16
                )
                for job in jobs or ():
                    if job.ctx.id == ack.job_id:
                        self._beacon = job.ctx
                    else:
                        await self._take(calls, job)
            self._extend_at = self._rt.current_time() + EXTEND_S
            await self._put_entry(calls, self.queue, self._beacon.id, final=False)
        except (JobRejectedError, UnknownQueuesError) as exc:
            raise ResultUnavailableError(
                f"the server refused reply queue {self.queue} ({exc}): results need a server"
                " that accepts undeclared queues (strict_queues off)"
            ) from exc

    async def run(self, calls: JobsClient) -> None:
        """Listen until `stop()` (or cancelled): one Reserve of the reply queue and the
        directory at a time, the beacon's lease kept between them. A failure of its own
        (never the client's calls, which it retries) ends every wait rather than the task
        group the listener runs in."""
        try:
            await self._listen(calls)
        except Exception as exc:
            self._log.error("sepp: the reply listener of %s failed", self.queue, exc_info=exc)
            self._fail_all(ResultUnavailableError(f"the reply listener failed: {exc!r}"))

    async def _listen(self, calls: JobsClient) -> None:
        failures = 0
        while not self._stopping:
            wait_s = max(1.0, min(WAIT_S, self._extend_at - self._rt.current_time()))
            try:
                jobs = await calls.reserve(
                    [self.queue, DIRECTORY],
                    lease_duration=LEASE_S,
                    wait_timeout=wait_s,
                    max_jobs=256,
                )
                for job in jobs or ():
                    await self._take(calls, job)
                if self._rt.current_time() >= self._extend_at:
                    await self._keep_beacon(calls)
                failures = 0
            except UnknownQueuesError as exc:
                self._fail_all(ResultUnavailableError(f"reply queue {self.queue}: {exc}"))
                return
            except SeppError as exc:
                if self.stopping:  # the client closed under the call
                    return
                failures += 1
                delay_s = backoff_delay(
                    failures, initial=ERROR_BACKOFF_S, multiplier=2.0, cap=MAX_ERROR_BACKOFF_S
                )
                self._log.warning(
                    "sepp: the reply listener of %s failed (%s); retrying in %gs",
                    self.queue,
                    exc,
                    delay_s,
                )
                await self._rt.sleep(delay_s)

    def stop(self) -> None:
        """The listener ends at its next turn (the client is closing)."""
        self._stopping = True

    @property
    def stopping(self) -> bool:
        return self._stopping

    async def close(self, calls: JobsClient) -> None:
        """The client closes: release the beacon, so a check clears what is left of the queue
        soon, and end every wait (ResultUnavailableError)."""
        self.stop()
        beacon, self._beacon = self._beacon, None
        self._fail_all(ResultUnavailableError(f"the client awaiting it closed ({self.queue})"))
        if beacon is not None:
            try:
                await calls.ack(beacon, timeout=CLOSE_TIMEOUT_S)
            except SeppError:
                pass  # its lease runs out instead

    # -- what a reserve brings -------------------------------------------------------------------

    async def _take(self, calls: JobsClient, job: Job) -> None:
        ctx = job.ctx
        if ctx.queue == DIRECTORY:
            await self._check(calls, job)
            return
        if ctx.job_type == BEACON_TYPE and self._beacon is not None and ctx.id == self._beacon.id:
            self._beacon = ctx  # its lease had lapsed: held again, on its new attempt
            return
        if ctx.job_type == p.RESULT_JOB_TYPE:
            self._deliver(job)
        await self._ack(calls, ctx)

    def _deliver(self, job: Job) -> None:
        custom = job.ctx.custom
        reply_id = custom.get(p.REPLY_ID)
        waiter = None
        if isinstance(reply_id, str):
            with self._waiters_lock:
                waiter = self._waiters.pop(reply_id, None)
        if waiter is None:
            self.dropped += 1  # nobody waits for it any more (a handle dropped or forgotten)
            return
        if custom.get(p.RESULT_STATUS) == p.FAILED:
            waiter.settle(Reply(None, p.read_failure(custom)))
        else:
            waiter.settle(Reply(job.payload))

    async def _ack(self, calls: JobsClient, ctx: JobContext) -> None:
        try:
            await calls.ack(ctx)
        except SeppError as exc:  # it comes back when its lease runs out, and is dropped then
            self._log.debug("sepp: could not ack %s in the reply listener: %s", ctx, exc)

    async def _keep_beacon(self, calls: JobsClient) -> None:
        beacon = self._beacon
        if beacon is None:
            return
        try:
            await calls.extend(beacon, LEASE_S)
        except (JobNotFoundError, AttemptMismatchError):
            # Lost: its lease lapsed (this client stalled for longer than LEASE_S) and a check
            # took this client for gone and cleared its queue, or will. The results awaited
            # now may have been dropped with it; a new queue takes the ones awaited from now.
            lost = self.queue
            self._beacon = None
            self.queue = f"{QUEUE_PREFIX}{uuid.uuid4().hex}"
            self._log.warning(
                "sepp: reply queue %s lost its beacon (this client stalled for over %gs?); the"
                " results awaited there are given up, later ones come to %s",
                lost,
                LEASE_S,
                self.queue,
            )
            self._fail_waiting(
                ResultUnavailableError(f"reply queue {lost} was lost: this client stalled")
            )
            await self.register(calls)
        self._extend_at = self._rt.current_time() + EXTEND_S

    # -- the directory --------------------------------------------------------------------------

    async def _put_entry(
        self, calls: JobsClient, queue: str, beacon: str, *, final: bool, generation: int = 0
    ) -> None:
        entry = {"queue": queue, "beacon": beacon, "final": final, "generation": generation}
        request = EnqueueRequest(
            DIRECTORY,
            ENTRY_TYPE,
            payload=Payload.json(entry),
            idempotency_key=f"sepp.replies/{queue}/{beacon}/{generation}",
            scheduled_at=utc_now() + timedelta(seconds=CHECK_S),
        )
        await calls.enqueue(request)

    async def _check(self, calls: JobsClient, job: Job) -> None:
        """A directory entry fell due: the reply queue it names is kept, or cleared."""
        try:
            entry: Any = job.payload.json() if job.payload is not None else None
            queue, beacon = str(entry["queue"]), str(entry["beacon"])
            final, generation = bool(entry["final"]), int(entry["generation"])
        except (TypeError, ValueError, KeyError):
            await self._ack(calls, job.ctx)  # not an entry of ours
            return
        alive = True if queue == self.queue else await probe_beacon(calls, beacon)
        if alive is False:
            cleared = await self._clear(calls, queue)
            if cleared:
                self._log.info(
                    "sepp: cleared %d reply job(s) of %s, whose client went away", cleared, queue
                )
        if alive is not False or not final:
            await self._put_entry(
                calls, queue, beacon, final=alive is False, generation=generation + 1
            )
        await self._ack(calls, job.ctx)

    async def _clear(self, calls: JobsClient, queue: str) -> int:
        cleared = 0
        while jobs := await calls.reserve(
            queue, lease_duration=LEASE_S, wait_timeout=0.0, max_jobs=256
        ):
            for job in jobs:
                await self._ack(calls, job.ctx)
            cleared += len(jobs)
        return cleared
