"""gRPC length-prefixed message framing: a 1-byte compressed flag and a 4-byte big-endian length.

Requests go uncompressed. A response message may come gzip-compressed (flag 1 under
`grpc-encoding: gzip`, which every gRPC server may send, and a grpcio server configured to
compress sends whatever the client accepts); it is decompressed with the receive cap applied to
what it decompresses to.
"""

from __future__ import annotations

import struct
import zlib
from typing import NoReturn

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


# What we send as grpc-accept-encoding (identity is always accepted and never named).
ACCEPT_ENCODING = b"gzip"
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # gzip's header and trailer around the deflate stream


def gunzip(data: bytes, max_bytes: int | None) -> bytes:
    """A gzip-compressed message's bytes, decompressed into at most `max_bytes` (plus one, to
    tell the cap was passed): a decompression bomb costs the cap, never what it expands to."""
    inflater = zlib.decompressobj(_GZIP_WBITS)
    try:
        # max_length 0 means no limit, and max_bytes + 1 is never 0.
        message = inflater.decompress(data, 0 if max_bytes is None else max_bytes + 1)
    except zlib.error as exc:
        raise FramingError(
            FailureKind.MALFORMED, f"a gzip-compressed response message does not decompress: {exc}"
        ) from None
    if max_bytes is not None and len(message) > max_bytes:
        raise FramingError(
            FailureKind.TOO_LARGE,
            f"response message of {len(data)} bytes gzip-compressed decompresses to more than "
            f"the {max_bytes}-byte receive limit",
        )
    if not inflater.eof:
        raise FramingError(FailureKind.MALFORMED, "a gzip-compressed response message is truncated")
    if inflater.unused_data:
        raise FramingError(
            FailureKind.MALFORMED, "bytes after the gzip stream in a compressed response message"
        )
    return message


class MessageDecoder:
    """Reassembles exactly one gRPC message from DATA chunks (every sepp RPC is unary).

    The declared length is checked against the cap as soon as the prefix is complete, so an
    oversized message is refused before its body is buffered. A message that arrives whole in
    one chunk (the common case) is sliced out without buffering. A response whose headers name
    a grpc-encoding gets an `EncodedMessageDecoder` instead (`with_encoding`), so reading an
    uncompressed response costs nothing for compression.
    """

    __slots__ = ("_buffer", "_declared", "_max_bytes", "message")

    def __init__(self, max_bytes: int | None) -> None:
        self._buffer = bytearray()
        self._declared: int | None = None
        self._max_bytes = max_bytes
        self.message: bytes | None = None

    def with_encoding(self, encoding: bytes) -> MessageDecoder:
        """The decoder for a response whose headers said `grpc-encoding: encoding`."""
        return EncodedMessageDecoder(self._max_bytes, encoding)

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
        if flag:
            self._compressed_flag(flag)
        # A compressed message is held to the cap too: deflate output is never much smaller
        # than its input for data that does not compress, and the cap bounds what is buffered.
        if self._max_bytes is not None and length > self._max_bytes:
            raise FramingError(
                FailureKind.TOO_LARGE,
                f"response message of {length} bytes exceeds the "
                f"{self._max_bytes}-byte receive limit",
            )
        self._declared = length
        return int(length)

    def _compressed_flag(self, flag: int) -> None:
        """The message's flag is set: refuse it (no grpc-encoding said how it is compressed)."""
        self._refuse_compressed(flag, "without a grpc-encoding")

    @staticmethod
    def _refuse_compressed(flag: int, why: str) -> NoReturn:
        if flag != 1:
            raise FramingError(FailureKind.MALFORMED, f"invalid compressed flag {flag}")
        # gRPC's rule: a message compressed in an encoding we never accepted is INTERNAL.
        raise FramingError(
            FailureKind.COMPRESSED,
            f"compressed message received {why} (we accept {ACCEPT_ENCODING.decode()})",
        )

    @property
    def incomplete(self) -> bool:
        """True when part of a message arrived but not all of it."""
        return self.message is None and (self._declared is not None or bool(self._buffer))


class EncodedMessageDecoder(MessageDecoder):
    """A MessageDecoder for a response whose headers named a grpc-encoding: a message with the
    compressed flag is decompressed once whole (gzip; another encoding is refused, named)."""

    __slots__ = ("_compressed", "encoding")

    def __init__(self, max_bytes: int | None, encoding: bytes) -> None:
        super().__init__(max_bytes)
        self.encoding = encoding
        self._compressed = False  # the message's flag said it is compressed

    def feed(self, data: bytes | memoryview) -> None:
        whole = self.message is not None
        super().feed(data)
        if not whole and self._compressed and self.message is not None:
            self.message = gunzip(self.message, self._max_bytes)

    def _compressed_flag(self, flag: int) -> None:
        encoding = self.encoding
        if flag == 1 and encoding == b"gzip":
            self._compressed = True
        elif encoding == b"identity":
            self._refuse_compressed(flag, "without a grpc-encoding")
        else:
            name = encoding.decode("latin-1")
            self._refuse_compressed(flag, f"in grpc-encoding {name!r}, which we do not accept")
