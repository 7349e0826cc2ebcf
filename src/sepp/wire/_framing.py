"""gRPC length-prefixed message framing: a 1-byte compressed flag and a 4-byte big-endian length."""

from __future__ import annotations

import struct

_PREFIX = struct.Struct(">BI")
PREFIX_BYTES = _PREFIX.size


def encode_message(body: bytes) -> bytes:
    """Frame one uncompressed message."""
    return _PREFIX.pack(0, len(body)) + body


class FramingError(Exception):
    """The peer sent a message we cannot accept; `kind` says why."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class MessageDecoder:
    """Reassembles exactly one gRPC message from DATA chunks (every sepp RPC is unary).

    The declared length is checked against the cap as soon as the prefix is complete, so an
    oversized message is refused before its body is buffered.
    """

    __slots__ = ("_buffer", "_declared", "_max_bytes", "message")

    def __init__(self, max_bytes: int | None) -> None:
        self._buffer = bytearray()
        self._declared: int | None = None
        self._max_bytes = max_bytes
        self.message: bytes | None = None

    def feed(self, data: bytes) -> None:
        """Add a chunk; raises FramingError on a bad or oversized message."""
        if self.message is not None:
            if data:
                raise FramingError("malformed", "more than one message in a unary response")
            return
        self._buffer += data
        if self._declared is None:
            if len(self._buffer) < PREFIX_BYTES:
                return
            flag, length = _PREFIX.unpack_from(self._buffer)
            if flag == 1:
                raise FramingError("compressed", "compressed message received, none was accepted")
            if flag != 0:
                raise FramingError("malformed", f"invalid compressed flag {flag}")
            if self._max_bytes is not None and length > self._max_bytes:
                raise FramingError(
                    "too_large",
                    f"response message of {length} bytes exceeds the "
                    f"{self._max_bytes}-byte receive limit",
                )
            self._declared = length
            del self._buffer[:PREFIX_BYTES]
        if len(self._buffer) > self._declared:
            raise FramingError("malformed", "more data than the length prefix declared")
        if len(self._buffer) == self._declared:
            self.message = bytes(self._buffer)
            self._buffer.clear()

    @property
    def incomplete(self) -> bool:
        """True when part of a message arrived but not all of it."""
        return self.message is None and (self._declared is not None or bool(self._buffer))
