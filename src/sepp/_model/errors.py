"""The SeppError tree, and the one place that maps a gRPC status to an error."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from ..wire._failure import FailureKind
from ..wire._status import StatusCode
from .rejections import BatchRejection, JobRejection


class SeppError(Exception):
    """Root of every error sepp-trio raises."""


class ValidationError(SeppError, ValueError):
    """Input refused before anything was sent; `field` names what was wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class ClientError(SeppError):
    """A call failed. `code` is the gRPC status (None for purely local failures) and
    `details` the server's message."""

    def __init__(self, message: str, *, code: StatusCode | None = None, details: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.details = details


class ConnectError(ClientError):
    """No connection could be made to the server (refused, unreachable, TLS, timeout)."""

    def __init__(self, addr: str, reason: str) -> None:
        super().__init__(
            f"cannot connect to {addr}: {reason}", code=StatusCode.UNAVAILABLE, details=reason
        )
        self.addr = addr
        self.reason = reason


class TransportError(ClientError):
    """The call did not complete: UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, CANCELLED, or a
    broken connection. Whether the server acted on it is unknown unless `code` is UNAVAILABLE
    before any response (retry-safe) — see the retry policy."""


class UnauthenticatedError(ClientError):
    """The server refused the API key (UNAUTHENTICATED / PERMISSION_DENIED)."""


class OverloadedError(ClientError):
    """The server shed load (RESOURCE_EXHAUSTED)."""


class InvalidRequestError(ClientError):
    """The server refused the request as malformed (INVALID_ARGUMENT)."""


class ServerInternalError(ClientError):
    """The server failed internally (INTERNAL, DATA_LOSS, UNKNOWN)."""


class UnexpectedStatusError(ClientError):
    """A status code this call does not expect."""


class MalformedResponseError(ClientError):
    """The server's response could not be understood (bad framing, protobuf or fields)."""


class MessageTooLargeError(ClientError):
    """A response message exceeded `max_receive_message_bytes` (a gzip-compressed one once
    decompressed); it was refused unread."""


class ClientInternalError(ClientError):
    """A bug in sepp-trio itself, never in the calling code (private: users see a
    ClientError whose message begins "sepp internal error")."""

    def __init__(self, what: str) -> None:
        super().__init__(f"sepp internal error: {what}")


class OtherRunError(ClientError, RuntimeError):
    """A client was used from a trio run or asyncio event loop other than the one that opened
    it (private: users see a ClientError, and a RuntimeError as before)."""


class JobRejectedError(SeppError):
    """`enqueue` of one job was rejected; `rejection` says why."""

    def __init__(self, rejection: JobRejection) -> None:
        from .rejection_reasons import describe_job_rejection

        super().__init__(f"job rejected: {describe_job_rejection(rejection)}")
        self.rejection = rejection


class BatchValidationError(SeppError):
    """An atomic enqueue was refused as a whole; `errors` lists each offending job."""

    def __init__(self, errors: Sequence[BatchRejection]) -> None:
        from .rejection_reasons import describe_job_rejection

        parts = "; ".join(
            f"#{e.index}: {describe_job_rejection(e.rejection)}" for e in list(errors)[:5]
        )
        more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
        super().__init__(f"atomic enqueue rejected: {parts}{more}")
        self.errors = list(errors)


class LeaseError(SeppError):
    """An ack, nack or extend found the lease gone."""

    def __init__(self, message: str, *, code: StatusCode | None = None, details: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.details = details


class JobNotFoundError(LeaseError):
    """No in-flight record for the job: already acked/nacked, swept after expiry, or unknown.
    After a retried ack or nack it may mean the first attempt succeeded."""


class AttemptMismatchError(LeaseError):
    """The job is in flight under a newer attempt: this lease was lost."""


class UnknownQueuesError(SeppError):
    """Reserve named a queue the server (in strict mode) does not declare."""

    def __init__(self, message: str, *, code: StatusCode | None = None, details: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.details = details


class ResultError(SeppError):
    """A result handle gives no result: `JobFailedError`, `ResultTimeoutError` or
    `ResultUnavailableError`."""


class JobFailedError(ResultError):
    """The awaited job, or a step of its chain, was dead-lettered: no result will come.
    `job_id`, `queue`, `job_type` and `reason` (the dead letter's `last_reason`) name the job
    that failed; `chain_id`, `step` and `steps` its place in a chain (None outside one)."""

    def __init__(
        self,
        *,
        job_id: str,
        queue: str,
        job_type: str,
        reason: str,
        chain_id: str | None = None,
        step: int | None = None,
        steps: int | None = None,
    ) -> None:
        where = "" if chain_id is None else f" (step {step} of {steps} of chain {chain_id})"
        super().__init__(f"{job_type}[{job_id}] on {queue}{where} was dead-lettered: {reason}")
        self.job_id = job_id
        self.queue = queue
        self.job_type = job_type
        self.reason = reason
        self.chain_id = chain_id
        self.step = step
        self.steps = steps


class ResultTimeoutError(ResultError, TimeoutError):
    """No result within the `timeout` given to `result()`: the job may still succeed, and
    `result()` may be called again (until the handle's `result_ttl` has passed)."""


class ResultUnavailableError(ResultError):
    """No result will come to this handle: its `result_ttl` passed (a worker sends none after
    it), the enqueue was deduplicated (the result goes to whoever enqueued the job first), or
    the client closed or lost its reply queue."""


CallKind = Literal["generic", "lease", "reserve"]

_BY_CODE: dict[StatusCode, type[ClientError]] = {
    StatusCode.UNAVAILABLE: TransportError,
    StatusCode.DEADLINE_EXCEEDED: TransportError,
    StatusCode.ABORTED: TransportError,
    StatusCode.CANCELLED: TransportError,
    StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    StatusCode.PERMISSION_DENIED: UnauthenticatedError,
    StatusCode.RESOURCE_EXHAUSTED: OverloadedError,
    StatusCode.INVALID_ARGUMENT: InvalidRequestError,
    StatusCode.INTERNAL: ServerInternalError,
    StatusCode.DATA_LOSS: ServerInternalError,
    StatusCode.UNKNOWN: ServerInternalError,
}

_LOCAL_KINDS: dict[FailureKind, type[ClientError]] = {
    FailureKind.TOO_LARGE: MessageTooLargeError,
    FailureKind.COMPRESSED: MalformedResponseError,
    FailureKind.MALFORMED: MalformedResponseError,
}


# Ports a sepp server listens on by default: its gRPC job API and its admin UI.
DEFAULT_GRPC_PORT = 50051
DEFAULT_ADMIN_PORT = 9465


def not_grpc_hint(addr: str) -> str:
    """Said of an HTTP answer that is not gRPC's (a 404, a 400): the address is most likely
    another HTTP server, such as sepp's admin UI. (A proxy's 502/503/504 means the backend is
    down instead, and gets no hint.)"""
    where = addr or "this address"
    return (
        f" (not a gRPC answer: {where} is probably not sepp's gRPC port; the server's job API"
        f" listens on {DEFAULT_GRPC_PORT} by default, its admin UI on {DEFAULT_ADMIN_PORT})"
    )


def error_from_status(
    code: StatusCode,
    details: str,
    *,
    call: CallKind = "generic",
    method: str = "",
    kind: FailureKind | None = None,
    addr: str = "",
) -> SeppError:
    """Map a failed call to its typed error (the one mapper; see peer-clients §2.3)."""
    where = f"{method}: " if method else ""
    text = f"{where}{code.name}: {details}" if details else f"{where}{code.name}"
    if kind is FailureKind.HTTP and code is not StatusCode.UNAVAILABLE:
        text += not_grpc_hint(addr)
    if kind is FailureKind.CONNECT:
        return ConnectError(addr, details)
    local = _LOCAL_KINDS.get(kind) if kind is not None else None
    if local is not None:
        return local(f"{where}{details}", code=code, details=details)
    if call == "lease":
        if code is StatusCode.NOT_FOUND:
            return JobNotFoundError(text, code=code, details=details)
        if code is StatusCode.FAILED_PRECONDITION:
            return AttemptMismatchError(text, code=code, details=details)
    if call == "reserve" and code is StatusCode.FAILED_PRECONDITION:
        return UnknownQueuesError(text, code=code, details=details)
    return _BY_CODE.get(code, UnexpectedStatusError)(text, code=code, details=details)
