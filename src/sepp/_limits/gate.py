"""One `Limit` as a Worker uses it: `LimitGate` admits each handler through it (in this
process, or across every process on the server), says how many run and wait, and runs what a
global limit does in the background.

How the Worker calls it (docs/limits.md, "What the Worker calls"):

    gate = LimitGate(limit.named(job_type), client=client, cc=cc, log=log)
    nursery.start_soon(gate.run)           # global: its acquirers, keepers and releases
    admission = await gate.admit(ctx, patience_s=...)   # None: not in time -> defer the job
    admission.on_lost(lambda why: cancel the handler)   # global: the permit is gone
    ... run the handler ...
    admission.release()                    # after the handler, whatever its outcome
    gate.close()                           # at shutdown; run() returns once releases are sent
"""

from __future__ import annotations

import math

from .._model.types import JobContext
from .._runtime.concurrency import TASK_STATUS_IGNORED, TRIO, Event, ServiceRuntime, TaskStatus
from .._util.log import Log
from .admission import Admission, Admissions, LimitStats
from .client_calls import LimitClient
from .global_concurrency import GlobalConcurrency
from .global_pool import GlobalPool, GlobalTuning
from .global_rate import GlobalRate
from .limit import Limit
from .local import LocalLimiter
from .timing import Epochs, ServerClock, epochs_for

# How often a global limit measures the server's clock again.
CLOCK_RESYNC_S = 60.0
# How long close() waits for releases still being sent before it cancels them.
CLOSE_GRACE_S = 10.0


