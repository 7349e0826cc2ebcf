"""The default engine: a purpose-built sans-IO HTTP/2 client codec for unary gRPC calls.

It implements RFC 9113 from the client's side for exactly what this client does: many
concurrent unary calls on one connection, no server push, no priorities. Requests are packed
with `struct` from a per-method header block encoded once (`_hpack.py`); responses are parsed
in one loop over the received bytes, and header blocks are decoded with hpack's Decoder behind
a cache of whole blocks (see `_HeaderBlocks`). Peer errors follow h2's choice between stream
and connection errors where RFC 9113 leaves it open (§5.4.1 allows either), so the reference
engine and this one fail the same calls.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence

from hpack.exceptions import OversizedHeaderListError

from .._calls import (
    FIELD_OVERHEAD,
    CallTable,
    HeaderListTooLarge,
    StreamIdsExhausted,
    header_list_size,
    without_streams_above,
)
from .._constants import (
    DEFAULT_CONNECTION_WINDOW,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_HEADER_LIST_SIZE,
    DEFAULT_STREAM_WINDOW,
    MAX_HEADER_BLOCK_BYTES,
    MAX_INFORMATIONAL_RESPONSES,
    MAX_PINGS_WITHOUT_DATA,
    MAX_QUEUED_CONTROL_REPLY_BYTES,
    MAX_STREAM_ID,
    SERVICE_PATH,
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
from .._framing import (
    ACCEPT_ENCODING,
    PREFIX_BYTES,
    FramingError,
    Request,
    message_prefix,
    request_size,
)
from .._hpack import BoundedDecoder, encode_authority, encode_field
from .._response import (
    FRAME_HEADER_BYTES,
    ResponseState,
    finish,
    goaway_result,
    is_informational,
    reset_result,
)
from .._status import StatusCode, encode_grpc_timeout

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
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

# Settings (RFC 9113 §6.5.2).
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6
SETTINGS_ENABLE_CONNECT_PROTOCOL = 0x8  # RFC 8441

_DEFAULT_WINDOW = 65_535
_MAX_WINDOW = 2**31 - 1
_MIN_FRAME_SIZE = 16_384
_MAX_FRAME_SIZE_LIMIT = 2**24 - 1
_MAX_CONTINUATIONS = 64

# Frame header: 24-bit length (as 16 + 8 bits), type, flags, reserved bit + 31-bit stream id.
_FRAME = struct.Struct(">HBBBL")
_U32 = struct.Struct(">L")
_GOAWAY = struct.Struct(">LL")
_SETTING = struct.Struct(">HL")

_SETTINGS_ACK = _FRAME.pack(0, 0, SETTINGS, ACK, 0)
_TABLE_SIZE_ZERO = b"\x20"  # our first header block sets the server's table for us to 0
_TIMEOUT_FIELD = encode_field(b"grpc-timeout", b"", sensitive=True)[:-1]  # minus the 0 length
_TIMEOUT_FIELD_SIZE = len(b"grpc-timeout") + FIELD_OVERHEAD  # plus its value's length
# The most a grpc-timeout field can count (encode_grpc_timeout: at most 8 digits and a unit).
_MAX_TIMEOUT_FIELD_SIZE = _TIMEOUT_FIELD_SIZE + 9
_EMPTY = memoryview(b"")
# A request body at least this long goes to the driver as a view of the caller's bytes, beside
# its frame headers, instead of being copied into one buffer with them (see buffers_to_send).
VIEW_MIN_BYTES = 16 * 1024
_INTERESTING = frozenset(
    {b":status", b"content-type", b"grpc-status", b"grpc-message", b"grpc-encoding"}
)


def frame(frame_type: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame."""
    n = len(payload)
    return _FRAME.pack(n >> 8, n & 0xFF, frame_type, flags, stream_id) + payload


