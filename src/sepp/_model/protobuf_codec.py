"""The reference message codec: the generated protobuf classes and `convert`. Selected with
SEPP_MESSAGE_CODEC=protobuf; the tests hold our own codec (wire_requests, wire_responses) to
what this one does. The same functions as those modules, with protobuf's parse errors
re-raised as wire_format.DecodeError.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from . import convert as cv
from .errors import BatchValidationError
from .rejections import BatchRejection
from .types import (
    DeadLetterRecord,
    EnqueueAck,
    EnqueueRequest,
    Job,
    Retry,
    ServerInfo,
    TraceContext,
)
from .wire_format import DecodeError

if TYPE_CHECKING:
    from .._pb import queue_pb2 as pb
    from .rejections import JobRejection
else:  # protobuf loads with the first call
    from .._util.lazy import lazy_module

    pb = lazy_module("sepp._pb.queue_pb2")

M = TypeVar("M")


def preload() -> None:
    """Load the message classes (about 25 ms) before the first call needs them."""
    pb.DESCRIPTOR  # noqa: B018


def _parse(cls: type[M], body: bytes) -> M:
    try:
        return cls.FromString(body)  # type: ignore[attr-defined,no-any-return]
    except Exception as exc:
        raise DecodeError(str(exc)) from exc


# -- requests -------------------------------------------------------------------------------


def enqueue_batch(jobs: Iterable[EnqueueRequest], trace: TraceContext | None = None) -> bytes:
    return cv.enqueue_batch_to_pb(jobs, trace)


def reserve(
    queues: Sequence[str],
    wait_s: float,
    lease_s: float,
    worker_id: str | None,
    max_jobs: int | None,
) -> bytes:
    msg = pb.ReserveRequest(queues=queues)
    cv.duration_to_pb(wait_s, msg.wait_timeout)
    cv.duration_to_pb(lease_s, msg.lease_duration)
    if worker_id is not None:
        msg.worker_id = worker_id
    if max_jobs is not None:
        msg.max_jobs = max_jobs
    return msg.SerializeToString()


def ack(job_id: str, attempt: int, worker_id: str | None) -> bytes:
    msg = pb.AckRequest(job_id=job_id, attempt=attempt)
    if worker_id is not None:
        msg.worker_id = worker_id
    return msg.SerializeToString()


def nack(
    job_id: str, attempt: int, reason: str | None, retry: Retry, worker_id: str | None
) -> bytes:
    msg = pb.NackRequest(job_id=job_id, attempt=attempt)
    if reason:
        msg.reason = reason
    if retry.kind == "delay" and retry.delay is not None:
        cv.duration_to_pb(retry.delay.total_seconds(), msg.retry.delay)
    elif retry.kind == "dead_letter":
        msg.retry.dead_letter.SetInParent()
    else:
        msg.retry.default.SetInParent()
    if worker_id is not None:
        msg.worker_id = worker_id
    return msg.SerializeToString()


def extend(job_id: str, attempt: int, lease_s: float, worker_id: str | None) -> bytes:
    msg = pb.ExtendRequest(job_id=job_id, attempt=attempt)
    cv.duration_to_pb(lease_s, msg.lease_duration)
    if worker_id is not None:
        msg.worker_id = worker_id
    return msg.SerializeToString()


def drain_dead_letters(queue: str | None, max: int) -> bytes:
    msg = pb.DrainDeadLettersRequest(max=max)
    if queue is not None:
        msg.queue = queue
    return msg.SerializeToString()


# -- responses ------------------------------------------------------------------------------


def batch_results(body: bytes, expected: int) -> list[EnqueueAck | JobRejection]:
    results = _parse(pb.EnqueueBatchResponse, body).results
    if len(results) != expected:
        raise cv.Malformed(f"expected {expected} results, got {len(results)}")
    return [cv.job_result_from_pb(result) for result in results]


def single_result(body: bytes) -> EnqueueAck | JobRejection:
    return batch_results(body, 1)[0]


def atomic_acks(body: bytes, expected: int) -> list[EnqueueAck]:
    msg = _parse(pb.EnqueueAtomicResponse, body)
    which = msg.WhichOneof("outcome")
    if which == "rejection":
        raise BatchValidationError(
            [
                BatchRejection(e.index, cv.rejection_from_pb(e.rejection))
                for e in msg.rejection.errors
            ]
        )
    if which != "success":
        raise cv.Malformed("response has no outcome")
    responses = msg.success.responses
    if len(responses) != expected:
        raise cv.Malformed(f"expected {expected} results, got {len(responses)}")
    return [cv.ack_from_pb(r) for r in responses]


def reserved_jobs(body: bytes) -> Sequence[Any]:
    return _parse(pb.ReserveResponse, body).jobs


def job(fields: Any, worker_id: str | None, client: object = None) -> Job:
    return cv.job_from_pb(fields, worker_id, client)


def ack_response(body: bytes) -> None:
    _parse(pb.AckResponse, body)


def nack_dead_lettered(body: bytes) -> bool:
    return _parse(pb.NackResponse, body).dead_lettered


def extended_until(body: bytes) -> datetime:
    response = _parse(pb.ExtendResponse, body)
    if not response.HasField("lease_expires_at"):
        raise cv.Malformed("response has no lease_expires_at")
    return cv.timestamp_from_pb(response.lease_expires_at)


def dead_letter_records(body: bytes) -> Sequence[Any]:
    return _parse(pb.DrainDeadLettersResponse, body).records


def dead_letter(record: Any) -> DeadLetterRecord:
    return cv.dead_letter_from_pb(record)


def server_info(body: bytes) -> ServerInfo:
    return cv.server_info_from_pb(_parse(pb.GetServerInfoResponse, body))
