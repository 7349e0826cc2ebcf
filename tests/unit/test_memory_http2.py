"""The memory server's HTTP/2 sides (our codec, and the reference on h2) over byte strings,
with h2's client at the other end: unary calls, trailers, flow control both ways, pings,
settings, resets, header blocks in pieces and with a dynamic table, GOAWAY."""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from sepp.testing._memory.calls import Call
from sepp.testing._memory.codec_server import CodecServerConnection
from sepp.testing._memory.h2_server import ServerConnection
from sepp.testing._memory.service import Reply

PATH = b"/sepp.v1.QueueService/Ack"


class Dispatcher:
    """Answers each call with its request reversed (or holds it, `hold=True`)."""

    def __init__(self, *, hold: bool = False, early: Reply | None = None) -> None:
        self.hold = hold
        self.early = early
        self.calls: list[tuple[Call, bytes]] = []
        self.forgotten: list[Call] = []
        self.began: list[Call] = []

    def admit(self, call: Call) -> Reply | None:
        return self.early

    def started(self, call: Call) -> None:
        self.began.append(call)

    def dispatch(self, call: Call, body: bytes) -> None:
        self.calls.append((call, body))
        if not self.hold:
            call.respond(Reply(body=body[::-1]))

    def forget(self, call: Call) -> None:
        self.forgotten.append(call)


@pytest.fixture(params=[CodecServerConnection, ServerConnection], ids=["codec", "h2"])
def kind(request: pytest.FixtureRequest) -> Any:
    return request.param


class Pair:
    """A server connection and h2's client, wired by hand."""

    def __init__(
        self, kind: Any, dispatcher: Dispatcher, client_settings: dict[int, int] | None = None
    ) -> None:
        self.server = kind(
            dispatcher, max_message_bytes=1 << 20, runtime_now=lambda: 0.0, on_output=lambda: None
        )
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.client = h2.connection.H2Connection(config=config)
        if client_settings:
            self.client.local_settings = h2.settings.Settings(
                client=True, initial_values=client_settings
            )
        self.client.initiate_connection()
        self.events: list[h2.events.Event] = []
        self.pump()

    def pump(self) -> None:
        for _ in range(20):
            moved = False
            data = self.client.data_to_send()
            if data:
                self.server.receive(data)
                moved = True
            data = self.server.data_to_send()
            if data:
                self.events += self.client.receive_data(data)
                moved = True
            if not moved:
                return

    def request(self, body: bytes, *, headers: list[tuple[bytes, bytes]] | None = None) -> int:
        stream_id = self.client.get_next_available_stream_id()
        self.client.send_headers(
            stream_id,
            headers
            or [
                (b":method", b"POST"),
                (b":scheme", b"http"),
                (b":path", PATH),
                (b":authority", b"x"),
                (b"content-type", b"application/grpc"),
                (b"te", b"trailers"),
                (b"grpc-timeout", b"5S"),
            ],
        )
        message = b"\x00" + len(body).to_bytes(4, "big") + body
        while True:
            room = min(self.client.local_flow_control_window(stream_id), 16384)
            chunk, message = message[:room], message[room:]
            self.client.send_data(stream_id, chunk, end_stream=not message)
            self.pump()
            if not message:
                return stream_id

    def of(self, stream_id: int, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind) and e.stream_id == stream_id]


def test_a_unary_call_gets_headers_data_and_trailers(kind: Any) -> None:
    dispatcher = Dispatcher()
    pair = Pair(kind, dispatcher)
    stream = pair.request(b"hello")
    [(call, body)] = dispatcher.calls
    assert body == b"hello" and call.path == PATH.decode() and call.deadline == 5.0
    [response] = pair.of(stream, h2.events.ResponseReceived)
    assert dict(response.headers)[b":status"] == b"200"
    data = b"".join(e.data for e in pair.of(stream, h2.events.DataReceived))
    assert data == b"\x00\x00\x00\x00\x05olleh"
    [trailers] = pair.of(stream, h2.events.TrailersReceived)
    assert dict(trailers.headers)[b"grpc-status"] == b"0"
    assert pair.of(stream, h2.events.StreamEnded)