class LimitGate:
    """One limit, for every key, in one process (a Worker's)."""

    def __init__(
        self,
        limit: Limit,
        *,
        client: LimitClient | None = None,
        cc: ServiceRuntime = TRIO,
        log: Log | None = None,
        tuning: GlobalTuning | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.limit = limit
        self._local: LocalLimiter | None = None
        self._global: GlobalLimiter | None = None
        if limit.is_global:
            if client is None:
                raise ValueError("a global limit needs the client its permits are jobs on")
            if limit.name is None:
                raise ValueError("a global limit needs a name (Limit.named(job_type))")
            self._global = GlobalLimiter(
                limit, client, cc, log or Log(None), tuning or GlobalTuning(), worker_id
            )
        else:
            self._local = LocalLimiter(limit, cc)

    def key_of(self, ctx: JobContext) -> str:
        return self.limit.key_of(ctx)

    async def admit(
        self, ctx: JobContext | str, *, patience_s: float = math.inf
    ) -> Admission | None:
        """Wait up to `patience_s` seconds for an admission for `ctx`'s key (or the key given);
        None if none came in time: the job waited for nothing, and should be deferred."""
        key = ctx if isinstance(ctx, str) else self.key_of(ctx)
        if self._local is not None:
            return await self._local.admit(key, patience_s=patience_s)
        assert self._global is not None
        return await self._global.admit(key, patience_s=patience_s)

    def try_admit(self, ctx: JobContext | str) -> Admission | None:
        """An admission at once, or None (a global limit always says None: ask `admit`)."""
        if self._local is None:
            return None
        return self._local.try_admit(ctx if isinstance(ctx, str) else self.key_of(ctx))

    def retry_after(self, ctx: JobContext | str) -> float | None:
        """Seconds until the key might admit one more (None: unknown): a deferral's delay."""
        if self._local is None:
            return None
        return self._local.retry_after(ctx if isinstance(ctx, str) else self.key_of(ctx))

    def stats(self, key: str | None = None) -> list[LimitStats]:
        """How many of this limit's handlers run and wait in this process, per key."""
        if self._local is not None:
            return self._local.stats(key)
        assert self._global is not None
        return self._global.stats(key)

    @property
    def keys_held(self) -> int:
        if self._local is not None:
            return self._local.keys_held
        assert self._global is not None
        return self._global.keys_held

    async def run(self, *, task_status: TaskStatus[None] = TASK_STATUS_IGNORED) -> None:
        """What a global limit does in the background, until `close()` (a local limit has
        nothing to do: it returns once closed)."""
        if self._global is not None:
            await self._global.run(task_status=task_status)
        else:
            task_status.started()

    def close(self) -> None:
        """Admit no more (waiters get None); `run()` ends once releases are sent."""
        if self._global is not None:
            self._global.close()


class GlobalLimiter:
    """A global limit's concurrency permits and rate tokens, on one estimate of the server's
    clock. With both, a job takes a permit first, then a token (a token taken first and then
    waited on would be a start that never happened)."""

    def __init__(
        self,
        limit: Limit,
        client: LimitClient,
        cc: ServiceRuntime,
        log: Log,
        tuning: GlobalTuning,
        worker_id: str | None,
    ) -> None:
        self.limit = limit
        self._cc = cc
        self._log = log
        self.clock = ServerClock(client, cc)
        self.epochs: Epochs = epochs_for(
            lease_s=limit.lease,
            per_s=limit.per if limit.rate is not None else None,
            epoch_s=tuning.epoch_s,
            skew_s=tuning.skew_s,
        )
        self._pools: list[GlobalPool] = []
        self._concurrency: GlobalConcurrency | None = None
        self._rate: GlobalRate | None = None
        common = (limit, client, self.clock, self.epochs, log, tuning)
        if limit.concurrency is not None:
            self._concurrency = GlobalConcurrency(
                *common, size=limit.concurrency, worker_id=worker_id, cc=cc
            )
            self._pools.append(self._concurrency)
        if limit.rate is not None:
            self._rate = GlobalRate(*common, size=limit.rate, worker_id=worker_id, cc=cc)
            self._pools.append(self._rate)
        self._closed: Event = cc.event()

    async def admit(self, key: str, *, patience_s: float) -> Admission | None:
        cc = self._cc
        deadline = cc.current_time() + patience_s
        started = cc.current_time()
        parts: list[Admission] = []
        for pool in self._pools:
            left = max(deadline - cc.current_time(), 0.0)
            try:
                admission = await pool.admit(key, patience_s=left)
            except BaseException:
                for part in parts:
                    part.release()
                raise
            if admission is None:
                for part in parts:
                    part.release()
                return None
            parts.append(admission)
        if len(parts) == 1:
            return parts[0]
        return Admissions(key, parts, cc.current_time() - started).admission

    async def run(self, *, task_status: TaskStatus[None] = TASK_STATUS_IGNORED) -> None:
        cc = self._cc
        await self._sync_clock()
        async with cc.open_nursery() as nursery:
            for pool in self._pools:
                pool.nursery = nursery
            nursery.start_soon(self._resync_clock)
            task_status.started()
            await self._closed.wait()
            with cc.move_on_after(CLOSE_GRACE_S):
                for pool in self._pools:
                    await pool.wait_for_pending()
            nursery.cancel_scope.cancel()
        for pool in self._pools:
            pool.nursery = None

    async def _sync_clock(self) -> None:
        try:
            await self.clock.sync()
        except Exception as exc:
            self._log.warning(
                "sepp: global limit %s: reading the server's clock failed (%s); using ours",
                self.limit.name,
                exc,
            )

    async def _resync_clock(self) -> None:
        while True:
            await self._cc.sleep(CLOCK_RESYNC_S)
            await self._sync_clock()

    def close(self) -> None:
        for pool in self._pools:
            pool.close()
        self._closed.set()

    def stats(self, key: str | None = None) -> list[LimitStats]:
        limit = self.limit
        counts: dict[str, list[int]] = {}
        for pool in self._pools:
            held = pool.counts() if key is None else {key: pool.counts_for(key)}
            for k, (holding, waiting) in held.items():
                entry = counts.setdefault(k, [0, 0])
                entry[0] += holding
                entry[1] += waiting
        return [
            LimitStats(
                limit.name,
                limit.scope,
                k,
                running,
                waiting,
                limit.concurrency,
                limit.rate,
                limit.per,
            )
            for k, (running, waiting) in counts.items()
        ]

    @property
    def keys_held(self) -> int:
        return max((pool.keys_held for pool in self._pools), default=0)
