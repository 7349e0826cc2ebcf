"""HTTP/2 frames as the codec reads and writes them (RFC 9113 §4 and §6): the types, flags and
error codes, the 9-byte header's layout, and what a frame that breaks the protocol raises."""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 §6).
DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Error codes (RFC 9113 §7).
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
FLOW_CONTROL_ERROR = 0x3
FRAME_SIZE_ERROR = 0x6
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

# SETTINGS_MAX_FRAME_SIZE's bounds (§6.5.2): the initial value is the least.
MIN_FRAME_SIZE = 16_384
MAX_FRAME_SIZE_LIMIT = 2**24 - 1

# Frame header: 24-bit length (as 16 + 8 bits), type, flags, reserved bit + 31-bit stream id.
_FRAME_HEADER = struct.Struct(">HBBBL")
_U32 = struct.Struct(">L")
_GOAWAY = struct.Struct(">LL")  # last stream id, error code (then debug data)

# The structs' methods, bound once: the other modules call them by name. (Called as
# `_U32.pack(...)` from a module that imported `_U32`, CPython 3.11+ compiles an attribute load
# rather than a method call, which makes a bound method on every call.)
pack_frame_header = _FRAME_HEADER.pack
unpack_frame_header = _FRAME_HEADER.unpack_from
pack_u32 = _U32.pack
unpack_u32 = _U32.unpack_from
pack_goaway = _GOAWAY.pack
unpack_goaway = _GOAWAY.unpack_from


def frame(frame_type: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame."""
    n = len(payload)
    return _FRAME_HEADER.pack(n >> 8, n & 0xFF, frame_type, flags, stream_id) + payload


class PeerConnectionError(Exception):
    """The peer broke HTTP/2: GOAWAY with `code`, and every call fails (a connection error,
    RFC 9113 §5.4.1)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def check_dependency(data: bytes, start: int, stream_id: int) -> None:
    """A priority signal (PRIORITY, or HEADERS with the flag) must not name its own stream."""
    if _U32.unpack_from(data, start)[0] & 0x7FFFFFFF == stream_id:
        raise PeerConnectionError(PROTOCOL_ERROR, f"stream {stream_id} depends on itself")


def strip_padding(data: bytes, start: int, stop: int, what: str) -> tuple[int, int]:
    """The payload of a PADDED frame between `start` and `stop`, without its padding."""
    if stop == start:
        raise PeerConnectionError(FRAME_SIZE_ERROR, f"padded {what} frame without a pad length")
    pad = data[start]
    if pad >= stop - start:
        raise PeerConnectionError(PROTOCOL_ERROR, f"{what} padding exceeds the frame")
    return start + 1, stop - pad
