"""What a global limit's concurrency permits and rate tokens share: per key, the jobs of this
process waiting for one (served in arrival order by one acquirer task that long-polls the
key's queue), genesis, and the enqueue-then-ack moves of `permits` (hand-over, refresh)."""

from __future__ import annotations

import collections
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from .._model.errors import AttemptMismatchError, JobNotFoundError, UnknownQueuesError
from .._model.rejection_reasons import UnknownQueue, describe_job_rejection
from .._model.settlement import describe
from .._model.types import EnqueueAck, EnqueueRequest, Job
from .._runtime.concurrency import TRIO, Event, Nursery, ServiceRuntime
from .._util.log import Log
from .admission import Admission
from .client_calls import LimitClient
from .errors import GlobalLimitError
from .limit import Limit
from .permits import Permit, marker_request, permit_request, queue_name
from .timing import Epochs, ServerClock

# A failed enqueue of a permit is tried this many times, this far apart, before the move is
# left to the permit's lease (it comes back, and the move is made then).
ENQUEUE_TRIES = 3
ENQUEUE_RETRY_S = 0.2
RESERVE_BACKOFF_S = 1.0
# Keys whose epoch of genesis is remembered after they go idle (the most recent ones).
GENESIS_MEMORY = 4096


@dataclass(frozen=True, slots=True)
class GlobalTuning:
    """How a global limit keeps time (docs/limits.md, "Epochs"): tests shorten the epochs."""

    epoch_s: float | None = None  # None: max(600 s, what the lease and window need)
    skew_s: float = 1.0  # how far processes' estimates of the server's clock may differ
    poll_s: float = 5.0  # the longest long poll for a permit (bounds how late close() ends)
    genesis_retry_s: float | None = None  # None: max(2 leases, 10 s)


class Waiter:
    __slots__ = ("admission", "error", "event", "started_at")

    def __init__(self, event: Event, started_at: float) -> None:
        self.event = event
        self.started_at = started_at
        self.admission: Admission | None = None
        self.error: BaseException | None = None


class KeyPool:
    """One key's permits as this process sees them."""

    __slots__ = (
        "acquiring",
        "genesis_epoch",
        "holds",
        "known_epoch",
        "known_slots",
        "last_genesis_at",
        "last_node_at",
        "last_poll_empty",
        "polled",
        "queue",
        "waiters",
    )

    def __init__(self, queue: str, now: float, genesis_epoch: int | None) -> None:
        self.queue = queue
        self.waiters: collections.deque[Waiter] = collections.deque()
        self.acquiring = False
        self.holds = 0
        self.polled = False
        self.last_poll_empty = False
        self.genesis_epoch = genesis_epoch
        self.last_genesis_at = -math.inf
        self.last_node_at = now  # quiet since it was made: genesis again only after a while
        self.known_epoch: int | None = None  # slots seen to exist in that epoch
        self.known_slots: set[int] = set()

    def idle(self) -> bool:
        return not self.waiters and not self.acquiring and not self.holds


