"""The memory server's semantic core: queues, jobs, leases, schedules, idempotency keys and
dead letters, as sepp 0.1.1 keeps them. No I/O and no clock: every operation is given the
time (`now_ms`, milliseconds on the server's wall clock), and `sweep(now_ms)` applies what
has fallen due by then (scheduled jobs become ready, expired leases redeliver or dead-letter,
idempotency keys lapse, dead letters age out). Callers sweep before each operation, so every
operation sees the state the real server's timer sweep would have left by then.

Jobs of one queue are delivered by priority (9 first), then by enqueue time; a job retried
or redelivered keeps its place. Where the real server breaks a tie of equal priority and
enqueue millisecond by its random job ids, this core takes the enqueue order."""

from __future__ import annotations

import bisect
import heapq
import itertools
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from . import encoding

READY, SCHEDULED, IN_FLIGHT = 0, 1, 2

# DeadLetterCause values.
ATTEMPTS_EXHAUSTED, REJECTED, LEASE_EXPIRED = 1, 2, 3


class StatusError(Exception):
    """An operation refused with a gRPC status (`code`, `message`)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


NOT_FOUND, FAILED_PRECONDITION = 5, 9


def _job_not_found() -> StatusError:
    return StatusError(NOT_FOUND, "job not found")


def _attempt_mismatch() -> StatusError:
    return StatusError(FAILED_PRECONDITION, "attempt mismatch")


class StoredJob:
    """One live job (ready, scheduled or in flight)."""

    __slots__ = (
        "attempt",
        "enqueued_at_ms",
        "id",
        "lease_expires_ms",
        "lease_token",
        "max_attempts",
        "priority",
        "queue",
        "seq",
        "state",
        "static",
    )

    def __init__(
        self,
        job_id: str,
        queue: str,
        static: bytes,
        priority: int,
        max_attempts: int,
        enqueued_at_ms: int,
        seq: int,
    ) -> None:
        self.id = job_id
        self.queue = queue
        self.static = static  # the Job message's fields but attempt and lease expiry
        self.priority = priority
        self.max_attempts = max_attempts
        self.enqueued_at_ms = enqueued_at_ms
        self.seq = seq  # enqueue order: the tie-break after priority and enqueue time
        self.attempt = 1
        self.state = READY
        self.lease_expires_ms = 0
        self.lease_token = 0  # which lease-timer entry is this job's current one

    def message(self) -> bytes:
        return encoding.job_message(self.static, self.attempt, self.lease_expires_ms)


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job that passed every check, as the server prepares it for the commit."""

    queue: str
    request: Any  # the EnqueueRequest message
    priority: int
    max_attempts: int
    scheduled_at_ms: int | None
    idempotency_key: str | None
    dedup_window_ms: int
    max_queue_depth: int | None


@dataclass(frozen=True, slots=True)
class Accepted:
    job_id: str
    deduplicated: bool


