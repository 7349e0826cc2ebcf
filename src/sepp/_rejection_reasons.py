"""The JobRejection subclasses, one per server reason, and their descriptions. Imported on first
use (a rejection arriving, a local limit check failing, `sepp.QueueFull` and the like), not by
`import sepp`: 15 dataclasses are a third of what the client's own modules cost to import."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from ._rejections import JobRejection as JobRejection  # for `rj.JobRejection`


@dataclass(frozen=True, slots=True)
class UnknownQueue(JobRejection):
    queue: str


@dataclass(frozen=True, slots=True)
class PayloadTooLarge(JobRejection):
    limit: int
    actual: int


@dataclass(frozen=True, slots=True)
class EncodingNotAllowed(JobRejection):
    encoding: str
    allowed: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class JobTypeNotAllowed(JobRejection):
    job_type: str
    allowed: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CustomEntriesTooMany(JobRejection):
    limit: int
    actual: int


@dataclass(frozen=True, slots=True)
class CustomMapTooLarge(JobRejection):
    limit: int
    actual: int


@dataclass(frozen=True, slots=True)
class CustomKeyTooLong(JobRejection):
    key: str
    limit: int
    actual: int


@dataclass(frozen=True, slots=True)
class QueueNameTooLong(JobRejection):
    limit: int
    actual: int


@dataclass(frozen=True, slots=True)
class JobTypeNameTooLong(JobRejection):
    limit: int
    actual: int


@dataclass(frozen=True, slots=True)
class IdempotencyKeyTooLong(JobRejection):
    limit: int
    actual: int


@dataclass(frozen=True, slots=True)
class ScheduledTooFar(JobRejection):
    horizon: timedelta
    actual: datetime | None


@dataclass(frozen=True, slots=True)
class InvalidRequest(JobRejection):
    detail: str


@dataclass(frozen=True, slots=True)
class QueueFull(JobRejection):
    queue: str
    limit: int

    @property
    def retryable(self) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class QueueClosing(JobRejection):
    queue: str

    @property
    def retryable(self) -> bool:
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
