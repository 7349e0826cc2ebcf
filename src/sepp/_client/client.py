"""Client: one method per operation — validate, convert, call, map — and `open()`."""

from __future__ import annotations

import dataclasses
import math
import os
import ssl
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, overload

from .._model import message_codec
from .._model import validate as v
from .._model.errors import (
    BatchValidationError,
    ClientError,
    JobRejectedError,
    OtherRunError,
    SeppError,
    TransportError,
    ValidationError,
    error_from_status,
)
from .._model.rejections import BatchRejection, JobRejection
from .._model.types import (
    CustomValue,
    DeadLetterRecord,
    EnqueueAck,
    EnqueueRequest,
    Job,
    JobContext,
    Payload,
    Retry,
    ServerInfo,
    TraceContext,
)
from .._runtime.protocol import Runtime, TaskGroup
from .._util.log import Log, LoggerLike
from ..wire._engine import WireEngine
from ..wire._status import StatusCode
from ..wire.drivers._base import ChannelBase, RpcError
from . import fork
from . import operations as ops
from . import otel as _otel
from .batching import Batching, EnqueueBatcher
from .chunking import DEFAULT_MAX_ENQUEUE_BATCH, MAX_CONCURRENT_CHUNKS, split_batch
from .duration_guard import DurationGuard
from .handler_threads import refuse_in_handler_threads
from .limits import LimitsCache, ServerLimits
from .opening import Opening
from .options import DEFAULT_MAX_RECEIVE_MESSAGE_BYTES as DEFAULT_MAX_RECEIVE_MESSAGE_BYTES
from .options import ConnectOptions
from .retry import RetryPolicy, call_with_retry

if TYPE_CHECKING:
    from .replies import Replies  # loaded when a first result is awaited

# The results of a batch the server took whole: no rejection to look at.
_ACK_TYPE = {EnqueueAck}

_FORKED_HINT = (
    "Open a new client in the child, in its own trio.run (the parent's trio.run and the"
    " client's connection tasks do not exist there); sepp.SyncClient reconnects by itself."
)