@dataclass(frozen=True, slots=True)
class QueueFull:
    queue: str
    limit: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A dead letter as DrainDeadLetters returns it."""

    queue: str
    job: bytes  # the Job snapshot message
    cause: int
    failed_at_ms: int
    final_attempt: int
    last_reason: str | None


@dataclass(frozen=True, slots=True)
class QueueDepths:
    """A queue's jobs by state, and its dead letters: what the real server's admin UI shows."""

    ready: int = 0
    scheduled: int = 0
    in_flight: int = 0
    dead_letters: int = 0


class QueueState:
    """Every queue's jobs. `dead_letter_retention_ms` 0 keeps no dead letters (as the server:
    a dead-lettered job is then gone)."""

    def __init__(self, *, dead_letter_retention_ms: int = 0) -> None:
        self._retention_ms = dead_letter_retention_ms
        self._jobs: dict[str, StoredJob] = {}
        self._ready: dict[str, list[tuple[int, int, int, StoredJob]]] = {}
        self._scheduled: list[tuple[int, int, StoredJob]] = []
        self._leases: list[tuple[int, int, int, StoredJob]] = []  # (expiry, seq, token, job)
        self._live: dict[str, int] = {}  # ready + scheduled + in flight, per queue
        self._dedup: dict[tuple[str, str], tuple[int, str]] = {}  # → (deadline, job id)
        self._dedup_expiry: list[tuple[int, str, str]] = []
        # Dead letters oldest first, by (failed at, the queue as the server's key sorts it,
        # order of arrival).
        self._dead_keys: list[tuple[int, bytes, int]] = []
        self._dead: dict[tuple[int, bytes, int], DeadLetter] = {}
        self._seq = itertools.count()
        self._new_ready: set[str] = set()

    # -- time -----------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        """The earliest time (ms) at which `sweep` has something to do, if any."""
        candidates = []
        if self._scheduled:
            candidates.append(self._scheduled[0][0])
        if self._leases:
            candidates.append(self._leases[0][0])
        if self._dedup_expiry:
            candidates.append(self._dedup_expiry[0][0])
        if self._retention_ms and self._dead_keys:
            candidates.append(self._dead_keys[0][0] + self._retention_ms)
        return min(candidates) if candidates else None

    def sweep(self, now_ms: int) -> None:
        """Apply everything due by `now_ms`, in the server's order: promotions, lease
        expiries, lapsed idempotency keys, expired dead letters."""
        scheduled = self._scheduled
        while scheduled and scheduled[0][0] <= now_ms:
            _, _, job = heapq.heappop(scheduled)
            self._make_ready(job)
        leases = self._leases
        while leases and leases[0][0] <= now_ms:
            _, _, token, job = heapq.heappop(leases)
            if job.state != IN_FLIGHT or job.lease_token != token:
                continue  # settled or extended since
            if job.attempt >= job.max_attempts:
                self._dead_letter(job, LEASE_EXPIRED, None, now_ms)
            else:
                job.attempt += 1
                self._make_ready(job)
        expiry = self._dedup_expiry
        while expiry and expiry[0][0] <= now_ms:
            _, queue, key = heapq.heappop(expiry)
            record = self._dedup.get((queue, key))
            if record is not None and record[0] <= now_ms:
                del self._dedup[(queue, key)]
        if self._retention_ms:
            cutoff = now_ms - self._retention_ms
            dead = self._dead_keys
            while dead and dead[0][0] <= cutoff:
                del self._dead[dead.pop(0)]

    def take_new_ready(self) -> set[str]:
        """The queues that got ready jobs since the last call (whose long polls to wake)."""
        woken, self._new_ready = self._new_ready, set()
        return woken

    # -- enqueue --------------------------------------------------------------------------

    def enqueue(self, jobs: Sequence[NewJob], now_ms: int) -> list[Accepted | QueueFull]:
        """Best effort: each job is a dedup hit, a new job, or refused by its queue's depth
        (jobs taken earlier in the batch count)."""
        results: list[Accepted | QueueFull] = []
        for job in jobs:
            hit = self._dedup_hit(job, now_ms)
            if hit is not None:
                results.append(Accepted(hit, True))
                continue
            cap = job.max_queue_depth
            if cap is not None and self._live.get(job.queue, 0) >= cap:
                results.append(QueueFull(job.queue, cap))
                continue
            results.append(Accepted(self._insert(job, now_ms), False))
        return results

    def enqueue_atomic(
        self, jobs: Sequence[NewJob], now_ms: int
    ) -> list[Accepted] | list[tuple[int, QueueFull]]:
        """All or nothing: the batch's count per queue (dedup hits included, as the server
        counts them) must fit each queue's depth, or every job of a full queue is reported."""
        wanted: dict[str, tuple[int, int | None]] = {}
        for job in jobs:
            count, cap = wanted.get(job.queue, (0, job.max_queue_depth))
            wanted[job.queue] = (count + 1, cap)
        full = {
            queue: cap
            for queue, (count, cap) in wanted.items()
            if cap is not None and self._live.get(queue, 0) + count > cap
        }
        if full:
            return [
                (index, QueueFull(job.queue, full[job.queue]))
                for index, job in enumerate(jobs)
                if job.queue in full
            ]
        accepted: list[Accepted] = []
        for job in jobs:
            hit = self._dedup_hit(job, now_ms)
            accepted.append(
                Accepted(hit, True)
                if hit is not None
                else Accepted(self._insert(job, now_ms), False)
            )
        return accepted

    def _dedup_hit(self, job: NewJob, now_ms: int) -> str | None:
        if job.idempotency_key is None:
            return None
        record = self._dedup.get((job.queue, job.idempotency_key))
        if record is not None and now_ms < record[0]:
            return record[1]
        return None

    def _insert(self, new: NewJob, now_ms: int) -> str:
        job_id = str(uuid.uuid4())
        queue = new.queue
        static = encoding.static_job_fields(
            job_id=job_id,
            queue=queue,
            request=new.request,
            priority=new.priority,
            max_attempts=new.max_attempts,
            enqueued_at_ms=now_ms,
        )
        job = StoredJob(
            job_id, queue, static, new.priority, new.max_attempts, now_ms, next(self._seq)
        )
        self._jobs[job_id] = job
        self._live[queue] = self._live.get(queue, 0) + 1
        at = new.scheduled_at_ms
        if at is not None and at > now_ms:
            self._schedule(job, at)
        else:
            self._make_ready(job)
        if new.idempotency_key is not None:
            deadline = now_ms + new.dedup_window_ms
            self._dedup[(queue, new.idempotency_key)] = (deadline, job_id)
            heapq.heappush(self._dedup_expiry, (deadline, queue, new.idempotency_key))
        return job_id

    def _make_ready(self, job: StoredJob) -> None:
        job.state = READY
        heap = self._ready.get(job.queue)
        if heap is None:
            heap = self._ready[job.queue] = []
        heapq.heappush(heap, (9 - job.priority, job.enqueued_at_ms, job.seq, job))
        self._new_ready.add(job.queue)

    def _schedule(self, job: StoredJob, at_ms: int) -> None:
        job.state = SCHEDULED
        heapq.heappush(self._scheduled, (at_ms, next(self._seq), job))

    # -- reserve and the lease calls --------------------------------------------------------

    def reserve(
        self, queues: Iterable[str], lease_ms: int, max_jobs: int, now_ms: int
    ) -> list[StoredJob]:
        """Lease up to `max_jobs` ready jobs, from the queues in the order given."""
        expires = now_ms + lease_ms
        taken: list[StoredJob] = []
        for queue in queues:
            heap = self._ready.get(queue)
            while heap and len(taken) < max_jobs:
                job = heapq.heappop(heap)[3]
                job.state = IN_FLIGHT
                job.lease_expires_ms = expires
                job.lease_token += 1
                heapq.heappush(self._leases, (expires, next(self._seq), job.lease_token, job))
                taken.append(job)
            if len(taken) >= max_jobs:
                break
        return taken

    def in_flight_queue(self, job_id: str) -> str | None:
        """The queue of `job_id` if it is leased now (the server's lookup for a nack's retry
        policy and an extend's lease ceiling)."""
        job = self._jobs.get(job_id)
        return job.queue if job is not None and job.state == IN_FLIGHT else None

    def _leased(self, job_id: str, attempt: int) -> StoredJob:
        job = self._jobs.get(job_id)
        if job is None or job.state != IN_FLIGHT:
            raise _job_not_found()
        if job.attempt != attempt:
            raise _attempt_mismatch()
        return job

    def ack(self, job_id: str, attempt: int) -> None:
        self._remove(self._leased(job_id, attempt))

    def nack(
        self,
        job_id: str,
        attempt: int,
        *,
        retry_delay_ms: int,
        dead_letter: bool,
        reason: str | None,
        now_ms: int,
    ) -> bool:
        """Whether the job was dead-lettered: asked to, or on its last attempt."""
        job = self._leased(job_id, attempt)
        if dead_letter or job.attempt >= job.max_attempts:
            self._dead_letter(job, REJECTED if dead_letter else ATTEMPTS_EXHAUSTED, reason, now_ms)
            return True
        job.attempt += 1
        job.lease_token += 1  # its lease timer is void
        if retry_delay_ms > 0:
            self._schedule(job, now_ms + retry_delay_ms)
        else:
            self._make_ready(job)
        return False

    def extend(self, job_id: str, attempt: int, lease_ms: int, now_ms: int) -> int:
        """The new lease expiry (ms): `lease_ms` (at least 1) from now."""
        job = self._leased(job_id, attempt)
        expires = now_ms + max(lease_ms, 1)
        job.lease_expires_ms = expires
        job.lease_token += 1
        heapq.heappush(self._leases, (expires, next(self._seq), job.lease_token, job))
        return expires

    def _remove(self, job: StoredJob) -> None:
        del self._jobs[job.id]
        job.lease_token += 1
        job.state = -1
        left = self._live[job.queue] - 1
        if left:
            self._live[job.queue] = left
        else:
            del self._live[job.queue]

    # -- dead letters -------------------------------------------------------------------------

    def _dead_letter(self, job: StoredJob, cause: int, reason: str | None, now_ms: int) -> None:
        self._remove(job)
        if not self._retention_ms:
            return
        queue = job.queue.encode("utf-8")
        key = (now_ms, len(queue).to_bytes(2, "big") + queue, next(self._seq))
        bisect.insort(self._dead_keys, key)
        self._dead[key] = DeadLetter(
            queue=job.queue,
            job=encoding.job_message(job.static, job.attempt, None),
            cause=cause,
            failed_at_ms=now_ms,
            final_attempt=job.attempt,
            last_reason=reason,
        )

    def drain(self, queue: str | None, max_records: int, scan_cap: int) -> list[DeadLetter]:
        """Take (delete) up to `max_records` dead letters, oldest first, looking at no more
        than `scan_cap` of the oldest (so a drain of one queue can come back short)."""
        chosen: list[tuple[int, bytes, int]] = []
        for examined, key in enumerate(self._dead_keys):
            if len(chosen) >= max_records or examined >= scan_cap:
                break
            if queue is None or self._dead[key].queue == queue:
                chosen.append(key)
        for key in chosen:
            self._dead_keys.remove(key)
        return [self._dead.pop(key) for key in chosen]

    # -- looking in (the memory server's own, for tests) ------------------------------------

    def depths(self, queue: str) -> QueueDepths:
        counts = [0, 0, 0]
        for job in self._jobs.values():
            if job.queue == queue:
                counts[job.state] += 1
        dead = sum(1 for record in self._dead.values() if record.queue == queue)
        return QueueDepths(counts[READY], counts[SCHEDULED], counts[IN_FLIGHT], dead)

    def queues(self) -> list[str]:
        """Every queue that holds a job or a dead letter, sorted."""
        names = {job.queue for job in self._jobs.values()}
        names.update(record.queue for record in self._dead.values())
        return sorted(names)
