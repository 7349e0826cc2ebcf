"""The server side of gRPC over HTTP/2 for unary calls, on `h2`, with no I/O: bytes in,
calls out to a `Dispatcher`; replies in, bytes out (`data_to_send`).

What a tonic server does, and so this one: a call is dispatched when its request has ended;
the API-key check, an unknown method and a compressed request are answered from the headers
alone; a reply is HEADERS, DATA, then trailers with `grpc-status` (a failure: one HEADERS
frame, "trailers only", with `grpc-message` percent-encoded); DATA waits for the peer's flow-
control windows; what arrives is acknowledged as it is read; `goaway()` says no more streams
and lets those begun finish."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Protocol

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from .service import INTERNAL, OK, UNIMPLEMENTED, Reply

CANCELLED, OUT_OF_RANGE = 1, 11
_PREFIX = struct.Struct(">BI")

_CONFIG = h2.config.H2Configuration(
    client_side=False,
    header_encoding=None,
    validate_inbound_headers=False,
    validate_outbound_headers=False,
    normalize_inbound_headers=False,
    normalize_outbound_headers=False,
)
# What a tonic (hyper) server offers: 1 MiB windows, streams unbounded.
_WINDOW = 1 << 20
_MAX_STREAMS = 2**31 - 1
_RESPONSE_HEADERS = ((b":status", b"200"), (b"content-type", b"application/grpc"))
_OK_TRAILERS = ((b"grpc-status", b"0"),)
# tonic's percent-encoding of grpc-message: controls, space and " # % < > ` ? { }, and
# every byte outside ASCII.
_PLAIN = frozenset(range(0x21, 0x7F)) - set(b'"#%<>`?{}')


def grpc_message(text: str) -> bytes:
    raw = text.encode("utf-8")
    if all(byte in _PLAIN for byte in raw):
        return raw
    return b"".join(bytes((byte,)) if byte in _PLAIN else b"%%%02X" % byte for byte in raw)


def parse_grpc_timeout(value: bytes) -> float | None:
    """Seconds, or None for an absent or malformed header (which tonic ignores)."""
    if not value or len(value) > 9:
        return None
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit():
        return None
    scale = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}.get(unit)
    return None if scale is None else int(digits) * scale


class Responder(Protocol):
    """A connection, as its calls see it."""

    def respond(self, call: Call, reply: Reply) -> None: ...


class Call:
    """One request stream."""

    __slots__ = (
        "answered",
        "authorization",
        "body",
        "connection",
        "deadline",
        "dispatched",
        "encoding",
        "path",
        "stream_id",
        "waiter",
    )

    def __init__(self, connection: Responder, stream_id: int) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.path = ""
        self.authorization: bytes | None = None
        self.encoding: bytes | None = None
        self.deadline = math.inf  # the runtime's clock; from grpc-timeout
        self.body = bytearray()
        self.answered = False
        self.dispatched = False
        self.waiter: object = None  # the dispatcher's, while a Reserve waits

    def respond(self, reply: Reply) -> None:
        self.connection.respond(self, reply)


class Dispatcher(Protocol):
    def admit(self, call: Call) -> Reply | None:
        """The reply to give from the headers alone (auth, unknown method), or None."""

    def dispatch(self, call: Call, body: bytes) -> None:
        """Answer the call (now or later) with `call.respond`."""

    def forget(self, call: Call) -> None:
        """The call ended without a reply from the dispatcher (reset, or the connection)."""

    def started(self, call: Call) -> None:
        """A call began (its deadline is known): for the dispatcher's timers."""


