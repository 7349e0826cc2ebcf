"""`OutboxRelay`: forwards an outbox's rows to the server, claim -> send -> settle, as a task
(trio or asyncio; the blocking database calls run in a thread) or in a thread of its own
(with a `SyncClient`). The loop is written once, as a coroutine; in a thread it runs under
`run_blocking` (as `SyncClient` runs the client's), its waits and calls blocking. The
decisions are `policy`'s; the SQL is `store`'s."""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .._client.client_kind import refuse_a_blocking_client, refuse_an_async_client
from .._model import validate as v
from .._model.errors import SeppError, ValidationError
from .._model.rejections import JobRejection
from .._model.types import EnqueueAck, EnqueueRequest
from .._probes.server import ProbeServer
from .._runtime import concurrency
from .._runtime.blocking_runtime import run_blocking
from .._runtime.concurrency import TASK_STATUS_IGNORED, RunHandle, TaskStatus
from . import metrics
from .outbox import Outbox
from .policy import Counters, RelayPolicy, Settlement
from .store import Backlog, Claim, Store, open_store

if TYPE_CHECKING:
    from .._client.sync import SyncClient
    from .._runtime.protocol import CancelScope

T = TypeVar("T")
_log = logging.getLogger("sepp.outbox")

LOG_EVERY_S = 60.0  # the status line's period while there is something to say
LISTEN_WAIT_S = 1.0  # PostgreSQL: the longest wait on a notification (shutdown looks between)


class _AsyncClient(Protocol):
    async def enqueue_batch(
        self, jobs: list[EnqueueRequest], *, timeout: float | None = None
    ) -> list[EnqueueAck | JobRejection]: ...


