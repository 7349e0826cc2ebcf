"""Local checks of jobs against the server's advertised (global) limits, so a job the server
would reject costs no round trip. The server keeps the final word: per-queue overrides are
not advertised."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from . import _rejections as rj
from ._types import EnqueueRequest, ServerInfo

# Only reject a schedule this far past the estimated horizon: the server's clock is estimated.
_SCHEDULE_SLACK = timedelta(seconds=2)


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8"))


def custom_map_bytes(request: EnqueueRequest) -> int:
    """Key bytes plus value bytes; an int or double counts 8 and a bool 1 (server rule)."""
    total = 0
    for key, value in request.custom.items():
        total += _utf8_len(key)
        if isinstance(value, bool):
            total += 1
        elif isinstance(value, (int, float)):
            total += 8
        else:
            total += _utf8_len(value)
    return total


class ServerLimits:
    """A cached ServerInfo and the local clock reading taken when it was fetched."""

    __slots__ = ("fetched_at", "info")

    def __init__(self, info: ServerInfo, fetched_at: datetime) -> None:
        self.info = info
        self.fetched_at = fetched_at

    def server_now(self) -> datetime:
        return self.info.server_time + (datetime.now(timezone.utc) - self.fetched_at)

    def check(self, request: EnqueueRequest) -> rj.JobRejection | None:
        info = self.info
        size = _utf8_len(request.queue)
        if info.max_queue_name_bytes and size > info.max_queue_name_bytes:
            return rj.QueueNameTooLong(info.max_queue_name_bytes, size)
        size = _utf8_len(request.job_type)
        if info.max_job_type_bytes and size > info.max_job_type_bytes:
            return rj.JobTypeNameTooLong(info.max_job_type_bytes, size)
        if request.idempotency_key is not None:
            size = _utf8_len(request.idempotency_key)
            if info.max_idempotency_key_bytes and size > info.max_idempotency_key_bytes:
                return rj.IdempotencyKeyTooLong(info.max_idempotency_key_bytes, size)
        payload = request.payload
        if payload is not None:
            if info.max_payload_bytes and len(payload.data) > info.max_payload_bytes:
                return rj.PayloadTooLarge(info.max_payload_bytes, len(payload.data))
            if info.restricts_encodings and payload.encoding not in info.allowed_encodings:
                return rj.EncodingNotAllowed(payload.encoding, info.allowed_encodings)
        if request.custom:
            if info.max_custom_entries and len(request.custom) > info.max_custom_entries:
                return rj.CustomEntriesTooMany(info.max_custom_entries, len(request.custom))
            for key in request.custom:
                size = _utf8_len(key)
                if info.max_custom_key_bytes and size > info.max_custom_key_bytes:
                    return rj.CustomKeyTooLong(key, info.max_custom_key_bytes, size)
            size = custom_map_bytes(request)
            if info.max_custom_total_bytes and size > info.max_custom_total_bytes:
                return rj.CustomMapTooLarge(info.max_custom_total_bytes, size)
        if request.scheduled_at is not None and info.max_schedule_horizon:
            latest = self.server_now() + info.max_schedule_horizon + _SCHEDULE_SLACK
            if request.scheduled_at > latest:
                return rj.ScheduledTooFar(info.max_schedule_horizon, request.scheduled_at)
        return None

    def contradicted_by(self, rejection: rj.JobRejection) -> bool:
        """A deterministic server rejection naming a different global limit than ours: the
        config may have been hot-reloaded, so the cache should be refreshed."""
        info = self.info
        limits = {
            rj.QueueNameTooLong: info.max_queue_name_bytes,
            rj.JobTypeNameTooLong: info.max_job_type_bytes,
            rj.IdempotencyKeyTooLong: info.max_idempotency_key_bytes,
        }
        expected = limits.get(type(rejection))
        return expected is not None and getattr(rejection, "limit", expected) != expected