class Client:
    """A connection to one sepp server. Get one from `sepp.open()`; safe to share between tasks."""

    def __init__(
        self,
        channel: ChannelBase,
        *,
        address: str,
        rpc_timeout: float | None,
        retry_policy: RetryPolicy,
        log: Log,
        runtime: Runtime,
        nursery: TaskGroup | None = None,
        enqueue_batching: Batching | None = None,
        validate_locally: bool = True,
    ) -> None:
        self._channel = channel
        self._rt = runtime
        # What reserved jobs' contexts give as `ctx.client`: this client, or the SyncClient
        # that runs it.
        self.ctx_client: object = self
        self._address = address
        self._rpc_timeout = rpc_timeout
        self._retry_policy = retry_policy
        self._log = log
        self._batcher: EnqueueBatcher | None = None
        if enqueue_batching is not None:
            assert nursery is not None, "the auto-batcher sends from the client's nursery"
            self._batcher = EnqueueBatcher(
                enqueue_batching,
                nursery,
                self._enqueue_batch_rpc,
                self._max_enqueue_batch,
                runtime=runtime,
            )
        self._nursery = nursery
        self._validate_locally = validate_locally
        self._limits = LimitsCache(self._fetch_server_info, log, runtime)
        # The reply queue and its listener, made when a first result is awaited.
        self._replies: Replies | None = None
        self._durations = DurationGuard(log)
        self._opened_in = fork.here()
        # The run that opened the client: its tasks serve only callers in that run.
        self._root_task = runtime.owner()

    async def _connect(self) -> None:
        """Open the first connection (open() fails at once if the server is unreachable)."""
        try:
            await self._channel.connect()
        except RpcError as exc:
            raise error_from_status(
                exc.code, exc.details, kind=exc.kind, addr=self._address
            ) from None
        # What the message codec needs (protobuf's classes: about 25 ms) loads now rather
        # than in the first call, while the application is still starting up.
        message_codec.preload()
        if self._validate_locally and self._nursery is not None:
            self._limits.start(self._nursery)  # so the first enqueue need not wait for them

    async def _close(self) -> None:
        """Fail every call not yet done; new calls fail as the client is closed."""
        if self._replies is not None:
            await self._replies.close(self)
        if self._batcher is not None:
            self._batcher.close()
        await self._channel.aclose()

    def __repr__(self) -> str:
        return f"<sepp.Client {self._address}>"

    @property
    def address(self) -> str:
        """The address of the server this client connects to."""
        return self._address

    # -- producing --------------------------------------------------------------------------

    @overload
    async def enqueue(
        self, request: EnqueueRequest, /, *, timeout: float | timedelta | None = None
    ) -> EnqueueAck: ...

    @overload
    async def enqueue(
        self,
        queue: str,
        job_type: str,
        *,
        payload: Payload | None = None,
        idempotency_key: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        custom: Mapping[str, CustomValue] | None = None,
        scheduled_at: datetime | None = None,
        trace_context: TraceContext | None = None,
        timeout: float | timedelta | None = None,
    ) -> EnqueueAck: ...

    async def enqueue(
        self,
        queue: str | EnqueueRequest,
        job_type: str | None = None,
        *,
        payload: Payload | None = None,
        idempotency_key: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        custom: Mapping[str, CustomValue] | None = None,
        scheduled_at: datetime | None = None,
        trace_context: TraceContext | None = None,
        timeout: float | timedelta | None = None,
    ) -> EnqueueAck:
        """Enqueue one job, given as an EnqueueRequest or as its fields (not both); raises
        JobRejectedError if the server rejects it."""
        request = ops.enqueue_request(
            queue,
            job_type,
            payload=payload,
            idempotency_key=idempotency_key,
            priority=priority,
            max_attempts=max_attempts,
            custom=custom,
            scheduled_at=scheduled_at,
            trace_context=trace_context,
        )
        if self._batcher is not None:
            deadline = self._deadline(timeout)
            limits = await self._current_limits(deadline)
            local = limits.check(request) if limits is not None else None
            if local is not None:
                raise JobRejectedError(local)
            result = await self._enqueue_via_batcher(request, timeout, deadline)
            if isinstance(result, JobRejection):
                self._limits.note_rejections([result])
        else:
            result = await self._enqueue_one(request, timeout)
        if isinstance(result, JobRejection):
            raise JobRejectedError(result)
        return result

    async def _enqueue_one(
        self, request: EnqueueRequest, timeout: float | timedelta | None
    ) -> EnqueueAck | JobRejection:
        """One job: the common case, as one EnqueueBatch call without the batch machinery."""
        timeout_s = self._timeout_s(timeout)
        if self._validate_locally:
            if self._limits.fresh:
                limits = self._limits.limits
            else:  # the first calls, or a refresh: never wait past the call's deadline
                deadline = math.inf if timeout_s is None else self._rt.current_time() + timeout_s
                limits = await self._limits.current(deadline)
                timeout_s = self._left_s(deadline)
            local = limits.check(request) if limits is not None else None
            if local is not None:
                return local
        with _otel.client_span("sepp.enqueue", lambda: _batch_attributes((request,))) as span:
            body = await self._send_s(
                ops.enqueue_batch_call((request,), span.trace_context, label="Enqueue"), timeout_s
            )
            result = ops.read_enqueue_one(body)
            _record_results(span, (result,))
        if isinstance(result, JobRejection):
            self._limits.note_rejections((result,))
        return result

    async def _enqueue_via_batcher(
        self, request: EnqueueRequest, timeout: float | timedelta | None, deadline: float
    ) -> EnqueueAck | JobRejection:
        """One job through the auto-batcher, in its own sepp.enqueue span."""
        assert self._batcher is not None
        if self._root_task is not None and self._rt.owner() is not self._root_task:
            raise _other_run()
        if timeout is None and not _otel.tracing():
            return await self._batcher.submit(request)  # the common case, kept lean
        with _otel.client_span("sepp.enqueue", lambda: _batch_attributes([request])) as span:
            trace_context = span.trace_context
            if trace_context is not None and request.trace_context is None:
                request = dataclasses.replace(request, trace_context=trace_context)
            if timeout is None:
                # The batch's own call is bounded by rpc_timeout; a cancel scope per caller
                # would cost more than the rest of the enqueue.
                result = await self._batcher.submit(request)
            else:
                with self._rt.move_on_at(deadline) as scope:
                    result = await self._batcher.submit(request)
                if scope.cancelled_caught:
                    raise TransportError(
                        "Enqueue: DEADLINE_EXCEEDED: no result within"
                        f" {v.seconds('timeout', timeout):g}s "
                        "(the job may still be enqueued)",
                        code=StatusCode.DEADLINE_EXCEEDED,
                    )
            if isinstance(result, EnqueueAck):
                span.set("sepp.job_id", result.job_id)
            return result

    async def _enqueue_batch_rpc(
        self,
        requests: list[EnqueueRequest],
        timeout: float | timedelta | None = None,
        trace_context: TraceContext | None = None,
    ) -> list[EnqueueAck | JobRejection]:
        """One EnqueueBatch call: the auto-batcher's sender, and enqueue_batch's core."""
        body = await self._send(ops.enqueue_batch_call(requests, trace_context), timeout)
        return ops.read_enqueue_batch(body, len(requests))

    async def enqueue_batch(
        self, jobs: Iterable[EnqueueRequest], *, timeout: float | timedelta | None = None
    ) -> list[EnqueueAck | JobRejection]:
        """Best effort: one result per job, in order; rejections are values, not errors."""
        return await self._enqueue_checked(ops.job_requests(jobs), timeout)

    async def enqueue_atomic(
        self, jobs: Iterable[EnqueueRequest], *, timeout: float | timedelta | None = None
    ) -> list[EnqueueAck]:
        """All or nothing: every job is enqueued, or BatchValidationError lists the culprits."""
        requests = ops.job_requests(jobs)
        deadline = self._deadline(timeout)
        limits = await self._current_limits(deadline)
        if limits is not None:
            most = limits.info.max_enqueue_batch
            if most and len(requests) > most:
                raise ValidationError(
                    "jobs",
                    f"an atomic enqueue holds at most {most} jobs (the server's"
                    f" max_enqueue_batch), got {len(requests)}; enqueue_batch splits bigger ones",
                )
            local = [(i, limits.check(r)) for i, r in enumerate(requests)]
            refused = [BatchRejection(i, r) for i, r in local if r is not None]
            if refused:
                raise BatchValidationError(refused)
        with _otel.client_span("sepp.enqueue_atomic", lambda: _batch_attributes(requests)) as span:
            body = await self._send(
                ops.enqueue_atomic_call(requests, span.trace_context), self._left_s(deadline)
            )
            try:
                acks = ops.read_enqueue_atomic(body, len(requests))
            except BatchValidationError as exc:
                span.set("sepp.outcome", "rejected")
                span.set("sepp.rejected", len(exc.errors))
                self._limits.note_rejections([e.rejection for e in exc.errors])
                raise
            span.set("sepp.outcome", "accepted")
        return acks

    async def _enqueue_checked(
        self, requests: list[EnqueueRequest], timeout: float | timedelta | None
    ) -> list[EnqueueAck | JobRejection]:
        """Check jobs against the server's limits, send the rest; every result in order."""
        deadline = self._deadline(timeout)
        limits = await self._current_limits(deadline)
        local = limits.check_all(requests) if limits is not None else []
        if not any(local):
            results = await self._enqueue_in_chunks(requests, deadline)
        else:
            # Send only what the server could accept; keep every result in input order.
            to_send = [r for r, rejection in zip(requests, local, strict=True) if rejection is None]
            remote = iter(await self._enqueue_in_chunks(to_send, deadline) if to_send else [])
            results = [rejection or next(remote) for rejection in local]
        if set(map(type, results)) != _ACK_TYPE:  # (a C loop: the common batch is all acks)
            self._limits.note_rejections([r for r in results if isinstance(r, JobRejection)])
        return results

    async def _enqueue_in_chunks(
        self, requests: list[EnqueueRequest], deadline: float
    ) -> list[EnqueueAck | JobRejection]:
        """As many EnqueueBatch calls as the server's limits need, sent in order, a few at a
        time; results in order. After a failure no more are sent, and the earliest failed
        chunk's error is raised (chunks already sent may have been enqueued)."""
        if len(requests) == 1:
            return await self._enqueue_traced(requests, self._left_s(deadline))
        chunks = split_batch(requests, max_jobs=self._max_enqueue_batch())
        if len(chunks) == 1:
            return await self._enqueue_traced(requests, self._left_s(deadline))
        results: list[list[EnqueueAck | JobRejection]] = [[] for _ in chunks]
        failures: dict[int, SeppError] = {}
        unsent = iter(enumerate(chunks))  # shared by the senders: chunks leave in order

        async def sender() -> None:
            for index, chunk in unsent:
                try:
                    results[index] = await self._enqueue_traced(chunk, self._left_s(deadline))
                except SeppError as exc:
                    failures[index] = exc
                if failures:
                    return

        await self._rt.run_concurrently(sender, at_most=min(MAX_CONCURRENT_CHUNKS, len(chunks)))
        if failures:
            raise failures[min(failures)]
        return [result for chunk_results in results for result in chunk_results]

    def _max_enqueue_batch(self) -> int:
        limits = self._limits.limits
        if limits is not None and limits.info.max_enqueue_batch:
            return limits.info.max_enqueue_batch
        return DEFAULT_MAX_ENQUEUE_BATCH

    async def _enqueue_traced(
        self, requests: list[EnqueueRequest], timeout: float | timedelta | None
    ) -> list[EnqueueAck | JobRejection]:
        """One EnqueueBatch call in its own sepp.enqueue span."""
        with _otel.client_span("sepp.enqueue", lambda: _batch_attributes(requests)) as span:
            results = await self._enqueue_batch_rpc(requests, timeout, span.trace_context)
            _record_results(span, results)
            return results

    def _deadline(self, timeout: float | timedelta | None) -> float:
        """The runtime's time by which a call given `timeout` (None: rpc_timeout) must be done."""
        timeout_s = self._rpc_timeout if timeout is None else v.seconds("timeout", timeout)
        return math.inf if timeout_s is None else self._rt.current_time() + timeout_s

    def _left_s(self, deadline: float) -> float | None:
        """What is left until `deadline`, as a call's timeout (None: no deadline). Never zero,
        which is not a valid timeout: a call with no time left fails with DEADLINE_EXCEEDED."""
        if deadline == math.inf:
            return None
        return max(deadline - self._rt.current_time(), 1e-6)

    async def _current_limits(self, deadline: float) -> ServerLimits | None:
        """The server's advertised limits for a call due by `deadline`; None when local checks
        are off, or the limits are not to be had in time (the server then checks alone)."""
        if not self._validate_locally:
            return None
        return await self._limits.current(deadline)

    # -- consuming --------------------------------------------------------------------------

    async def reserve(
        self,
        queues: Sequence[str] | str,
        *,
        lease_duration: float | timedelta = 30.0,
        wait_timeout: float | timedelta = 20.0,
        max_jobs: int | None = None,
        worker_id: str | None = None,
    ) -> list[Job] | None:
        """Long-poll for jobs; None when the wait ended with nothing to do. Never retried.

        If this call is cancelled after the server leased jobs, those jobs come back only when
        their leases expire.
        """
        call, names = ops.reserve_call(
            queues,
            lease_duration=lease_duration,
            wait_timeout=wait_timeout,
            max_jobs=max_jobs,
            worker_id=worker_id,
        )
        limits = self._limits.limits
        if limits is not None:
            info = limits.info
            self._durations.check(
                "reserve", "lease_duration", lease_duration, info.max_lease_duration
            )
            self._durations.check("reserve", "wait_timeout", wait_timeout, info.max_wait_timeout)
        attributes: dict[str, str | int | list[str]] = {"sepp.queues": names}
        if worker_id is not None:
            attributes["sepp.worker_id"] = worker_id

        with _otel.client_span("sepp.reserve", attributes) as span:
            body = await self._send(call, None)
            jobs = ops.read_reserve(body, worker_id, self._log, self.ctx_client)
            span.set("sepp.jobs", len(jobs))
        return jobs or None

    async def ack(self, ctx: JobContext, *, timeout: float | timedelta | None = None) -> None:
        """Finish a job. JobNotFoundError / AttemptMismatchError mean the lease was lost."""
        call = ops.ack_call(ctx)
        with _otel.client_span("sepp.ack", lambda: _lease_attributes(ctx)):
            ops.read_ack(await self._send(call, timeout))

    async def nack(
        self,
        ctx: JobContext,
        *,
        reason: str | None = None,
        retry: Retry = Retry.DEFAULT,
        timeout: float | timedelta | None = None,
    ) -> bool:
        """Give a job back; returns whether the server dead-lettered it."""
        call = ops.nack_call(ctx, reason, retry)
        with _otel.client_span(
            "sepp.nack", lambda: _lease_attributes(ctx, retry=retry.kind)
        ) as span:
            dead = ops.read_nack(await self._send(call, timeout))
            span.set("sepp.dead_lettered", dead)
            return dead

    async def extend(
        self,
        ctx: JobContext,
        lease_duration: float | timedelta,
        *,
        timeout: float | timedelta | None = None,
    ) -> datetime:
        """Extend a lease to `lease_duration` from now (the server may clamp it); returns and
        records on `ctx` the new expiry."""
        call = ops.extend_call(ctx, lease_duration)
        limits = self._limits.limits
        if limits is not None:
            self._durations.check(
                "extend", "lease_duration", lease_duration, limits.info.max_lease_duration
            )
        with _otel.client_span("sepp.extend", lambda: _lease_attributes(ctx)):
            body = await self._send(call, timeout)
        return ops.read_extend(body, ctx)

    # -- operations -------------------------------------------------------------------------

    async def drain_dead_letters(
        self,
        queue: str | None = None,
        *,
        max: int = 100,
        timeout: float | timedelta | None = None,
    ) -> list[DeadLetterRecord]:
        """Remove and return up to `max` dead-lettered jobs, oldest first. Destructive, so never
        retried. `max=0` returns [] without a call."""
        call = ops.drain_dead_letters_call(queue, max)
        if call is None:
            return []
        attributes = {"sepp.queue": queue} if queue is not None else {}
        with _otel.client_span("sepp.drain_dead_letters", attributes) as span:
            body = await self._send(call, timeout)
            records = ops.read_drain_dead_letters(body, self._log)
            span.set("sepp.records", len(records))
        return records

    async def get_server_info(self, *, timeout: float | timedelta | None = None) -> ServerInfo:
        """The server's version, clock and global limits."""
        with _otel.client_span("sepp.get_server_info", {}):
            return await self._fetch_server_info(timeout)

    async def _fetch_server_info(self, timeout: float | timedelta | None = None) -> ServerInfo:
        """GetServerInfo without a span (the limits cache fetches with it in the background);
        every answer refreshes the cached limits."""
        info = ops.read_server_info(await self._send(ops.SERVER_INFO_CALL, timeout))
        self._limits.update(info)
        return info

    # -- results ----------------------------------------------------------------------------

    async def _awaiting_results(self) -> Replies:
        """The reply queue results awaited through this client come to, its listener running
        in the client's own task group: made by the first caller, which the others wait for."""
        while True:
            replies = self._replies
            if replies is None:
                break
            if replies.ready.is_set():
                if replies.closed is not None:
                    raise replies.closed
                return replies
            await self._rt.wait_event(replies.ready, math.inf)
        if self._nursery is None:
            raise ClientError(
                "results are awaited through a client opened with `async with sepp.open(...)`"
                " (or a sepp.SyncClient)"
            )
        from .replies import Replies

        replies = self._replies = Replies(self._rt, self._log)
        try:
            await replies.register(self)
        except BaseException:
            self._replies = None
            raise
        finally:
            replies.ready.set()
        self._nursery.start_soon(replies.run, self, name=f"sepp replies {replies.queue}")
        return replies

    # -- plumbing ---------------------------------------------------------------------------

    def _timeout_s(self, timeout: float | timedelta | None) -> float | None:
        """A call's timeout in seconds: its own, else rpc_timeout (None: no limit)."""
        return self._rpc_timeout if timeout is None else v.seconds("timeout", timeout)

    async def _send(self, call: ops.Call, timeout: float | timedelta | None) -> bytes:
        """Send `call` within `timeout` (None: the operation's own, else rpc_timeout)."""
        if timeout is None and call.timeout_s is not None:
            return await self._send_s(call, call.timeout_s)
        return await self._send_s(call, self._timeout_s(timeout))

    async def _send_s(self, call: ops.Call, timeout_s: float | None) -> bytes:
        """One call (with the retry policy's retries), its failure mapped to a SeppError."""
        fork.check_not_forked(self._opened_in, "sepp.Client", _FORKED_HINT)
        if self._root_task is not None and self._rt.owner() is not self._root_task:
            raise _other_run()
        method, request = call.method, call.request
        label = call.label or method
        metadata = _otel.outgoing_headers() if _otel.AVAILABLE else ()
        try:
            retry_request = call.retry_request
            if retry_request is not None:
                return await self._channel.call(
                    method,
                    request,
                    timeout=timeout_s,
                    metadata=metadata,
                    retry_request=retry_request,
                )
            if self._retry_policy.max_attempts == 1:  # the default: no retry loop to set up
                return await self._channel.call(
                    method, request, timeout=timeout_s, metadata=metadata
                )

            async def attempt() -> bytes:
                return await self._channel.call(
                    method, request, timeout=timeout_s, metadata=metadata
                )

            return await call_with_retry(
                self._retry_policy,
                attempt,
                method=label,
                log=self._log,
                retryable=call.retryable,
                ambiguous_retry_safe=call.ambiguous_retry_safe,
                sleep=self._rt.sleep,
            )
        except RpcError as exc:
            raise error_from_status(
                exc.code,
                exc.details,
                call=call.kind,
                method=label,
                kind=exc.kind,
                addr=self._address,
            ) from None


