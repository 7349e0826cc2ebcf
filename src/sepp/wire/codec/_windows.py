"""Flow control (RFC 9113 §5.2, §6.9), both ways: what the server's DATA frames cost the
windows we give it and when we credit them back with WINDOW_UPDATE (h2's `windows.py`), and a
request's body sent as the server's windows allow, waiting for its WINDOW_UPDATEs when they
are spent.

Credit goes back in batches, not per DATA frame: the connection's once a quarter of its
window is used, a stream's once half of its window is (never after its last frame).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._calls import CallTable
from .._constants import MAX_PINGS_WITHOUT_DATA
from .._events import CallFinished, Event, StreamCapacityChanged
from .._failure import FailureKind
from .._framing import FramingError
from .._status import StatusCode
from ._frames import (
    CANCEL,
    DATA,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    PADDED,
    PROTOCOL_ERROR,
    RST_STREAM,
    WINDOW_UPDATE,
    PeerConnectionError,
    frame,
    pack_frame_header,
    pack_u32,
    strip_padding,
    unpack_u32,
)
from ._stream import EMPTY, Stream

# A window's size until SETTINGS or WINDOW_UPDATE say otherwise, and the most it may be.
DEFAULT_WINDOW = 65_535
MAX_WINDOW = 2**31 - 1
# A request body at least this long goes to the driver as a view of the caller's bytes, beside
# its frame headers, instead of being copied into one buffer with them (see buffers_to_send).
VIEW_MIN_BYTES = 16 * 1024


class Windows(CallTable[Stream]):
    """The connection's flow control: a base class of `CodecGrpcConnection`, so the hot path
    reads its state as the connection's own attributes."""

    # Kept by the connection: its output, the server's MAX_FRAME_SIZE, the keepalive count.
    _out: list[bytes | memoryview]
    _views_queued: bool
    _max_outbound_frame: int
    _pings_left: int

    if TYPE_CHECKING:

        def _forget(self, stream_id: int) -> None: ...
        def _end_stream(self, stream_id: int, call: Stream, out: list[Event]) -> None: ...
        def _untracked_stream(self, stream_id: int, what: str) -> None: ...
        def _stream_error(self, stream_id: int, code: int, what: str, out: list[Event]) -> None: ...

    def _init_windows(self, stream_window: int, connection_window: int) -> None:
        self._stream_window = stream_window
        self._connection_window = connection_window
        # Calls whose request body waits for flow-control window, in stream order.
        self._blocked: dict[int, Stream] = {}
        # What the server allows us (its SETTINGS and WINDOW_UPDATEs).
        self._send_window = DEFAULT_WINDOW
        self._peer_initial_window = DEFAULT_WINDOW
        # What we allow the server; credited back in batches, not per DATA frame.
        self._recv_window = connection_window

    def _connection_credit(self) -> bytes:
        """The WINDOW_UPDATE after our SETTINGS that raises the connection window from its
        default to ours (b"": none needed)."""
        extra = self._connection_window - DEFAULT_WINDOW
        return frame(WINDOW_UPDATE, 0, 0, pack_u32(extra)) if extra > 0 else b""

    # -- frames from the server --------------------------------------------------------------

    def _on_data(
        self, data: bytes, start: int, stop: int, flags: int, stream_id: int, out: list[Event]
    ) -> None:
        if stream_id == 0:
            raise PeerConnectionError(PROTOCOL_ERROR, "DATA frame on stream 0")
        flow_length = stop - start
        if flags & PADDED:
            start, stop = strip_padding(data, start, stop, "DATA")
        # Every DATA frame counts against the connection window, even on a closed stream.
        window = self._recv_window - flow_length
        if window < 0:
            raise PeerConnectionError(FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        consumed = self._connection_window - window
        if consumed >= self._connection_window >> 2:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, pack_u32(consumed)))
            window = self._connection_window
        self._recv_window = window
        call = self._calls[stream_id] if stream_id in self._calls else None
        if call is None:
            self._untracked_stream(stream_id, "DATA")
            return
        stream_window = call.recv_window - flow_length
        if stream_window < 0:
            raise PeerConnectionError(
                FLOW_CONTROL_ERROR, f"DATA beyond stream {stream_id}'s window"
            )
        if not flags & END_STREAM and stream_window <= self._stream_window >> 1:
            credit = self._stream_window - stream_window
            self._out.append(frame(WINDOW_UPDATE, 0, stream_id, pack_u32(credit)))
            stream_window = self._stream_window
        call.recv_window = stream_window
        if not call.headers_received:
            raise PeerConnectionError(PROTOCOL_ERROR, f"DATA before HEADERS on stream {stream_id}")
        if call.grpc_body and stop > start:
            try:
                call.decoder.feed(memoryview(data)[start:stop])
            except FramingError as exc:
                code = (
                    StatusCode.RESOURCE_EXHAUSTED
                    if exc.kind is FailureKind.TOO_LARGE
                    else StatusCode.INTERNAL
                )
                self._forget(stream_id)
                self._out.append(frame(RST_STREAM, 0, stream_id, pack_u32(CANCEL)))
                out.append(CallFinished(stream_id, code, str(exc), None, exc.kind))
                out.append(StreamCapacityChanged())
                return
        # Otherwise not a gRPC body (say a proxy's HTML error page): dropped unread; finish()
        # maps the response by its :status or content-type, not by a framing error.
        if flags & END_STREAM:
            self._end_stream(stream_id, call, out)

    def _on_window_update(
        self, data: bytes, start: int, stop: int, flags: int, stream_id: int, out: list[Event]
    ) -> None:
        if stop - start != 4:
            raise PeerConnectionError(FRAME_SIZE_ERROR, "WINDOW_UPDATE frame is not 4 bytes")
        increment = unpack_u32(data, start)[0] & 0x7FFFFFFF
        if increment == 0:  # a stream error on a stream; like h2, we end the connection
            raise PeerConnectionError(PROTOCOL_ERROR, f"WINDOW_UPDATE of 0 on stream {stream_id}")
        if stream_id == 0:
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise PeerConnectionError(FLOW_CONTROL_ERROR, "the connection window overflowed")
            self._flush_blocked()
            return
        call = self._calls[stream_id] if stream_id in self._calls else None
        if call is None:
            self._untracked_stream(stream_id, "WINDOW_UPDATE")
            return
        call.send_window += increment
        if call.send_window > MAX_WINDOW:
            self._stream_error(stream_id, FLOW_CONTROL_ERROR, "stream window overflow", out)
            return
        if call.outbound or call.prefix:
            self._send_body(stream_id, call)

    def _initial_window_changed(self, window: int) -> None:
        """The server's SETTINGS_INITIAL_WINDOW_SIZE is now `window`: every stream's send
        window moves by the difference (RFC 9113 §6.9.2)."""
        delta = window - self._peer_initial_window
        if delta:
            self._peer_initial_window = window
            for call in self._calls.values():
                call.send_window += delta
                if call.send_window > MAX_WINDOW:
                    raise PeerConnectionError(FLOW_CONTROL_ERROR, "a stream window overflowed")
            if delta > 0:
                self._flush_blocked()

    # -- request bodies ----------------------------------------------------------------------

    def _send_body(self, stream_id: int, call: Stream) -> None:
        """Send as much of the request as flow control allows; END_STREAM with the last byte.
        Each DATA frame is the length prefix's rest (in the first frame) and a slice of the
        request: a small slice is copied behind its frame header, a big one queued as a view
        (as views of two parts where it spans them)."""
        prefix = call.prefix
        body = call.outbound
        later = call.later
        out = self._out
        left = len(prefix) + len(body)
        if later:
            left += sum(map(len, later))
        max_frame = self._max_outbound_frame
        while left:
            n = min(left, self._send_window, call.send_window, max_frame)
            if n <= 0:
                call.prefix = prefix
                call.outbound = body
                self._blocked[stream_id] = call
                return
            if n == max_frame and n < left and not prefix:
                # A run of full frames before the last one, within this part: all alike but
                # for their slice.
                size = min(left - 1, len(body), self._send_window, call.send_window) // n * n
                if size:
                    self._pings_left = MAX_PINGS_WITHOUT_DATA
                    header = pack_frame_header(n >> 8, n & 0xFF, DATA, 0, stream_id)
                    for start in range(0, size, n):
                        out.append(header)
                        out.append(body[start : start + n])
                    self._views_queued = True
                    self._send_window -= size
                    call.send_window -= size
                    left -= size
                    body = body[size:]
                    if not body and later:
                        body = later.pop(0)
                    continue
            left -= n
            self._pings_left = MAX_PINGS_WITHOUT_DATA
            header = pack_frame_header(n >> 8, n & 0xFF, DATA, 0 if left else END_STREAM, stream_id)
            self._send_window -= n
            call.send_window -= n
            if prefix:
                taken = min(n, len(prefix))
                header += prefix[:taken]
                prefix = prefix[taken:]
                n -= taken
            if n <= len(body):
                if n < VIEW_MIN_BYTES:
                    out.append(header + body[:n])
                else:
                    out.append(header)
                    out.append(body[:n])
                    self._views_queued = True
                body = body[n:]
            else:
                # The frame spans parts: its slice is the rest of this one and the next's head.
                assert later, "the window counted bytes the request does not have"
                pieces = [body]
                need = n - len(body)
                while need:
                    body = later.pop(0)
                    pieces.append(body[:need])
                    taken = min(need, len(body))
                    body = body[taken:]
                    need -= taken
                if n < VIEW_MIN_BYTES:
                    out.append(header + b"".join(pieces))
                else:
                    out.append(header)
                    out += pieces
                    self._views_queued = True
            if not body and later:
                body = later.pop(0)
        call.prefix = b""
        call.outbound = EMPTY
        call.later = None
        self._blocked.pop(stream_id, None)

    def _flush_blocked(self) -> None:
        for stream_id, call in list(self._blocked.items()):
            if self._send_window <= 0:
                return
            self._send_body(stream_id, call)
