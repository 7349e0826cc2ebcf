"""Which message codec encodes requests and decodes responses: our own (`wire_requests`,
`wire_responses`: pure Python, straight between bytes and our types), the default, or the
generated protobuf classes (`protobuf_codec`), the reference, with SEPP_MESSAGE_CODEC=protobuf.
Both are modules with the functions of `MessageCodec`; the client reads `CODEC` at each call.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from . import wire_requests, wire_responses

if TYPE_CHECKING:
    from .rejections import JobRejection
    from .types import (
        DeadLetterRecord,
        EnqueueAck,
        EnqueueRequest,
        Job,
        Retry,
        ServerInfo,
        TraceContext,
    )

ENV = "SEPP_MESSAGE_CODEC"
NAMES = ("sepp", "protobuf")


class Requests(Protocol):
    def enqueue_batch(
        self, jobs: Iterable[EnqueueRequest], trace: TraceContext | None = None
    ) -> bytes: ...
    def reserve(
        self,
        queues: Sequence[str],
        wait_s: float,
        lease_s: float,
        worker_id: str | None,
        max_jobs: int | None,
    ) -> bytes: ...
    def ack(self, job_id: str, attempt: int, worker_id: str | None) -> bytes: ...
    def nack(
        self, job_id: str, attempt: int, reason: str | None, retry: Retry, worker_id: str | None
    ) -> bytes: ...
    def extend(self, job_id: str, attempt: int, lease_s: float, worker_id: str | None) -> bytes: ...
    def drain_dead_letters(self, queue: str | None, max: int) -> bytes: ...


class Responses(Protocol):
    """Readers raise wire_format.DecodeError for bytes that do not parse, convert.Malformed
    for a message that cannot become our type."""

    def batch_results(self, body: bytes, expected: int) -> list[EnqueueAck | JobRejection]: ...
    def single_result(self, body: bytes) -> EnqueueAck | JobRejection: ...
    def atomic_acks(self, body: bytes, expected: int) -> list[EnqueueAck]: ...
    def reserved_jobs(self, body: bytes) -> Sequence[Any]: ...
    def job(self, fields: Any, worker_id: str | None, client: object = None) -> Job: ...
    def ack_response(self, body: bytes) -> None: ...
    def nack_dead_lettered(self, body: bytes) -> bool: ...
    def extended_until(self, body: bytes) -> datetime: ...
    def dead_letter_records(self, body: bytes) -> Sequence[Any]: ...
    def dead_letter(self, record: Any) -> DeadLetterRecord: ...
    def server_info(self, body: bytes) -> ServerInfo: ...


def requests_of(name: str) -> Requests:
    if name == "protobuf":
        from . import protobuf_codec

        return protobuf_codec
    return wire_requests


def responses_of(name: str) -> Responses:
    if name == "protobuf":
        from . import protobuf_codec

        return protobuf_codec
    return wire_responses


def select(name: str) -> None:
    """Use the codec `name` from the next call on (tests run suites over both)."""
    global NAME, REQUESTS, RESPONSES
    if name not in NAMES:
        raise ValueError(f"{ENV} must be one of {', '.join(NAMES)}, got {name!r}")
    NAME, REQUESTS, RESPONSES = name, requests_of(name), responses_of(name)


def preload() -> None:
    """Load what the codec needs before the first call (protobuf's classes take ~25 ms)."""
    if NAME == "protobuf":
        from . import protobuf_codec

        protobuf_codec.preload()


NAME: str = "sepp"
REQUESTS: Requests = wire_requests
RESPONSES: Responses = wire_responses
select(os.environ.get(ENV) or "sepp")