class ServerConnection:
    """One client connection. `on_output` is called whenever bytes wait to be sent."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        max_message_bytes: int,
        runtime_now: Callable[[], float],
        on_output: Callable[[], None],
    ) -> None:
        self._dispatcher = dispatcher
        self._max_message_bytes = max_message_bytes
        self._now = runtime_now
        self._on_output = on_output
        self._h2 = h2.connection.H2Connection(config=_CONFIG)
        self._h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: _MAX_STREAMS,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _WINDOW,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 16 << 10,
            },
        )
        self._calls: dict[int, Call] = {}
        # Replies whose DATA waits for a window: stream → (bytes left to send, trailers).
        self._sending: dict[int, list[bytes]] = {}
        self.closed = False  # no more to read or send: the driver may close the socket
        self._going_away = False
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(_WINDOW - 65_535)

    @property
    def idle(self) -> bool:
        """No call begun and not answered, nothing left to send."""
        return not self._calls and not self._sending

    def data_to_send(self) -> bytes:
        return bytes(self._h2.data_to_send())

    def receive(self, data: bytes) -> None:
        """Bytes from the client (b"": it closed its side)."""
        if not data:
            self.connection_lost()
            return
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            self._fail_connection()
            return
        for event in events:
            self._handle(event)
        self._on_output()

    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._request(event.stream_id, event.headers or [])
        elif isinstance(event, h2.events.DataReceived):
            if event.flow_controlled_length:
                self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            call = self._calls.get(event.stream_id)
            if call is not None and not call.answered:
                call.body += event.data or b""
                self._check_prefix(call)
        elif isinstance(event, h2.events.StreamEnded):
            self._ended(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            self._sending.pop(event.stream_id, None)
            call = self._calls.pop(event.stream_id, None)
            if call is not None and not call.answered:
                call.answered = True
                self._dispatcher.forget(call)
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self._send_pending()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._going_away = True
            self._close_if_done()

    def _request(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        if self._going_away:
            self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        call = Call(self, stream_id)
        self._calls[stream_id] = call
        for name, value in headers:
            if name == b":path":
                call.path = value.decode("utf-8", "replace")
            elif name == b"authorization":
                call.authorization = value
            elif name == b"grpc-timeout":
                timeout = parse_grpc_timeout(value)
                if timeout is not None:
                    call.deadline = self._now() + timeout
            elif name == b"grpc-encoding":
                call.encoding = value
        early = self._dispatcher.admit(call)
        if early is None and call.encoding is not None and call.encoding != b"identity":
            encoding = call.encoding.decode("utf-8", "replace")
            early = Reply(
                UNIMPLEMENTED, f"Content is compressed with `{encoding}` which isn't supported"
            )
            self.respond(call, early, extra=((b"grpc-accept-encoding", b"identity"),))
            return
        if early is not None:
            self.respond(call, early)
            return
        self._dispatcher.started(call)

    def _check_prefix(self, call: Call) -> None:
        if len(call.body) < _PREFIX.size:
            return
        flag, length = _PREFIX.unpack_from(call.body)
        if flag == 1:
            self.respond(
                call,
                Reply(
                    INTERNAL,
                    "protocol error: received message with compressed-flag but no "
                    "grpc-encoding was specified",
                ),
            )
        elif flag:
            self.respond(
                call,
                Reply(
                    INTERNAL,
                    f"protocol error: received message with invalid compression flag: {flag}"
                    " (valid flags are 0 and 1), while sending request",
                ),
            )
        elif length > self._max_message_bytes:
            self.respond(
                call,
                Reply(
                    OUT_OF_RANGE,
                    f"Error, decoded message length too large: found {length} bytes, the "
                    f"limit is: {self._max_message_bytes} bytes",
                ),
            )

    def _ended(self, stream_id: int) -> None:
        call = self._calls.get(stream_id)
        if call is None or call.answered or call.dispatched:
            return
        call.dispatched = True
        body = call.body
        if not body:
            self.respond(call, Reply(INTERNAL, "Missing request message."))
            return
        length = _PREFIX.unpack_from(body)[1] if len(body) >= _PREFIX.size else -1
        if length < 0 or len(body) < _PREFIX.size + length:
            self.respond(call, Reply(INTERNAL, "Unexpected EOF decoding stream."))
            return
        message = bytes(body[_PREFIX.size : _PREFIX.size + length])
        call.body = bytearray()
        self._dispatcher.dispatch(call, message)

    # -- replies ---------------------------------------------------------------------------

    def respond(
        self, call: Call, reply: Reply, *, extra: tuple[tuple[bytes, bytes], ...] = ()
    ) -> None:
        """Send `reply` on `call`'s stream (once; later replies are dropped)."""
        if call.answered:
            return
        call.answered = True
        stream_id = call.stream_id
        if self._calls.get(stream_id) is not call:
            return
        try:
            if reply.code != OK or reply.body is None:
                headers = [*_RESPONSE_HEADERS, (b"grpc-status", b"%d" % reply.code)]
                if reply.message:
                    headers.append((b"grpc-message", grpc_message(reply.message)))
                headers.extend(extra)
                self._h2.send_headers(stream_id, headers, end_stream=True)
                self._calls.pop(stream_id, None)
            else:
                self._h2.send_headers(stream_id, _RESPONSE_HEADERS)
                self._sending[stream_id] = [_PREFIX.pack(0, len(reply.body)) + reply.body]
                self._send_pending()
        except h2.exceptions.H2Error:  # the stream or connection is gone
            self._calls.pop(stream_id, None)
            self._sending.pop(stream_id, None)
        self._close_if_done()
        self._on_output()

    def _send_pending(self) -> None:
        h2conn = self._h2
        for stream_id in list(self._sending):
            left = self._sending[stream_id]
            data = left[0]
            try:
                while data:
                    window = min(
                        h2conn.local_flow_control_window(stream_id), h2conn.max_outbound_frame_size
                    )
                    if window <= 0:
                        break
                    h2conn.send_data(stream_id, data[:window])
                    data = data[window:]
                left[0] = data
                if not data:
                    h2conn.send_headers(stream_id, _OK_TRAILERS, end_stream=True)
                    del self._sending[stream_id]
                    self._calls.pop(stream_id, None)
            except h2.exceptions.H2Error:
                self._sending.pop(stream_id, None)
                self._calls.pop(stream_id, None)
        self._close_if_done()

    # -- the connection's end ----------------------------------------------------------------

    def goaway(self) -> None:
        """No new streams; those begun are answered, then GOAWAY (NO_ERROR) and it closes.
        (h2 sends nothing after a GOAWAY of ours, so it waits for the calls; a stream begun
        meanwhile is refused, REFUSED_STREAM.)"""
        if self._going_away or self.closed:
            return
        self._going_away = True
        self._close_if_done()
        self._on_output()

    def _close_if_done(self) -> None:
        if self._going_away and self.idle and not self.closed:
            self.closed = True
            try:
                self._h2.close_connection(
                    error_code=h2.errors.ErrorCodes.NO_ERROR,
                    last_stream_id=self._h2.highest_inbound_stream_id,
                )
            except h2.exceptions.H2Error:
                pass

    def _fail_connection(self) -> None:
        self.closed = True
        self.connection_lost()

    def connection_lost(self) -> None:
        """The socket is gone: every call still waiting is forgotten."""
        self.closed = True
        self._sending.clear()
        calls, self._calls = self._calls, {}
        for call in calls.values():
            if not call.answered:
                call.answered = True
                self._dispatcher.forget(call)
