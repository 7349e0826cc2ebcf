"""A global `concurrency` limit: N permits per key, jobs in a queue of their own, held as
leases (docs/limits.md, "Global concurrency").

A job is admitted holding one permit: its lease, extended every third of it while the handler
runs. The holder's own clock fences it: if no extend has succeeded for the lease (less a
margin) since the last one was *sent*, the server may give the permit to another, so the
admission is lost and the Worker must stop the handler. Release is a nack with no delay (the
permit is ready at once, and wakes a waiting acquirer), or a move to the permit's successor
when its epoch is over or its attempts are nearly spent (`permits`). A holder still holding at
an epoch boundary claims the new epoch's key for its slot before genesis may make it.
"""

from __future__ import annotations

from .._model.errors import AttemptMismatchError, JobNotFoundError
from .._model.settlement import describe
from .._model.types import Job, Retry
from .._runtime.concurrency import CancelScope
from .admission import Admission
from .global_pool import GlobalPool, KeyPool
from .permits import (
    Next,
    Permit,
    marker_request,
    on_released,
    on_reserved,
    permit_of,
    permit_request,
    successor,
)

# The holder stops its handler this fraction of the lease before its own view of the expiry
# (its last successful extend's send time plus the lease): room for the cancellation to land.
FENCE_MARGIN = 0.1
EXTEND_RETRY_S = 0.25


class Hold:
    """One permit held for one admitted job."""

    __slots__ = (
        "admission",
        "claim_retry_at",
        "claimed",
        "key",
        "last_ok",
        "lease_lost",
        "lease_s",
        "permit",
        "pool",
        "retry_at",
        "scope",
    )

    def __init__(
        self, key: str, pool: KeyPool, permit: Permit, sent: float, lease_s: float
    ) -> None:
        self.key = key
        self.pool = pool
        self.permit = permit
        self.last_ok = sent  # the lease runs from the server's answer, after this
        self.lease_s = lease_s
        self.claimed: set[int] = set()
        self.lease_lost = False
        self.retry_at = 0.0
        self.claim_retry_at = 0.0
        self.scope: CancelScope | None = None
        self.admission: Admission

    @property
    def fence_at(self) -> float:
        return self.last_ok + self.lease_s * (1 - FENCE_MARGIN)


