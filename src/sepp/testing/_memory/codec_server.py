"""The memory server's default HTTP/2 side: a purpose-built codec for what a gRPC server of
unary calls needs, with the interface of `h2_server.ServerConnection` (the reference, on h2)
and its behaviour, at a fraction of its cost per call (a memory server runs in the test's
process, so what it spends there is the test's time).

Frames are parsed in one loop over the bytes read; replies are packed with `struct` from
header blocks encoded once (`:status 200`, content-type, `grpc-status 0` never change). A
request's header block is decoded field by field, each distinct field once: a field that is a
static-table reference or a literal the peer did not add to its table means the same in
every block (sepp clients send their headers so); a block that touches the HPACK dynamic
table (grpcio's do) goes to hpack's Decoder whole, which keeps the table.
"""

from __future__ import annotations

import struct

from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

from ...wire._hpack import BoundedDecoder, encode_field
from . import calls
from .calls import PREFIX, Call, Extra, ServerSide, grpc_message
from .service import OK, Reply

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x5, 0x6, 0x7, 0x8, 0x9
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR = 0x0, 0x1, 0x3, 0x6
COMPRESSION_ERROR = 0x9
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x4, 0x5

_FRAME = struct.Struct(">HBBBL")  # 24-bit length as 16 + 8 bits, type, flags, stream id
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")
_WINDOW = 1 << 20  # what a tonic (hyper) server offers, for streams and the connection
_MAX_STREAMS = 2**31 - 1
_MAX_HEADER_LIST = 16 << 10
_MAX_BLOCK = 4 * _MAX_HEADER_LIST
_MAX_FRAME = 1 << 14  # what we take in one frame (the default: we announce no other)
_MAX_FIELDS_CACHED = 1024


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return _FRAME.pack(size >> 8, size & 0xFF, kind, flags, stream_id) + payload


_SETTINGS_ACK = _frame(SETTINGS, ACK, 0)
_OUR_SETTINGS = _frame(
    SETTINGS,
    0,
    0,
    _SETTING.pack(0x3, _MAX_STREAMS)
    + _SETTING.pack(SETTINGS_INITIAL_WINDOW_SIZE, _WINDOW)
    + _SETTING.pack(0x6, _MAX_HEADER_LIST),
)
_OPENING = _OUR_SETTINGS + _frame(WINDOW_UPDATE, 0, 0, _U32.pack(_WINDOW - 65_535))
_STATUS_200 = b"\x88" + encode_field(b"content-type", b"application/grpc", sensitive=False)
_OK_TRAILERS = encode_field(b"grpc-status", b"0", sensitive=False)
_STATIC = HeaderTable.STATIC_TABLE


class _ProtocolError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Fields:
    """Request header blocks to (name, value) pairs (see the module's docstring)."""

    __slots__ = ("_cache", "_decoder")

    def __init__(self) -> None:
        self._decoder = BoundedDecoder(max_header_list_size=_MAX_HEADER_LIST)
        self._cache: dict[bytes, tuple[bytes, bytes]] = {}

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        fields = self._stateless(block)
        if fields is not None:
            return fields
        try:
            return [(bytes(n), bytes(v)) for n, v in self._decoder.decode(block, raw=True)]
        except Exception as exc:  # hpack raises assorted types on garbage
            raise _ProtocolError(
                COMPRESSION_ERROR, f"cannot decode a header block: {exc}"
            ) from None

    def _stateless(self, block: bytes) -> list[tuple[bytes, bytes]] | None:
        """The fields, if every one means the same whatever the dynamic table holds; else
        None (the block is left, unread, to the decoder)."""
        out = []
        cache = self._cache
        pos, end = 0, len(block)
        while pos < end:
            first = block[pos]
            if first & 0x80:  # indexed: only a static entry is the same in every table
                index, stop = _integer(block, pos, 7)
                if not 1 <= index <= len(_STATIC):
                    return None
                out.append(_STATIC[index - 1])
                pos = stop
                continue
            if first & 0xE0:  # incremental indexing, or a table size update: changes the table
                if first & 0xF0 != 0x10:
                    return None
            start = pos
            name_index, pos = _integer(block, pos, 4)
            if name_index:
                if name_index > len(_STATIC):
                    return None
                pos = _skip_string(block, pos)
            else:
                pos = _skip_string(block, _skip_string(block, pos))
            if pos > end:
                return None
            raw = block[start:pos]
            field = cache.get(raw)
            if field is None:
                field = _literal(raw, name_index)
                if len(cache) >= _MAX_FIELDS_CACHED:
                    cache.clear()
                cache[raw] = field
            out.append(field)
        return out


