"""gRPC status codes, grpc-message decoding, the HTTP→gRPC mapping and grpc-timeout encoding."""

from __future__ import annotations

import enum
import math
from urllib.parse import unquote_to_bytes


class StatusCode(enum.IntEnum):
    """The gRPC status codes (https://grpc.github.io/grpc/core/md_doc_statuscodes.html)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16

    # The same text on every Python: since 3.11, str() and format() of an IntEnum member are
    # its bare number ("5"), which says nothing in a log line or a print.
    def __str__(self) -> str:
        return f"StatusCode.{self.name}"

    def __format__(self, spec: str) -> str:
        return str(self) if not spec else format(int(self), spec)


_HTTP_TO_GRPC = {
    400: StatusCode.INTERNAL,
    401: StatusCode.UNAUTHENTICATED,
    403: StatusCode.PERMISSION_DENIED,
    404: StatusCode.UNIMPLEMENTED,
    429: StatusCode.UNAVAILABLE,
    502: StatusCode.UNAVAILABLE,
    503: StatusCode.UNAVAILABLE,
    504: StatusCode.UNAVAILABLE,
}

# RST_STREAM error code → gRPC status, per the gRPC HTTP/2 protocol document.
_RST_TO_GRPC = {
    0x7: StatusCode.UNAVAILABLE,  # REFUSED_STREAM: never processed, safe to retry
    0x8: StatusCode.CANCELLED,
    0xB: StatusCode.RESOURCE_EXHAUSTED,  # ENHANCE_YOUR_CALM
    0xC: StatusCode.PERMISSION_DENIED,  # INADEQUATE_SECURITY
}


def status_from_http(http_status: int) -> StatusCode:
    """Map a non-200 HTTP `:status` to the gRPC code the spec prescribes."""
    return _HTTP_TO_GRPC.get(http_status, StatusCode.UNKNOWN)


def status_from_rst(error_code: int) -> StatusCode:
    """Map an HTTP/2 RST_STREAM error code to a gRPC code."""
    return _RST_TO_GRPC.get(error_code, StatusCode.INTERNAL)


_STATUS_BY_TEXT = {b"%d" % code: code for code in StatusCode}


def parse_grpc_status(raw: bytes | None) -> StatusCode | None:
    """Parse a `grpc-status` value; None if absent, UNKNOWN if garbage or out of range."""
    if raw is None:
        return None
    exact = _STATUS_BY_TEXT.get(raw)
    if exact is not None:
        return exact
    text = raw.strip()
    if not text.isdigit() or len(text) > 3:
        return StatusCode.UNKNOWN
    try:
        return StatusCode(int(text))
    except ValueError:
        return StatusCode.UNKNOWN


def decode_grpc_message(raw: bytes | None) -> str:
    """Percent-decode a `grpc-message` value; malformed escapes and bad UTF-8 never raise."""
    if not raw:
        return ""
    try:
        return unquote_to_bytes(raw).decode("utf-8", errors="replace")
    except Exception:  # unquote_to_bytes is lenient, but stay total on arbitrary bytes
        return raw.decode("latin-1")


_TIMEOUT_UNITS = (
    ("n", 1e9),
    ("u", 1e6),
    ("m", 1e3),
    ("S", 1.0),
    ("M", 1 / 60),
    ("H", 1 / 3600),
)
_MAX_TIMEOUT_DIGITS_VALUE = 99_999_999
_MAX_TIMEOUT = b"%dH" % _MAX_TIMEOUT_DIGITS_VALUE
_MAX_TIMEOUT_SECONDS = _MAX_TIMEOUT_DIGITS_VALUE * 3600.0


def encode_grpc_timeout(seconds: float) -> bytes:
    """Encode a timeout as `grpc-timeout`: at most 8 digits, in the finest unit that fits.

    The value is rounded up so the server never sees a zero timeout for a live call. Timeouts
    beyond what 8 digits of hours can say (including inf and NaN) are sent as that maximum.
    """
    if not seconds < _MAX_TIMEOUT_SECONDS:
        return _MAX_TIMEOUT  # also inf and NaN, which math.ceil below would raise on
    seconds = max(seconds, 0.0)
    # Prefer milliseconds for the common range: short strings, exact enough.
    for unit, per_second in _TIMEOUT_UNITS[2:]:
        value = math.ceil(seconds * per_second)
        if value <= _MAX_TIMEOUT_DIGITS_VALUE:
            return b"%d%s" % (max(value, 1), unit.encode())
    return _MAX_TIMEOUT