def test_a_failure_is_trailers_only_with_its_message_percent_encoded(kind: Any) -> None:
    dispatcher = Dispatcher(early=Reply(16, "missing API key; 100% é"))
    pair = Pair(kind, dispatcher)
    stream = pair.request(b"x")
    [response] = pair.of(stream, h2.events.ResponseReceived)
    headers = dict(response.headers)
    assert headers[b"grpc-status"] == b"16"
    assert headers[b"grpc-message"] == b"missing%20API%20key;%20100%25%20%C3%A9"
    assert response.stream_ended is not None and dispatcher.calls == []


def test_replies_wait_for_the_clients_windows(kind: Any) -> None:
    dispatcher = Dispatcher()
    pair = Pair(kind, dispatcher, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1000})
    stream = pair.request(b"y" * 5000)  # the reply is 5005 bytes: five windows' worth
    received = sum(len(e.data) for e in pair.of(stream, h2.events.DataReceived))
    assert received == 1000 and not pair.of(stream, h2.events.TrailersReceived)
    for _ in range(6):
        pair.client.acknowledge_received_data(1000, stream)
        pair.pump()
    received = sum(len(e.data) for e in pair.of(stream, h2.events.DataReceived))
    assert received == 5005 and pair.of(stream, h2.events.TrailersReceived)


def test_big_requests_are_credited_back(kind: Any) -> None:
    dispatcher = Dispatcher(hold=True)
    pair = Pair(kind, dispatcher)
    pair.request(b"z" * 900_000)  # within our 1 MiB windows, which are credited as read
    pair.request(b"w" * 900_000)
    assert [len(body) for _, body in dispatcher.calls] == [900_000, 900_000]


def test_pings_are_answered_and_a_reset_forgets_its_call(kind: Any) -> None:
    dispatcher = Dispatcher(hold=True)
    pair = Pair(kind, dispatcher)
    pair.client.ping(b"12345678")
    pair.pump()
    assert [e.ping_data for e in pair.events if isinstance(e, h2.events.PingAckReceived)] == [
        b"12345678"
    ]
    stream = pair.request(b"held")
    pair.client.reset_stream(stream)
    pair.pump()
    assert [call.stream_id for call in dispatcher.forgotten] == [stream]


def test_a_header_block_in_continuations_and_with_a_dynamic_table(kind: Any) -> None:
    dispatcher = Dispatcher()
    pair = Pair(kind, dispatcher, {h2.settings.SettingCodes.MAX_FRAME_SIZE: 16384})
    big = [(b"x-pad-%d" % n, b"v" * 600) for n in range(20)]  # 12 KiB: a HEADERS and more
    headers = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", PATH),
        (b":authority", b"x"),
        (b"authorization", b"Bearer k"),
        *big,
    ]
    for _ in range(3):  # h2's encoder indexes the fields: later blocks refer to its table
        pair.request(b"a", headers=headers)
    assert len(dispatcher.calls) == 3
    assert {call.authorization for call, _ in dispatcher.calls} == {b"Bearer k"}


def _frames(data: bytes) -> list[tuple[int, int, bytes]]:
    """(type, stream id, payload) of each frame in `data`."""
    out = []
    while data:
        size = int.from_bytes(data[:3], "big")
        out.append((data[3], int.from_bytes(data[5:9], "big") & 0x7FFFFFFF, data[9 : 9 + size]))
        data = data[9 + size :]
    return out


def test_goaway_lets_begun_calls_finish_then_closes(kind: Any) -> None:
    dispatcher = Dispatcher(hold=True)
    pair = Pair(kind, dispatcher)
    pair.request(b"held")
    pair.server.goaway()
    sent = pair.server.data_to_send()
    assert not pair.server.closed  # a call is still to be answered
    [(call, _)] = dispatcher.calls
    call.respond(Reply(body=b"done"))
    sent += pair.server.data_to_send()
    assert pair.server.closed
    frames = _frames(sent)
    # Our codec says GOAWAY at once (as hyper does) and answers after it; the reference
    # (h2 sends nothing after its own GOAWAY) answers first. Either way: last stream 1.
    [goaway] = [payload for kind_, _, payload in frames if kind_ == 0x7]
    assert goaway == b"\x00\x00\x00\x01\x00\x00\x00\x00"
    assert any(kind_ == 0x0 and payload.endswith(b"done") for kind_, _, payload in frames)


def test_garbage_ends_the_connection(kind: Any) -> None:
    server = kind(
        Dispatcher(), max_message_bytes=1 << 20, runtime_now=lambda: 0.0, on_output=lambda: None
    )
    server.data_to_send()
    server.receive(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert server.closed
