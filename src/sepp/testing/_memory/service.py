"""`sepp.v1.QueueService` (and the health check) as sepp 0.1.1 answers it: request bytes in,
a status and response bytes out, with the server's checks, clamps and messages. No I/O; the
time is passed in. A Reserve that finds nothing and may wait comes back as a `Waiting`, which
the server retries when its queues get jobs, and answers empty at its deadline."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from ..._model.wire_format import LEN, VARINT, key, read_varint, varint
from ..._pb import queue_pb2 as pb
from . import encoding, rules
from .config import MemoryConfig
from .state import Accepted, NewJob, QueueFull, QueueState, StatusError

OK, INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION = 0, 3, 5, 9
INTERNAL, UNIMPLEMENTED, UNAUTHENTICATED = 13, 12, 16

SERVICE = "sepp.v1.QueueService"
HEALTH = "grpc.health.v1.Health"
SERVER_VERSION = "0.1.1"  # the release whose answers these are


@dataclass(frozen=True, slots=True)
class Reply:
    code: int = OK
    message: str = ""
    body: bytes | None = None  # the response message (None: trailers only)


@dataclass(slots=True)
class Waiting:
    """A Reserve with nothing to take yet: what to retry, and for how long (ms)."""

    queues: list[str]
    lease_ms: int
    max_jobs: int
    wait_ms: int


def _reserved(jobs: list[bytes]) -> Reply:
    return Reply(body=encoding.repeated_jobs(jobs))


EMPTY_RESERVE = Reply(body=b"")


class QueueService:
    def __init__(self, config: MemoryConfig, state: QueueState) -> None:
        self.config = config
        self.state = state
        self._methods: dict[str, Callable[[bytes, int], Reply | Waiting]] = {
            "EnqueueBatch": self._enqueue_batch,
            "EnqueueAtomic": self._enqueue_atomic,
            "Reserve": self._reserve,
            "Ack": self._ack,
            "Nack": self._nack,
            "Extend": self._extend,
            "DrainDeadLetters": self._drain,
            "GetServerInfo": self._server_info,
        }

    # -- the HTTP layer's entry points ----------------------------------------------------

    def authorize(self, path: str, authorization: bytes | None) -> Reply | None:
        """The API-key check, before anything else of a QueueService call (the health
        service is not behind it)."""
        allowed = self.config.api_keys
        if allowed is None or not path.startswith(f"/{SERVICE}/"):
            return None
        presented = None
        if authorization is not None and authorization.startswith(b"Bearer "):
            try:
                presented = authorization[7:].decode("ascii")
            except UnicodeDecodeError:
                presented = None
        if presented is None:
            return Reply(
                UNAUTHENTICATED,
                "missing API key; expected an `authorization: Bearer <key>` header",
            )
        if presented not in allowed:
            return Reply(UNAUTHENTICATED, "invalid API key")
        return None

    def knows(self, path: str) -> bool:
        service, _, method = path[1:].partition("/")
        if service == SERVICE:
            return method in self._methods
        return service == HEALTH and method == "Check"

    def call(self, path: str, body: bytes, now_ms: int) -> Reply | Waiting:
        """Answer one call (`path` as `knows` accepted it) at `now_ms`."""
        service, _, method = path[1:].partition("/")
        if service == HEALTH:
            return _health_check(body)
        self.state.sweep(now_ms)
        try:
            return self._methods[method](body, now_ms)
        except StatusError as exc:
            return Reply(exc.code, exc.message)
        except DecodeError as exc:
            return Reply(INTERNAL, f"failed to decode Protobuf message: {exc}")

    def retry_reserve(self, waiting: Waiting, now_ms: int) -> Reply | None:
        """A waiting Reserve tried again: its jobs, or None (still nothing)."""
        self.state.sweep(now_ms)
        jobs = self.state.reserve(waiting.queues, waiting.lease_ms, waiting.max_jobs, now_ms)
        return _reserved([job.message() for job in jobs]) if jobs else None

    # -- enqueue --------------------------------------------------------------------------

    def _batch(self, body: bytes) -> list[Any]:
        request = pb.EnqueueBatchRequest.FromString(body)
        jobs = list(request.jobs)
        if not jobs:
            raise StatusError(INVALID_ARGUMENT, "batch must contain at least one job")
        if len(jobs) > self.config.max_enqueue_batch:
            raise StatusError(
                INVALID_ARGUMENT,
                f"batch exceeds max_enqueue_batch ({self.config.max_enqueue_batch})",
            )
        return jobs

    def _classify(self, job: Any, now_ms: int) -> NewJob | Any:
        """The job ready for the commit, or its JobRejection message."""
        problem = rules.enqueue_problem(job)
        if problem is not None:
            return _rejection("invalid_request", {"message": problem})
        config = self.config
        if config.strict_queues and job.queue not in config.queues:
            return _rejection("unknown_queue", {"queue": job.queue})
        limits = config.limits(job.queue)
        broken = rules.limit_rejection(
            job,
            limits,
            max_queue_name_bytes=config.max_queue_name_bytes,
            max_job_type_bytes=config.max_job_type_bytes,
            max_idempotency_key_bytes=config.max_idempotency_key_bytes,
            now_ms=now_ms,
        )
        if broken is not None:
            return _rejection(*broken)
        max_attempts = (
            job.max_attempts if job.HasField("max_attempts") else limits.default_max_attempts
        )
        return NewJob(
            queue=job.queue,
            request=job,
            priority=job.priority if job.HasField("priority") else limits.default_priority,
            max_attempts=min(max_attempts, limits.max_attempts_ceiling),
            scheduled_at_ms=rules.timestamp_ms(job.scheduled_at)
            if job.HasField("scheduled_at")
            else None,
            idempotency_key=job.idempotency_key if job.HasField("idempotency_key") else None,
            dedup_window_ms=limits.dedup_window_ms,
            max_queue_depth=limits.max_queue_depth,
        )

    def _enqueue_batch(self, body: bytes, now_ms: int) -> Reply:
        classified = [self._classify(job, now_ms) for job in self._batch(body)]
        valid = [item for item in classified if isinstance(item, NewJob)]
        committed = iter(self.state.enqueue(valid, now_ms))
        response = pb.EnqueueBatchResponse()
        for item in classified:
            result = response.results.add()
            outcome = next(committed) if isinstance(item, NewJob) else item
            if isinstance(outcome, Accepted):
                result.success.job_id = outcome.job_id
                result.success.deduplicated = outcome.deduplicated
            elif isinstance(outcome, QueueFull):
                result.rejection.queue_full.queue = outcome.queue
                result.rejection.queue_full.limit = outcome.limit
            else:
                result.rejection.CopyFrom(outcome)
        return Reply(body=response.SerializeToString())

    def _enqueue_atomic(self, body: bytes, now_ms: int) -> Reply:
        classified = [self._classify(job, now_ms) for job in self._batch(body)]
        response = pb.EnqueueAtomicResponse()
        refused = [
            (index, item) for index, item in enumerate(classified) if not isinstance(item, NewJob)
        ]
        if refused:
            for index, rejection in refused:
                error = response.rejection.errors.add(index=index)
                error.rejection.CopyFrom(rejection)
            return Reply(body=response.SerializeToString())
        outcome = self.state.enqueue_atomic(classified, now_ms)
        for entry in outcome:
            if isinstance(entry, Accepted):
                response.success.responses.add(job_id=entry.job_id, deduplicated=entry.deduplicated)
            else:
                index, full = entry
                error = response.rejection.errors.add(index=index)
                error.rejection.queue_full.queue = full.queue
                error.rejection.queue_full.limit = full.limit
        if not outcome:  # cannot happen (a batch has a job), but say success, not nothing
            response.success.SetInParent()
        return Reply(body=response.SerializeToString())

    # -- reserve --------------------------------------------------------------------------

    def _reserve(self, body: bytes, now_ms: int) -> Reply | Waiting:
        request = pb.ReserveRequest.FromString(body)
        problem = rules.reserve_problem(request)
        if problem is not None:
            raise StatusError(INVALID_ARGUMENT, problem)
        config = self.config
        queues = list(request.queues)
        if len(queues) > config.max_reserve_queues:
            raise StatusError(
                INVALID_ARGUMENT,
                f"reserve exceeds max_reserve_queues ({config.max_reserve_queues})",
            )
        for queue in queues:
            if len(queue.encode("utf-8")) > config.max_queue_name_bytes:
                raise StatusError(
                    INVALID_ARGUMENT,
                    f"queue name {rules.rust_debug(queue)} exceeds max_queue_name_bytes "
                    f"({config.max_queue_name_bytes})",
                )
        if config.strict_queues:
            unknown = [queue for queue in queues if queue not in config.queues]
            if unknown:
                raise StatusError(
                    FAILED_PRECONDITION,
                    f"queue(s) not declared (strict mode): {rules.rust_debug_list(unknown)}",
                )
        ceiling = min(config.limits(queue).max_lease_duration_ms for queue in queues)
        lease_ms = max(min(rules.duration_ms(request.lease_duration), ceiling), 1)
        max_jobs = request.max_jobs if request.HasField("max_jobs") else 1
        max_jobs = min(max(max_jobs, 1), config.max_reserve_batch)
        wait_ms = rules.duration_ms(request.wait_timeout) if request.HasField("wait_timeout") else 0
        wait_ms = min(wait_ms, config.max_wait_timeout_ms)
        jobs = self.state.reserve(queues, lease_ms, max_jobs, now_ms)
        if jobs:
            return _reserved([job.message() for job in jobs])
        if wait_ms == 0:
            return EMPTY_RESERVE
        return Waiting(queues, lease_ms, max_jobs, wait_ms)

    # -- lease calls ------------------------------------------------------------------------

    def _ack(self, body: bytes, now_ms: int) -> Reply:
        request = pb.AckRequest.FromString(body)
        _check(rules.ack_problem(request))
        self.state.ack(request.job_id, request.attempt)
        return Reply(body=pb.AckResponse(job_id=request.job_id).SerializeToString())

    def _nack(self, body: bytes, now_ms: int) -> Reply:
        request = pb.NackRequest.FromString(body)
        _check(rules.nack_problem(request))
        strategy = request.retry.WhichOneof("strategy") if request.HasField("retry") else None
        dead_letter = strategy == "dead_letter"
        delay_ms = 0 if dead_letter else self._retry_delay_ms(request, strategy)
        dead_lettered = self.state.nack(
            request.job_id,
            request.attempt,
            retry_delay_ms=delay_ms,
            dead_letter=dead_letter,
            reason=request.reason if request.HasField("reason") else None,
            now_ms=now_ms,
        )
        response = pb.NackResponse(job_id=request.job_id, dead_lettered=dead_lettered)
        return Reply(body=response.SerializeToString())

    def _retry_delay_ms(self, request: Any, strategy: str | None) -> int:
        explicit = rules.duration_ms(request.retry.delay) if strategy == "delay" else None
        if explicit is None and not self.config.any_retry_policy:
            return 0
        queue = self.state.in_flight_queue(request.job_id)
        if queue is None:
            return 0  # not leased: the nack itself is refused
        limits = self.config.limits(queue)
        if explicit is not None:
            return min(explicit, limits.max_schedule_horizon_ms)
        return policy_retry_delay_ms(
            delay_ms=limits.retry_delay_ms,
            exponential=limits.retry_backoff == "exponential",
            max_delay_ms=min(limits.retry_delay_max_ms, limits.max_schedule_horizon_ms),
            attempt=request.attempt,
            job_id=request.job_id,
        )

    def _extend(self, body: bytes, now_ms: int) -> Reply:
        request = pb.ExtendRequest.FromString(body)
        _check(rules.extend_problem(request))
        lease_ms = max(rules.duration_ms(request.lease_duration), 1)
        if lease_ms > self.config.min_max_lease_ms:
            queue = self.state.in_flight_queue(request.job_id)
            if queue is None:
                raise StatusError(NOT_FOUND, "job not found")
            lease_ms = min(lease_ms, self.config.limits(queue).max_lease_duration_ms)
        expires_ms = self.state.extend(request.job_id, request.attempt, lease_ms, now_ms)
        response = pb.ExtendResponse(job_id=request.job_id)
        response.lease_expires_at.FromMilliseconds(expires_ms)
        return Reply(body=response.SerializeToString())

    # -- dead letters and server info ------------------------------------------------------

    def _drain(self, body: bytes, now_ms: int) -> Reply:
        request = pb.DrainDeadLettersRequest.FromString(body)
        _check(rules.drain_problem(request))
        config = self.config
        most = request.max if request.HasField("max") else 1
        most = min(max(most, 1), config.max_reserve_batch)
        queue = request.queue if request.HasField("queue") else None
        records = self.state.drain(queue, most, config.sweep_limit)
        out = []
        for record in records:
            fields = [
                _RECORD_JOB + varint(len(record.job)) + record.job,
                _RECORD_CAUSE + varint(record.cause),
            ]
            failed_at = encoding.timestamp_body(record.failed_at_ms)
            fields.append(_RECORD_FAILED_AT + varint(len(failed_at)) + failed_at)
            if record.final_attempt:
                fields.append(_RECORD_FINAL_ATTEMPT + varint(record.final_attempt))
            if record.last_reason is not None:
                reason = record.last_reason.encode("utf-8")
                fields.append(_RECORD_LAST_REASON + varint(len(reason)) + reason)
            message = b"".join(fields)
            out.append(_RECORDS + varint(len(message)) + message)
        return Reply(body=b"".join(out))

    def _server_info(self, body: bytes, now_ms: int) -> Reply:
        pb.GetServerInfoRequest.FromString(body)
        config = self.config
        defaults = config.defaults
        info = pb.GetServerInfoResponse(
            server_version=SERVER_VERSION,
            supported_protocol_versions=["v1"],
            restricts_encodings=defaults.allowed_encodings is not None,
            allowed_encodings=list(defaults.allowed_encodings or ()),
            max_payload_bytes=defaults.max_payload_bytes,
            max_custom_entries=defaults.max_custom_entries,
            max_custom_total_bytes=defaults.max_custom_total_bytes,
            max_custom_key_bytes=defaults.max_custom_key_bytes,
            max_queue_name_bytes=config.max_queue_name_bytes,
            max_job_type_bytes=config.max_job_type_bytes,
            max_idempotency_key_bytes=config.max_idempotency_key_bytes,
            max_enqueue_batch=config.max_enqueue_batch,
            max_reserve_batch=config.max_reserve_batch,
            max_reserve_queues=config.max_reserve_queues,
            strict_queues=config.strict_queues,
            dead_letter_retention_enabled=config.dead_letter_retention_ms > 0,
        )
        info.server_time.FromMilliseconds(now_ms)
        info.max_schedule_horizon.FromMilliseconds(defaults.max_schedule_horizon_ms)
        info.max_wait_timeout.FromMilliseconds(config.max_wait_timeout_ms)
        info.max_lease_duration.FromMilliseconds(defaults.max_lease_duration_ms)
        return Reply(body=info.SerializeToString())


_RECORDS = key(1, LEN)  # DrainDeadLettersResponse.records
_RECORD_JOB = key(1, LEN)
_RECORD_CAUSE = key(2, VARINT)
_RECORD_FAILED_AT = key(3, LEN)
_RECORD_FINAL_ATTEMPT = key(4, VARINT)
_RECORD_LAST_REASON = key(5, LEN)


def _check(problem: str | None) -> None:
    if problem is not None:
        raise StatusError(INVALID_ARGUMENT, problem)


def _rejection(reason: str, fields: dict[str, Any]) -> Any:
    rejection = pb.JobRejection()
    detail = getattr(rejection, reason)
    if reason == "scheduled_too_far":
        detail.horizon.FromMilliseconds(fields["horizon_ms"])
        detail.actual.CopyFrom(fields["actual"])
        return rejection
    for name, value in fields.items():
        if isinstance(value, list):
            getattr(detail, name).extend(value)
        else:
            setattr(detail, name, value)
    detail.SetInParent()
    return rejection


# -- the retry policy's delay -------------------------------------------------------------------

_MASK = (1 << 64) - 1


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (64 - bits))) & _MASK


def siphash13(data: bytes) -> int:
    """SipHash-1-3 with zero keys: what the server's standard-library hasher computes."""
    v0, v1, v2, v3 = 0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573

    def rounds(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
        v0 = (v0 + v1) & _MASK
        v1 = _rotl(v1, 13) ^ v0
        v0 = _rotl(v0, 32)
        v2 = (v2 + v3) & _MASK
        v3 = _rotl(v3, 16) ^ v2
        v0 = (v0 + v3) & _MASK
        v3 = _rotl(v3, 21) ^ v0
        v2 = (v2 + v1) & _MASK
        v1 = _rotl(v1, 17) ^ v2
        v2 = _rotl(v2, 32)
        return v0, v1, v2, v3

    length = len(data)
    whole = length - length % 8
    for start in range(0, whole, 8):
        word = int.from_bytes(data[start : start + 8], "little")
        v3 ^= word
        v0, v1, v2, v3 = rounds(v0, v1, v2, v3)
        v0 ^= word
    last = ((length & 0xFF) << 56) | int.from_bytes(data[whole:], "little")
    v3 ^= last
    v0, v1, v2, v3 = rounds(v0, v1, v2, v3)
    v0 ^= last
    v2 ^= 0xFF
    for _ in range(3):
        v0, v1, v2, v3 = rounds(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


def policy_retry_delay_ms(
    *, delay_ms: int, exponential: bool, max_delay_ms: int, attempt: int, job_id: str
) -> int:
    """The queue policy's delay for a nack of `attempt`: the base, doubled per attempt if
    exponential, capped, minus a jitter of up to a quarter drawn from the job id and attempt
    (the server's hash of them, so the same job and attempt get the same delay)."""
    if delay_ms == 0:
        return 0
    grown = delay_ms
    if exponential:  # saturating, as the server's 64-bit arithmetic
        exponent = max(attempt - 1, 0)
        grown = _MASK if exponent >= 64 else min(delay_ms << exponent, _MASK)
    capped = min(grown, max_delay_ms)
    # The hash of (job id as a string, attempt as a u32): the id's bytes, a 0xFF, the attempt.
    jitter = siphash13(job_id.encode("utf-8") + b"\xff" + attempt.to_bytes(4, "little"))
    return capped - jitter % (capped // 4 + 1)


# -- the health service ---------------------------------------------------------------------------

_SERVING = b"\x08\x01"  # HealthCheckResponse{status: SERVING}


def _health_check(body: bytes) -> Reply:
    name = ""
    pos, end = 0, len(body)
    try:
        while pos < end:
            tag, pos = read_varint(body, pos, end)
            wire = tag & 7
            if wire == VARINT:
                _, pos = read_varint(body, pos, end)
            elif wire == LEN:
                length, pos = read_varint(body, pos, end)
                if pos + length > end:
                    raise ValueError("truncated")
                if tag >> 3 == 1:
                    name = body[pos : pos + length].decode("utf-8")
                pos += length
            else:
                raise ValueError("unexpected wire type")
    except ValueError as exc:
        return Reply(INTERNAL, f"failed to decode Protobuf message: {exc}")
    if name in ("", SERVICE):
        return Reply(body=_SERVING)
    return Reply(NOT_FOUND, "service not registered")
