"""Dead-letter records as JSON lines, and back (for `replay --from`)."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import sepp

from .._model.types import JSON_ENCODING
from .._model.validate import custom_map
from ._output import json_line

# Replayed jobs carry this key + the dead job's id, so replaying the same records twice
# (a retry after a failure, `--from` a saved file) enqueues each job once.
REPLAY_KEY_PREFIX = "replay-"


class RecordFormatError(ValueError):
    """A line that is not a dead-letter record as `drain` writes them."""


def payload_to_json(payload: sepp.Payload | None) -> dict[str, object] | None:
    """The payload as readable JSON when that keeps its exact bytes, else base64."""
    if payload is None:
        return None
    if payload.encoding == JSON_ENCODING:
        try:
            value = json.loads(payload.data)
            # Not JSON we would write (spacing, or 1e400 read as inf): keep the exact text.
            if sepp.Payload.json(value).data == payload.data:
                return {"encoding": payload.encoding, "json": value}
        except ValueError:  # not JSON at all (sepp.ValidationError is a ValueError too)
            pass
    try:
        text = payload.data.decode("utf-8")
    except UnicodeDecodeError:
        encoded = base64.b64encode(payload.data).decode("ascii")
        return {"encoding": payload.encoding, "base64": encoded}
    return {"encoding": payload.encoding, "text": text}


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def record_to_json(record: sepp.DeadLetterRecord) -> dict[str, object]:
    trace = record.trace_context
    return {
        "job": {
            "id": record.job_id,
            "queue": record.queue,
            "job_type": record.job_type,
            "priority": record.priority,
            "attempt": record.attempt,
            "max_attempts": record.max_attempts,
            "custom": dict(record.custom),
            "enqueued_at": _time(record.enqueued_at),
            "scheduled_at": _time(record.scheduled_at),
            "trace_context": None
            if trace is None
            else {"traceparent": trace.traceparent, "tracestate": trace.tracestate},
            "payload": payload_to_json(record.payload),
        },
        "cause": record.cause.name.lower(),
        "failed_at": _time(record.failed_at),
        "final_attempt": record.final_attempt,
        "last_reason": record.last_reason,
    }


def record_line(record: sepp.DeadLetterRecord) -> str:
    return json_line(record_to_json(record))


# -- reading back ------------------------------------------------------------------------------


def _get(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise RecordFormatError(f"{where}: {key!r} is missing")
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise RecordFormatError(f"{where}: {key!r} has the wrong type ({type(value).__name__})")
    return value


def _optional_time(obj: Mapping[str, Any], key: str, where: str) -> datetime | None:
    text = _get(obj, key, (str, type(None)), where)
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise RecordFormatError(f"{where}: {key!r} is not an ISO 8601 time") from None
    if value.tzinfo is None:
        raise RecordFormatError(f"{where}: {key!r} has no UTC offset")
    return value


def payload_from_json(value: object) -> sepp.Payload | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RecordFormatError("job.payload: must be an object or null")
    encoding = _get(value, "encoding", str, "job.payload")
    if "json" in value:
        data = sepp.Payload.json(value["json"]).data
    elif "text" in value:
        data = _get(value, "text", str, "job.payload").encode("utf-8")
    else:
        try:
            data = base64.b64decode(_get(value, "base64", str, "job.payload"), validate=True)
        except binascii.Error:
            raise RecordFormatError("job.payload: 'base64' is not valid base64") from None
    return sepp.Payload(data, encoding)


def record_from_json(value: object) -> sepp.DeadLetterRecord:
    """The inverse of `record_to_json`; RecordFormatError (or ValidationError) if it is not."""
    if not isinstance(value, dict):
        raise RecordFormatError("a record must be a JSON object")
    job = _get(value, "job", dict, "record")
    trace = _get(job, "trace_context", (dict, type(None)), "job")
    cause_name = _get(value, "cause", str, "record")
    try:
        cause = sepp.DeadLetterCause[cause_name.upper()]
    except KeyError:
        raise RecordFormatError(f"record: unknown cause {cause_name!r}") from None
    return sepp.DeadLetterRecord(
        job_id=_get(job, "id", str, "job"),
        queue=_get(job, "queue", str, "job"),
        job_type=_get(job, "job_type", str, "job"),
        payload=payload_from_json(job.get("payload")),
        priority=_get(job, "priority", int, "job"),
        attempt=_get(job, "attempt", int, "job"),
        max_attempts=_get(job, "max_attempts", int, "job"),
        custom=custom_map("job.custom", _get(job, "custom", dict, "job")),
        trace_context=None
        if trace is None
        else sepp.TraceContext(
            _get(trace, "traceparent", str, "job.trace_context"),
            _get(trace, "tracestate", (str, type(None)), "job.trace_context"),
        ),
        enqueued_at=_optional_time(job, "enqueued_at", "job"),
        scheduled_at=_optional_time(job, "scheduled_at", "job"),
        cause=cause,
        failed_at=_optional_time(value, "failed_at", "record"),
        final_attempt=_get(value, "final_attempt", int, "record"),
        last_reason=_get(value, "last_reason", (str, type(None)), "record"),
    )


def replay_request(record: sepp.DeadLetterRecord) -> sepp.EnqueueRequest:
    """A fresh job from the record, keyed so that replaying it twice enqueues it once."""
    return dataclasses.replace(
        record.to_enqueue_request(), idempotency_key=REPLAY_KEY_PREFIX + record.job_id
    )
