"""A job as an outbox row and back. `custom` is JSON, which keeps str, int, float and bool
apart (and NaN and the infinities, as Python's json writes them)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone

from .._model.types import EnqueueRequest, Payload
from .dialects import SQLITE


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """A claimed row: its id and the values of `dialects.JOB_COLUMNS`."""

    id: int
    values: tuple[object, ...]


def row_values(request: EnqueueRequest, dialect: str) -> tuple[object, ...]:
    """The values of `dialects.JOB_COLUMNS` for `request` (which has an idempotency key)."""
    payload = request.payload
    scheduled_at: object = request.scheduled_at
    if scheduled_at is not None and dialect == SQLITE:
        scheduled_at = request.scheduled_at.isoformat()  # type: ignore[union-attr]
    return (
        request.queue,
        request.job_type,
        payload.data if payload is not None else None,
        payload.encoding if payload is not None else None,
        request.idempotency_key,
        request.priority,
        request.max_attempts,
        scheduled_at,
        json.dumps(dict(request.custom), separators=(",", ":")) if request.custom else None,
    )


def request_of(values: tuple[object, ...]) -> EnqueueRequest:
    """The job a row holds; ValidationError (or ValueError, TypeError) if it was tampered
    with: EnqueueRequest checks every field again."""
    queue, job_type, data, encoding, key, priority, max_attempts, scheduled_at, custom = values
    payload = None
    if data is not None:
        payload = Payload(bytes(data), encoding)  # type: ignore[call-overload, arg-type]
    if isinstance(scheduled_at, str):
        scheduled_at = datetime.fromisoformat(scheduled_at)
    if isinstance(scheduled_at, datetime) and scheduled_at.tzinfo is None:
        scheduled_at = scheduled_at.replace(tzinfo=timezone.utc)
    return EnqueueRequest(
        queue,  # type: ignore[arg-type]
        job_type,  # type: ignore[arg-type]
        payload=payload,
        idempotency_key=key,  # type: ignore[arg-type]
        priority=priority,  # type: ignore[arg-type]
        max_attempts=max_attempts,  # type: ignore[arg-type]
        custom=json.loads(custom) if custom else {},  # type: ignore[arg-type]
        scheduled_at=scheduled_at,  # type: ignore[arg-type]
    )
