"""The default engine: a purpose-built sans-IO HTTP/2 client codec for unary gRPC calls.

It implements RFC 9113 from the client's side for exactly what this client does: many
concurrent unary calls on one connection, no server push, no priorities. Requests are packed
with `struct` from a per-method header block encoded once (`_header_blocks.py`); responses are
parsed in one loop over the received bytes (`_frame_buffer.py`), and header blocks are decoded
with hpack's Decoder behind a cache of whole blocks. Peer errors follow h2's choice between
stream and connection errors where RFC 9113 leaves it open (§5.4.1 allows either), so the
reference engine and this one fail the same calls.

The connection is the glue: the driver API, a call's stream from HEADERS to its end, and the
frames that are neither flow control (`_windows.py`) nor settings (`_settings.py`). The rooms
that keep state on the hot path (the frame buffer, flow control, our request headers) are its
base classes rather than objects it holds, so every call reads their state as `self._x`, as
when the codec was one module: no call and no attribute lookup more per call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .._calls import (
    FIELD_OVERHEAD,
    StreamIdsExhausted,
    without_streams_above,
)
from .._constants import (
    DEFAULT_CONNECTION_WINDOW,
    DEFAULT_MAX_HEADER_LIST_SIZE,
    DEFAULT_STREAM_WINDOW,
    MAX_HEADER_BLOCK_BYTES,
    MAX_INFORMATIONAL_RESPONSES,
    MAX_PINGS_WITHOUT_DATA,
    MAX_QUEUED_CONTROL_REPLY_BYTES,
    MAX_STREAM_ID,
    TOO_MANY_1XX,
    TOO_MANY_REPLIES,
    Header,
)
from .._events import (
    CallFinished,
    ConnectionBroken,
    Event,
    GoAwayReceived,
    PingAcknowledged,
    StreamCapacityChanged,
)
from .._failure import FailureKind
from .._framing import PREFIX_BYTES, Request, message_prefix, request_size
from .._hpack import encode_field
from .._response import finish, goaway_result, is_informational, reset_result
from .._status import StatusCode, encode_grpc_timeout
from ._frame_buffer import FrameBuffer, FrameHandler
from ._frames import (
    ACK,
    CANCEL,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    MIN_FRAME_SIZE,
    NO_ERROR,
    PADDED,
    PING,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    RST_STREAM,
    PeerConnectionError,
    check_dependency,
    frame,
    pack_frame_header,
    pack_goaway,
    pack_u32,
    strip_padding,
    unpack_goaway,
    unpack_u32,
)
from ._header_blocks import (
    TABLE_SIZE_ZERO,
    TIMEOUT_FIELD,
    RequestHeaders,
    ResponseHeaderBlocks,
)
from ._settings import (
    SETTINGS_ACK,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_CONCURRENT_STREAMS,
    SETTINGS_MAX_FRAME_SIZE,
    SETTINGS_MAX_HEADER_LIST_SIZE,
    client_preface,
    read_settings,
)
from ._stream import EMPTY, Stream
from ._windows import VIEW_MIN_BYTES, Windows


class CodecGrpcConnection(FrameBuffer, Windows, RequestHeaders):
    """One HTTP/2 connection carrying many concurrent unary gRPC calls."""

    def __init__(
        self,
        *,
        authority: str,
        scheme: str = "http",
        user_agent: str = "sepp-trio",
        metadata: Sequence[Header] = (),
        secret_metadata: Sequence[Header] = (),
        max_receive_message_bytes: int | None = None,
        stream_window: int = DEFAULT_STREAM_WINDOW,
        connection_window: int = DEFAULT_CONNECTION_WINDOW,
    ) -> None:
        super().__init__()
        self._init_request_headers(
            authority=authority,
            scheme=scheme,
            user_agent=user_agent,
            metadata=metadata,
            secret_metadata=secret_metadata,
        )
        self._max_receive = max_receive_message_bytes
        self._blocks = ResponseHeaderBlocks(DEFAULT_MAX_HEADER_LIST_SIZE)
        self._init_windows(stream_window, connection_window)
        self._init_frame_buffer()

        self._next_stream_id = 1
        self._out: list[bytes | memoryview] = []
        # Whether _out holds views of request bodies (else buffers_to_send joins it).
        self._views_queued = False
        # Bytes of PING and SETTINGS ACKs in _out (see _queue_reply).
        self._queued_replies = 0
        # The server's SETTINGS_MAX_FRAME_SIZE: our frames' largest payload.
        self._max_outbound_frame = MIN_FRAME_SIZE

        self._goaway_sent = False
        # PINGs we may still send before a HEADERS or DATA frame of ours (see send_ping), and
        # the next stream id when that was counted: a call started since sent HEADERS (so a
        # call costs no bookkeeping here; a request body's later DATA resets the count).
        self._pings_left = 0
        self._pings_counted_at = self._next_stream_id
        self._handlers: tuple[FrameHandler, ...] = (
            self._on_data,
            self._on_headers,
            self._on_priority,
            self._on_rst_stream,
            self._on_settings,
            self._on_push_promise,
            self._on_ping,
            self._on_goaway,
            self._on_window_update,
            self._on_continuation,
        )

    # -- driver API -------------------------------------------------------------------------

    def initiate(self) -> None:
        """Queue the connection preface and our SETTINGS."""
        self._out.append(client_preface(self._stream_window))
        credit = self._connection_credit()
        if credit:
            self._out.append(credit)

    def data_to_send(self) -> bytes:
        return b"".join(self.buffers_to_send())

    def buffers_to_send(self) -> list[bytes | memoryview]:
        """The bytes queued for the socket, in order. Small frames come joined into one
        buffer; a big request body comes as views of the caller's bytes between the frame
        headers, so it reaches the socket without a copy (see the drivers' `send_some`)."""
        out = self._out
        if not out:
            return out
        self._out = []
        self._queued_replies = 0
        if self._views_queued:
            self._views_queued = False
            return out
        return [b"".join(out)] if len(out) > 1 else out

    def start_call(
        self,
        method: str,
        request: Request,
        *,
        timeout: float | None = None,
        metadata: Iterable[Header] = (),
    ) -> int:
        """Open a stream for `method` and queue its request; returns the stream id. A request
        in parts goes out as they are, each big part as views of it, never joined."""
        entry = self._method_blocks.get(method)
        if entry is None:
            entry = self._method_entry(method)
        block, room = entry
        if timeout is not None:
            # Per-call values are never indexed, so they do not churn the server's table.
            value = encode_grpc_timeout(timeout)
            block += TIMEOUT_FIELD + bytes((len(value),)) + value
        for name, value in metadata:
            block += encode_field(name, value, sensitive=True)
            room -= len(name) + len(value) + FIELD_OVERHEAD
        if room < 0:  # perhaps over the server's limit: count exactly
            self._check_header_list(method, timeout, entry[1] - room)
        if self._first_block:
            self._first_block = False
            block = TABLE_SIZE_ZERO + block
        stream_id = self._next_stream_id
        if stream_id + 2 > MAX_STREAM_ID:
            if stream_id > MAX_STREAM_ID:
                raise StreamIdsExhausted(f"stream id {stream_id} is past the last (2^31-1)")
            # Stream ids are spent: let this connection drain; the driver dials a fresh one.
            self.draining = True
        self._next_stream_id = stream_id + 2
        call = Stream(self._max_receive, self._peer_initial_window, self._stream_window)
        self._calls[stream_id] = call
        whole: bytes | None
        parts: tuple[bytes, ...]
        if isinstance(request, bytes):
            whole, parts = request, ()
            size = len(request)
        else:
            whole, parts = None, request
            size = request_size(parts)
        prefix = message_prefix(size)
        n = size + PREFIX_BYTES
        max_frame = self._max_outbound_frame
        if len(block) <= max_frame:
            headers = pack_frame_header(
                len(block) >> 8, len(block) & 0xFF, HEADERS, END_HEADERS, stream_id
            )
            if n <= self._send_window and n <= call.send_window and n <= max_frame:
                # The common case: the whole call in one write.
                self._send_window -= n
                call.send_window -= n
                head = (
                    headers
                    + block
                    + pack_frame_header(n >> 8, n & 0xFF, DATA, END_STREAM, stream_id)
                    + prefix
                )
                if whole is None:
                    self._out.append(head)
                    self._out += parts
                    self._views_queued = True
                elif size < VIEW_MIN_BYTES:
                    self._out.append(head + whole)
                else:
                    self._out.append(head)
                    self._out.append(whole)
                    self._views_queued = True
                return stream_id
            self._out.append(headers + block)
        else:
            self._queue_header_block(stream_id, block)
        call.prefix = prefix
        if whole is not None:
            call.outbound = memoryview(whole)
        else:
            views = [memoryview(part) for part in parts if part]
            if views:
                call.outbound = views.pop(0)
                call.later = views
        self._send_body(stream_id, call)
        return stream_id

    def cancel_call(self, stream_id: int) -> None:
        """Forget a call and reset its stream with CANCEL; the connection stays usable."""
        if self._calls.pop(stream_id, None) is None:
            return
        self._blocked.pop(stream_id, None)
        if self.broken is None:
            self._out.append(frame(RST_STREAM, 0, stream_id, pack_u32(CANCEL)))

    def send_ping(self, opaque: bytes) -> bool:
        """Queue a PING, unless MAX_PINGS_WITHOUT_DATA went out since our last HEADERS or DATA
        frame (none before the first): then queue nothing and return False."""
        if self._pings_counted_at != self._next_stream_id:  # a call's HEADERS went out since
            self._pings_counted_at = self._next_stream_id
            self._pings_left = MAX_PINGS_WITHOUT_DATA
        if not self._pings_left:
            return False
        self._pings_left -= 1
        self._out.append(frame(PING, 0, 0, opaque))
        return True

    def close(self) -> None:
        """Queue a GOAWAY; the driver sends it and closes the socket."""
        self._send_goaway(NO_ERROR)

    def _set_next_stream_id(self, stream_id: int) -> None:
        """Tests of stream-id exhaustion start near the end of the id space."""
        self._next_stream_id = stream_id

    # -- frames from the server --------------------------------------------------------------

    def _on_headers(
        self, data: bytes, start: int, stop: int, flags: int, stream_id: int, out: list[Event]
    ) -> None:
        if stream_id == 0:
            raise PeerConnectionError(PROTOCOL_ERROR, "HEADERS frame on stream 0")
        if flags & PADDED:
            start, stop = strip_padding(data, start, stop, "HEADERS")
        if flags & PRIORITY_FLAG:
            if stop - start < 5:
                raise PeerConnectionError(FRAME_SIZE_ERROR, "HEADERS frame too short for PRIORITY")
            if stream_id in self._calls:  # (a late frame on a reset stream is not checked)
                check_dependency(data, start, stream_id)
            start += 5  # otherwise ignored: priority signals are deprecated (RFC 9113 §5.3.2)
        if stop - start > MAX_HEADER_BLOCK_BYTES:
            raise PeerConnectionError(ENHANCE_YOUR_CALM, "header block exceeds our limit")
        block = data[start:stop]
        end_stream = bool(flags & END_STREAM)
        if flags & END_HEADERS:
            self._on_header_block(stream_id, block, end_stream, out)
        else:
            self._begin_header_block(stream_id, end_stream, block)

    def _on_header_block(
        self, stream_id: int, block: bytes, end_stream: bool, out: list[Event]
    ) -> None:
        # Decoded even for a call we forgot: the HPACK table must follow every block.
        fields = self._blocks.decode(block)
        call = self._calls[stream_id] if stream_id in self._calls else None
        if call is None:
            self._untracked_stream(stream_id, "HEADERS")
            return
        if call.headers_received:
            if not end_stream:
                raise PeerConnectionError(PROTOCOL_ERROR, "trailers without END_STREAM")
            call.read_headers(fields)
        else:
            if is_informational(fields):
                if end_stream:
                    raise PeerConnectionError(PROTOCOL_ERROR, "END_STREAM on a 1xx response")
                # An informational response precedes the real one; gRPC sends none.
                call.informational += 1
                if call.informational > MAX_INFORMATIONAL_RESPONSES:
                    self._stream_error(stream_id, ENHANCE_YOUR_CALM, TOO_MANY_1XX, out)
                return
            call.read_headers(fields)
            call.response_started()
        if end_stream:
            self._end_stream(stream_id, call, out)

    def _on_priority(
        self, data: bytes, start: int, stop: int, flags: int, stream_id: int, out: list[Event]
    ) -> None:
        if stream_id == 0:
            raise PeerConnectionError(PROTOCOL_ERROR, "PRIORITY frame on stream 0")
        if stop - start != 5:
            raise PeerConnectionError(FRAME_SIZE_ERROR, "PRIORITY frame is not 5 bytes")
        check_dependency(data, start, stream_id)

    def _on_rst_stream(
        self, data: bytes, start: int, stop: int, flags: int, stream_id: int, out: list[Event]
    ) -> None:
        if stream_id == 0:
            raise PeerConnectionError(PROTOCOL_ERROR, "RST_STREAM frame on stream 0")
        if stop - start != 4:
            raise PeerConnectionError(FRAME_SIZE_ERROR, "RST_STREAM frame is not 4 bytes")
        call = self._calls[stream_id] if stream_id in self._calls else None
        if call is None:
            return  # nothing to reset (like h2, even for a stream never opened)
        self._forget(stream_id)
        out.append(reset_result(stream_id, call, unpack_u32(data, start)[0]))
        out.append(StreamCapacityChanged())

    def _on_settings(
        self, data: bytes, start: int, stop: int, flags: int, stream_id: int, out: list[Event]
    ) -> None:
        values = read_settings(data, start, stop, flags, stream_id)
        if values is None:
            return  # an ACK of ours
        if SETTINGS_MAX_FRAME_SIZE in values:
            self._max_outbound_frame = values[SETTINGS_MAX_FRAME_SIZE]
        if SETTINGS_MAX_HEADER_LIST_SIZE in values:
            self._header_list_limit_changed(values[SETTINGS_MAX_HEADER_LIST_SIZE])
        if SETTINGS_INITIAL_WINDOW_SIZE in values:
            self._initial_window_changed(values[SETTINGS_INITIAL_WINDOW_SIZE])
        self._queue_reply(SETTINGS_ACK)
        # Callers waiting for a stream wake only when the server's limit may let them start.
        max_streams = values.get(SETTINGS_MAX_CONCURRENT_STREAMS, self._remote_max_streams)
        if max_streams != self._remote_max_streams or not self._settings_received:
            self._remote_max_streams = max_streams
            self._settings_received = True
            out.append(StreamCapacityChanged())

    def _on_push_promise(
        self, data: bytes, start: int, stop: int, flags: int, stream_id: int, out: list[Event]
    ) -> None:
        raise PeerConnectionError(PROTOCOL_ERROR, "PUSH_PROMISE although we disabled push")

    def _on_ping(
        self, data: bytes, start: int, stop: int, flags: int, stream_id: int, out: list[Event]
    ) -> None:
        if stream_id != 0:
            raise PeerConnectionError(PROTOCOL_ERROR, "PING frame on a stream")
        if stop - start != 8:
            raise PeerConnectionError(FRAME_SIZE_ERROR, "PING frame is not 8 bytes")
        opaque = data[start:stop]
        if flags & ACK:
            out.append(PingAcknowledged(opaque))
        else:
            self._queue_reply(frame(PING, ACK, 0, opaque))

    def _on_goaway(
        self, data: bytes, start: int, stop: int, flags: int, stream_id: int, out: list[Event]
    ) -> None:
        if stream_id != 0:
            raise PeerConnectionError(PROTOCOL_ERROR, "GOAWAY frame on a stream")
        if stop - start < 8:
            raise PeerConnectionError(FRAME_SIZE_ERROR, "GOAWAY frame shorter than 8 bytes")
        last, error_code = unpack_goaway(data, start)
        last &= 0x7FFFFFFF
        self.draining = True
        # Streams up to last_stream_id may still finish (RFC 9113 §6.8).
        for doomed in [s for s in self._calls if s > last]:
            self._forget(doomed)
            out.append(goaway_result(doomed))
        if self._out:  # their requests may be queued still: they must not go out now
            kept = without_streams_above(b"".join(self._out), last)
            self._out[:] = [kept] if kept else []
        out.append(GoAwayReceived(last, error_code, bytes(data[start + 8 : stop])))

    # -- helpers ----------------------------------------------------------------------------

    def _queue_reply(self, reply: bytes) -> None:
        """Queue an ACK the peer asked for, within MAX_QUEUED_CONTROL_REPLY_BYTES not yet taken
        by the driver: a peer that floods PINGs or SETTINGS and never reads is cut off instead
        of growing our memory (nghttp2 and Go's server cap these replies too)."""
        self._queued_replies += len(reply)
        if self._queued_replies > MAX_QUEUED_CONTROL_REPLY_BYTES:
            self._out.clear()  # it does not read them anyway
            raise PeerConnectionError(ENHANCE_YOUR_CALM, TOO_MANY_REPLIES)
        self._out.append(reply)

    def _queue_header_block(self, stream_id: int, block: bytes) -> None:
        """HEADERS plus CONTINUATION frames, each within the server's MAX_FRAME_SIZE."""
        size = self._max_outbound_frame
        chunks = [block[i : i + size] for i in range(0, len(block), size)]
        for index, chunk in enumerate(chunks):
            frame_type = HEADERS if index == 0 else CONTINUATION
            flags = END_HEADERS if index == len(chunks) - 1 else 0
            self._out.append(frame(frame_type, flags, stream_id, chunk))

    def _end_stream(self, stream_id: int, call: Stream, out: list[Event]) -> None:
        self._forget(stream_id)
        if call.outbound or call.prefix:
            # The server answered before taking the whole request (RFC 9113 §8.1): stop sending
            # and close our half too, so the stream stops counting against its limit.
            call.prefix = b""
            call.outbound = EMPTY
            call.later = None
            self._out.append(frame(RST_STREAM, 0, stream_id, pack_u32(NO_ERROR)))
        out.append(finish(stream_id, call))
        out.append(StreamCapacityChanged())

    def _forget(self, stream_id: int) -> None:
        del self._calls[stream_id]
        self._blocked.pop(stream_id, None)

    def _untracked_stream(self, stream_id: int, what: str) -> None:
        """A frame for a stream without a call (RFC 9113 §5.1). Never opened: a protocol error.
        Closed, however (reset by either side, given up above a GOAWAY's last stream id, or
        ended): ignored, with no memory of which streams closed how, so a late frame can never
        end the connection however long ago its stream closed. RFC 9113 §5.1 allows this for
        every closed stream; Go's client and grpc-go do the same. (The caller still decoded a
        HEADERS block for the HPACK table and counted DATA against the connection window.)"""
        if stream_id & 1 == 0 or stream_id >= self._next_stream_id:
            raise PeerConnectionError(PROTOCOL_ERROR, f"{what} frame on idle stream {stream_id}")

    def _stream_error(self, stream_id: int, code: int, what: str, out: list[Event]) -> None:
        """The server broke HTTP/2 on one stream: reset it and fail its call only."""
        self._forget(stream_id)
        self._out.append(frame(RST_STREAM, 0, stream_id, pack_u32(code)))
        reason = f"HTTP/2 stream error from server: {what}"
        out.append(CallFinished(stream_id, StatusCode.INTERNAL, reason, None, FailureKind.PROTOCOL))
        out.append(StreamCapacityChanged())

    def _send_goaway(self, code: int) -> None:
        if not self._goaway_sent:
            self._goaway_sent = True
            self._out.append(frame(GOAWAY, 0, 0, pack_goaway(0, code)))

    def _connection_error(self, code: int, what: str, out: list[Event]) -> None:
        reason = f"HTTP/2 protocol error from server: {what}"
        self.broken = reason
        self._send_goaway(code)
        out.extend(self._fail_all(StatusCode.UNAVAILABLE, reason, FailureKind.PROTOCOL))
        out.append(ConnectionBroken(reason))

    def _fail_all(self, code: StatusCode, reason: str, kind: FailureKind) -> list[CallFinished]:
        self._blocked.clear()
        return super()._fail_all(code, reason, kind)