class OutboxRelay:
    """Forwards the jobs of an `Outbox` table to the server, oldest first, in batches.

    `database`: `sqlite:///path/to.db` (`sqlite:////abs/path.db`) or `postgresql://...`.
    Run it with `await relay.run(client)` in a nursery or task group (trio, asyncio), or
    `relay.run_sync(sync_client)` in a thread; `shutdown()` stops it after the batch in hand.
    Its metrics are served by `await relay.serve_metrics(port)` beside `run`, or by
    `run_sync(..., metrics_port=port)`.

    A row is deleted only once the server accepted it or already had it (its idempotency
    key); a job the server rejects stays as a 'rejected' row with the reason; a full queue's
    jobs and every job of a batch the server did not answer are tried again, with backoff.
    Several relays may share a table: each claims the rows it sends for `claim_timeout`
    seconds (a send gives up after half of it). New rows wake it through PostgreSQL's
    LISTEN/NOTIFY; on sqlite3 it looks every `poll_interval` seconds.
    """

    def __init__(
        self,
        database: str,
        *,
        outbox: Outbox | None = None,
        batch_size: int = 100,
        poll_interval: float | timedelta = 0.25,
        claim_timeout: float | timedelta = 60.0,
        logger: logging.Logger | logging.LoggerAdapter[Any] | None = None,
    ) -> None:
        self._outbox = outbox if outbox is not None else Outbox()
        if not isinstance(self._outbox, Outbox):
            raise ValidationError("outbox", "must be a sepp.Outbox")
        self._database = database
        self._store: Store = open_store(database, self._outbox.table, self._outbox.channel)
        self._batch_size = v.whole_number("batch_size", batch_size, low=1, high=10_000)
        self._poll_s = v.seconds("poll_interval", poll_interval)
        self._claim_s = v.seconds("claim_timeout", claim_timeout)
        if self._claim_s < 2.0:
            raise ValidationError("claim_timeout", f"must be at least 2s, got {self._claim_s:g}s")
        self._log = logger if logger is not None else _log
        self._policy = RelayPolicy(self._batch_size)
        self._backlog = Backlog(0, 0.0, 0)
        self._backlog_known = False
        self._stopping = False
        self._running = False
        self._wake = threading.Event()  # run_sync's idle waits
        self._idle_scope: CancelScope | None = None  # run's idle wait
        self._handle = RunHandle()
        self._last_log = 0.0
        self._logged: tuple[int, ...] = ()
        self._metrics_port: int | None = None

    def __repr__(self) -> str:
        return f"<sepp.OutboxRelay {self._outbox.table} in {self._store.dialect}>"

    # -- state --------------------------------------------------------------------------------

    @property
    def counters(self) -> Counters:
        """What this relay did: relayed, deduplicated, rejected, send and database failures."""
        return self._policy.counters

    @property
    def backlog(self) -> Backlog:
        """The table's rows waiting and rejected and the oldest waiting row's age, as last
        counted (after each idle look, at most every poll)."""
        return self._backlog

    def prometheus_text(self) -> str:
        """The relay's metrics in the Prometheus text format."""
        return metrics.render(self._outbox.table, self._policy, self._backlog)

    @property
    def metrics_port(self) -> int | None:
        """The port `/metrics` is being served on (by `serve_metrics()` or `run_sync()`), or
        None."""
        return self._metrics_port

    async def serve_metrics(
        self,
        port: int,
        *,
        host: str | None = None,
        task_status: TaskStatus[int] = TASK_STATUS_IGNORED,
    ) -> None:
        """Serve `/metrics` over HTTP on `host:port` (None: every interface; port 0: any free
        one) until cancelled, from a thread of its own; `nursery.start()` returns the bound
        port."""
        with self._serving_metrics(port, host) as bound:
            task_status.started(bound)
            await concurrency.current().sleep(math.inf)

    @contextlib.contextmanager
    def _serving_metrics(self, port: int, host: str | None) -> Iterator[int]:
        """`/metrics` served from a thread while in the block; the bound port."""
        with ProbeServer(metrics.route(self.prometheus_text), port, host=host) as server:
            self._metrics_port = server.port
            try:
                yield server.port
            finally:
                self._metrics_port = None

    def shutdown(self) -> None:
        """Stop after the batch in hand (from any thread, or a signal handler)."""
        self._stopping = True
        self._wake.set()
        self._handle.call(self._cancel_idle, from_task=True)

    def _cancel_idle(self) -> None:
        if self._idle_scope is not None:
            self._idle_scope.cancel()

    # -- as a task, or in a thread ------------------------------------------------------------

    async def run(
        self, client: _AsyncClient, *, task_status: TaskStatus[None] = TASK_STATUS_IGNORED
    ) -> None:
        """Relay until `shutdown()` (or cancelled). `client`: a connected `sepp.Client`."""
        refuse_a_blocking_client(client, "OutboxRelay.run")
        self._start()
        cc = concurrency.current()
        self._handle.enter(cc)
        try:
            task_status.started()
            await self._relay(client, _InTask(self, cc))
        finally:
            self._handle.leave()
            self._stop()

    def run_sync(
        self,
        client: SyncClient,
        *,
        metrics_port: int | None = None,
        metrics_host: str | None = None,
    ) -> None:
        """Relay in the calling thread until `shutdown()`. `client`: a `sepp.SyncClient`.
        With `metrics_port`, `/metrics` is served meanwhile, as `serve_metrics()` serves it, on
        `metrics_host:metrics_port` (port 0: any free one; `metrics_port` says which)."""
        refuse_an_async_client(client, "OutboxRelay.run_sync")
        port = (
            None
            if metrics_port is None
            else v.whole_number("metrics_port", metrics_port, low=0, high=65535)
        )
        self._start()
        try:
            with contextlib.ExitStack() as serving:
                if port is not None:
                    serving.enter_context(self._serving_metrics(port, metrics_host))
                # The same loop, every await of which completes without suspending here.
                run_blocking(self._relay(_Blocking(client), _InThread(self._wake)))
        finally:
            self._stop()

    async def _relay(self, client: _AsyncClient, io: _Io) -> None:
        """Claim -> send -> settle, and back off or wait for rows, until `shutdown()`."""
        while not self._stopping:
            claim = await self._db_call(
                io, self._store.claim, self._policy.claim_limit(), self._claim_s
            )
            if claim is not None and claim.rows:
                rows, requests, settlement = self._policy.jobs(claim.rows)
                if requests:
                    try:
                        results = await client.enqueue_batch(requests, timeout=self._claim_s / 2)
                    except SeppError as exc:
                        self._send_failed(rows, exc, settlement)
                    else:
                        self._policy.answered(rows, results, settlement)
                await self._db_call(io, self._settle, claim, settlement)
            delay = self._policy.backoff_s()
            idle = claim is not None and not claim.rows
            if idle or delay:  # counted when it waits, never between batches
                self._note_backlog(await self._db_call(io, self._store.backlog))
            if self._stopping or not (delay or idle):
                continue
            with io.idle():  # shutdown() ends the wait
                if delay or not self._store.listens:
                    await io.sleep(delay or self._poll_s)
                else:
                    await self._db_call(io, self._store.wait, LISTEN_WAIT_S)

    async def _db_call(self, io: _Io, fn: Callable[..., T], *args: object) -> T | None:
        try:
            return await io.blocking(fn, *args)
        except Exception as exc:  # the database is down or locked: back off, reconnect
            self._db_failed(exc)
            return None

    # -- shared -------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._running:
            raise SeppError("this OutboxRelay is already running")
        self._running = True
        self._stopping = False
        self._wake.clear()
        self._log.info(
            "outbox relay started: table %s in %s, batches of %d",
            self._outbox.table,
            self._store.dialect,
            self._batch_size,
        )

    def _stop(self) -> None:
        self._store.close()
        self._running = False
        c = self._policy.counters
        self._log.info(
            "outbox relay stopped: relayed %d, deduplicated %d, rejected %d",
            c.relayed,
            c.deduplicated,
            c.rejected,
        )

    def _settle(self, claim: Claim, settlement: Settlement) -> None:
        self._store.settle(claim.token, settlement.done, settlement.rejected, settlement.released)
        for row_id, reason in settlement.rejected:
            self._log.warning("outbox row %d rejected: %s", row_id, reason)
        self._log.debug(
            "outbox batch: %d done, %d rejected, %d to retry",
            len(settlement.done),
            len(settlement.rejected),
            len(settlement.released),
        )

    def _send_failed(self, rows: list[Any], exc: SeppError, settlement: Settlement) -> None:
        self._policy.send_failed(rows, exc, settlement)
        failures = self._policy.failures_in_a_row
        self._log.warning(
            "outbox relay: server did not take %d jobs (%s; failure %d in a row); retrying",
            len(rows),
            exc,
            failures,
        )

    def _db_failed(self, exc: Exception) -> None:
        self._policy.db_failed()
        self._log.warning(
            "outbox relay: database call failed (%s: %s; failure %d in a row)",
            type(exc).__name__,
            exc,
            self._policy.failures_in_a_row,
        )
        try:
            self._store.close()  # reconnect on the next call
        except Exception:
            pass

    def _note_backlog(self, backlog: Backlog | None) -> None:
        if backlog is None:
            return
        self._backlog = backlog
        c = self._policy.counters
        state = (backlog.waiting, backlog.rejected, c.relayed, c.deduplicated, c.rejected)
        now = time.monotonic()
        if (state != self._logged and now - self._last_log >= LOG_EVERY_S) or not self._logged:
            self._last_log, self._logged = now, state
            self._log.info(
                "outbox: %d waiting (oldest %.1fs), %d rejected in the table; relayed %d,"
                " deduplicated %d, rejected %d",
                backlog.waiting,
                backlog.oldest_age_s,
                backlog.rejected,
                c.relayed,
                c.deduplicated,
                c.rejected,
            )


