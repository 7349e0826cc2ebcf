"""gRPC length-prefixed message framing: a 1-byte compressed flag and a 4-byte big-endian length."""

from __future__ import annotations

import struct

from ._failure import FailureKind

_PREFIX = struct.Struct(">BI")
PREFIX_BYTES = _PREFIX.size


# A request message: its bytes, or its parts in order. A big payload comes as a part of its
# own, so that the codec engine hands it to the socket without copying it into a joined message.
Request = bytes | tuple[bytes, ...]


def request_size(request: Request) -> int:
    if isinstance(request, bytes):
        return len(request)
    return sum(len(part) for part in request)


def joined(request: Request) -> bytes:
    return request if isinstance(request, bytes) else b"".join(request)


def message_prefix(length: int) -> bytes:
    """The prefix of one uncompressed message of `length` bytes."""
    return _PREFIX.pack(0, length)


def encode_message(body: bytes) -> bytes:
    """Frame one uncompressed message."""
    return _PREFIX.pack(0, len(body)) + body


class FramingError(Exception):
    """The peer sent a message we cannot accept; `kind` says why."""

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class MessageDecoder:
    """Reassembles exactly one gRPC message from DATA chunks (every sepp RPC is unary).

    The declared length is checked against the cap as soon as the prefix is complete, so an
    oversized message is refused before its body is buffered. A message that arrives whole in
    one chunk (the common case) is sliced out without buffering.
    """

    __slots__ = ("_buffer", "_declared", "_max_bytes", "message")

    def __init__(self, max_bytes: int | None) -> None:
        self._buffer = bytearray()
        self._declared: int | None = None
        self._max_bytes = max_bytes
        self.message: bytes | None = None

    def feed(self, data: bytes | memoryview) -> None:
        """Add a chunk; raises FramingError on a bad or oversized message."""
        if self.message is not None:
            if data:
                raise FramingError(
                    FailureKind.MALFORMED, "more than one message in a unary response"
                )
            return
        if self._declared is None and not self._buffer and len(data) >= PREFIX_BYTES:
            length = self._read_prefix(data)
            if len(data) - PREFIX_BYTES == length:
                self.message = bytes(data[PREFIX_BYTES:])
                return
            data = data[PREFIX_BYTES:]
        self._buffer += data
        if self._declared is None:
            if len(self._buffer) < PREFIX_BYTES:
                return
            self._read_prefix(self._buffer)
            del self._buffer[:PREFIX_BYTES]
        assert self._declared is not None
        if len(self._buffer) > self._declared:
            raise FramingError(FailureKind.MALFORMED, "more data than the length prefix declared")
        if len(self._buffer) == self._declared:
            self.message = bytes(self._buffer)
            self._buffer.clear()

    def _read_prefix(self, data: bytes | bytearray | memoryview) -> int:
        flag, length = _PREFIX.unpack_from(data)
        if flag == 1:
            raise FramingError(
                FailureKind.COMPRESSED, "compressed message received, none was accepted"
            )
        if flag != 0:
            raise FramingError(FailureKind.MALFORMED, f"invalid compressed flag {flag}")
        if self._max_bytes is not None and length > self._max_bytes:
            raise FramingError(
                FailureKind.TOO_LARGE,
                f"response message of {length} bytes exceeds the "
                f"{self._max_bytes}-byte receive limit",
            )
        self._declared = length
        return int(length)

    @property
    def incomplete(self) -> bool:
        """True when part of a message arrived but not all of it."""
        return self.message is None and (self._declared is not None or bool(self._buffer))