def _integer(data: bytes, pos: int, prefix_bits: int) -> tuple[int, int]:
    limit = (1 << prefix_bits) - 1
    if pos >= len(data):
        raise _ProtocolError(COMPRESSION_ERROR, "a truncated header block")
    value = data[pos] & limit
    pos += 1
    if value < limit:
        return value, pos
    shift = 0
    while True:
        if pos >= len(data) or shift > 28:
            raise _ProtocolError(COMPRESSION_ERROR, "a malformed integer in a header block")
        byte = data[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _skip_string(data: bytes, pos: int) -> int:
    length, pos = _integer(data, pos, 7)
    return pos + length


def _string(data: bytes, pos: int) -> tuple[bytes, int]:
    huffman = data[pos] & 0x80 if pos < len(data) else 0
    length, pos = _integer(data, pos, 7)
    raw = data[pos : pos + length]
    if len(raw) != length:
        raise _ProtocolError(COMPRESSION_ERROR, "a truncated header block")
    if huffman:
        try:
            raw = decode_huffman(raw)
        except Exception as exc:
            raise _ProtocolError(COMPRESSION_ERROR, f"bad Huffman coding: {exc}") from None
    return bytes(raw), pos + length


def _literal(raw: bytes, name_index: int) -> tuple[bytes, bytes]:
    _, pos = _integer(raw, 0, 4)
    if name_index:
        name = _STATIC[name_index - 1][0]
    else:
        name, pos = _string(raw, pos)
    value, _ = _string(raw, pos)
    return name, value


class CodecServerConnection(ServerSide):
    """One client connection (the interface of h2_server.ServerConnection)."""

    def _open_connection(self) -> None:
        self._out: list[bytes] = [_OPENING]
        self._in = b""
        self._preface = True
        self._fields = _Fields()
        self._open: set[int] = set()  # streams the client may still send on
        self._last_stream = 0
        self._block: bytearray | None = None  # a header block awaiting CONTINUATION
        self._block_stream = 0
        self._block_ends_stream = False
        # Flow control: what we may send, and what the client may send before we credit it.
        self._send_window = 65_535
        self._initial_send_window = 65_535
        self._stream_windows: dict[int, int] = {}
        self._max_frame = 16_384
        self._received = 0  # connection bytes not yet credited back
        self._stream_received: dict[int, int] = {}

    def data_to_send(self) -> bytes:
        if not self._out:
            return b""
        out = b"".join(self._out)
        self._out.clear()
        return out

    # -- reading ----------------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        if not data:
            self.connection_lost()
            return
        if self.closed:
            return
        try:
            self._receive(data)
        except _ProtocolError as exc:
            self._out.append(
                _frame(GOAWAY, 0, 0, _U32.pack(self._last_stream) + _U32.pack(exc.code))
            )
            self.connection_lost()
        self._on_output()

    def _receive(self, data: bytes) -> None:
        buffer = self._in + data if self._in else data
        if self._preface:
            if len(buffer) < len(PREFACE):
                if not PREFACE.startswith(buffer):
                    raise _ProtocolError(PROTOCOL_ERROR, "not the HTTP/2 preface")
                self._in = buffer
                return
            if not buffer.startswith(PREFACE):
                raise _ProtocolError(PROTOCOL_ERROR, "not the HTTP/2 preface")
            buffer = buffer[len(PREFACE) :]
            self._preface = False
        pos, end = 0, len(buffer)
        while end - pos >= 9:
            high, low, kind, flags, stream_id = _FRAME.unpack_from(buffer, pos)
            size = high << 8 | low
            if size > _MAX_FRAME:
                raise _ProtocolError(FRAME_SIZE_ERROR, f"a frame of {size} bytes")
            if end - pos - 9 < size:
                break
            payload = buffer[pos + 9 : pos + 9 + size]
            pos += 9 + size
            self._frame(kind, flags, stream_id & 0x7FFFFFFF, payload)
        self._in = buffer[pos:] if pos < end else b""

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block is not None and kind != CONTINUATION:
            raise _ProtocolError(PROTOCOL_ERROR, "a frame inside a header block")
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            if self._block is None or stream_id != self._block_stream:
                raise _ProtocolError(PROTOCOL_ERROR, "an unexpected CONTINUATION")
            self._block += payload
            if len(self._block) > _MAX_BLOCK:
                raise _ProtocolError(COMPRESSION_ERROR, "a header block too large")
            if flags & END_HEADERS:
                block, self._block = bytes(self._block), None
                self._header_block(stream_id, block, self._block_ends_stream)
        elif kind == SETTINGS:
            if not flags & ACK:
                self._settings(payload)
        elif kind == PING:
            if not flags & ACK and len(payload) == 8:
                self._out.append(_frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == RST_STREAM:
            self._reset(stream_id)
        elif kind == GOAWAY:
            self._going_away = True
            self._close_if_done()
        elif kind == PUSH_PROMISE:
            raise _ProtocolError(PROTOCOL_ERROR, "a client sent PUSH_PROMISE")
        # PRIORITY and unknown frame types are ignored (RFC 9113 §5.5).

    def _unpadded(self, flags: int, payload: bytes) -> bytes:
        if flags & PADDED:
            if not payload or payload[0] >= len(payload):
                raise _ProtocolError(PROTOCOL_ERROR, "bad padding")
            return payload[1 : len(payload) - payload[0]]
        return payload

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        block = self._unpadded(flags, payload)
        if flags & PRIORITY_FLAG:
            block = block[5:]
        ends_stream = bool(flags & END_STREAM)
        if not flags & END_HEADERS:
            self._block = bytearray(block)
            self._block_stream = stream_id
            self._block_ends_stream = ends_stream
            return
        self._header_block(stream_id, block, ends_stream)

    def _header_block(self, stream_id: int, block: bytes, ends_stream: bool) -> None:
        fields = self._fields.decode(block)
        if stream_id in self._open:  # request trailers: nothing in them matters
            if ends_stream:
                self._ended(stream_id)
            return
        if stream_id % 2 == 0 or stream_id <= self._last_stream:
            raise _ProtocolError(PROTOCOL_ERROR, f"a new stream {stream_id} out of order")
        self._last_stream = stream_id
        if self._going_away:
            return  # past our GOAWAY: never processed
        self._open.add(stream_id)
        self._stream_windows[stream_id] = self._initial_send_window
        call = Call(self, stream_id)
        self._calls[stream_id] = call
        call.read_headers(fields, self._now())
        calls.begin(self._dispatcher, call)
        if ends_stream:
            self._ended(stream_id)

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        size = len(payload)
        if size:
            self._received += size
            if self._received >= _WINDOW // 2:
                self._out.append(_frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._received)))
                self._received = 0
        if stream_id not in self._open:
            if stream_id > self._last_stream or stream_id == 0:
                raise _ProtocolError(PROTOCOL_ERROR, f"DATA on idle stream {stream_id}")
            return  # a stream we closed (answered early, or reset): its bytes are dropped
        if size and not flags & END_STREAM:
            credit = self._stream_received.get(stream_id, 0) + size
            if credit >= _WINDOW // 2:
                self._out.append(_frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(credit)))
                credit = 0
            self._stream_received[stream_id] = credit
        call = self._calls.get(stream_id)
        if call is not None and not call.answered:
            call.body += self._unpadded(flags, payload)
            calls.check_prefix(call, self._max_message_bytes)
        if flags & END_STREAM:
            self._ended(stream_id)

    def _ended(self, stream_id: int) -> None:
        self._open.discard(stream_id)
        self._stream_received.pop(stream_id, None)
        calls.ended(self._dispatcher, self._calls.get(stream_id))

    def _settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise _ProtocolError(FRAME_SIZE_ERROR, "a SETTINGS frame of odd length")
        for offset in range(0, len(payload), 6):
            setting, value = _SETTING.unpack_from(payload, offset)
            if setting == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > 2**31 - 1:
                    raise _ProtocolError(FLOW_CONTROL_ERROR, "an initial window too large")
                delta = value - self._initial_send_window
                self._initial_send_window = value
                for stream_id in self._stream_windows:
                    self._stream_windows[stream_id] += delta
            elif setting == SETTINGS_MAX_FRAME_SIZE:
                if not 16_384 <= value <= 2**24 - 1:
                    raise _ProtocolError(PROTOCOL_ERROR, f"a max frame size of {value}")
                self._max_frame = value
        self._out.append(_SETTINGS_ACK)
        self._send_pending()

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ProtocolError(FRAME_SIZE_ERROR, "a WINDOW_UPDATE of the wrong size")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if stream_id == 0:
            self._send_window += increment
        elif stream_id in self._stream_windows:
            self._stream_windows[stream_id] += increment
        self._send_pending()

    def _reset(self, stream_id: int) -> None:
        self._open.discard(stream_id)
        self._sending.pop(stream_id, None)
        self._stream_windows.pop(stream_id, None)
        self._stream_received.pop(stream_id, None)
        call = self._calls.pop(stream_id, None)
        if call is not None and not call.answered:
            call.answered = True
            self._dispatcher.forget(call)
        self._close_if_done()

    # -- replies ----------------------------------------------------------------------------

    def respond(self, call: Call, reply: Reply, *, extra: Extra = ()) -> None:
        if not self._claim(call):
            return
        stream_id = call.stream_id
        if reply.code != OK or reply.body is None:
            block = _STATUS_200 + encode_field(b"grpc-status", b"%d" % reply.code, sensitive=False)
            if reply.message:
                block += encode_field(b"grpc-message", grpc_message(reply.message), sensitive=False)
            for name, value in extra:
                block += encode_field(name, value, sensitive=False)
            self._headers_out(stream_id, block, end_stream=True)
            self._finish(stream_id)
        else:
            self._headers_out(stream_id, _STATUS_200, end_stream=False)
            self._sending[stream_id] = [PREFIX.pack(0, len(reply.body)) + reply.body]
            self._send_pending()
        self._close_if_done()
        self._on_output()

    def _headers_out(self, stream_id: int, block: bytes, *, end_stream: bool) -> None:
        flags = END_HEADERS | (END_STREAM if end_stream else 0)
        if len(block) <= self._max_frame:
            self._out.append(_frame(HEADERS, flags, stream_id, block))
            return
        chunks = [block[i : i + self._max_frame] for i in range(0, len(block), self._max_frame)]
        self._out.append(_frame(HEADERS, flags & ~END_HEADERS, stream_id, chunks[0]))
        for chunk in chunks[1:-1]:
            self._out.append(_frame(CONTINUATION, 0, stream_id, chunk))
        self._out.append(_frame(CONTINUATION, END_HEADERS, stream_id, chunks[-1]))

    def _finish(self, stream_id: int) -> None:
        self._calls.pop(stream_id, None)
        self._sending.pop(stream_id, None)
        if stream_id not in self._open:
            self._stream_windows.pop(stream_id, None)

    def _send_pending(self) -> None:
        for stream_id in list(self._sending):
            left = self._sending[stream_id]
            data = left[0]
            while data:
                window = min(
                    self._send_window, self._stream_windows.get(stream_id, 0), self._max_frame
                )
                if window <= 0:
                    break
                chunk, data = data[:window], data[window:]
                self._send_window -= len(chunk)
                self._stream_windows[stream_id] -= len(chunk)
                self._out.append(_frame(DATA, 0, stream_id, chunk))
            left[0] = data
            if not data:
                self._out.append(_frame(HEADERS, END_HEADERS | END_STREAM, stream_id, _OK_TRAILERS))
                self._finish(stream_id)
        self._close_if_done()

    # -- the end ------------------------------------------------------------------------------

    def goaway(self) -> None:
        if self._going_away or self.closed:
            return
        self._going_away = True
        self._out.append(_frame(GOAWAY, 0, 0, _U32.pack(self._last_stream) + _U32.pack(NO_ERROR)))
        self._close_if_done()
        self._on_output()

    def _close_if_done(self) -> None:
        if self._going_away and self.idle:
            self.closed = True
