"""The JobRejection subclasses, one per server reason, and their descriptions. Imported on first
use (a rejection arriving, a local limit check failing, `sepp.QueueFull` and the like), not by
`import sepp`: 15 dataclasses are a third of what the client's own modules cost to import."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from .rejections import JobRejection as JobRejection


@dataclass(frozen=True, slots=True)
class UnknownQueue(JobRejection):
    """The queue does not exist (the server runs with `strict_queues` and did not declare it)."""

    queue: str


@dataclass(frozen=True, slots=True)
class PayloadTooLarge(JobRejection):
    """The payload is larger than the server's (or the queue's) `max_payload_bytes`."""

    limit: int
    actual: int


@dataclass(frozen=True, slots=True)
class EncodingNotAllowed(JobRejection):
    """The server (or the queue) accepts only the payload encodings in `allowed`."""

    encoding: str
    allowed: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class JobTypeNotAllowed(JobRejection):
    """The queue accepts only the job types in `allowed`."""

    job_type: str
    allowed: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CustomEntriesTooMany(JobRejection):
    """The custom map has more entries than the server allows."""

    limit: int
    actual: int


@dataclass(frozen=True, slots=True)
class CustomMapTooLarge(JobRejection):
    """The custom map's keys and values together are larger than the server allows."""

    limit: int
    actual: int


@dataclass(frozen=True, slots=True)
class CustomKeyTooLong(JobRejection):
    """A custom key is longer than the server allows."""

    key: str
    limit: int
    actual: int


@dataclass(frozen=True, slots=True)
class QueueNameTooLong(JobRejection):
    """The queue name is longer than the server allows."""

    limit: int
    actual: int


@dataclass(frozen=True, slots=True)
class JobTypeNameTooLong(JobRejection):
    """The job type is longer than the server allows."""

    limit: int
    actual: int


@dataclass(frozen=True, slots=True)
class IdempotencyKeyTooLong(JobRejection):
    """The idempotency key is longer than the server allows."""

    limit: int
    actual: int


@dataclass(frozen=True, slots=True)
class ScheduledTooFar(JobRejection):
    """`scheduled_at` is further ahead than the server's `max_schedule_horizon`."""

    horizon: timedelta
    actual: datetime | None


@dataclass(frozen=True, slots=True)
class InvalidRequest(JobRejection):
    """The server found the job malformed; `detail` says how."""

    detail: str


@dataclass(frozen=True, slots=True)
class QueueFull(JobRejection):
    """The queue holds its maximum of `limit` jobs; retryable once it drains."""

    queue: str
    limit: int

    @property
    def retryable(self) -> bool:
        """True: the same job may succeed later."""
        return True


@dataclass(frozen=True, slots=True)
class QueueClosing(JobRejection):
    """The queue is being deleted; retryable once the deletion finishes or is abandoned."""

    queue: str

    @property
    def retryable(self) -> bool:
        """True: the same job may succeed later."""
        return True


@dataclass(frozen=True, slots=True)
class UnknownRejection(JobRejection):
    """A rejection reason this client version does not know (or none at all)."""


def describe_job_rejection(rejection: JobRejection) -> str:
    """A one-line, human-readable explanation of a rejection."""
    r = rejection
    if isinstance(r, UnknownQueue):
        return f"unknown queue {r.queue!r}"
    if isinstance(r, PayloadTooLarge):
        return f"payload of {r.actual} bytes exceeds the {r.limit}-byte limit"
    if isinstance(r, EncodingNotAllowed):
        return f"encoding {r.encoding!r} not allowed (allowed: {', '.join(r.allowed) or 'none'})"
    if isinstance(r, JobTypeNotAllowed):
        return f"job type {r.job_type!r} not allowed (allowed: {', '.join(r.allowed) or 'none'})"
    if isinstance(r, CustomEntriesTooMany):
        return f"{r.actual} custom entries exceed the limit of {r.limit}"
    if isinstance(r, CustomMapTooLarge):
        return f"custom map of {r.actual} bytes exceeds the {r.limit}-byte limit"
    if isinstance(r, CustomKeyTooLong):
        return f"custom key {r.key!r} of {r.actual} bytes exceeds the {r.limit}-byte limit"
    if isinstance(r, QueueNameTooLong):
        return f"queue name of {r.actual} bytes exceeds the {r.limit}-byte limit"
    if isinstance(r, JobTypeNameTooLong):
        return f"job type of {r.actual} bytes exceeds the {r.limit}-byte limit"
    if isinstance(r, IdempotencyKeyTooLong):
        return f"idempotency key of {r.actual} bytes exceeds the {r.limit}-byte limit"
    if isinstance(r, ScheduledTooFar):
        when = r.actual.isoformat() if r.actual is not None else "the requested time"
        return f"{when} is beyond the scheduling horizon of {r.horizon}"
    if isinstance(r, InvalidRequest):
        return f"invalid request: {r.detail}"
    if isinstance(r, QueueFull):
        return f"queue {r.queue!r} is full (limit {r.limit})"
    if isinstance(r, QueueClosing):
        return f"queue {r.queue!r} is closing"
    return "rejected for a reason this client does not know"
