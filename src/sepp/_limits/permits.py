"""Global permits as jobs, with no I/O: their queues, their identities and idempotency keys,
and what to do with one that was reserved or is released (docs/limits.md, "Global scope").

A permit is a job of type `PERMIT_TYPE` in a queue of its own limit and key. It carries its
epoch `e`, its slot `i` (0 ≤ i < N) and its generation `g` in its custom map, and was made with
the idempotency key `p:<e>:<i>:<g>`: the only way any process makes a permit, so within the
server's dedup window there is at most one job per (e, i, g). Within an epoch a slot's permits
form a chain: g+1 is made only from g, as g's attempts run out. An epoch's first permit of a
slot, (e, i, 0), is made by whichever comes first: the hand-over of the slot's permit from an
older epoch, genesis (making it from nothing), or a claim (a holder of an older permit reserving
the key for the new epoch while it still runs). Every successor is enqueued *before* its
predecessor is acked, so a crash in between leaves a stale predecessor that can never be held
(its epoch is old, or its attempts are spent) and collapses onto the successor's key when next
touched; a successor's key hit means someone else already moved the slot on.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass
from datetime import datetime

from .._model.types import EnqueueRequest, Job

PERMIT_TYPE = "sepp.permit"
MARKER_TYPE = "sepp.permit.claimed"
EPOCH, SLOT, GENERATION = "sepp.permit.e", "sepp.permit.i", "sepp.permit.g"
# Asked of the server, which clamps it to its ceiling (100 by default, not advertised): a
# permit is released by a nack, so it is replaced by its successor every ceiling-1 uses.
PERMIT_MAX_ATTEMPTS = 1_000_000
QUEUE_PREFIX = "sepp-limit"


def queue_name(kind: str, limit_name: str, key: str) -> str:
    """The queue of one limit's permits (`kind` "c": concurrency, "r": rate) for one key:
    readable for a limit without a key (an operator can declare it on a strict server); a
    digest of the key otherwise (any text, any length, never shown)."""
    base = f"{QUEUE_PREFIX}.{limit_name}.{kind}"
    if not key:
        return base
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
    return f"{base}.{digest}"


def permit_key(epoch: int, slot: int, generation: int) -> str:
    return f"p:{epoch}:{slot}:{generation}"


def marker_key(permit_id: str, epoch: int) -> str:
    return f"c:{permit_id}:{epoch}"


@dataclass(frozen=True, slots=True)
class Permit:
    """A reserved permit: which it is, and the delivery it came in."""

    epoch: int
    slot: int
    generation: int
    job: Job

    @property
    def attempt(self) -> int:
        return self.job.ctx.attempt

    @property
    def max_attempts(self) -> int:
        return self.job.ctx.max_attempts


def permit_of(job: Job) -> Permit | None:
    """The permit a reserved job is; None for a claim marker or anything malformed (both are
    acked away)."""
    ctx = job.ctx
    if ctx.job_type != PERMIT_TYPE:
        return None
    values = [ctx.custom.get(name) for name in (EPOCH, SLOT, GENERATION)]
    numbers = [value for value in values if type(value) is int and value >= 0]
    if len(numbers) != 3:
        return None
    epoch, slot, generation = numbers
    return Permit(epoch, slot, generation, job)


def permit_request(
    queue: str, epoch: int, slot: int, generation: int, scheduled_at: datetime | None = None
) -> EnqueueRequest:
    return EnqueueRequest(
        queue,
        PERMIT_TYPE,
        idempotency_key=permit_key(epoch, slot, generation),
        max_attempts=PERMIT_MAX_ATTEMPTS,
        custom={EPOCH: epoch, SLOT: slot, GENERATION: generation},
        scheduled_at=scheduled_at,
    )


def marker_request(
    queue: str, permit_id: str, epoch: int, scheduled_at: datetime
) -> EnqueueRequest:
    """The record that the holder of `permit_id` claimed `epoch` for its slot (scheduled far
    ahead; acked away when it comes due). Also how a process asks whether one exists: a hit
    says so, and a miss leaves a marker that claims nothing."""
    return EnqueueRequest(
        queue,
        MARKER_TYPE,
        idempotency_key=marker_key(permit_id, epoch),
        max_attempts=1,
        scheduled_at=scheduled_at,
    )


class Next(enum.Enum):
    """What to do with a permit."""

    HOLD = "hold"  # give it to a waiting job
    DISCARD = "discard"  # ack it: a marker, or malformed
    # Enqueue the successor, then ack this one (a hit on the successor: this one was stale).
    HAND_OVER = "hand over"  # to (E, i, 0): its epoch is over
    REFRESH = "refresh"  # to (e, i, g+1): its attempts are (nearly) spent
    CONTINUE = "continue"  # to (E, i, 1): its holder claimed (E, i, 0) while it held it
    NACK = "nack"  # release it for the next holder (costs it one attempt)


def on_reserved(permit: Permit | None, epoch_now: int) -> Next:
    """A concurrency permit just reserved: hold it only if it is of the current epoch (or a
    later one, by a skew) and not on its final attempt, so that a holder's crash (its lease
    expires: attempt + 1) never dead-letters it."""
    if permit is None:
        return Next.DISCARD
    if permit.epoch < epoch_now:
        return Next.HAND_OVER
    if permit.attempt >= permit.max_attempts:
        return Next.REFRESH
    return Next.HOLD


def on_released(permit: Permit, epoch_now: int, claimed: frozenset[int]) -> Next:
    """A held concurrency permit whose job is done."""
    if permit.epoch < epoch_now:
        return Next.CONTINUE if epoch_now in claimed else Next.HAND_OVER
    if permit.attempt <= permit.max_attempts - 2:
        return Next.NACK  # the next holder gets it at attempt + 1 ≤ max - 1: holdable
    return Next.REFRESH


def successor(permit: Permit, how: Next, epoch_now: int) -> tuple[int, int, int]:
    """The (epoch, slot, generation) that `how` moves `permit`'s slot to."""
    if how is Next.HAND_OVER:
        return epoch_now, permit.slot, 0
    if how is Next.CONTINUE:
        return epoch_now, permit.slot, 1
    if how is Next.REFRESH:
        return permit.epoch, permit.slot, permit.generation + 1
    raise ValueError(f"{how} has no successor")


