"""What both HTTP/2 engines share: reading a gRPC response into a `CallFinished`, and telling
an HTTP/2 server's first bytes from anything else.

Keeping this in one place is what makes the engines interchangeable: they differ in how frames
become header lists and message bytes, never in what a response means.
"""

from __future__ import annotations

from collections.abc import Iterable

from ._events import CallFinished
from ._failure import FailureKind
from ._framing import MessageDecoder
from ._status import (
    StatusCode,
    decode_grpc_message,
    parse_grpc_status,
    status_from_http,
    status_from_rst,
)

FRAME_HEADER_BYTES = 9
_SETTINGS_TYPE = 0x4
_ACK_FLAG = 0x1
_REFUSED_STREAM = 0x7


class ResponseState:
    """What a call's response headers and trailers said so far, and its message decoder."""

    __slots__ = (
        "content_type",
        "decoder",
        "grpc_body",
        "grpc_message",
        "grpc_status",
        "headers_received",
        "http_status",
        "informational",
    )

    def __init__(self, max_receive_bytes: int | None) -> None:
        self.decoder = MessageDecoder(max_receive_bytes)
        self.http_status: int | None = None
        self.content_type: bytes | None = None
        self.grpc_status: bytes | None = None
        self.grpc_message: bytes | None = None
        self.grpc_body = False  # whether the response headers announced gRPC messages
        self.headers_received = False
        self.informational = 0  # 1xx responses so far

    def read_headers(self, headers: Iterable[tuple[bytes, bytes]]) -> None:
        for name, value in headers:
            if name == b":status":
                try:
                    self.http_status = int(value)
                except ValueError:
                    self.http_status = 0
            elif name == b"grpc-status":
                self.grpc_status = value
            elif name == b"grpc-message":
                self.grpc_message = value
            elif name == b"content-type":
                self.content_type = value
            elif name == b"grpc-encoding" and not self.headers_received:
                # How a compressed message is compressed (before any message arrives).
                self.decoder = self.decoder.with_encoding(value)

    def response_started(self) -> None:
        """The response headers (not informational ones) have been read."""
        self.headers_received = True
        ctype = self.content_type
        self.grpc_body = self.http_status == 200 and (ctype is None or is_grpc_content_type(ctype))


def is_informational(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """A 1xx header block, which precedes the real response and is skipped."""
    for name, value in headers:
        if name == b":status":
            return value[:1] == b"1"
    return False


def finish(stream_id: int, state: ResponseState) -> CallFinished:
    """The call's result once its stream ended (or was reset after a status arrived)."""
    if state.http_status is None:
        return CallFinished(
            stream_id,
            StatusCode.INTERNAL,
            "response carried no :status",
            None,
            FailureKind.MALFORMED,
        )
    if state.http_status != 200:
        http = state.http_status
        return CallFinished(
            stream_id,
            status_from_http(http),
            f"server answered HTTP {http} instead of 200",
            None,
            FailureKind.HTTP,
        )
    status = parse_grpc_status(state.grpc_status)
    if status is None:
        return CallFinished(
            stream_id,
            StatusCode.UNKNOWN,
            "response carried no grpc-status",
            None,
            FailureKind.MALFORMED,
        )
    details = decode_grpc_message(state.grpc_message)
    if status is not StatusCode.OK:
        return CallFinished(stream_id, status, details)
    if state.content_type is not None and not is_grpc_content_type(state.content_type):
        ctype = state.content_type.decode("latin-1")
        return CallFinished(
            stream_id,
            StatusCode.UNKNOWN,
            f"unexpected content-type {ctype!r}",
            None,
            FailureKind.MALFORMED,
        )
    message = state.decoder.message
    if message is None:
        why = "truncated response message" if state.decoder.incomplete else "no response message"
        return CallFinished(stream_id, StatusCode.INTERNAL, why, None, FailureKind.MALFORMED)
    return CallFinished(stream_id, StatusCode.OK, details, message)


def reset_result(stream_id: int, state: ResponseState, error_code: int) -> CallFinished:
    """A call the server reset: the status it sent first, if any, wins over the reset."""
    if state.grpc_status is not None:
        return finish(stream_id, state)
    if error_code == _REFUSED_STREAM and not state.headers_received:
        # RFC 9113 §8.7: no application processing happened, so it is safe to send it again.
        return CallFinished(
            stream_id,
            StatusCode.UNAVAILABLE,
            "server refused the stream (REFUSED_STREAM) before processing the call",
            None,
            FailureKind.REFUSED,
        )
    return CallFinished(
        stream_id,
        status_from_rst(error_code),
        f"stream reset by server (HTTP/2 error code {error_code})",
        None,
        FailureKind.RESET,
    )


def goaway_result(stream_id: int) -> CallFinished:
    """A call above a GOAWAY's last stream id: never processed, so safe to retry."""
    return CallFinished(
        stream_id,
        StatusCode.UNAVAILABLE,
        "server sent GOAWAY before processing the call",
        None,
        FailureKind.GOAWAY,
    )


def is_grpc_content_type(value: bytes) -> bool:
    """`application/grpc`, optionally followed by `+subtype` or parameters."""
    if value == b"application/grpc":
        return True
    return value[:16].lower() == b"application/grpc" and value[16:17] in (b"", b"+", b";")


def not_http2_reason(first_bytes: bytes) -> str | None:
    """Why a server's first frame header (9 bytes) is not an HTTP/2 server preface, or None.

    The preface must open with a SETTINGS frame (RFC 9113 §3.4). Checking the first frame header
    at once matters: an HTTP/1.1 reply read as a frame header announces a ~4.7 MB frame, and a
    parser waiting for it would only notice when the connect timeout ran out.
    """
    if first_bytes[3] != _SETTINGS_TYPE or first_bytes[4] & _ACK_FLAG:
        return (
            "the server did not answer with HTTP/2 (its first bytes were "
            f"{first_bytes[:24]!r}, not a SETTINGS frame)"
        )
    return None