class _Io(Protocol):
    """Where the relay's loop runs: a task (trio, asyncio) or a thread of its own."""

    def idle(self) -> AbstractContextManager[None]:
        """A block of waiting (a sleep, or for rows) that `shutdown()` may end early."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    async def blocking(self, fn: Callable[..., T], *args: object) -> T:
        """A blocking database call."""
        ...


class _InTask:
    """In a task: the database calls in worker threads, waited for even when cancelled (a
    transaction is never left half done in an abandoned thread); the waits in a cancel scope
    that `shutdown()` cancels."""

    def __init__(self, relay: OutboxRelay, cc: concurrency.ServiceRuntime) -> None:
        self._relay = relay
        self._cc = cc

    @contextlib.contextmanager
    def idle(self) -> Iterator[None]:
        scope = self._cc.cancel_scope()
        self._relay._idle_scope = scope
        try:
            with scope:
                yield
        finally:
            self._relay._idle_scope = None

    async def sleep(self, seconds: float) -> None:
        await self._cc.sleep(seconds)

    async def blocking(self, fn: Callable[..., T], *args: object) -> T:
        return await self._cc.run_sync_in_thread(fn, *args, abandon=False)


class _InThread:
    """In the calling thread (`run_sync`): every call made here and now, the sleeps on an
    event that `shutdown()` sets (a wait for rows lasts at most `LISTEN_WAIT_S`)."""

    def __init__(self, wake: threading.Event) -> None:
        self._wake = wake

    def idle(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    async def sleep(self, seconds: float) -> None:
        self._wake.wait(seconds)

    async def blocking(self, fn: Callable[..., T], *args: object) -> T:
        return fn(*args)


class _Blocking:
    """A `SyncClient` as the loop calls a client: its call completes before the await does."""

    def __init__(self, client: SyncClient) -> None:
        self._client = client

    async def enqueue_batch(
        self, jobs: list[EnqueueRequest], *, timeout: float | None = None
    ) -> list[EnqueueAck | JobRejection]:
        return self._client.enqueue_batch(jobs, timeout=timeout)