class GlobalConcurrency(GlobalPool):
    kind = "c"

    @property
    def reserve_lease_s(self) -> float:
        return self.limit.lease

    async def on_job(self, key: str, pool: KeyPool, job: Job, sent: float) -> None:
        permit = permit_of(job)
        if permit is not None and permit.max_attempts < 2:
            from .errors import GlobalLimitError

            self.fail(
                GlobalLimitError(
                    f"the server allows the permits of {pool.queue!r} {permit.max_attempts}"
                    " attempt: a global concurrency limit needs at least 2"
                    " (max_attempts_ceiling)"
                )
            )
            return
        epoch = self.epochs.of(self._clock.now())
        how = on_reserved(permit, epoch)
        if how is Next.DISCARD:
            await self.ack(job)
        elif how is Next.HAND_OVER:
            assert permit is not None
            await self.hand_over(pool, permit, epoch, claims=True)
        elif how is Next.REFRESH:
            assert permit is not None
            await self.succeed(job, permit_request(pool.queue, *successor(permit, how, epoch)))
        else:
            assert permit is not None
            hold = Hold(key, pool, permit, sent, self._clock.granted_lease_s(self.limit.lease))
            pool.holds += 1
            hold.admission = Admission(key, lambda _: self._release(hold))
            waiter = self.take_waiter(pool)
            self.spawn(self._keep, hold)
            if waiter is None:
                hold.admission.release()  # nobody left to give it to
            else:
                self.grant(waiter, hold.admission)

    # -- holding ------------------------------------------------------------------------------

    async def _keep(self, hold: Hold) -> None:
        """Extend the permit's lease, claim each epoch it is held into, and fence."""
        cc = self.cc
        epochs = self.epochs
        permit = hold.permit
        with cc.cancel_scope() as hold.scope:
            if hold.admission.released:
                return
            while True:
                now = cc.current_time()
                epoch = epochs.of(self._clock.now())
                claim_due = epoch > permit.epoch and epoch not in hold.claimed
                claim_at = (
                    max(now, hold.claim_retry_at)
                    if claim_due
                    else self._clock.local_deadline(epochs.start(epoch + 1))
                )
                extend_at = max(hold.last_ok + hold.lease_s / 3, hold.retry_at)
                wake = min(hold.fence_at, extend_at, claim_at)
                if now < wake:
                    await cc.sleep_until(wake)
                    continue
                if now >= hold.fence_at:
                    self._lose(hold, "its lease could not be kept (no extend succeeded)")
                    return
                if claim_due and now >= claim_at:
                    outcome = await self._claim(hold, epoch)
                    if outcome == "conflict":
                        self._fence(hold, f"another process made epoch {epoch}'s permit first")
                        return
                    if outcome == "failed":
                        if self._clock.now() >= epochs.claim_deadline(epoch):
                            self._fence(hold, f"it could not claim epoch {epoch} in time")
                            return
                        hold.claim_retry_at = cc.current_time() + EXTEND_RETRY_S
                    continue
                if now >= extend_at:
                    await self._extend(hold)
                    if hold.lease_lost:
                        return

    async def _extend(self, hold: Hold) -> None:
        cc = self.cc
        sent = cc.current_time()
        with cc.move_on_at(hold.fence_at):
            try:
                await self._client.extend(hold.permit.job.ctx, self.limit.lease)
            except (JobNotFoundError, AttemptMismatchError) as exc:
                self._lose(hold, f"extending it was refused: {describe(exc)}")
                return
            except Exception as exc:
                self._log.warning(
                    "sepp: global limit %s: extending a permit failed: %s; retrying while its"
                    " lease lasts",
                    self._name,
                    describe(exc),
                )
                hold.retry_at = cc.current_time() + EXTEND_RETRY_S
                return
            hold.last_ok = sent
            hold.retry_at = 0.0

    async def _claim(self, hold: Hold, epoch: int) -> str:
        """Reserve (epoch, slot, 0) for this holder's slot: a permit scheduled after the
        epoch (so nobody holds it meanwhile), and a marker saying this holder made it."""
        permit = hold.permit
        queue = hold.pool.queue
        claim = await self.enqueue(
            permit_request(queue, epoch, permit.slot, 0, scheduled_at=self.claim_time(epoch))
        )
        if claim is None:
            return "failed"
        if claim.deduplicated:
            return "conflict"
        hold.claimed.add(epoch)
        await self.enqueue(marker_request(queue, permit.job.id, epoch, self.marker_time(epoch)))
        return "claimed"

    def _lose(self, hold: Hold, why: str) -> None:
        """The lease is gone (or may be): never touch the permit again."""
        hold.lease_lost = True
        self._fence(hold, why)

    def _fence(self, hold: Hold, why: str) -> None:
        if hold.admission.lost is None and not hold.admission.released:
            self._log.error(
                "sepp: global limit %s: lost a permit for key %r: %s; its handler must stop",
                self._name,
                hold.key,
                why,
            )
        hold.admission.lose(why)

    # -- releasing ----------------------------------------------------------------------------

    def _release(self, hold: Hold) -> None:
        if hold.scope is not None:
            hold.scope.cancel()
        hold.pool.holds -= 1
        if hold.lease_lost:
            self.drop_if_idle(hold.key, hold.pool)
            return
        self.spawn(self._settle, hold)

    async def _settle(self, hold: Hold) -> None:
        permit = hold.permit
        pool = hold.pool
        try:
            epoch = self.epochs.of(self._clock.now())
            how = on_released(permit, epoch, frozenset(hold.claimed))
            if how is Next.NACK:
                try:
                    await self._client.nack(permit.job.ctx, retry=Retry.after(0))
                except (JobNotFoundError, AttemptMismatchError):
                    pass
                except Exception as exc:
                    self._log.warning(
                        "sepp: global limit %s: releasing a permit failed: %s; its lease"
                        " returns it",
                        self._name,
                        describe(exc),
                    )
            elif how is Next.HAND_OVER:
                await self.hand_over(pool, permit, epoch, claims=False)
            else:
                await self.succeed(
                    permit.job, permit_request(pool.queue, *successor(permit, how, epoch))
                )
        finally:
            self.drop_if_idle(hold.key, pool)