class GlobalPool:
    """The permits of one limit and kind ("c" or "r") across its keys: `admit` waits for one;
    subclasses say what a reserved job becomes (`on_job`)."""

    kind = ""

    def __init__(
        self,
        limit: Limit,
        client: LimitClient,
        clock: ServerClock,
        epochs: Epochs,
        log: Log,
        tuning: GlobalTuning,
        *,
        size: int,
        worker_id: str | None = None,
        cc: ServiceRuntime = TRIO,
    ) -> None:
        assert limit.name is not None, "a global limit is named before it is used"
        self.limit = limit
        self._name = limit.name
        self._client = client
        self._clock = clock
        self.epochs = epochs
        self._log = log
        self._size = size
        self._poll_s = tuning.poll_s
        self._genesis_retry_s = (
            max(2 * limit.lease, 10.0) if tuning.genesis_retry_s is None else tuning.genesis_retry_s
        )
        self._worker_id = worker_id
        self._keys: dict[str, KeyPool] = {}
        self._genesis_done: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.nursery: Nursery | None = None
        self.error: GlobalLimitError | None = None
        self.closing = False
        self.pending = 0  # moves started in the background and not finished
        self.cc = cc
        self._pending_done = cc.parking_lot()

    # -- admitting ----------------------------------------------------------------------------

    async def admit(self, key: str, *, patience_s: float = math.inf) -> Admission | None:
        """Wait up to `patience_s` for one of `key`'s permits (arrival order in this process);
        None when it ran out (or the limit is closing). Raises GlobalLimitError if the server
        cannot hold the limit."""
        if self.error is not None:
            raise self.error
        if self.nursery is None or self.closing:
            if self.closing:
                return None
            raise RuntimeError("a global limit admits jobs only while its run() runs")
        cc = self.cc
        pool = self._pool(key)
        waiter = Waiter(cc.event(), cc.current_time())
        pool.waiters.append(waiter)
        if not pool.acquiring:
            pool.acquiring = True
            self.nursery.start_soon(self._acquire, key, pool, name=f"sepp limit {self._name}")
        granted = False
        try:
            with cc.move_on_after(patience_s):
                await waiter.event.wait()
            if waiter.error is not None:
                raise waiter.error
            if waiter.admission is not None:
                granted = True
            return waiter.admission
        finally:
            if not granted:
                try:
                    pool.waiters.remove(waiter)
                except ValueError:
                    pass
                if waiter.admission is not None:  # granted as the wait was cancelled
                    waiter.admission.release()
                self.drop_if_idle(key, pool)

    def take_waiter(self, pool: KeyPool) -> Waiter | None:
        return pool.waiters.popleft() if pool.waiters else None

    def grant(self, waiter: Waiter, admission: Admission) -> None:
        admission.waited_s = self.cc.current_time() - waiter.started_at
        waiter.admission = admission
        waiter.event.set()

    def fail(self, error: GlobalLimitError) -> None:
        """The server cannot hold this limit: every waiter, now and later, gets `error`."""
        if self.error is None:
            self._log.error("sepp: global limit %s: %s", self._name, error)
        self.error = error
        for pool in self._keys.values():
            while pool.waiters:
                waiter = pool.waiters.popleft()
                waiter.error = error
                waiter.event.set()

    def close(self) -> None:
        """Stop admitting: waiters get None; background moves still finish."""
        self.closing = True
        for pool in self._keys.values():
            while pool.waiters:
                pool.waiters.popleft().event.set()

    # -- the acquirer -------------------------------------------------------------------------

    async def _acquire(self, key: str, pool: KeyPool) -> None:
        try:
            while pool.waiters and not self.closing and self.error is None:
                await self._poll_once(key, pool)
        finally:
            pool.acquiring = False
            self.drop_if_idle(key, pool)

    async def _poll_once(self, key: str, pool: KeyPool) -> None:
        cc = self.cc
        now_s = self._clock.now()
        epoch = self.epochs.of(now_s)
        if self._genesis_due(pool, now_s, epoch):
            await self._genesis(pool, epoch)
            if not pool.waiters or self.error is not None:
                return
        wait_s = self._poll_wait(pool, now_s, epoch) if pool.polled else 0.0
        want = max(1, min(len(pool.waiters), self._size))
        sent = cc.current_time()
        try:
            jobs = await self._client.reserve(
                [pool.queue],
                lease_duration=self.reserve_lease_s,
                wait_timeout=wait_s,
                max_jobs=want,
                worker_id=self._worker_id,
            )
        except UnknownQueuesError as exc:
            self.fail(GlobalLimitError(_strict_message(pool.queue, describe(exc))))
            return
        except Exception as exc:  # the acquirer outlives a failed poll: its waiters wait on
            self._log.warning(
                "sepp: global limit %s: reserving a permit failed: %s", self._name, describe(exc)
            )
            await cc.sleep(RESERVE_BACKOFF_S)
            return
        pool.polled = True
        pool.last_poll_empty = not jobs
        if jobs:
            pool.last_node_at = cc.current_time()
        for job in jobs or ():
            await self.on_job(key, pool, job, sent)

    @property
    def reserve_lease_s(self) -> float:
        raise NotImplementedError

    async def on_job(self, key: str, pool: KeyPool, job: Job, sent: float) -> None:
        raise NotImplementedError

    def _genesis_due(self, pool: KeyPool, now_s: float, epoch: int) -> bool:
        if not self.epochs.genesis_open(now_s):
            return False
        if pool.genesis_epoch != epoch and pool.last_poll_empty:
            return True  # nothing to be had: maybe nothing exists yet this epoch
        quiet_since = max(pool.last_node_at, pool.last_genesis_at)
        return self.cc.current_time() - quiet_since >= self._genesis_retry_s

    def _poll_wait(self, pool: KeyPool, now_s: float, epoch: int) -> float:
        """Long-poll until a permit comes, or until genesis should be tried next."""
        now = self.cc.current_time()
        next_check = max(pool.last_node_at, pool.last_genesis_at) + self._genesis_retry_s
        if pool.genesis_epoch != epoch:
            window = self._clock.local_deadline(self.epochs.next_genesis_window(now_s))
            next_check = min(next_check, window)
        return min(self._poll_s, max(next_check - now, 0.05))

    async def _genesis(self, pool: KeyPool, epoch: int) -> None:
        """Make the epoch's first permit of every slot that has none (a hit: it has)."""
        requests = [permit_request(pool.queue, epoch, slot, 0) for slot in range(self._size)]
        pool.last_genesis_at = self.cc.current_time()
        try:
            results = await self._client.enqueue_batch(requests)
        except Exception as exc:
            self._log.warning(
                "sepp: global limit %s: making permits failed: %s", self._name, describe(exc)
            )
            return
        created: set[int] = set()
        exist: set[int] = set()
        for slot, result in enumerate(results):
            if isinstance(result, EnqueueAck):
                exist.add(slot)
                if not result.deduplicated:
                    created.add(slot)
            elif isinstance(result, UnknownQueue):
                self.fail(GlobalLimitError(_strict_message(pool.queue, "UnknownQueue")))
                return
            else:
                self._log.warning(
                    "sepp: global limit %s: a permit was refused: %s",
                    self._name,
                    describe_job_rejection(result),
                )
        if pool.known_epoch == epoch and created & pool.known_slots:
            self._log.error(
                "sepp: global limit %s: permits made this epoch were made again: the server's"
                " dedup window is shorter than the limit's epoch (%gs), and the limit can be"
                " exceeded (raise storage.dedup_window_ms)",
                self._name,
                self.epochs.length_s,
            )
        if pool.known_epoch != epoch:
            pool.known_epoch, pool.known_slots = epoch, set()
        pool.known_slots |= exist
        pool.genesis_epoch = epoch
        if created:
            self._log.info(
                "sepp: global limit %s: made %d permit(s) for epoch %d",
                self._name,
                len(created),
                epoch,
            )

    # -- moves --------------------------------------------------------------------------------

    async def enqueue(self, request: EnqueueRequest) -> EnqueueAck | None:
        """One permit or marker enqueued (retried a little); None if it could not be."""
        for attempt in range(ENQUEUE_TRIES):
            try:
                (result,) = await self._client.enqueue_batch([request])
            except Exception as exc:
                why = describe(exc)
            else:
                if isinstance(result, EnqueueAck):
                    return result
                if isinstance(result, UnknownQueue):
                    self.fail(GlobalLimitError(_strict_message(request.queue, "UnknownQueue")))
                    return None
                why = describe_job_rejection(result)
            if attempt + 1 < ENQUEUE_TRIES:
                await self.cc.sleep(ENQUEUE_RETRY_S)
        self._log.warning(
            "sepp: global limit %s: enqueueing a permit failed: %s; its lease returns it",
            self._name,
            why,
        )
        return None

    async def ack(self, job: Job) -> None:
        try:
            await self._client.ack(job.ctx)
        except (JobNotFoundError, AttemptMismatchError):
            pass  # its lease ran out: whoever has it now moves it on
        except Exception as exc:
            self._log.warning(
                "sepp: global limit %s: acking a permit failed: %s; its lease returns it",
                self._name,
                describe(exc),
            )

    async def succeed(self, job: Job, request: EnqueueRequest) -> bool | None:
        """Enqueue `request` (the successor), then ack `job`: True if the successor is new,
        False if it existed (so `job` was stale), None if it could not be enqueued (`job` is
        left to its lease)."""
        result = await self.enqueue(request)
        if result is None:
            return None
        await self.ack(job)
        return not result.deduplicated

    async def hand_over(self, pool: KeyPool, permit: Permit, epoch: int, *, claims: bool) -> None:
        """Move an older epoch's permit to `epoch`'s first of its slot, or collapse it onto
        that one. With `claims` (concurrency), a hit on a permit whose holder lost it is
        checked for that holder's claim: then the slot continues as (epoch, slot, 1)."""
        first = await self.enqueue(permit_request(pool.queue, epoch, permit.slot, 0))
        if first is None:
            return
        if first.deduplicated and claims and permit.attempt >= 2:
            marker = await self.enqueue(
                marker_request(pool.queue, permit.job.id, epoch, self.marker_time(epoch))
            )
            if marker is None:
                return  # unknown: left to its lease, decided when it comes back
            if marker.deduplicated:
                await self.succeed(permit.job, permit_request(pool.queue, epoch, permit.slot, 1))
                return
        await self.ack(permit.job)

    def claim_time(self, epoch: int) -> datetime:
        """When a claim for `epoch` comes due: after `epoch`, as an old permit."""
        epochs = self.epochs
        return self._clock.to_datetime(epochs.start(epoch + 1) + epochs.genesis_delay_s)

    def marker_time(self, epoch: int) -> datetime:
        epochs = self.epochs
        return self._clock.to_datetime(epochs.start(epoch + 2) + epochs.genesis_delay_s)

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Run a move in the background; run() waits for it before it ends."""
        assert self.nursery is not None
        self.pending += 1
        self.nursery.start_soon(self._counted, fn, *args)

    async def _counted(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        try:
            await fn(*args)
        finally:
            self.pending -= 1
            if not self.pending and self._pending_done:
                self._pending_done.unpark_all()

    async def wait_for_pending(self) -> None:
        while self.pending:
            await self._pending_done.park()

    # -- keys ---------------------------------------------------------------------------------

    def _pool(self, key: str) -> KeyPool:
        pool = self._keys.get(key)
        if pool is None:
            pool = self._keys[key] = KeyPool(
                queue_name(self.kind, self._name, key),
                self.cc.current_time(),
                self._genesis_done.get(key),
            )
        return pool

    def drop_if_idle(self, key: str, pool: KeyPool) -> None:
        if pool.idle() and self._keys.get(key) is pool:
            del self._keys[key]
            if pool.genesis_epoch is not None:
                # Remembered for a while, so that a key used now and then does not make its
                # permits again each time (a string of hits, but N enqueues).
                done = self._genesis_done
                done[key] = pool.genesis_epoch
                done.move_to_end(key)
                if len(done) > GENESIS_MEMORY:
                    done.popitem(last=False)

    def counts(self) -> dict[str, tuple[int, int]]:
        """Per key held here: (holding, waiting)."""
        return {key: (pool.holds, len(pool.waiters)) for key, pool in self._keys.items()}

    def counts_for(self, key: str) -> tuple[int, int]:
        pool = self._keys.get(key)
        return (0, 0) if pool is None else (pool.holds, len(pool.waiters))

    @property
    def keys_held(self) -> int:
        return len(self._keys)


def _strict_message(queue: str, why: str) -> str:
    return (
        f"the server refuses the limit's queue {queue!r} ({why}): it is in strict mode and does"
        " not declare it; declare it ([[queues]] name = ...) or turn strict_queues off"
    )