# In a Worker's `def` handler thread these raise rather than make a coroutine nothing runs
# (handler_threads): every call a handler makes. `reserve` and `ack`, the Worker's own calls
# for every job (a lookup through the guard costs about 0.2 µs), stay plain methods.
refuse_in_handler_threads(
    Client,
    (
        "enqueue",
        "enqueue_batch",
        "enqueue_atomic",
        "nack",
        "extend",
        "drain_dead_letters",
        "get_server_info",
    ),
)


def _batch_attributes(requests: Sequence[EnqueueRequest]) -> dict[str, int | list[str]]:
    # Passed to client_span as a lambda, so only built for a span; the guard is for any caller.
    if not _otel.tracing():
        return {}
    return {
        "sepp.batch_size": len(requests),
        "sepp.queues": sorted({r.queue for r in requests}),
        "sepp.job_types": sorted({r.job_type for r in requests}),
    }


def _lease_attributes(ctx: JobContext, **extra: str) -> dict[str, str | int]:
    if not _otel.tracing():
        return {}
    out: dict[str, str | int] = {
        "sepp.job_id": ctx.id,
        "sepp.queue": ctx.queue,
        "sepp.job_type": ctx.job_type,
        "sepp.attempt": ctx.attempt,
        **{f"sepp.{k}": v for k, v in extra.items()},
    }
    if ctx.worker_id is not None:
        out["sepp.worker_id"] = ctx.worker_id
    return out


