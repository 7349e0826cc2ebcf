"""The reference engine: the sans-IO gRPC client connection on h2's HTTP/2 state machine.

Slower than the codec (`codec/_connection.py`, the default) but built on a general, widely used
HTTP/2 implementation: selectable with `sepp.open(..., wire_engine="h2")`, and the tests' oracle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import h2.events
import h2.exceptions
import h2.settings
from h2.errors import ErrorCodes
from hpack import NeverIndexedHeaderTuple

from .._calls import CallTable, HeaderListTooLarge, StreamIdsExhausted, header_list_size
from .._constants import (
    DEFAULT_CONNECTION_WINDOW,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_HEADER_LIST_SIZE,
    DEFAULT_STREAM_WINDOW,
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
from .._framing import ACCEPT_ENCODING, FramingError, Request, encode_message, joined
from .._hpack import encode_authority
from .._response import ResponseState, finish, goaway_result, reset_result
from .._status import StatusCode, encode_grpc_timeout
from ._overrides import PatchedH2Connection

_H2_DEFAULT_WINDOW = 65_535


class _TooManyReplies(Exception):
    """The peer asked for more replies (ACKs, RST_STREAMs) than we queue (see the codec's)."""


class _Call(ResponseState):
    __slots__ = ("outbound",)

    def __init__(self, max_receive_bytes: int | None, body: bytes) -> None:
        super().__init__(max_receive_bytes)
        self.outbound = memoryview(body)


class H2GrpcConnection(CallTable[_Call]):
    """One HTTP/2 connection carrying many concurrent unary gRPC calls, on h2."""

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
        self._h2 = PatchedH2Connection(
            stream_window=stream_window,
            max_frame_size=DEFAULT_MAX_FRAME_SIZE,
            max_header_list_size=DEFAULT_MAX_HEADER_LIST_SIZE,
        )
        self._connection_window = connection_window
        self._max_receive = max_receive_message_bytes
        super().__init__()
        self._base_headers: list[Header] = [
            (b":method", b"POST"),
            (b":scheme", scheme.encode("ascii")),
            (b":path", b""),  # replaced per method
            (b":authority", encode_authority(authority)),
            (b"te", b"trailers"),
            (b"content-type", b"application/grpc"),
            (b"user-agent", user_agent.encode("ascii")),
            (b"grpc-accept-encoding", ACCEPT_ENCODING),
            *metadata,
            # Credentials must never enter the HPACK dynamic table (RFC 7541 §7.1.3).
            *(NeverIndexedHeaderTuple(k, v) for k, v in secret_metadata),
        ]
        # Per method: its headers, and the size of their header list.
        self._method_headers: dict[str, tuple[list[Header], int]] = {}
        # Bytes of PING and SETTINGS ACKs h2 queued since the driver last took our output.
        self._queued_replies = 0
        # PINGs we may still send before a HEADERS or DATA frame of ours (see send_ping).
        self._pings_left = 0

    # -- driver API -------------------------------------------------------------------------

    def initiate(self) -> None:
        """Queue the connection preface and our SETTINGS."""
        self._h2.initiate_connection()
        extra = self._connection_window - _H2_DEFAULT_WINDOW
        if extra > 0:
            self._h2.increment_flow_control_window(extra)

    def data_to_send(self) -> bytes:
        self._queued_replies = 0
        return self._h2.data_to_send()

    def buffers_to_send(self) -> list[bytes | memoryview]:
        data = self.data_to_send()
        return [data] if data else []

    def start_call(
        self,
        method: str,
        request: Request,
        *,
        timeout: float | None = None,
        metadata: Iterable[Header] = (),
    ) -> int:
        """Open a stream for `method` and queue its request; returns the stream id."""
        entry = self._method_headers.get(method)
        if entry is None:
            headers = list(self._base_headers)
            headers[2] = (b":path", SERVICE_PATH + method.encode("ascii"))
            entry = headers, header_list_size(headers)
            self._method_headers[method] = entry
        headers, size = entry
        per_call: list[Header] = []
        if timeout is not None:
            # Per-call values are never indexed so they do not churn the dynamic table.
            per_call.append(NeverIndexedHeaderTuple(b"grpc-timeout", encode_grpc_timeout(timeout)))
        for name, value in metadata:
            per_call.append(NeverIndexedHeaderTuple(name, value))
        if per_call:
            size += header_list_size(per_call)
        # h2 sends whatever it is given: the server's limit is ours to keep.
        if size > self._remote_max_header_list:
            raise HeaderListTooLarge(size, int(self._remote_max_header_list))
        try:
            stream_id = self._h2.get_next_available_stream_id()
        except h2.exceptions.NoAvailableStreamIDError:
            raise StreamIdsExhausted("stream ids are past the last (2^31-1)") from None
        self._h2.open_calls = len(self._calls)
        self._h2.send_headers(stream_id, headers + per_call if per_call else headers)
        self._pings_left = MAX_PINGS_WITHOUT_DATA
        call = _Call(self._max_receive, encode_message(joined(request)))
        self._calls[stream_id] = call
        if stream_id + 2 > MAX_STREAM_ID:
            # Stream ids are spent: let this connection drain; the driver dials a fresh one.
            self.draining = True
        self._flush_outbound(stream_id, call)
        return stream_id

    def cancel_call(self, stream_id: int) -> None:
        """Forget a call and reset its stream with CANCEL; the connection stays usable."""
        if self._calls.pop(stream_id, None) is None:
            return
        self._reset(stream_id, ErrorCodes.CANCEL)

    def send_ping(self, opaque: bytes) -> bool:
        """Queue a PING, unless MAX_PINGS_WITHOUT_DATA went out since our last HEADERS or DATA
        frame (none before the first): then queue nothing and return False."""
        if not self._pings_left:
            return False
        self._pings_left -= 1
        self._h2.ping(opaque)
        return True

    def close(self) -> None:
        """Queue a GOAWAY; the driver sends it and closes the socket."""
        try:
            self._h2.close_connection()
        except h2.exceptions.ProtocolError:
            pass

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes from the socket; returns the resulting events in order."""
        if self.broken is not None:
            return []
        if self._preface is not None:
            first, failed = self._take_preface(data)
            if first is None:
                return failed
            data = first
        events: list[Event] = []
        try:
            queued = self._h2.queued_bytes
            h2_events = self._h2.receive_data(data)
            # What h2 queued by itself meanwhile is replies: PING and SETTINGS ACKs, and a
            # RST_STREAM for every frame on a stream it reset (a flood must not pile them up).
            self._count_reply(max(0, self._h2.queued_bytes - queued))
            for event in h2_events:
                handler: _Handler | None = _DISPATCH.get(type(event))
                if handler is not None:
                    handler(self, event, events)
        except Exception as exc:
            # h2, hpack and hyperframe raise assorted types on hostile input (and h2 can refuse
            # what a handler asks of it afterwards); all of them mean the peer broke HTTP/2 and
            # the connection cannot be trusted any more. Calls already finished keep their result.
            reason = f"HTTP/2 protocol error from server: {type(exc).__name__}: {exc}"
            if isinstance(exc, _TooManyReplies):
                self._h2.clear_outbound_data_buffer()  # the peer does not read them anyway
                self._h2.close_connection(ErrorCodes.ENHANCE_YOUR_CALM)
                reason = f"HTTP/2 protocol error from server: {exc}"
            self.broken = reason
            events.extend(self._fail_all(StatusCode.UNAVAILABLE, reason, FailureKind.PROTOCOL))
            events.append(ConnectionBroken(reason))
        return events

    def _set_next_stream_id(self, stream_id: int) -> None:
        """Tests of stream-id exhaustion start near the end of the id space."""
        self._h2.highest_outbound_stream_id = stream_id - 2

    # -- h2 event handlers ------------------------------------------------------------------

    def _on_informational(
        self, event: h2.events.InformationalResponseReceived, out: list[Event]
    ) -> None:
        stream_id = event.stream_id
        call = self._calls[stream_id] if stream_id in self._calls else None
        if call is None:
            return
        call.informational += 1
        if call.informational > MAX_INFORMATIONAL_RESPONSES:
            del self._calls[stream_id]
            self._reset(stream_id, ErrorCodes.ENHANCE_YOUR_CALM)
            reason = f"HTTP/2 stream error from server: {TOO_MANY_1XX}"
            out.append(
                CallFinished(stream_id, StatusCode.INTERNAL, reason, None, FailureKind.PROTOCOL)
            )
            out.append(StreamCapacityChanged())

    def _on_response(self, event: h2.events.ResponseReceived, out: list[Event]) -> None:
        call = self._calls[event.stream_id] if event.stream_id in self._calls else None
        if call is not None:
            call.read_headers(event.headers)
            call.response_started()

    def _on_trailers(self, event: h2.events.TrailersReceived, out: list[Event]) -> None:
        call = self._calls[event.stream_id] if event.stream_id in self._calls else None
        if call is not None:
            call.read_headers(event.headers)

    def _on_data(self, event: h2.events.DataReceived, out: list[Event]) -> None:
        stream_id = event.stream_id
        # Unary responses are buffered (and size-capped) anyway, so credit the window at once.
        if event.flow_controlled_length:
            self._h2.acknowledge_received_data(event.flow_controlled_length, stream_id)
        call = self._calls[stream_id] if stream_id in self._calls else None
        if call is None or not call.grpc_body:
            # Not a gRPC body (say a proxy's HTML error page): drop it unread; finish() maps
            # the response by its :status or content-type, not by a framing error.
            return
        try:
            call.decoder.feed(event.data)
        except FramingError as exc:
            code = (
                StatusCode.RESOURCE_EXHAUSTED
                if exc.kind is FailureKind.TOO_LARGE
                else StatusCode.INTERNAL
            )
            del self._calls[stream_id]
            self._reset(stream_id, ErrorCodes.CANCEL)
            out.append(CallFinished(stream_id, code, str(exc), None, exc.kind))
            out.append(StreamCapacityChanged())

    def _on_stream_ended(self, event: h2.events.StreamEnded, out: list[Event]) -> None:
        call = self._calls.pop(event.stream_id, None)
        if call is not None:
            if call.outbound:
                # The server answered before taking the whole request (RFC 9113 §8.1). Stop
                # sending and close our half too, or h2 keeps the stream open and counting
                # against MAX_CONCURRENT_STREAMS, and the next start_call would be refused.
                call.outbound = memoryview(b"")
                self._reset(event.stream_id, ErrorCodes.NO_ERROR)
            out.append(finish(event.stream_id, call))
            out.append(StreamCapacityChanged())

    def _on_reset(self, event: h2.events.StreamReset, out: list[Event]) -> None:
        call = self._calls.pop(event.stream_id, None)
        if call is None:
            return
        out.append(reset_result(event.stream_id, call, int(event.error_code)))
        out.append(StreamCapacityChanged())

    def _on_goaway(self, event: h2.events.ConnectionTerminated, out: list[Event]) -> None:
        last = event.last_stream_id if event.last_stream_id is not None else 0
        self.draining = True
        # Streams up to last_stream_id may still finish (PatchedH2Connection keeps h2 open).
        for stream_id in [s for s in self._calls if s > last]:
            del self._calls[stream_id]
            out.append(goaway_result(stream_id))
        debug = bytes(event.additional_data or b"")
        out.append(GoAwayReceived(last, int(event.error_code or 0), debug))

    def _on_ping_ack(self, event: h2.events.PingAckReceived, out: list[Event]) -> None:
        out.append(PingAcknowledged(bytes(event.ping_data or b"")))

    def _on_settings(self, event: h2.events.RemoteSettingsChanged, out: list[Event]) -> None:
        codes = h2.settings.SettingCodes
        if codes.INITIAL_WINDOW_SIZE in event.changed_settings:
            self._flush_all()
        # Callers waiting for a stream wake only when the server's limit may let them start.
        header_list = event.changed_settings.get(codes.MAX_HEADER_LIST_SIZE)
        if header_list is not None:
            self._remote_max_header_list = header_list.new_value
        changed = event.changed_settings.get(codes.MAX_CONCURRENT_STREAMS)
        max_streams = changed.new_value if changed is not None else self._remote_max_streams
        if max_streams != self._remote_max_streams or not self._settings_received:
            self._remote_max_streams = max_streams
            self._settings_received = True
            out.append(StreamCapacityChanged())

    def _on_window(self, event: h2.events.WindowUpdated, out: list[Event]) -> None:
        self._flush_all()

    # -- helpers ----------------------------------------------------------------------------

    def _count_reply(self, size: int) -> None:
        self._queued_replies += size
        if self._queued_replies > MAX_QUEUED_CONTROL_REPLY_BYTES:
            raise _TooManyReplies(TOO_MANY_REPLIES)

    def _flush_outbound(self, stream_id: int, call: _Call) -> None:
        """Send as much of the request as flow control allows; END_STREAM with the last byte."""
        body = call.outbound
        while True:
            window = min(
                self._h2.local_flow_control_window(stream_id), self._h2.max_outbound_frame_size
            )
            if len(body) <= window:
                self._h2.send_data(stream_id, body.tobytes(), end_stream=True)
                self._pings_left = MAX_PINGS_WITHOUT_DATA
                call.outbound = memoryview(b"")
                return
            if window <= 0:
                call.outbound = body
                return
            self._h2.send_data(stream_id, body[:window].tobytes())
            self._pings_left = MAX_PINGS_WITHOUT_DATA
            body = body[window:]

    def _flush_all(self) -> None:
        for stream_id, call in list(self._calls.items()):
            if call.outbound:
                try:
                    self._flush_outbound(stream_id, call)
                except h2.exceptions.StreamClosedError:
                    call.outbound = memoryview(b"")

    def _reset(self, stream_id: int, code: ErrorCodes) -> None:
        try:
            self._h2.reset_stream(stream_id, code)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            pass  # already closed on the wire; nothing to reset


_Handler = Callable[[H2GrpcConnection, Any, list[Event]], None]
_DISPATCH: dict[type[h2.events.Event], _Handler] = {
    h2.events.InformationalResponseReceived: H2GrpcConnection._on_informational,
    h2.events.ResponseReceived: H2GrpcConnection._on_response,
    h2.events.TrailersReceived: H2GrpcConnection._on_trailers,
    h2.events.DataReceived: H2GrpcConnection._on_data,
    h2.events.StreamEnded: H2GrpcConnection._on_stream_ended,
    h2.events.StreamReset: H2GrpcConnection._on_reset,
    h2.events.ConnectionTerminated: H2GrpcConnection._on_goaway,
    h2.events.PingAckReceived: H2GrpcConnection._on_ping_ack,
    h2.events.RemoteSettingsChanged: H2GrpcConnection._on_settings,
    h2.events.WindowUpdated: H2GrpcConnection._on_window,
}
