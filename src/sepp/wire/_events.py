"""Events the sans-IO gRPC connection hands to its driver (small, slotted, immutable)."""

from __future__ import annotations

from dataclasses import dataclass

from ._failure import FailureKind
from ._status import StatusCode


@dataclass(frozen=True, slots=True)
class CallFinished:
    """A call ended. `body` is the response message when `code` is OK.

    `error_kind` says how a failed call failed below its status (a local verdict on the
    response, or how the call died), when that matters for errors and retries.
    """

    stream_id: int
    code: StatusCode
    details: str
    body: bytes | None = None
    error_kind: FailureKind | None = None


@dataclass(frozen=True, slots=True)
class GoAwayReceived:
    """The server will take no new streams; streams above `last_stream_id` already failed.
    `debug_data` is the GOAWAY's opaque payload (`too_many_pings` from a gRPC server)."""

    last_stream_id: int
    error_code: int
    debug_data: bytes = b""


@dataclass(frozen=True, slots=True)
class PingAcknowledged:
    opaque: bytes


@dataclass(frozen=True, slots=True)
class ConnectionBroken:
    """The peer broke HTTP/2; every call on the connection has been finished with an error."""

    reason: str


@dataclass(frozen=True, slots=True)
class StreamCapacityChanged:
    """The server's MAX_CONCURRENT_STREAMS changed or a stream slot was freed."""


Event = CallFinished | GoAwayReceived | PingAcknowledged | ConnectionBroken | StreamCapacityChanged
