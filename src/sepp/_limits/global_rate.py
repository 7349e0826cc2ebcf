"""A global `rate` limit: R tokens per key, jobs in a queue of their own (docs/limits.md,
"Global rate").

A start takes one token: it is reserved with a lease of `per`, and that lease *is* its
cooldown. Nothing more is sent: when the lease expires (on the server's clock, `per` after it
was granted) the server makes the token ready again, one attempt older, and wakes whoever
waits. So a crashed starter costs nothing, and no token is ever granted twice within `per`:
at most R grants in any window of `per` on the server's clock. A token whose cooldown would
end in the next epoch, or whose attempts are nearly spent, is replaced at once by its
successor scheduled at the end of the cooldown (and used only if that successor is new).
"""

from __future__ import annotations

from .._model.settlement import describe
from .._model.types import Job, Retry
from .admission import Admission
from .global_pool import GlobalPool, KeyPool
from .permits import TokenUse, on_token, permit_of, permit_request

# When `per` is over the server's lease ceiling the token is nacked with the delay instead
# (its lease is then only a guard: a starter that crashes before the nack shortens that one
# cooldown to the lease).
DEFAULT_LEASE_CEILING_S = 300.0


def _spent(_: Admission) -> None:
    pass


class GlobalRate(GlobalPool):
    kind = "r"

    @property
    def _lease_ceiling_s(self) -> float:
        ceiling = self._clock.max_lease_s
        return DEFAULT_LEASE_CEILING_S if ceiling is None else ceiling

    @property
    def reserve_lease_s(self) -> float:
        return min(self.limit.per, self._lease_ceiling_s)

    async def on_job(self, key: str, pool: KeyPool, job: Job, sent: float) -> None:
        permit = permit_of(job)
        per_s = self.limit.per
        lease_s = self.reserve_lease_s
        granted_at = job.ctx.lease_expires_at.timestamp() - lease_s
        epoch = self.epochs.of(self._clock.now())
        plan = on_token(
            permit,
            epoch_now=epoch,
            epoch_of_cooldown_end=self.epochs.of(granted_at + per_s),
            granted_at=granted_at,
            per_s=per_s,
            lease_covers_per=per_s <= self._lease_ceiling_s,
        )
        if plan.use is TokenUse.DISCARD:
            await self.ack(job)
            return
        if plan.use is TokenUse.HAND_OVER:
            assert permit is not None
            await self.hand_over(pool, permit, epoch, claims=False)
            return
        if plan.use is TokenUse.SUCCEED:
            assert plan.successor is not None and plan.successor_at is not None
            fresh = await self.succeed(
                job,
                permit_request(
                    pool.queue,
                    *plan.successor,
                    scheduled_at=self._clock.to_datetime(plan.successor_at),
                ),
            )
            if not fresh:
                return  # stale (or not moved: its lease is its cooldown): not a start
        elif plan.use is TokenUse.NACK_LATER:
            self.spawn(self._cool_down, job)
        self._start(key, pool)

    def _start(self, key: str, pool: KeyPool) -> None:
        """One start: to the first waiter (a start nobody takes is spent all the same)."""
        waiter = self.take_waiter(pool)
        if waiter is None:
            return
        admission = Admission(key, _spent)
        admission.released = True  # a token is spent on start: nothing to give back
        self.grant(waiter, admission)

    async def _cool_down(self, job: Job) -> None:
        try:
            await self._client.nack(job.ctx, retry=Retry.after(self.limit.per))
        except Exception as exc:
            self._log.warning(
                "sepp: global limit %s: cooling a token down failed: %s; its lease does",
                self._name,
                describe(exc),
            )
