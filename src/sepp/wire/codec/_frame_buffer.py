"""Bytes from the socket into whole frames (h2's `frame_buffer.py`): each frame handed to its
handler where it lies in the bytes read, a frame that a read cut short kept in one buffer until
the next reads complete it, and a header block gathered across CONTINUATION frames."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .._calls import CallTable
from .._constants import DEFAULT_MAX_FRAME_SIZE, MAX_HEADER_BLOCK_BYTES
from .._events import Event
from .._response import FRAME_HEADER_BYTES
from ._frames import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    ENHANCE_YOUR_CALM,
    FRAME_SIZE_ERROR,
    PROTOCOL_ERROR,
    PeerConnectionError,
    unpack_frame_header,
)
from ._stream import Stream

# A frame's handler: (bytes, payload start, payload stop, flags, stream id, events out).
FrameHandler = Callable[[bytes, int, int, int, int, list[Event]], None]

# CONTINUATION frames one header block may take (h2's limit).
MAX_CONTINUATIONS = 64


class FrameBuffer(CallTable[Stream]):
    """Received bytes into frames: a base class of `CodecGrpcConnection`, which supplies a
    handler per frame type (`_handlers`, indexed by type) and what a header block and a
    connection error do."""

    _handlers: tuple[FrameHandler, ...]

    if TYPE_CHECKING:

        def _on_header_block(
            self, stream_id: int, block: bytes, end_stream: bool, out: list[Event]
        ) -> None: ...
        def _connection_error(self, code: int, what: str, out: list[Event]) -> None: ...

    def _init_frame_buffer(self) -> None:
        self._max_inbound_frame = DEFAULT_MAX_FRAME_SIZE
        # Received bytes not yet a whole frame (one buffer, however small the reads), and how
        # many bytes would complete it.
        self._pending = bytearray()
        self._needed = 0
        # A header block split over CONTINUATION frames: (stream id, END_STREAM) and parts.
        self._continuing: tuple[int, bool] | None = None
        self._block_parts: list[bytes] = []
        self._block_bytes = 0

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes from the socket; returns the resulting events in order."""
        if self.broken is not None:
            return []
        if self._preface is not None:
            first, failed = self._take_preface(data)
            if first is None:
                return failed
            data = first
        out: list[Event] = []
        pos = 0
        if self._pending:
            # Complete the frame an earlier read began from the front of `data` and parse it
            # alone; the rest of `data` is parsed where it is. So only that frame is copied,
            # not the whole read, and a big DATA frame is parsed from the buffer it was
            # completed in.
            frame, pos = self._complete_pending(data)
            if frame is None:
                return out
            if not self._parse(frame if frame[3] == DATA else bytes(frame), 0, out):
                return out
        self._parse(data, pos, out)
        return out

    def _complete_pending(self, data: bytes) -> tuple[bytearray | None, int]:
        """Move bytes from `data` into the pending frame until it is whole: returns it (None:
        `data` did not complete it) and where in `data` the next frame starts."""
        pending = self._pending
        pos = 0
        while True:
            take = self._needed - len(pending)
            pending += memoryview(data)[pos : pos + take]
            pos = min(pos + take, len(data))
            if len(pending) < self._needed:
                return None, pos
            if self._needed == FRAME_HEADER_BYTES:
                length = (pending[0] << 16) | (pending[1] << 8) | pending[2]
                # An oversized frame is refused at its header, in _parse.
                if 0 < length <= self._max_inbound_frame:
                    self._needed += length
                    continue
            # A fresh buffer: views of the old one may live on (in the parse that follows).
            self._pending = bytearray()
            return pending, pos

    def _parse(self, data: bytes | bytearray, pos: int, out: list[Event]) -> bool:
        """Handle the whole frames in `data` from `pos` on and keep a partial last frame;
        False if the server broke the connection."""
        end = len(data)
        unpack = unpack_frame_header
        handlers = self._handlers
        try:
            while end - pos >= FRAME_HEADER_BYTES:
                high, low, frame_type, flags, stream_id = unpack(data, pos)
                length = (high << 8) | low
                if length > self._max_inbound_frame:
                    raise PeerConnectionError(
                        FRAME_SIZE_ERROR,
                        f"a frame of {length} bytes exceeds our MAX_FRAME_SIZE "
                        f"({self._max_inbound_frame})",
                    )
                start = pos + FRAME_HEADER_BYTES
                stop = start + length
                if stop > end:
                    break
                pos = stop
                if self._continuing is not None and frame_type != CONTINUATION:
                    raise PeerConnectionError(
                        PROTOCOL_ERROR, f"frame type {frame_type} inside a header block"
                    )
                if frame_type < 10:  # the types RFC 9113 defines; extensions are ignored
                    handlers[frame_type](data, start, stop, flags, stream_id & 0x7FFFFFFF, out)
        except PeerConnectionError as exc:
            self._connection_error(exc.code, str(exc), out)
            return False
        if pos < end:
            pending = self._pending
            pending += memoryview(data)[pos:]
            if len(pending) < FRAME_HEADER_BYTES:
                self._needed = FRAME_HEADER_BYTES
            else:
                self._needed = FRAME_HEADER_BYTES + (
                    (pending[0] << 16) | (pending[1] << 8) | pending[2]
                )
        return True

    # -- header blocks across frames ---------------------------------------------------------

    def _begin_header_block(self, stream_id: int, end_stream: bool, block: bytes) -> None:
        """A HEADERS frame without END_HEADERS: its block goes on in CONTINUATION frames."""
        self._continuing = (stream_id, end_stream)
        self._block_parts = [block]
        self._block_bytes = len(block)

    def _on_continuation(
        self, data: bytes, start: int, stop: int, flags: int, stream_id: int, out: list[Event]
    ) -> None:
        continuing = self._continuing
        if continuing is None or continuing[0] != stream_id:
            raise PeerConnectionError(PROTOCOL_ERROR, "CONTINUATION outside a header block")
        self._block_parts.append(data[start:stop])
        self._block_bytes += stop - start
        # Refuse a CONTINUATION flood before buffering it: too many frames (h2's limit), or a
        # compressed block that could not decode within our header list limit anyway.
        if len(self._block_parts) > MAX_CONTINUATIONS:
            raise PeerConnectionError(ENHANCE_YOUR_CALM, "too many CONTINUATION frames")
        if self._block_bytes > MAX_HEADER_BLOCK_BYTES:
            raise PeerConnectionError(ENHANCE_YOUR_CALM, "header block exceeds our limit")
        if flags & END_HEADERS:
            block = b"".join(self._block_parts)
            self._continuing = None
            self._block_parts = []
            self._on_header_block(stream_id, block, continuing[1], out)
