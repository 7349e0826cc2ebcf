"""Each sans-IO engine against a server-side h2 connection in memory (no sockets).

Every test runs on both engines (the `wire_engine` parametrisation in conftest.py).

Bytes go both ways by hand: `Pair.to_server()` feeds what the client queued to the server's h2
state machine, `Pair.to_client()` the reverse. Where the server's h2 cannot be made to misbehave
(GOAWAY followed by more frames, garbage), frames are built with hyperframe.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Sequence
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest
from fixtures.fuzz import examples
from h2.errors import ErrorCodes
from hpack import NeverIndexedHeaderTuple
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sepp.wire import (
    CallFinished,
    ConnectionBroken,
    GoAwayReceived,
    PingAcknowledged,
    StreamCapacityChanged,
    _engine,
    connection_class,
)
from sepp.wire._calls import HeaderListTooLarge, header_list_size, without_streams_above
from sepp.wire._constants import (
    DEFAULT_CONNECTION_WINDOW,
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_STREAM_WINDOW,
)
from sepp.wire._events import Event
from sepp.wire._failure import FailureKind
from sepp.wire._framing import encode_message
from sepp.wire._status import StatusCode

pytestmark = [pytest.mark.both_engines, pytest.mark.arch_smoke]

SC = h2.settings.SettingCodes
OK_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]


class Pair:
    """A client engine and a server-side H2Connection wired together in memory."""

    def __init__(
        self,
        *,
        server_settings: dict[Any, int] | None = None,
        handshake: bool = True,
        **client_kwargs: Any,
    ) -> None:
        client_kwargs.setdefault("authority", "sepp.test:50051")
        client_kwargs.setdefault("user_agent", "sepp-trio/test")
        self.client = connection_class(_engine.DEFAULT_WIRE_ENGINE)(**client_kwargs)
        self.client.initiate()
        config = h2.config.H2Configuration(
            client_side=False,
            header_encoding=None,
            # Inbound validation stays on: it checks the client's request headers are legal.
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        self.server = h2.connection.H2Connection(config=config)
        if server_settings:
            self.server.local_settings = h2.settings.Settings(
                client=False, initial_values=server_settings
            )
            if SC.MAX_FRAME_SIZE in server_settings:
                self.server.max_inbound_frame_size = server_settings[SC.MAX_FRAME_SIZE]
        self.events: list[Event] = []
        self.server_events: list[h2.events.Event] = []
        if handshake:
            self.server.initiate_connection()
            self.pump()

    # -- moving bytes ---------------------------------------------------------------------------

    def to_server(self) -> list[h2.events.Event]:
        data = self.client.data_to_send()
        events = self.server.receive_data(data) if data else []
        self.server_events.extend(events)
        return events

    def to_client(self, extra: bytes = b"") -> list[Event]:
        data = self.server.data_to_send() + extra
        events = self.client.receive_data(data) if data else []
        self.events.extend(events)
        return events

    def pump(self) -> None:
        for _ in range(100):
            moved = bool(self.to_server()) | bool(self.to_client())
            if not moved and not self.client.data_to_send() and not self.server.data_to_send():
                return
        raise AssertionError("connection never went quiet")

    # -- calls ----------------------------------------------------------------------------------

    def call(self, method: str = "Ack", body: bytes = b"req", **kwargs: Any) -> int:
        stream_id = self.client.start_call(method, body, **kwargs)
        self.to_server()
        return stream_id

    def request_headers(self, stream_id: int) -> list[tuple[bytes, bytes]]:
        for event in self.server_events:
            if isinstance(event, h2.events.RequestReceived) and event.stream_id == stream_id:
                return list(event.headers)
        raise AssertionError(f"no request on stream {stream_id}")

    def request_body(self, stream_id: int) -> bytes:
        return b"".join(
            e.data
            for e in self.server_events
            if isinstance(e, h2.events.DataReceived) and e.stream_id == stream_id
        )

    def respond(
        self,
        stream_id: int,
        body: bytes = b"resp",
        *,
        status: int = 0,
        message: bytes | None = None,
        send: bool = True,
    ) -> list[Event]:
        self.server.send_headers(stream_id, OK_HEADERS)
        self.server.send_data(stream_id, encode_message(body))
        self.trailers(stream_id, status=status, message=message, send=False)
        return self.to_client() if send else []

    def trailers(
        self,
        stream_id: int,
        *,
        status: int | bytes | None = 0,
        message: bytes | None = None,
        send: bool = True,
    ) -> list[Event]:
        trailers: list[tuple[bytes, bytes]] = []
        if status is not None:
            trailers.append(
                (b"grpc-status", status if isinstance(status, bytes) else b"%d" % status)
            )
        if message is not None:
            trailers.append((b"grpc-message", message))
        self.server.send_headers(stream_id, trailers, end_stream=True)
        return self.to_client() if send else []

    def trailers_only(
        self, stream_id: int, status: int, message: bytes | None = None
    ) -> list[Event]:
        headers = [*OK_HEADERS, (b"grpc-status", b"%d" % status)]
        if message is not None:
            headers.append((b"grpc-message", message))
        self.server.send_headers(stream_id, headers, end_stream=True)
        return self.to_client()

    def finished(self, stream_id: int) -> CallFinished:
        found = [e for e in self.events if isinstance(e, CallFinished) and e.stream_id == stream_id]
        assert len(found) == 1, f"stream {stream_id} finished {len(found)} times: {self.events}"
        return found[0]

    def server_resets(self) -> dict[int, int]:
        return {
            e.stream_id: int(e.error_code)
            for e in self.server_events
            if isinstance(e, h2.events.StreamReset)
        }


def goaway(last_stream_id: int, error_code: int = 0) -> bytes:
    return GoAwayFrame(0, last_stream_id=last_stream_id, error_code=error_code).serialize()


def kinds(events: Sequence[Event]) -> list[type]:
    return [type(e) for e in events]


# -- connection preface ----------------------------------------------------------------------------


def test_preface_advertises_no_push_big_windows_and_frames() -> None:
    pair = Pair()
    remote = pair.server.remote_settings
    assert remote[SC.ENABLE_PUSH] == 0
    assert remote[SC.INITIAL_WINDOW_SIZE] == DEFAULT_STREAM_WINDOW
    assert remote[SC.MAX_FRAME_SIZE] == DEFAULT_MAX_FRAME_SIZE
    assert pair.server.outbound_flow_control_window == DEFAULT_CONNECTION_WINDOW
    assert pair.client.remote_settings_received


def test_frames_up_to_the_advertised_max_frame_size_are_accepted() -> None:
    pair = Pair()
    sid = pair.call()
    body = b"z" * (DEFAULT_MAX_FRAME_SIZE - 5)
    pair.server.send_headers(sid, OK_HEADERS)
    pair.server.send_data(sid, encode_message(body))  # one DATA frame of exactly 1 MiB
    pair.trailers(sid)
    result = pair.finished(sid)
    assert result.code is StatusCode.OK
    assert result.body == body


# -- request headers -------------------------------------------------------------------------------


def test_request_headers_are_exact_and_in_order() -> None:
    pair = Pair(secret_metadata=[(b"authorization", b"Bearer s3cret")])
    sid = pair.call("Reserve", b"body", timeout=1.5)
    assert pair.request_headers(sid) == [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/sepp.v1.QueueService/Reserve"),
        (b":authority", b"sepp.test:50051"),
        (b"te", b"trailers"),
        (b"content-type", b"application/grpc"),
        (b"user-agent", b"sepp-trio/test"),
        (b"grpc-accept-encoding", b"gzip"),
        (b"authorization", b"Bearer s3cret"),
        (b"grpc-timeout", b"1500m"),
    ]
    assert pair.request_body(sid) == encode_message(b"body")
    assert any(
        isinstance(e, h2.events.StreamEnded) and e.stream_id == sid for e in pair.server_events
    )


def test_https_scheme_and_static_metadata() -> None:
    pair = Pair(scheme="https", metadata=[(b"x-static", b"1")])
    sid = pair.call("Ack", b"", metadata=[(b"traceparent", b"00-ab-cd-01")])
    headers = pair.request_headers(sid)
    assert (b":scheme", b"https") in headers
    assert headers[-2:] == [(b"x-static", b"1"), (b"traceparent", b"00-ab-cd-01")]
    assert not any(name == b"grpc-timeout" for name, _ in headers)


def test_authorization_is_never_indexed_and_never_enters_the_dynamic_table() -> None:
    pair = Pair(secret_metadata=[(b"authorization", b"Bearer s3cret")])
    first = pair.call(timeout=2)
    second = pair.call(timeout=3)
    for sid in (first, second):
        by_name = {bytes(h[0]): h for h in pair.request_headers(sid)}
        assert isinstance(by_name[b"authorization"], NeverIndexedHeaderTuple)
        assert isinstance(by_name[b"grpc-timeout"], NeverIndexedHeaderTuple)
        assert not isinstance(by_name[b"user-agent"], NeverIndexedHeaderTuple)
    table = pair.server.decoder.header_table.dynamic_entries
    names = {entry[0] for entry in table}
    assert b"authorization" not in names
    assert b"grpc-timeout" not in names
    assert all(b"s3cret" not in entry[1] for entry in table)


@pytest.mark.parametrize(
    ("timeout", "wire"),
    [(30.0, b"30000m"), (0.0004, b"1m"), (200_000.0, b"200000S"), (-1.0, b"1m")],
)
def test_grpc_timeout_header(timeout: float, wire: bytes) -> None:
    pair = Pair()
    sid = pair.call(timeout=timeout)
    assert (b"grpc-timeout", wire) in pair.request_headers(sid)


def test_cached_method_headers_do_not_leak_per_call_values() -> None:
    pair = Pair()
    first = pair.call("Ack", timeout=1.0, metadata=[(b"traceparent", b"t1")])
    second = pair.call("Ack")
    headers = pair.request_headers(second)
    assert not any(name in (b"grpc-timeout", b"traceparent") for name, _ in headers)
    assert (b"traceparent", b"t1") in pair.request_headers(first)


# -- responses -------------------------------------------------------------------------------------


def test_normal_response() -> None:
    pair = Pair()
    sid = pair.call()
    assert pair.client.active_calls == 1
    events = pair.respond(sid, b"the answer")
    assert kinds(events) == [CallFinished, StreamCapacityChanged]
    result = pair.finished(sid)
    assert (result.code, result.body, result.details, result.error_kind) == (
        StatusCode.OK,
        b"the answer",
        "",
        None,
    )
    assert pair.client.active_calls == 0


def test_empty_response_message_is_ok() -> None:
    pair = Pair()
    sid = pair.call()
    pair.respond(sid, b"")
    assert pair.finished(sid).body == b""


def test_trailers_only_error_response() -> None:
    pair = Pair()
    sid = pair.call()
    pair.trailers_only(sid, 5, b"job%20not%20found")
    result = pair.finished(sid)
    assert (result.code, result.details, result.body) == (
        StatusCode.NOT_FOUND,
        "job not found",
        None,
    )


def test_trailers_only_ok_without_a_message_is_malformed() -> None:
    pair = Pair()
    sid = pair.call()
    pair.trailers_only(sid, 0)
    result = pair.finished(sid)
    assert (result.code, result.error_kind) == (StatusCode.INTERNAL, FailureKind.MALFORMED)


def test_error_status_with_a_body_keeps_the_status() -> None:
    pair = Pair()
    sid = pair.call()
    pair.respond(sid, b"ignored", status=9, message=b"precondition")
    result = pair.finished(sid)
    assert (result.code, result.details, result.body) == (
        StatusCode.FAILED_PRECONDITION,
        "precondition",
        None,
    )


def test_message_split_across_many_data_frames() -> None:
    pair = Pair()
    sid = pair.call()
    framed = encode_message(b"0123456789" * 20)
    pair.server.send_headers(sid, OK_HEADERS)
    pair.to_client()
    for i in range(len(framed)):
        pair.server.send_data(sid, framed[i : i + 1])
        assert not [e for e in pair.to_client() if isinstance(e, CallFinished)]
    pair.trailers(sid)
    assert pair.finished(sid).body == b"0123456789" * 20


def test_message_and_trailers_in_one_read() -> None:
    pair = Pair()
    sid = pair.call()
    pair.respond(sid, b"x", send=False)
    pair.to_client()
    assert pair.finished(sid).body == b"x"


def test_two_messages_are_malformed_and_the_stream_is_cancelled() -> None:
    pair = Pair()
    sid = pair.call()
    pair.server.send_headers(sid, OK_HEADERS)
    pair.server.send_data(sid, encode_message(b"one") + encode_message(b"two"))
    pair.to_client()
    result = pair.finished(sid)
    assert (result.code, result.error_kind) == (StatusCode.INTERNAL, FailureKind.MALFORMED)
    pair.to_server()
    assert pair.server_resets() == {sid: ErrorCodes.CANCEL}
    # The trailers that follow are ignored: the call finished once.
    pair.server_events.clear()
    pair.pump()
    assert pair.finished(sid) is result


def test_more_data_than_the_prefix_declared_is_malformed() -> None:
    pair = Pair()
    sid = pair.call()
    pair.server.send_headers(sid, OK_HEADERS)
    pair.server.send_data(sid, struct.pack(">BI", 0, 2) + b"abc")
    pair.to_client()
    assert pair.finished(sid).error_kind is FailureKind.MALFORMED


def test_truncated_message_is_malformed() -> None:
    pair = Pair()
    sid = pair.call()
    pair.server.send_headers(sid, OK_HEADERS)
    pair.server.send_data(sid, struct.pack(">BI", 0, 10) + b"abc")
    pair.trailers(sid)
    result = pair.finished(sid)
    assert (result.code, result.error_kind) == (StatusCode.INTERNAL, FailureKind.MALFORMED)
    assert "truncated" in result.details


def test_huge_length_prefix_is_refused_before_the_body_arrives() -> None:
    pair = Pair(max_receive_message_bytes=1024)
    sid = pair.call()
    pair.server.send_headers(sid, OK_HEADERS)
    pair.server.send_data(sid, struct.pack(">BI", 0, 2**31))  # only the 5-byte prefix
    events = pair.to_client()
    assert kinds(events) == [CallFinished, StreamCapacityChanged]
    result = pair.finished(sid)
    assert (result.code, result.error_kind) == (
        StatusCode.RESOURCE_EXHAUSTED,
        FailureKind.TOO_LARGE,
    )
    assert "1024" in result.details
    pair.to_server()
    assert pair.server_resets() == {sid: ErrorCodes.CANCEL}
    assert pair.client.active_calls == 0
    # The connection is still good.
    nxt = pair.call()
    pair.respond(nxt, b"small")
    assert pair.finished(nxt).body == b"small"


def test_compressed_in_an_encoding_we_never_accepted_is_a_typed_error() -> None:
    pair = Pair()
    sid = pair.call()
    pair.server.send_headers(sid, [*OK_HEADERS, (b"grpc-encoding", b"snappy")])
    pair.server.send_data(sid, struct.pack(">BI", 1, 3) + b"abc")
    pair.to_client()
    result = pair.finished(sid)
    assert (result.code, result.error_kind) == (StatusCode.INTERNAL, FailureKind.COMPRESSED)
    assert "'snappy'" in result.details


# -- the server's header list limit ---------------------------------------------------------------


def test_headers_over_the_servers_header_list_limit_are_refused_unsent() -> None:
    pair = Pair(server_settings={SC.MAX_HEADER_LIST_SIZE: 16 * 1024})
    big = [(b"x-big", b"v" * (63 * 1024))]
    with pytest.raises(HeaderListTooLarge) as info:
        pair.client.start_call("Ack", b"req", timeout=5.0, metadata=big)
    assert info.value.limit == 16 * 1024 and info.value.size > 63 * 1024
    assert "16384-byte header list limit" in str(info.value)
    assert pair.client.data_to_send() == b""  # nothing queued, no stream used
    assert pair.client.active_calls == 0 and pair.client.usable
    sid = pair.call(timeout=5.0)
    assert sid == 1
    pair.respond(sid, b"fine")
    assert pair.finished(sid).body == b"fine"


def test_a_limit_below_the_headers_every_call_sends_refuses_calls_without_metadata() -> None:
    pair = Pair(server_settings={SC.MAX_HEADER_LIST_SIZE: 300})
    with pytest.raises(HeaderListTooLarge):
        pair.client.start_call("Ack", b"req", timeout=5.0)
    with pytest.raises(HeaderListTooLarge):
        pair.client.start_call("Ack", b"req")
    assert pair.client.data_to_send() == b""


def test_the_header_list_limit_is_exact_and_follows_the_servers_settings() -> None:
    pair = Pair()
    metadata = [(b"x-pad", b"p" * 1000)]
    sid = pair.call("Reserve", timeout=2.5, metadata=metadata)
    size = header_list_size(pair.request_headers(sid))  # as the server counts it
    pair.server.update_settings({SC.MAX_HEADER_LIST_SIZE: size})
    pair.pump()
    exact = pair.call("Reserve", timeout=2.5, metadata=metadata)
    assert header_list_size(pair.request_headers(exact)) == size
    with pytest.raises(HeaderListTooLarge) as info:
        pair.client.start_call("Reserve", b"req", timeout=2.5, metadata=[(b"x-pad", b"p" * 1001)])
    assert (info.value.size, info.value.limit) == (size + 1, size)
    assert pair.client.data_to_send() == b""


# -- gzip-compressed responses ---------------------------------------------------------------------


def gzip_framed(body: bytes) -> bytes:
    packed = gzip.compress(body)
    return struct.pack(">BI", 1, len(packed)) + packed


def test_every_request_accepts_gzip() -> None:
    pair = Pair()
    first, second = pair.call(), pair.call("Extend")
    for sid in (first, second):
        assert (b"grpc-accept-encoding", b"gzip") in pair.request_headers(sid)


def test_a_gzip_response_is_decompressed() -> None:
    pair = Pair()
    body = b"compressed by the server " * 40
    sid = pair.call()
    pair.server.send_headers(sid, [*OK_HEADERS, (b"grpc-encoding", b"gzip")])
    framed = gzip_framed(body)
    pair.server.send_data(sid, framed[:7])  # split: the message is whole only at the end
    pair.server.send_data(sid, framed[7:])
    pair.trailers(sid)
    assert (pair.finished(sid).code, pair.finished(sid).body) == (StatusCode.OK, body)


def test_a_gzip_bomb_fails_its_call_as_too_large_and_keeps_the_connection() -> None:
    pair = Pair(max_receive_message_bytes=64 * 1024)
    sid = pair.call()
    pair.server.send_headers(sid, [*OK_HEADERS, (b"grpc-encoding", b"gzip")])
    framed = gzip_framed(bytes(16 << 20))  # 16 MiB of zeros in about 16 KiB
    assert len(framed) < 64 * 1024
    pair.server.send_data(sid, framed)
    events = pair.to_client()
    assert kinds(events) == [CallFinished, StreamCapacityChanged]
    result = pair.finished(sid)
    assert (result.code, result.error_kind) == (
        StatusCode.RESOURCE_EXHAUSTED,
        FailureKind.TOO_LARGE,
    )
    assert "decompresses to more than the 65536-byte receive limit" in result.details
    pair.to_server()
    assert pair.server_resets() == {sid: ErrorCodes.CANCEL}
    nxt = pair.call()
    pair.respond(nxt, b"after")
    assert pair.finished(nxt).body == b"after"


@pytest.mark.parametrize(
    ("http", "code"),
    [
        (400, StatusCode.INTERNAL),
        (401, StatusCode.UNAUTHENTICATED),
        (403, StatusCode.PERMISSION_DENIED),
        (404, StatusCode.UNIMPLEMENTED),
        (429, StatusCode.UNAVAILABLE),
        (500, StatusCode.UNKNOWN),
        (502, StatusCode.UNAVAILABLE),
        (503, StatusCode.UNAVAILABLE),
        (504, StatusCode.UNAVAILABLE),
    ],
)
def test_non_200_status_maps_per_the_grpc_http_table(http: int, code: StatusCode) -> None:
    pair = Pair()
    sid = pair.call()
    # Even a grpc-status of OK does not rescue a non-200 response.
    headers = [(b":status", b"%d" % http), (b"content-type", b"text/html"), (b"grpc-status", b"0")]
    pair.server.send_headers(sid, headers)
    pair.server.send_data(sid, b"<html>nope</html>", end_stream=True)
    pair.to_client()
    result = pair.finished(sid)
    assert (result.code, result.error_kind) == (code, FailureKind.HTTP)
    assert str(http) in result.details


def test_missing_status_pseudo_header_is_malformed() -> None:
    pair = Pair()
    sid = pair.call()
    pair.server.send_headers(sid, [(b"content-type", b"application/grpc"), (b"grpc-status", b"0")],
                             end_stream=True)  # fmt: skip
    pair.to_client()
    result = pair.finished(sid)
    assert (result.code, result.error_kind) == (StatusCode.INTERNAL, FailureKind.MALFORMED)


def test_unparseable_status_pseudo_header() -> None:
    pair = Pair()
    sid = pair.call()
    pair.server.send_headers(sid, [(b":status", b"2OO"), (b"grpc-status", b"0")], end_stream=True)
    pair.to_client()
    assert pair.finished(sid).code is StatusCode.UNKNOWN


def test_missing_grpc_status() -> None:
    pair = Pair()
    sid = pair.call()
    pair.server.send_headers(sid, OK_HEADERS)
    pair.server.send_data(sid, encode_message(b"x"), end_stream=True)
    pair.to_client()
    result = pair.finished(sid)
    assert (result.code, result.error_kind) == (StatusCode.UNKNOWN, FailureKind.MALFORMED)
    assert "grpc-status" in result.details


@pytest.mark.parametrize("raw", [b"OK", b"", b"-1", b"17", b"1.0", b"\xff"])
def test_garbage_grpc_status_is_unknown(raw: bytes) -> None:
    pair = Pair()
    sid = pair.call()
    pair.server.send_headers(sid, OK_HEADERS)
    pair.server.send_data(sid, encode_message(b"x"))
    pair.trailers(sid, status=raw, message=b"boom")
    result = pair.finished(sid)
    assert (result.code, result.details, result.body) == (StatusCode.UNKNOWN, "boom", None)


@pytest.mark.parametrize(
    ("raw", "details"),
    [
        (b"bad %zz escape", "bad %zz escape"),
        (b"dangling %", "dangling %"),
        (b"half %E2%82", "half \ufffd"),
        (b"latin %E9t%E9", "latin \ufffdt\ufffd"),
        (b"fine %E2%82%AC", "fine €"),
    ],
)
def test_bad_percent_encoding_in_grpc_message(raw: bytes, details: str) -> None:
    pair = Pair()
    sid = pair.call()
    pair.trailers_only(sid, 3, raw)
    result = pair.finished(sid)
    assert (result.code, result.details) == (StatusCode.INVALID_ARGUMENT, details)


@pytest.mark.parametrize(
    ("ctype", "ok"),
    [
        (b"application/grpc", True),
        (b"application/grpc+proto", True),
        (b"application/grpc; charset=utf-8", True),
        (b"Application/GRPC", True),
        (b"application/grpcweb", False),
        (b"application/json", False),
        (b"text/html", False),
    ],
)
def test_response_content_type(ctype: bytes, ok: bool) -> None:
    pair = Pair()
    sid = pair.call()
    pair.server.send_headers(sid, [(b":status", b"200"), (b"content-type", ctype)])
    pair.server.send_data(sid, encode_message(b"x"))
    pair.trailers(sid)
    result = pair.finished(sid)
    if ok:
        assert result.code is StatusCode.OK
    else:
        assert (result.code, result.error_kind) == (StatusCode.UNKNOWN, FailureKind.MALFORMED)


def test_informational_headers_are_skipped() -> None:
    pair = Pair()
    sid = pair.call()
    pair.server.send_headers(sid, [(b":status", b"100")])
    pair.respond(sid, b"after 100")
    assert pair.finished(sid).body == b"after 100"


# -- RST_STREAM ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error_code", "code"),
    [
        (ErrorCodes.INTERNAL_ERROR, StatusCode.INTERNAL),
        (ErrorCodes.REFUSED_STREAM, StatusCode.UNAVAILABLE),
        (ErrorCodes.CANCEL, StatusCode.CANCELLED),
        (ErrorCodes.ENHANCE_YOUR_CALM, StatusCode.RESOURCE_EXHAUSTED),
        (ErrorCodes.NO_ERROR, StatusCode.INTERNAL),
    ],
)
def test_rst_stream_mid_response(error_code: ErrorCodes, code: StatusCode) -> None:
    pair = Pair()
    sid = pair.call()
    other = pair.call()
    pair.server.send_headers(sid, OK_HEADERS)
    pair.server.send_data(sid, encode_message(b"partial message")[:8])
    pair.to_client()
    pair.server.reset_stream(sid, error_code)
    events = pair.to_client()
    assert kinds(events) == [CallFinished, StreamCapacityChanged]
    result = pair.finished(sid)
    assert (result.code, result.error_kind) == (code, FailureKind.RESET)
    # Other calls on the connection are unaffected.
    assert pair.client.can_start_call
    pair.respond(other, b"fine")
    assert pair.finished(other).body == b"fine"


def test_refused_stream_before_response_headers_is_unprocessed() -> None:
    pair = Pair()
    sid = pair.call()
    pair.server.reset_stream(sid, ErrorCodes.REFUSED_STREAM)
    pair.to_client()
    result = pair.finished(sid)
    assert (result.code, result.error_kind) == (StatusCode.UNAVAILABLE, FailureKind.REFUSED)
    assert result.error_kind.unprocessed
    assert "REFUSED_STREAM" in result.details


def test_goaway_carries_its_debug_data() -> None:
    pair = Pair()
    pair.call()
    frame = GoAwayFrame(0, last_stream_id=0, error_code=0xB, additional_data=b"too_many_pings")
    events = pair.to_client(frame.serialize())
    assert events[-1] == GoAwayReceived(0, 0xB, b"too_many_pings")


def test_rst_stream_after_a_status_keeps_the_status() -> None:
    pair = Pair()
    sid = pair.call()
    pair.server.send_headers(sid, [*OK_HEADERS, (b"grpc-status", b"8"), (b"grpc-message", b"busy")])
    pair.server.reset_stream(sid, ErrorCodes.NO_ERROR)
    pair.to_client()
    result = pair.finished(sid)
    assert (result.code, result.details) == (StatusCode.RESOURCE_EXHAUSTED, "busy")


# -- GOAWAY ----------------------------------------------------------------------------------------


def three_calls(pair: Pair) -> tuple[int, int, int]:
    a, b, c = pair.call(), pair.call(), pair.call()
    assert (a, b, c) == (1, 3, 5)
    return a, b, c


def test_goaway_fails_calls_above_last_stream_id_and_lets_the_rest_finish() -> None:
    pair = Pair()
    a, b, c = three_calls(pair)
    events = pair.to_client(goaway(b))
    assert kinds(events) == [CallFinished, GoAwayReceived]
    result = pair.finished(c)
    assert (result.code, result.error_kind) == (StatusCode.UNAVAILABLE, FailureKind.GOAWAY)
    assert events[1] == GoAwayReceived(b, 0)
    assert pair.client.draining
    assert not pair.client.usable
    assert not pair.client.can_start_call
    assert pair.client.active_calls == 2
    # The reopened h2 state machine still processes the surviving streams' frames.
    pair.respond(a, b"first")
    pair.respond(b, b"second")
    assert pair.finished(a).body == b"first"
    assert pair.finished(b).body == b"second"
    assert pair.client.active_calls == 0


def test_goaway_and_the_surviving_responses_in_one_read() -> None:
    # h2 alone closes its state machine on GOAWAY, so frames after it in the same read used
    # to be a protocol error that failed every call on the connection.
    pair = Pair()
    a, b, c = three_calls(pair)
    pair.respond(a, b"first", send=False)
    pair.respond(b, b"second", send=False)
    events = pair.client.receive_data(goaway(b) + pair.server.data_to_send())
    pair.events.extend(events)
    assert not any(isinstance(e, ConnectionBroken) for e in events)
    assert pair.client.broken is None
    assert pair.finished(a).body == b"first"
    assert pair.finished(b).body == b"second"
    assert pair.finished(c).error_kind is FailureKind.GOAWAY
    assert pair.client.active_calls == 0


def test_graceful_double_goaway() -> None:
    pair = Pair()
    a, b, c = three_calls(pair)
    first = pair.to_client(goaway(2**31 - 1))
    assert kinds(first) == [GoAwayReceived]
    assert pair.client.active_calls == 3
    second = pair.to_client(goaway(a))
    assert kinds(second) == [CallFinished, CallFinished, GoAwayReceived]
    assert {pair.finished(b).error_kind, pair.finished(c).error_kind} == {FailureKind.GOAWAY}
    pair.respond(a)
    assert pair.finished(a).code is StatusCode.OK


def test_goaway_with_an_error_code_still_lets_lower_streams_finish() -> None:
    pair = Pair()
    a, _, _ = three_calls(pair)
    events = pair.to_client(goaway(a, ErrorCodes.ENHANCE_YOUR_CALM))
    assert events[-1] == GoAwayReceived(a, ErrorCodes.ENHANCE_YOUR_CALM)
    pair.respond(a)
    assert pair.finished(a).code is StatusCode.OK


def test_goaway_keeps_frames_queued_in_the_same_read() -> None:
    pair = Pair()
    a = pair.call()
    ping = PingFrame(0, opaque_data=b"12345678").serialize()
    pair.to_client(ping + goaway(a))
    # h2 would have dropped the PING ACK it queued before the GOAWAY.
    sent = pair.client.data_to_send()
    pair.server_events.extend(pair.server.receive_data(sent))
    assert any(isinstance(e, h2.events.PingAckReceived) for e in pair.server_events)


def test_goaway_lets_a_surviving_request_body_finish_sending() -> None:
    pair = Pair(server_settings={SC.INITIAL_WINDOW_SIZE: 100})
    body = b"b" * 1000
    sid = pair.call(body=body)
    assert len(pair.request_body(sid)) == 100
    # The server reads what it has, and sends WINDOW_UPDATE and GOAWAY in one write.
    pair.server.acknowledge_received_data(100, sid)
    pair.server.increment_flow_control_window(10_000, stream_id=sid)
    pair.to_client(goaway(sid))
    assert pair.client.active_calls == 1
    for _ in range(20):
        pair.to_server()
        for event in pair.server_events:
            if isinstance(event, h2.events.DataReceived) and event.flow_controlled_length:
                pair.server.acknowledge_received_data(event.flow_controlled_length, sid)
        pair.to_client()
    assert pair.request_body(sid) == encode_message(body)
    pair.respond(sid, b"done")
    assert pair.finished(sid).body == b"done"


def test_goaway_drops_the_queued_requests_of_the_streams_it_refused() -> None:
    # The requests of calls started before the GOAWAY was read, not yet on the socket: the
    # server will not read them, and nginx resets a connection it closes with unread bytes,
    # losing answers to calls it did process. Only the surviving stream's frames go out.
    pair = Pair(server_settings={SC.INITIAL_WINDOW_SIZE: 100})
    a = pair.call(body=b"a" * 300)  # 100 bytes sent; the rest waits for the window
    b = pair.client.start_call("Ack", b"b")
    c = pair.client.start_call("Ack", b"c")
    pair.client.cancel_call(c)  # its RST_STREAM is queued too
    pair.server.acknowledge_received_data(100, a)
    pair.server.increment_flow_control_window(10_000, stream_id=a)
    ping = PingFrame(0, opaque_data=b"12345678").serialize()
    events = pair.client.receive_data(pair.server.data_to_send() + ping + goaway(a))
    assert pair.client.draining and kinds(events)[-2:] == [CallFinished, GoAwayReceived]
    sent = pair.client.data_to_send()
    streams = [int.from_bytes(sent[i + 5 : i + 9], "big") for i in frame_starts(sent)]
    assert b not in streams and c not in streams
    assert a in streams  # the rest of its body, now the window allows it
    pair.server_events.extend(pair.server.receive_data(sent))
    assert any(isinstance(e, h2.events.PingAckReceived) for e in pair.server_events)
    assert pair.request_body(a) == encode_message(b"a" * 300)


_RAW_FRAMES = st.lists(
    st.tuples(
        st.integers(0, 9), st.integers(0, 255), st.integers(0, 2**31 - 1), st.binary(max_size=40)
    ),
    max_size=12,
)


@given(_RAW_FRAMES, st.integers(0, 2**31 - 1), st.booleans())
def test_without_streams_above_keeps_exactly_the_other_frames_in_order(
    frames: list[tuple[int, int, int, bytes]], last: int, reserved_bit: bool
) -> None:
    def raw(kind: int, flags: int, stream_id: int, payload: bytes) -> bytes:
        sid = stream_id | (2**31 if reserved_bit else 0)  # the R bit is not part of the id
        return (
            len(payload).to_bytes(3, "big")
            + bytes((kind, flags))
            + sid.to_bytes(4, "big")
            + payload
        )

    queued = b"".join(raw(*f) for f in frames)
    expected = b"".join(raw(*f) for f in frames if f[2] <= last)
    assert without_streams_above(queued, last) == expected


def frame_starts(data: bytes) -> list[int]:
    starts, at = [], 0
    while at < len(data):
        starts.append(at)
        at += 9 + int.from_bytes(data[at : at + 3], "big")
    assert at == len(data)
    return starts


def test_goaway_with_no_calls_in_flight() -> None:
    pair = Pair()
    events = pair.to_client(goaway(0))
    assert events == [GoAwayReceived(0, 0)]
    assert pair.client.draining
    assert pair.client.active_calls == 0


# -- cancellation ----------------------------------------------------------------------------------


def test_cancel_call_sends_rst_stream_cancel_and_the_connection_stays_usable() -> None:
    pair = Pair()
    sid = pair.call()
    pair.client.cancel_call(sid)
    assert pair.client.active_calls == 0
    pair.to_server()
    assert pair.server_resets() == {sid: ErrorCodes.CANCEL}
    # A late response on the cancelled stream produces nothing and breaks nothing.
    assert pair.to_client() == []
    nxt = pair.call()
    pair.respond(nxt, b"next")
    assert pair.finished(nxt).body == b"next"
    assert not [e for e in pair.events if isinstance(e, CallFinished) and e.stream_id == sid]


def test_cancel_call_with_data_already_in_flight_from_the_server() -> None:
    pair = Pair()
    sid = pair.call()
    pair.server.send_headers(sid, OK_HEADERS)
    pair.server.send_data(sid, encode_message(b"late") * 1)
    pair.client.cancel_call(sid)
    assert pair.to_client() == []  # DATA for a stream we reset is dropped by h2
    assert pair.client.broken is None


def test_cancel_unknown_or_finished_call_is_a_no_op() -> None:
    pair = Pair()
    sid = pair.call()
    pair.respond(sid)
    pair.client.cancel_call(sid)
    pair.client.cancel_call(999)
    assert pair.client.data_to_send() == b""


# -- MAX_CONCURRENT_STREAMS ----------------------------------------------------------------------


def test_max_concurrent_streams_is_tracked() -> None:
    pair = Pair(server_settings={SC.MAX_CONCURRENT_STREAMS: 2})
    assert pair.client.can_start_call
    a = pair.call()
    assert pair.client.can_start_call
    b = pair.call()
    assert not pair.client.can_start_call
    assert pair.client.usable
    events = pair.respond(a)
    assert StreamCapacityChanged() in events
    assert pair.client.can_start_call
    c = pair.call()
    assert not pair.client.can_start_call
    # The server lowers its limit to 1: two calls are in flight, so wait for both.
    pair.server.update_settings({SC.MAX_CONCURRENT_STREAMS: 1})
    events = pair.to_client()
    assert StreamCapacityChanged() in events
    pair.respond(b)
    assert not pair.client.can_start_call
    pair.respond(c)
    assert pair.client.can_start_call


def test_only_one_call_before_the_server_settings_arrive() -> None:
    pair = Pair(handshake=False)
    assert not pair.client.remote_settings_received
    assert pair.client.can_start_call
    pair.client.start_call("Ack", b"")
    assert not pair.client.can_start_call  # the server's limit is still unknown
    pair.server.initiate_connection()
    pair.pump()
    assert pair.client.remote_settings_received
    assert pair.client.can_start_call


def test_early_response_releases_the_stream_even_with_request_data_unsent() -> None:
    pair = Pair(server_settings={SC.MAX_CONCURRENT_STREAMS: 1, SC.INITIAL_WINDOW_SIZE: 100})
    sid = pair.call(body=b"q" * 10_000)
    assert len(pair.request_body(sid)) == 100
    pair.trailers_only(sid, 7, b"no")  # refused before reading the rest
    assert pair.finished(sid).code is StatusCode.PERMISSION_DENIED
    pair.to_server()
    # The client stopped uploading and closed the stream, so h2 no longer counts it.
    assert pair.server_resets() == {sid: ErrorCodes.NO_ERROR}
    assert pair.client.can_start_call
    nxt = pair.call(body=b"small")  # h2 would raise TooManyStreamsError were it still open
    pair.respond(nxt)
    assert pair.finished(nxt).code is StatusCode.OK


# -- flow control ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stream_window", "size"),
    [
        (1_000, 50_000),  # stream window is the limit
        (2**31 - 1, 300_000),  # the connection window (65,535) is the limit
    ],
)
def test_request_larger_than_the_window_is_sent_as_the_window_opens(
    stream_window: int, size: int
) -> None:
    pair = Pair(server_settings={SC.INITIAL_WINDOW_SIZE: stream_window})
    body = bytes(range(256)) * (size // 256)
    sid = pair.call(body=body)
    assert 0 < len(pair.request_body(sid)) < len(body)
    seen = 0
    for _ in range(1000):
        pair.to_server()
        for event in pair.server_events[seen:]:
            if isinstance(event, h2.events.DataReceived):
                assert len(event.data) <= pair.server.max_inbound_frame_size
                pair.server.acknowledge_received_data(event.flow_controlled_length, sid)
        seen = len(pair.server_events)
        if any(isinstance(e, h2.events.StreamEnded) for e in pair.server_events):
            break
        pair.to_client()
    else:
        raise AssertionError("request never completed")
    assert pair.request_body(sid) == encode_message(body)
    pair.respond(sid, b"got it")
    assert pair.finished(sid).body == b"got it"


def test_received_data_is_acknowledged() -> None:
    pair = Pair()
    sid = pair.call()
    before = pair.server.outbound_flow_control_window
    big = b"d" * (DEFAULT_MAX_FRAME_SIZE - 5)
    for _ in range(40):  # 40 MiB: more than half the connection window
        other = pair.call()
        pair.respond(other, big)
    assert pair.server.outbound_flow_control_window > before - 40 * DEFAULT_MAX_FRAME_SIZE
    pair.respond(sid)


# -- pings, stream ids, broken connections --------------------------------------------------------


def test_ping_acknowledged() -> None:
    pair = Pair()
    pair.call()
    assert pair.client.send_ping(b"abcdefgh")
    pair.to_server()
    assert pair.to_client() == [PingAcknowledged(b"abcdefgh")]


def pings_received(pair: Pair) -> list[bytes]:
    return [bytes(e.ping_data) for e in pair.server_events if isinstance(e, h2.events.PingReceived)]


def test_no_ping_before_the_first_call() -> None:
    pair = Pair()
    assert not pair.client.send_ping(b"too-soon")
    assert pair.client.data_to_send() == b""  # nothing queued


def test_two_pings_at_most_until_a_headers_frame_goes_out() -> None:
    """grpc-core's max_pings_without_data: grpc-go and grpc-core servers end the connection at
    the third PING that comes while they send nothing (GOAWAY too_many_pings)."""
    pair = Pair()
    sid = pair.call()
    assert pair.client.send_ping(b"ping-001") and pair.client.send_ping(b"ping-002")
    assert not pair.client.send_ping(b"ping-003")
    pair.to_server()
    assert pings_received(pair) == [b"ping-001", b"ping-002"]
    # What the server sends does not count (grpc-core counts what it sends itself).
    pair.server.send_headers(sid, OK_HEADERS)
    pair.to_client()
    assert not pair.client.send_ping(b"ping-004")
    # A call's HEADERS do.
    pair.call()
    assert pair.client.send_ping(b"ping-005") and pair.client.send_ping(b"ping-006")
    assert not pair.client.send_ping(b"ping-007")
    pair.to_server()
    assert pings_received(pair) == [b"ping-001", b"ping-002", b"ping-005", b"ping-006"]


def test_a_request_body_sent_as_the_window_opens_allows_pings_again() -> None:
    pair = Pair(server_settings={SC.INITIAL_WINDOW_SIZE: 1_000})
    sid = pair.call(body=b"x" * 5_000)
    assert pair.client.send_ping(b"ping-001") and pair.client.send_ping(b"ping-002")
    assert not pair.client.send_ping(b"ping-003")
    pair.server.increment_flow_control_window(1_000, stream_id=sid)
    pair.to_client()  # more DATA goes out
    assert pair.client.send_ping(b"ping-004")
    pair.to_server()
    assert b"ping-004" in pings_received(pair)


def test_server_ping_is_answered() -> None:
    pair = Pair()
    pair.server.ping(b"srvping!")
    assert pair.to_client() == []
    assert any(isinstance(e, h2.events.PingAckReceived) for e in pair.to_server())


def test_stream_ids_running_out_drains_the_connection() -> None:
    pair = Pair()
    pair.client._set_next_stream_id(2**31 - 3)  # type: ignore[attr-defined]
    sid = pair.call()
    assert sid == 2**31 - 3
    assert pair.client.can_start_call
    last = pair.call()
    assert last == 2**31 - 1
    assert pair.client.draining
    assert not pair.client.can_start_call
    pair.respond(sid)
    pair.respond(last)
    assert pair.finished(last).code is StatusCode.OK


def test_connection_lost_fails_every_call() -> None:
    pair = Pair()
    a, b = pair.call(), pair.call()
    finished = pair.client.connection_lost("socket died")
    assert {f.stream_id for f in finished} == {a, b}
    assert all(
        (f.code, f.details, f.error_kind)
        == (StatusCode.UNAVAILABLE, "socket died", FailureKind.CONNECTION)
        for f in finished
    )
    assert not pair.client.usable
    assert pair.client.receive_data(b"anything") == []
    assert pair.client.connection_lost("again") == []


def test_protocol_garbage_breaks_the_connection() -> None:
    pair = Pair()
    a = pair.call()
    # A SETTINGS frame on a stream is a connection error.
    events = pair.client.receive_data(b"\x00\x00\x00\x04\x00\x00\x00\x00\x01")
    assert kinds(events) == [CallFinished, ConnectionBroken]
    result = events[0]
    assert isinstance(result, CallFinished)
    assert (result.stream_id, result.code, result.error_kind) == (
        a,
        StatusCode.UNAVAILABLE,
        FailureKind.PROTOCOL,
    )
    assert pair.client.broken is not None
    assert not pair.client.can_start_call
    assert pair.client.receive_data(b"more") == []


def test_calls_finished_before_a_protocol_error_keep_their_result() -> None:
    pair = Pair()
    a, b = pair.call(), pair.call()
    pair.respond(a, b"done", send=False)
    data = pair.server.data_to_send()
    # DATA on stream 0 is a connection error.
    bad = b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x"
    events = pair.client.receive_data(data + bad)
    finished = {e.stream_id: e for e in events if isinstance(e, CallFinished)}
    # h2 raises before returning any event of the read, so both fail; the connection is broken.
    assert set(finished) <= {a, b}
    assert finished[b].code is StatusCode.UNAVAILABLE
    assert isinstance(events[-1], ConnectionBroken)


# -- hypothesis: hostile bytes never escape as exceptions ------------------------------------------


def _check_events(pair: Pair, events: list[Event], open_ids: set[int]) -> None:
    for event in events:
        assert isinstance(
            event,
            CallFinished
            | GoAwayReceived
            | PingAcknowledged
            | ConnectionBroken
            | StreamCapacityChanged,
        )
        if isinstance(event, CallFinished):
            assert event.stream_id in open_ids, "a call finished twice or was never started"
            open_ids.discard(event.stream_id)
            assert isinstance(event.code, StatusCode)
            assert (event.body is not None) == (event.code is StatusCode.OK)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=8))
def test_receive_data_never_raises_on_arbitrary_bytes(chunks: list[bytes]) -> None:
    pair = Pair()
    open_ids = {pair.call(), pair.call(), pair.call()}
    for chunk in chunks:
        _check_events(pair, pair.client.receive_data(chunk), open_ids)
    pair.client.data_to_send()


_STREAM_IDS = st.sampled_from([0, 1, 3, 5, 7, 2, 2**31 - 1])


@st.composite
def frames(draw: st.DrawFn, pair: Pair) -> bytes:
    """One frame of any type, often on a stream (or stream 0) where it does not belong."""
    kind = draw(st.integers(0, 11))
    if kind == 11:  # a whole, valid response, so that calls also finish normally
        sid = draw(st.sampled_from([1, 3, 5, 7]))
        head = HeadersFrame(sid, pair.server.encoder.encode(OK_HEADERS), flags=["END_HEADERS"])
        data = DataFrame(sid, encode_message(draw(st.binary(max_size=20))))
        status = draw(st.sampled_from([b"0", b"0", b"14"]))
        tail = HeadersFrame(
            sid,
            pair.server.encoder.encode([(b"grpc-status", status)]),
            flags=["END_HEADERS", "END_STREAM"],
        )
        return b"".join(bytes(f.serialize()) for f in (head, data, tail))
    flags = draw(st.sets(st.sampled_from(["END_STREAM", "END_HEADERS", "ACK", "PADDED"])))
    frame: Frame
    if kind == 0:
        body = draw(st.binary(max_size=30))
        frame = DataFrame(1, draw(st.sampled_from([body, encode_message(body)])))
    elif kind == 1:
        headers = draw(st.lists(st.sampled_from(_HEADER_CHOICES), max_size=5))
        frame = HeadersFrame(1, pair.server.encoder.encode(headers))
        flags.add("END_HEADERS")
    elif kind == 2:
        frame = RstStreamFrame(1, error_code=draw(st.integers(0, 20)))
    elif kind == 3:
        values = st.dictionaries(st.integers(1, 8), st.integers(0, 2**32 - 1), max_size=3)
        frame = SettingsFrame(0, settings=draw(values))
        flags.discard("ACK")
    elif kind == 4:
        frame = WindowUpdateFrame(0, window_increment=draw(st.integers(1, 2**31 - 1)))
    elif kind == 5:
        frame = PingFrame(0, opaque_data=draw(st.binary(min_size=8, max_size=8)))
    elif kind == 6:
        frame = GoAwayFrame(
            0, last_stream_id=draw(_STREAM_IDS), error_code=draw(st.integers(0, 15))
        )
    elif kind == 7:
        frame = PriorityFrame(1, depends_on=draw(_STREAM_IDS))
    elif kind == 8:
        frame = ContinuationFrame(1, draw(st.binary(max_size=10)))
    elif kind == 9:
        return draw(st.binary(max_size=20))
    else:
        frame = HeadersFrame(1, draw(st.binary(max_size=20)))  # garbage HPACK block
    # Mostly where it belongs, sometimes on a stream (or stream 0) where it does not.
    frame.stream_id = draw(st.one_of(st.just(frame.stream_id), _STREAM_IDS))
    names = {f.name for f in frame.defined_flags}
    for flag in flags & names:
        frame.flags.add(flag)
    if isinstance(frame, DataFrame | HeadersFrame) and "PADDED" in frame.flags:
        frame.pad_length = draw(st.integers(0, 5))
    return bytes(frame.serialize())


_HEADER_CHOICES = [
    (b":status", b"200"),
    (b":status", b"503"),
    (b":status", b"x"),
    (b"content-type", b"application/grpc"),
    (b"content-type", b"text/plain"),
    (b"grpc-status", b"0"),
    (b"grpc-status", b"13"),
    (b"grpc-status", b"zz"),
    (b"grpc-message", b"%ff%"),
    (b":path", b"/nope"),
    (b"Upper", b"case"),
]


@settings(max_examples=examples(250), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_receive_data_never_raises_on_arbitrary_frames(data: st.DataObject) -> None:
    pair = Pair(max_receive_message_bytes=16)
    open_ids = {pair.call(), pair.call(), pair.call()}
    for _ in range(data.draw(st.integers(1, 12))):
        chunk = data.draw(frames(pair))
        _check_events(pair, pair.client.receive_data(chunk), open_ids)
        # The client may still cancel, start calls and flush without raising, but for the
        # typed refusal of a call whose headers are over a limit the server just set (a
        # SETTINGS_MAX_HEADER_LIST_SIZE below them: nothing is sent).
        pair.client.data_to_send()
        if open_ids and data.draw(st.booleans()):
            victim = min(open_ids)
            pair.client.cancel_call(victim)
            open_ids.discard(victim)
        if pair.client.can_start_call and data.draw(st.booleans()):
            pair.client.data_to_send()  # the cancel's RST_STREAM: the refused call sends nothing
            try:
                open_ids.add(pair.client.start_call("Ack", b"again"))
            except HeaderListTooLarge as exc:
                assert exc.limit < exc.size
                assert not pair.client.data_to_send()
    # Every call is either finished or still tracked; losing the socket ends the rest.
    for finished in pair.client.connection_lost("end of test"):
        assert finished.stream_id in open_ids
        open_ids.discard(finished.stream_id)
    assert not open_ids