class _ConnectionError(Exception):
    """The peer broke HTTP/2: GOAWAY with `code`, and every call fails."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class _Call(ResponseState):
    __slots__ = ("later", "outbound", "prefix", "recv_window", "send_window")

    def __init__(self, max_receive_bytes: int | None, send_window: int, recv_window: int) -> None:
        super().__init__(max_receive_bytes)
        # The request not sent yet: the part of its gRPC length prefix left, then the message.
        # `outbound` is the rest of the message's current part, `later` the parts after it
        # (a request given in parts); `outbound` is empty only when nothing is left.
        self.prefix = b""
        self.outbound = _EMPTY
        self.later: list[memoryview] | None = None
        self.send_window = send_window
        self.recv_window = recv_window


class _HeaderBlocks:
    """Decodes response header blocks, remembering the result of each distinct block.

    A block's meaning depends on the HPACK dynamic table, which only changes when a block
    inserts an entry or resizes the table. So a block is remembered only if decoding it left
    the table untouched, and everything remembered is forgotten whenever the table changes:
    a remembered result is always what decoding the block now would give. The server encodes
    its steady responses (`:status 200`, content-type, `grpc-status 0`) as references to
    entries it inserted once, so after the first calls nearly every block is a dict hit. Only
    small blocks are remembered (block and fields within _MAX_ENTRY_BYTES), so the cache holds
    at most _MAX_ENTRIES * _MAX_ENTRY_BYTES bytes of them whatever the server sends.
    """

    __slots__ = ("_cache", "_decoder")

    _MAX_ENTRIES = 128
    _MAX_ENTRY_BYTES = 1024

    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = BoundedDecoder(max_header_list_size=max_header_list_size)
        self._cache: dict[bytes, tuple[Header, ...]] = {}

    def decode(self, block: bytes) -> tuple[Header, ...]:
        """The fields we read from a block (:status, content-type, grpc-status,
        grpc-message, grpc-encoding), in order; raises _ConnectionError if it cannot be decoded."""
        if block in self._cache:  # not .get(): see CallTable._calls
            return self._cache[block]
        table = self._decoder.header_table
        entries = table.dynamic_entries
        count = len(entries)
        newest = entries[0] if count else None
        max_size = table.maxsize
        try:
            headers = self._decoder.decode(block, raw=True)
        except OversizedHeaderListError as exc:
            raise _ConnectionError(ENHANCE_YOUR_CALM, f"oversized header block: {exc}") from None
        except Exception as exc:  # hpack raises assorted types on garbage
            raise _ConnectionError(
                COMPRESSION_ERROR, f"cannot decode a header block: {type(exc).__name__}: {exc}"
            ) from None
        fields = tuple((n, v) for n, v in headers if n in _INTERESTING)
        if (
            len(entries) != count
            or table.maxsize != max_size
            or (entries[0] if entries else None) is not newest
        ):
            self._cache.clear()
        elif len(block) + sum(len(n) + len(v) for n, v in fields) <= self._MAX_ENTRY_BYTES:
            if len(self._cache) >= self._MAX_ENTRIES:
                self._cache.clear()
            self._cache[bytes(block)] = fields
        return fields


class CodecGrpcConnection(CallTable[_Call]):
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
        # The fields before and after :path, which varies by method.
        before_path = [(b":method", b"POST"), (b":scheme", scheme.encode("ascii"))]
        after_path: list[tuple[bytes, bytes, bool]] = [
            (b":authority", encode_authority(authority), False),
            (b"te", b"trailers", False),
            (b"content-type", b"application/grpc", False),
            (b"user-agent", user_agent.encode("ascii"), False),
            (b"grpc-accept-encoding", ACCEPT_ENCODING, False),
            *((k, v, False) for k, v in metadata),
            # Credentials must never enter the HPACK dynamic table (RFC 7541 §7.1.3).
            *((k, v, True) for k, v in secret_metadata),
        ]
        self._before_path = b"".join(encode_field(n, v, sensitive=False) for n, v in before_path)
        self._after_path = b"".join(encode_field(n, v, sensitive=s) for n, v, s in after_path)
        # What those fields count against the server's header list limit, :path aside.
        self._fields_size = header_list_size(before_path) + header_list_size(
            (n, v) for n, v, _ in after_path
        )
        # Per method: its header block, and the room its header list leaves under the server's
        # limit with the longest grpc-timeout (recomputed when the limit changes). A call
        # counts its exact size only when its metadata takes more than that room.
        self._method_blocks: dict[str, tuple[bytes, int]] = {}
        self._first_block = True
        self._max_receive = max_receive_message_bytes
        self._stream_window = stream_window
        self._connection_window = connection_window
        self._blocks = _HeaderBlocks(DEFAULT_MAX_HEADER_LIST_SIZE)

        # Calls whose request body waits for flow-control window, in stream order.
        self._blocked: dict[int, _Call] = {}
        self._next_stream_id = 1
        self._out: list[bytes | memoryview] = []
        # Whether _out holds views of request bodies (else buffers_to_send joins it).
        self._views_queued = False
        # Bytes of PING and SETTINGS ACKs in _out (see _queue_reply).
        self._queued_replies = 0

        # What the server allows us (its SETTINGS and WINDOW_UPDATEs).
        self._send_window = _DEFAULT_WINDOW
        self._peer_initial_window = _DEFAULT_WINDOW
        self._max_outbound_frame = _MIN_FRAME_SIZE
        # What we allow the server; credited back in batches, not per DATA frame.
        self._recv_window = connection_window
        self._max_inbound_frame = DEFAULT_MAX_FRAME_SIZE

        # Received bytes not yet a whole frame (one buffer, however small the reads), and how
        # many bytes would complete it.
        self._pending = bytearray()
        self._needed = 0
        # A header block split over CONTINUATION frames: (stream id, END_STREAM) and parts.
        self._continuing: tuple[int, bool] | None = None
        self._block_parts: list[bytes] = []
        self._block_bytes = 0

        self._goaway_sent = False
        # PINGs we may still send before a HEADERS or DATA frame of ours (see send_ping), and
        # the next stream id when that was counted: a call started since sent HEADERS (so a
        # call costs no bookkeeping here; a request body's later DATA resets the count).
        self._pings_left = 0
        self._pings_counted_at = self._next_stream_id
        self._handlers: tuple[_FrameHandler, ...] = (
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
        settings = b"".join(
            _SETTING.pack(code, value)
            for code, value in (
                (SETTINGS_ENABLE_PUSH, 0),
                (SETTINGS_INITIAL_WINDOW_SIZE, self._stream_window),
                (SETTINGS_MAX_FRAME_SIZE, DEFAULT_MAX_FRAME_SIZE),
                (SETTINGS_MAX_HEADER_LIST_SIZE, DEFAULT_MAX_HEADER_LIST_SIZE),
            )
        )
        self._out.append(PREFACE + frame(SETTINGS, 0, 0, settings))
        extra = self._connection_window - _DEFAULT_WINDOW
        if extra > 0:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(extra)))

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
            block += _TIMEOUT_FIELD + bytes((len(value),)) + value
        for name, value in metadata:
            block += encode_field(name, value, sensitive=True)
            room -= len(name) + len(value) + FIELD_OVERHEAD
        if room < 0:  # perhaps over the server's limit: count exactly
            self._check_header_list(method, timeout, entry[1] - room)
        if self._first_block:
            self._first_block = False
            block = _TABLE_SIZE_ZERO + block
        stream_id = self._next_stream_id
        if stream_id + 2 > MAX_STREAM_ID:
            if stream_id > MAX_STREAM_ID:
                raise StreamIdsExhausted(f"stream id {stream_id} is past the last (2^31-1)")
            # Stream ids are spent: let this connection drain; the driver dials a fresh one.
            self.draining = True
        self._next_stream_id = stream_id + 2
        call = _Call(self._max_receive, self._peer_initial_window, self._stream_window)
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
            headers = _FRAME.pack(
                len(block) >> 8, len(block) & 0xFF, HEADERS, END_HEADERS, stream_id
            )
            if n <= self._send_window and n <= call.send_window and n <= max_frame:
                # The common case: the whole call in one write.
                self._send_window -= n
                call.send_window -= n
                head = (
                    headers
                    + block
                    + _FRAME.pack(n >> 8, n & 0xFF, DATA, END_STREAM, stream_id)
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

    def _method_entry(self, method: str) -> tuple[bytes, int]:
        path = SERVICE_PATH + method.encode("ascii")
        block = self._before_path + encode_field(b":path", path, sensitive=False) + self._after_path
        size = self._fields_size + header_list_size(((b":path", path),))
        entry = block, self._remote_max_header_list - size - _MAX_TIMEOUT_FIELD_SIZE
        self._method_blocks[method] = entry
        return entry

    def _check_header_list(self, method: str, timeout: float | None, metadata_size: int) -> None:
        """Raise HeaderListTooLarge if the call's headers come to more than the server's
        limit (start_call's slow path, when they may)."""
        path = SERVICE_PATH + method.encode("ascii")
        size = self._fields_size + header_list_size(((b":path", path),)) + metadata_size
        if timeout is not None:
            size += _TIMEOUT_FIELD_SIZE + len(encode_grpc_timeout(timeout))
        if size > self._remote_max_header_list:
            raise HeaderListTooLarge(size, self._remote_max_header_list)

    def cancel_call(self, stream_id: int) -> None:
        """Forget a call and reset its stream with CANCEL; the connection stays usable."""
        if self._calls.pop(stream_id, None) is None:
            return
        self._blocked.pop(stream_id, None)
        if self.broken is None:
            self._out.append(frame(RST_STREAM, 0, stream_id, _U32.pack(CANCEL)))

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
        unpack = _FRAME.unpack_from
        handlers = self._handlers
        try:
            while end - pos >= FRAME_HEADER_BYTES:
                high, low, frame_type, flags, stream_id = unpack(data, pos)
                length = (high << 8) | low
                if length > self._max_inbound_frame:
                    raise _ConnectionError(
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
                    raise _ConnectionError(
                        PROTOCOL_ERROR, f"frame type {frame_type} inside a header block"
                    )
                if frame_type < 10:
                    handlers[frame_type](data, start, stop, flags, stream_id & 0x7FFFFFFF, out)
        except _ConnectionError as exc:
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

    def _set_next_stream_id(self, stream_id: int) -> None:
        """Tests of stream-id exhaustion start near the end of the id space."""
        self._next_stream_id = stream_id

    # -- frames from the server --------------------------------------------------------------

    def _on_data(
        self, data: bytes, start: int, stop: int, flags: int, stream_id: int, out: list[Event]
    ) -> None:
        if stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "DATA frame on stream 0")
        flow_length = stop - start
        if flags & PADDED:
            start, stop = _strip_padding(data, start, stop, "DATA")
        # Every DATA frame counts against the connection window, even on a closed stream.
        window = self._recv_window - flow_length
        if window < 0:
            raise _ConnectionError(FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        consumed = self._connection_window - window
        if consumed >= self._connection_window >> 2:
            self._out.append(frame(WINDOW_UPDATE, 0, 0, _U32.pack(consumed)))
            window = self._connection_window
        self._recv_window = window
        call = self._calls[stream_id] if stream_id in self._calls else None
        if call is None:
            self._untracked_stream(stream_id, "DATA")
            return
        stream_window = call.recv_window - flow_length
        if stream_window < 0:
            raise _ConnectionError(FLOW_CONTROL_ERROR, f"DATA beyond stream {stream_id}'s window")
        if not flags & END_STREAM and stream_window <= self._stream_window >> 1:
            credit = self._stream_window - stream_window
            self._out.append(frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(credit)))
            stream_window = self._stream_window
        call.recv_window = stream_window
        if not call.headers_received:
            raise _ConnectionError(PROTOCOL_ERROR, f"DATA before HEADERS on stream {stream_id}")
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
                self._out.append(frame(RST_STREAM, 0, stream_id, _U32.pack(CANCEL)))
                out.append(CallFinished(stream_id, code, str(exc), None, exc.kind))
                out.append(StreamCapacityChanged())
                return
        # Otherwise not a gRPC body (say a proxy's HTML error page): dropped unread; finish()
        # maps the response by its :status or content-type, not by a framing error.
        if flags & END_STREAM:
            self._end_stream(stream_id, call, out)

    def _on_headers(
        self, data: bytes, start: int, stop: int, flags: int, stream_id: int, out: list[Event]
    ) -> None:
        if stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "HEADERS frame on stream 0")
        if flags & PADDED:
            start, stop = _strip_padding(data, start, stop, "HEADERS")
        if flags & PRIORITY_FLAG:
            if stop - start < 5:
                raise _ConnectionError(FRAME_SIZE_ERROR, "HEADERS frame too short for PRIORITY")
            if stream_id in self._calls:  # (a late frame on a reset stream is not checked)
                _check_dependency(data, start, stream_id)
            start += 5  # otherwise ignored: priority signals are deprecated (RFC 9113 §5.3.2)
        if stop - start > MAX_HEADER_BLOCK_BYTES:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "header block exceeds our limit")
        block = data[start:stop]
        end_stream = bool(flags & END_STREAM)
        if flags & END_HEADERS:
            self._on_header_block(stream_id, block, end_stream, out)
        else:
            self._continuing = (stream_id, end_stream)
            self._block_parts = [block]
            self._block_bytes = len(block)

    def _on_continuation(
        self, data: bytes, start: int, stop: int, flags: int, stream_id: int, out: list[Event]
    ) -> None:
        continuing = self._continuing
        if continuing is None or continuing[0] != stream_id:
            raise _ConnectionError(PROTOCOL_ERROR, "CONTINUATION outside a header block")
        self._block_parts.append(data[start:stop])
        self._block_bytes += stop - start
        # Refuse a CONTINUATION flood before buffering it: too many frames (h2's limit), or a
        # compressed block that could not decode within our header list limit anyway.
        if len(self._block_parts) > _MAX_CONTINUATIONS:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "too many CONTINUATION frames")
        if self._block_bytes > MAX_HEADER_BLOCK_BYTES:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "header block exceeds our limit")
        if flags & END_HEADERS:
            block = b"".join(self._block_parts)
            self._continuing = None
            self._block_parts = []
            self._on_header_block(stream_id, block, continuing[1], out)

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
                raise _ConnectionError(PROTOCOL_ERROR, "trailers without END_STREAM")
            call.read_headers(fields)
        else:
            if is_informational(fields):
                if end_stream:
                    raise _ConnectionError(PROTOCOL_ERROR, "END_STREAM on a 1xx response")
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
            raise _ConnectionError(PROTOCOL_ERROR, "PRIORITY frame on stream 0")
        if stop - start != 5:
            raise _ConnectionError(FRAME_SIZE_ERROR, "PRIORITY frame is not 5 bytes")
        _check_dependency(data, start, stream_id)

    def _on_rst_stream(
        self, data: bytes, start: int, stop: int, flags: int, stream_id: int, out: list[Event]
    ) -> None:
        if stream_id == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "RST_STREAM frame on stream 0")
        if stop - start != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "RST_STREAM frame is not 4 bytes")
        call = self._calls[stream_id] if stream_id in self._calls else None
        if call is None:
            return  # nothing to reset (like h2, even for a stream never opened)
        self._forget(stream_id)
        out.append(reset_result(stream_id, call, _U32.unpack_from(data, start)[0]))
        out.append(StreamCapacityChanged())

    def _on_settings(
        self, data: bytes, start: int, stop: int, flags: int, stream_id: int, out: list[Event]
    ) -> None:
        if stream_id != 0:
            raise _ConnectionError(PROTOCOL_ERROR, "SETTINGS frame on a stream")
        if flags & ACK:
            if stop != start:
                raise _ConnectionError(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if (stop - start) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "SETTINGS payload is not a multiple of 6")
        # Every value is checked in order (RFC 9113 §6.5.3), but a setting named many times
        # takes effect once, with its last value: a frame of many entries costs its length.
        max_streams = self._remote_max_streams
        window = self._peer_initial_window
        for offset in range(start, stop, 6):
            code, value = _SETTING.unpack_from(data, offset)
            if code == SETTINGS_MAX_CONCURRENT_STREAMS:
                max_streams = value
            elif code == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > _MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
                window = value
            elif code == SETTINGS_MAX_FRAME_SIZE:
                if not _MIN_FRAME_SIZE <= value <= _MAX_FRAME_SIZE_LIMIT:
                    raise _ConnectionError(PROTOCOL_ERROR, f"invalid MAX_FRAME_SIZE {value}")
                self._max_outbound_frame = value
            elif code == SETTINGS_ENABLE_PUSH and value != 0:
                raise _ConnectionError(PROTOCOL_ERROR, "a server cannot enable push")
            elif code == SETTINGS_ENABLE_CONNECT_PROTOCOL and value > 1:
                raise _ConnectionError(PROTOCOL_ERROR, f"invalid ENABLE_CONNECT_PROTOCOL {value}")
            elif code == SETTINGS_MAX_HEADER_LIST_SIZE:
                # Advisory in RFC 9113, but a server refuses a bigger block (or ends the
                # connection): start_call refuses it first.
                if value != self._remote_max_header_list:
                    self._remote_max_header_list = value
                    self._method_blocks.clear()  # their room was reckoned with the old limit
            # HEADER_TABLE_SIZE: our encoder never indexes, so the server's table size is moot.
            # Unknown settings are ignored (§6.5.2).
        delta = window - self._peer_initial_window
        if delta:
            self._peer_initial_window = window
            for call in self._calls.values():
                call.send_window += delta
                if call.send_window > _MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "a stream window overflowed")
            if delta > 0:
                self._flush_blocked()
        self._queue_reply(_SETTINGS_ACK)
        # Callers waiting for a stream wake only when the server's limit may let them start.
        if max_streams != self._remote_max_streams or not self._settings_received:
            self._remote_max_streams = max_streams
            self._settings_received = True
            out.append(StreamCapacityChanged())

    def _on_push_promise(
        self, data: bytes, start: int, stop: int, flags: int, stream_id: int, out: list[Event]
    ) -> None:
        raise _ConnectionError(PROTOCOL_ERROR, "PUSH_PROMISE although we disabled push")

    def _on_ping(
        self, data: bytes, start: int, stop: int, flags: int, stream_id: int, out: list[Event]
    ) -> None:
        if stream_id != 0:
            raise _ConnectionError(PROTOCOL_ERROR, "PING frame on a stream")
        if stop - start != 8:
            raise _ConnectionError(FRAME_SIZE_ERROR, "PING frame is not 8 bytes")
        opaque = data[start:stop]
        if flags & ACK:
            out.append(PingAcknowledged(opaque))
        else:
            self._queue_reply(frame(PING, ACK, 0, opaque))

    def _on_goaway(
        self, data: bytes, start: int, stop: int, flags: int, stream_id: int, out: list[Event]
    ) -> None:
        if stream_id != 0:
            raise _ConnectionError(PROTOCOL_ERROR, "GOAWAY frame on a stream")
        if stop - start < 8:
            raise _ConnectionError(FRAME_SIZE_ERROR, "GOAWAY frame shorter than 8 bytes")
        last, error_code = _GOAWAY.unpack_from(data, start)
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

    def _on_window_update(
        self, data: bytes, start: int, stop: int, flags: int, stream_id: int, out: list[Event]
    ) -> None:
        if stop - start != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "WINDOW_UPDATE frame is not 4 bytes")
        increment = _U32.unpack_from(data, start)[0] & 0x7FFFFFFF
        if increment == 0:  # a stream error on a stream; like h2, we end the connection
            raise _ConnectionError(PROTOCOL_ERROR, f"WINDOW_UPDATE of 0 on stream {stream_id}")
        if stream_id == 0:
            self._send_window += increment
            if self._send_window > _MAX_WINDOW:
                raise _ConnectionError(FLOW_CONTROL_ERROR, "the connection window overflowed")
            self._flush_blocked()
            return
        call = self._calls[stream_id] if stream_id in self._calls else None
        if call is None:
            self._untracked_stream(stream_id, "WINDOW_UPDATE")
            return
        call.send_window += increment
        if call.send_window > _MAX_WINDOW:
            self._stream_error(stream_id, FLOW_CONTROL_ERROR, "stream window overflow", out)
            return
        if call.outbound or call.prefix:
            self._send_body(stream_id, call)

    # -- helpers ----------------------------------------------------------------------------

    def _queue_reply(self, reply: bytes) -> None:
        """Queue an ACK the peer asked for, within MAX_QUEUED_CONTROL_REPLY_BYTES not yet taken
        by the driver: a peer that floods PINGs or SETTINGS and never reads is cut off instead
        of growing our memory (nghttp2 and Go's server cap these replies too)."""
        self._queued_replies += len(reply)
        if self._queued_replies > MAX_QUEUED_CONTROL_REPLY_BYTES:
            self._out.clear()  # it does not read them anyway
            raise _ConnectionError(ENHANCE_YOUR_CALM, TOO_MANY_REPLIES)
        self._out.append(reply)

    def _queue_header_block(self, stream_id: int, block: bytes) -> None:
        """HEADERS plus CONTINUATION frames, each within the server's MAX_FRAME_SIZE."""
        size = self._max_outbound_frame
        chunks = [block[i : i + size] for i in range(0, len(block), size)]
        for index, chunk in enumerate(chunks):
            frame_type = HEADERS if index == 0 else CONTINUATION
            flags = END_HEADERS if index == len(chunks) - 1 else 0
            self._out.append(frame(frame_type, flags, stream_id, chunk))

    def _send_body(self, stream_id: int, call: _Call) -> None:
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
                    header = _FRAME.pack(n >> 8, n & 0xFF, DATA, 0, stream_id)
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
            header = _FRAME.pack(n >> 8, n & 0xFF, DATA, 0 if left else END_STREAM, stream_id)
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
        call.outbound = _EMPTY
        call.later = None
        self._blocked.pop(stream_id, None)

    def _flush_blocked(self) -> None:
        for stream_id, call in list(self._blocked.items()):
            if self._send_window <= 0:
                return
            self._send_body(stream_id, call)

    def _end_stream(self, stream_id: int, call: _Call, out: list[Event]) -> None:
        self._forget(stream_id)
        if call.outbound or call.prefix:
            # The server answered before taking the whole request (RFC 9113 §8.1): stop sending
            # and close our half too, so the stream stops counting against its limit.
            call.prefix = b""
            call.outbound = _EMPTY
            call.later = None
            self._out.append(frame(RST_STREAM, 0, stream_id, _U32.pack(NO_ERROR)))
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
            raise _ConnectionError(PROTOCOL_ERROR, f"{what} frame on idle stream {stream_id}")

    def _stream_error(self, stream_id: int, code: int, what: str, out: list[Event]) -> None:
        """The server broke HTTP/2 on one stream: reset it and fail its call only."""
        self._forget(stream_id)
        self._out.append(frame(RST_STREAM, 0, stream_id, _U32.pack(code)))
        reason = f"HTTP/2 stream error from server: {what}"
        out.append(CallFinished(stream_id, StatusCode.INTERNAL, reason, None, FailureKind.PROTOCOL))
        out.append(StreamCapacityChanged())

    def _send_goaway(self, code: int) -> None:
        if not self._goaway_sent:
            self._goaway_sent = True
            self._out.append(frame(GOAWAY, 0, 0, _GOAWAY.pack(0, code)))

    def _connection_error(self, code: int, what: str, out: list[Event]) -> None:
        reason = f"HTTP/2 protocol error from server: {what}"
        self.broken = reason
        self._send_goaway(code)
        out.extend(self._fail_all(StatusCode.UNAVAILABLE, reason, FailureKind.PROTOCOL))
        out.append(ConnectionBroken(reason))

    def _fail_all(self, code: StatusCode, reason: str, kind: FailureKind) -> list[CallFinished]:
        self._blocked.clear()
        return super()._fail_all(code, reason, kind)


_FrameHandler = Callable[[bytes, int, int, int, int, list[Event]], None]


def _check_dependency(data: bytes, start: int, stream_id: int) -> None:
    if _U32.unpack_from(data, start)[0] & 0x7FFFFFFF == stream_id:
        raise _ConnectionError(PROTOCOL_ERROR, f"stream {stream_id} depends on itself")


def _strip_padding(data: bytes, start: int, stop: int, what: str) -> tuple[int, int]:
    if stop == start:
        raise _ConnectionError(FRAME_SIZE_ERROR, f"padded {what} frame without a pad length")
    pad = data[start]
    if pad >= stop - start:
        raise _ConnectionError(PROTOCOL_ERROR, f"{what} padding exceeds the frame")
    return start + 1, stop - pad