class TokenUse(enum.Enum):
    """What a reserved rate token allows, and what follows it."""

    DISCARD = "discard"  # ack it
    HAND_OVER = "hand over"  # an older epoch's: enqueue (E, i, 0) ready, ack it, do not use it
    KEEP_LEASE = "keep the lease"  # use it; its lease (= per) is its cooldown: nothing to send
    NACK_LATER = "nack later"  # use it; nack it with delay per (per is over the lease ceiling)
    SUCCEED = "succeed"  # use it if its successor, scheduled at t + per, is new; then ack it


@dataclass(frozen=True, slots=True)
class TokenPlan:
    use: TokenUse
    successor: tuple[int, int, int] | None = None  # (epoch, slot, generation)
    successor_at: float | None = None  # server seconds


def on_token(
    permit: Permit | None,
    *,
    epoch_now: int,
    epoch_of_cooldown_end: int,
    granted_at: float,
    per_s: float,
    lease_covers_per: bool,
) -> TokenPlan:
    """A rate token just reserved at server time `granted_at`: it may start one job, and is
    then unavailable for `per_s` (its lease, or a successor scheduled `per_s` later)."""
    if permit is None:
        return TokenPlan(TokenUse.DISCARD)
    if permit.epoch < epoch_now:
        return TokenPlan(TokenUse.HAND_OVER, (epoch_now, permit.slot, 0))
    ends = granted_at + per_s
    if epoch_of_cooldown_end > permit.epoch:
        # The cooldown ends in a later epoch: the slot moves there now (scheduled), so that
        # genesis there finds it and a lease expiring there never leaves an old token behind.
        return TokenPlan(TokenUse.SUCCEED, (epoch_of_cooldown_end, permit.slot, 0), ends)
    if permit.attempt >= permit.max_attempts - 1:
        # Left to its lease it would come back on its final attempt (or be dead-lettered).
        return TokenPlan(TokenUse.SUCCEED, (permit.epoch, permit.slot, permit.generation + 1), ends)
    return TokenPlan(TokenUse.KEEP_LEASE if lease_covers_per else TokenUse.NACK_LATER)