def _other_run() -> OtherRunError:
    return OtherRunError(
        "this sepp.Client was opened in another trio.run() or asyncio event loop (or thread),"
        " and a client serves only the run that opened it: open one with"
        " `async with sepp.open(...)` in each run"
    )


def _record_results(
    span: _otel.NoopSpan | _otel.OtelSpan, results: Sequence[EnqueueAck | JobRejection]
) -> None:
    if isinstance(span, _otel.NoopSpan):
        return
    rejected = sum(isinstance(r, JobRejection) for r in results)
    span.set("sepp.accepted", len(results) - rejected)
    span.set("sepp.rejected", rejected)
    if len(results) == 1 and isinstance(results[0], EnqueueAck):
        span.set("sepp.job_id", results[0].job_id)


def open(
    address: str,
    *,
    api_key: str | None = None,
    tls: bool | ssl.SSLContext | None = None,
    tls_ca_cert: bytes | str | os.PathLike[str] | None = None,
    tls_domain: str | None = None,
    retry_policy: RetryPolicy | None = None,
    connect_timeout: float | timedelta = 5.0,
    rpc_timeout: float | timedelta | None = 30.0,
    max_receive_message_bytes: int | None = None,
    logger: LoggerLike | None = None,
    keepalive_interval: float | timedelta | None = 30.0,
    keepalive_timeout: float | timedelta = 10.0,
    enqueue_batching: Batching | None = None,
    validate_locally: bool = True,
    wire_engine: WireEngine | None = None,
) -> AbstractAsyncContextManager[Client]:
    """Connect to a sepp server; the client's connection tasks live until the block exits.

    `address` is `host:port`, `[v6]:port`, `http://host:port` or `https://host:port`.
    TLS is on for `https://`, `tls=True` (system roots), a `tls_ca_cert` (PEM bytes or a
    path), a `tls_domain` (server-name override, also sent as `:authority`) or a caller's
    `ssl.SSLContext`.
    `wire_engine` picks the HTTP/2 implementation: None (the default engine, "codec", our
    own) or "h2" (the reference engine, built on the h2 package).
    """
    options = ConnectOptions.parse(
        address,
        api_key=api_key,
        tls=tls,
        tls_ca_cert=tls_ca_cert,
        tls_domain=tls_domain,
        retry_policy=retry_policy,
        connect_timeout=connect_timeout,
        rpc_timeout=rpc_timeout,
        max_receive_message_bytes=max_receive_message_bytes,
        logger=logger,
        keepalive_interval=keepalive_interval,
        keepalive_timeout=keepalive_timeout,
        enqueue_batching=enqueue_batching,
        validate_locally=validate_locally,
        wire_engine=wire_engine,
    )
    return Opening(lambda runtime: _open_client(options, runtime))


def client_for(
    options: ConnectOptions,
    channel: ChannelBase,
    *,
    runtime: Runtime,
    nursery: TaskGroup | None = None,
) -> Client:
    """The Client `options` describe, over `channel` (its background tasks in `nursery`)."""
    return Client(
        channel,
        address=options.address,
        rpc_timeout=options.rpc_timeout_s,
        retry_policy=options.retry_policy,
        log=options.log,
        runtime=runtime,
        nursery=nursery,
        enqueue_batching=options.enqueue_batching,
        validate_locally=options.validate_locally,
    )


@asynccontextmanager
async def _open_client(options: ConnectOptions, runtime: Runtime) -> AsyncIterator[Client]:
    user_exc: BaseException | None = None
    async with runtime.open_task_group() as nursery:
        channel = runtime.channel(options.endpoint, options.channel_options(), nursery)
        client = client_for(options, channel, runtime=runtime, nursery=nursery)
        try:
            await client._connect()
            yield client
        except BaseException as exc:
            # Re-raised below, outside the nursery, so it is not wrapped in an ExceptionGroup.
            user_exc = exc
        finally:
            await client._close()
            nursery.cancel_scope.cancel()
    if user_exc is not None:
        try:
            raise user_exc
        finally:
            user_exc = None
