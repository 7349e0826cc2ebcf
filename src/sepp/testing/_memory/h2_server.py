"""The server side of gRPC over HTTP/2 for unary calls, on `h2`, with no I/O: bytes in,
calls out to a `Dispatcher`; replies in, bytes out (`data_to_send`).

What a tonic server does, and so this one: a call is dispatched when its request has ended;
the API-key check, an unknown method and a compressed request are answered from the headers
alone; a reply is HEADERS, DATA, then trailers with `grpc-status` (a failure: one HEADERS
frame, "trailers only", with `grpc-message` percent-encoded); DATA waits for the peer's flow-
control windows; what arrives is acknowledged as it is read; `goaway()` says no more streams
and lets those begun finish."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from . import calls
from .calls import PREFIX, Call, Extra, ServerSide, grpc_message
from .service import OK, Reply

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


class ServerConnection(ServerSide):
    """One client connection. `on_output` is called whenever bytes wait to be sent."""

    def _open_connection(self) -> None:
        self._h2 = h2.connection.H2Connection(config=_CONFIG)
        self._h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: _MAX_STREAMS,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _WINDOW,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 16 << 10,
            },
        )
        # Replies whose DATA waits for a window: stream → (bytes left to send, trailers).
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(_WINDOW - 65_535)

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
                calls.check_prefix(call, self._max_message_bytes)
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
        call.read_headers(headers, self._now())
        calls.begin(self._dispatcher, call)

    def _ended(self, stream_id: int) -> None:
        calls.ended(self._dispatcher, self._calls.get(stream_id))

    # -- replies ---------------------------------------------------------------------------

    def respond(self, call: Call, reply: Reply, *, extra: Extra = ()) -> None:
        """Send `reply` on `call`'s stream (once; later replies are dropped)."""
        if not self._claim(call):
            return
        stream_id = call.stream_id
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
                self._sending[stream_id] = [PREFIX.pack(0, len(reply.body)) + reply.body]
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
