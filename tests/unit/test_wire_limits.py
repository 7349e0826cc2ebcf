"""Resource limits against a hostile server, on each sans-IO engine (both: see conftest.py).

Each test names a limit from docs/wire-engines.md ("Resource limits") and feeds what a peer
that ignores it would send. Work is counted, never timed.
"""

from __future__ import annotations

import struct
from typing import Any

import hpack
import pytest
from h2.errors import ErrorCodes
from hpack import NeverIndexedHeaderTuple
from test_wire_connection import OK_HEADERS, Pair, kinds

from sepp.wire import CallFinished, ConnectionBroken, StreamCapacityChanged
from sepp.wire._calls import StreamIdsExhausted
from sepp.wire._constants import (
    MAX_HEADER_BLOCK_BYTES,
    MAX_INFORMATIONAL_RESPONSES,
    MAX_QUEUED_CONTROL_REPLY_BYTES,
)
from sepp.wire._failure import FailureKind
from sepp.wire._framing import encode_message
from sepp.wire._status import StatusCode

pytestmark = pytest.mark.both_engines

_FRAME = struct.Struct(">HBBBL")
PING, SETTINGS, HEADERS, CONTINUATION, DATA = 0x6, 0x4, 0x1, 0x9, 0x0
END_STREAM, END_HEADERS = 0x1, 0x4
INITIAL_WINDOW_SIZE, MAX_CONCURRENT_STREAMS = 0x4, 0x3


def raw(frame_type: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _FRAME.pack(n >> 8, n & 0xFF, frame_type, flags, stream_id) + payload


def settings(*pairs: tuple[int, int]) -> bytes:
    return raw(SETTINGS, 0, 0, b"".join(struct.pack(">HL", k, v) for k, v in pairs))


def goaway_code(data: bytes) -> int | None:
    pos = 0
    while pos + 9 <= len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        if data[pos + 3] == 0x7:
            return int.from_bytes(data[pos + 13 : pos + 17], "big")
        pos += 9 + length
    return None


def literal_block(*headers: tuple[bytes, bytes]) -> bytes:
    """Fields that leave the HPACK dynamic table alone (literal, never indexed)."""
    encoder = hpack.Encoder()
    return bytes(encoder.encode([NeverIndexedHeaderTuple(n, v) for n, v in headers], False))


OK_BLOCK = literal_block(*OK_HEADERS)
OK_TRAILERS = literal_block((b"grpc-status", b"0"))


def ok_response(stream_id: int, body: bytes = b"ok") -> bytes:
    return (
        raw(HEADERS, END_HEADERS, stream_id, OK_BLOCK)
        + raw(DATA, 0, stream_id, encode_message(body))
        + raw(HEADERS, END_HEADERS | END_STREAM, stream_id, OK_TRAILERS)
    )


# -- PING and SETTINGS acknowledgements ------------------------------------------------------------


@pytest.mark.parametrize(
    "flood", [raw(PING, 0, 0, b"12345678"), raw(SETTINGS, 0, 0)], ids=["PING", "SETTINGS"]
)
def test_acks_a_server_never_lets_us_send_are_capped(flood: bytes) -> None:
    """A peer that floods PINGs (or SETTINGS) and never reads: the driver cannot hand our ACKs
    to the socket, so they pile up in the engine until the cap ends the connection."""
    pair = Pair()
    sid = pair.call()
    pair.client.data_to_send()
    batch = flood * 1000
    events: list[Any] = []
    sent_frames = 0
    while not events and sent_frames < 4 * MAX_QUEUED_CONTROL_REPLY_BYTES // 9:
        events = pair.client.receive_data(batch)
        sent_frames += 1000
    assert kinds(events) == [CallFinished, ConnectionBroken]
    assert events[0].stream_id == sid and events[0].code is StatusCode.UNAVAILABLE
    assert "did not read" in events[1].reason
    out = pair.client.data_to_send()
    assert goaway_code(out) == ErrorCodes.ENHANCE_YOUR_CALM
    assert len(out) < 100  # the queued ACKs were dropped, not sent
    assert sent_frames * len(flood) <= MAX_QUEUED_CONTROL_REPLY_BYTES + len(batch)


def test_frames_on_a_closed_stream_never_pile_up_replies() -> None:
    """DATA on a stream whose call is over, from a peer that never reads: the codec ignores
    it; h2 answers each frame with RST_STREAM, which counts against the same cap."""
    pair = Pair()
    sid = pair.call()
    pair.respond(sid)
    pair.client.data_to_send()
    batch = raw(DATA, 0, sid, b"x") * 1000
    events: list[Any] = []
    fed = 0
    while not events and fed < 4 * MAX_QUEUED_CONTROL_REPLY_BYTES:
        events = pair.client.receive_data(batch)
        fed += len(batch)
    out = pair.client.data_to_send()
    if events:  # ended for piling up replies
        assert kinds(events) == [ConnectionBroken]
        assert goaway_code(out) == ErrorCodes.ENHANCE_YOUR_CALM
    assert len(out) <= MAX_QUEUED_CONTROL_REPLY_BYTES


def test_acks_the_driver_takes_are_never_capped() -> None:
    pair = Pair()
    pair.call()
    batch = raw(PING, 0, 0, b"12345678") * 10_000
    for _ in range(MAX_QUEUED_CONTROL_REPLY_BYTES // len(batch) + 2):
        assert pair.client.receive_data(batch) == []
        assert len(pair.client.data_to_send()) == len(batch)  # every PING answered
    assert pair.client.broken is None


# -- SETTINGS --------------------------------------------------------------------------------------


def test_settings_signal_capacity_only_when_the_stream_limit_changes() -> None:
    pair = Pair()
    pair.call()
    client = pair.client
    assert client.receive_data(raw(SETTINGS, 0, 0)) == []
    assert client.receive_data(settings((INITIAL_WINDOW_SIZE, 1000))) == []
    assert client.receive_data(settings((MAX_CONCURRENT_STREAMS, 2))) == [StreamCapacityChanged()]
    assert client.free_streams == 1
    assert client.receive_data(settings((MAX_CONCURRENT_STREAMS, 2))) == []
    assert client.receive_data(settings((MAX_CONCURRENT_STREAMS, 5))) == [StreamCapacityChanged()]
    assert client.free_streams == 4


def test_free_streams_before_and_without_a_server_limit() -> None:
    pair = Pair(handshake=False)
    assert pair.client.free_streams == 1  # one call until the server's SETTINGS arrive
    pair.client.start_call("Ack", b"x")
    assert pair.client.free_streams == 0
    pair.client.receive_data(raw(SETTINGS, 0, 0))  # no MAX_CONCURRENT_STREAMS
    assert pair.client.free_streams == 2**31 - 1


class _CountingDict(dict[int, Any]):
    """The engine's calls, counting every walk over them."""

    walks = 0

    def values(self) -> Any:
        _CountingDict.walks += 1
        return super().values()

    def items(self) -> Any:
        _CountingDict.walks += 1
        return super().items()

    def __iter__(self) -> Any:
        _CountingDict.walks += 1
        return super().__iter__()


def test_a_settings_frame_of_many_entries_changes_the_call_windows_once() -> None:
    pair = Pair()
    for _ in range(20):
        pair.call()
    client: Any = pair.client
    client._calls = _CountingDict(client._calls)
    _CountingDict.walks = 0
    entries = [(INITIAL_WINDOW_SIZE, 2**20 + (i & 1)) for i in range(999)]
    client.receive_data(settings(*entries, (INITIAL_WINDOW_SIZE, 1000)))
    assert client.broken is None
    assert _CountingDict.walks <= 1
    # Only the last value counts: a new call may send 1,000 bytes before a WINDOW_UPDATE.
    sid = pair.call(body=b"x" * 5000)
    assert len(pair.request_body(sid)) == 1000


# -- header blocks ---------------------------------------------------------------------------------


def test_an_oversized_single_headers_frame_is_refused_undecoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decoded: list[int] = []
    original = hpack.Decoder.decode

    def spy(self: hpack.Decoder, data: bytes, raw: bool = False) -> Any:
        decoded.append(len(data))
        return original(self, data, raw)

    monkeypatch.setattr(hpack.Decoder, "decode", spy)
    pair = Pair()
    sid = pair.call()
    block = OK_BLOCK + literal_block((b"x-pad", b"p" * MAX_HEADER_BLOCK_BYTES))
    events = pair.client.receive_data(raw(HEADERS, END_HEADERS, sid, block))
    assert kinds(events) == [CallFinished, ConnectionBroken]
    assert goaway_code(pair.client.data_to_send()) == ErrorCodes.ENHANCE_YOUR_CALM
    assert all(size <= MAX_HEADER_BLOCK_BYTES for size in decoded)


def test_a_header_block_over_the_byte_cap_is_refused_before_it_ends() -> None:
    """HEADERS plus CONTINUATION frames: refused once the block passes the cap, not buffered
    until END_HEADERS (h2 alone would take 64 frames of up to 1 MiB each)."""
    pair = Pair()
    sid = pair.call()
    half = literal_block((b"x-pad", b"p" * (MAX_HEADER_BLOCK_BYTES // 2)))
    events = pair.client.receive_data(raw(HEADERS, 0, sid, half))
    assert events == []
    events = pair.client.receive_data(raw(CONTINUATION, 0, sid, b"\x00" * len(half)))
    assert kinds(events) == [CallFinished, ConnectionBroken]
    assert goaway_code(pair.client.data_to_send()) == ErrorCodes.ENHANCE_YOUR_CALM


@pytest.mark.parametrize(("updates", "ok"), [(1, True), (2, True), (3, False), (500, False)])
def test_at_most_two_table_size_updates_start_a_block(updates: int, ok: bool) -> None:
    pair = Pair()
    sid = pair.call()
    size_updates = b"\x3f\xe1\x1f" * updates  # each: table size 4096
    events = pair.client.receive_data(
        raw(HEADERS, END_HEADERS, sid, size_updates + OK_BLOCK)
        + raw(DATA, 0, sid, encode_message(b"ok"))
        + raw(HEADERS, END_HEADERS | END_STREAM, sid, OK_TRAILERS)
    )
    if ok:
        assert [e.body for e in events if isinstance(e, CallFinished)] == [b"ok"]
        assert pair.client.broken is None
    else:
        assert kinds(events) == [CallFinished, ConnectionBroken]
        assert events[0].code is StatusCode.UNAVAILABLE


def test_informational_responses_are_capped_per_stream() -> None:
    pair = Pair()
    patient, flooded = pair.call(), pair.call()
    informational = raw(HEADERS, END_HEADERS, 0, literal_block((b":status", b"100")))

    def on(stream_id: int) -> bytes:
        return informational[:5] + struct.pack(">L", stream_id) + informational[9:]

    assert pair.client.receive_data(on(patient) * MAX_INFORMATIONAL_RESPONSES) == []
    events = pair.client.receive_data(on(flooded) * (MAX_INFORMATIONAL_RESPONSES + 1))
    assert kinds(events) == [CallFinished, StreamCapacityChanged]
    assert (events[0].stream_id, events[0].code, events[0].error_kind) == (
        flooded,
        StatusCode.INTERNAL,
        FailureKind.PROTOCOL,
    )
    assert "informational" in events[0].details
    assert pair.to_server() and pair.server_resets() == {flooded: ErrorCodes.ENHANCE_YOUR_CALM}
    # The stream is reset, the connection and the other call carry on.
    events = pair.client.receive_data(ok_response(patient))
    assert [(e.stream_id, e.body) for e in events if isinstance(e, CallFinished)] == [
        (patient, b"ok")
    ]
    assert pair.client.broken is None


# -- streams that closed ---------------------------------------------------------------------------


def test_a_late_frame_for_a_stream_reset_long_ago_is_ignored() -> None:
    pair = Pair()
    client = pair.client
    first = client.start_call("Ack", b"x")
    client.cancel_call(first)
    for _ in range(5000):  # more streams than any memory of reset ones would hold
        client.cancel_call(client.start_call("Ack", b"x"))
    client.data_to_send()
    survivor = client.start_call("Ack", b"x")
    events = client.receive_data(ok_response(first) + ok_response(survivor, b"alive"))
    assert [(e.stream_id, e.body) for e in events if isinstance(e, CallFinished)] == [
        (survivor, b"alive")
    ]
    assert client.broken is None


# -- input buffering -------------------------------------------------------------------------------


@pytest.mark.needs("tracemalloc")
def test_a_frame_arriving_in_tiny_reads_is_held_in_one_buffer() -> None:
    import tracemalloc

    pair = Pair()
    sid = pair.call()
    body = b"m" * (32 * 1024)
    data = ok_response(sid, body)
    data_frame_end = data.index(OK_TRAILERS) - 9
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(0, data_frame_end - 3, 3):
            assert pair.client.receive_data(data[i : i + 3]) == []
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # As a list of 3-byte strings it would be about 14 bytes per byte received.
    assert held < 2 * len(body)
    events = pair.client.receive_data(data[i + 3 :])
    assert [e.body for e in events if isinstance(e, CallFinished)] == [body]


# -- stream ids ------------------------------------------------------------------------------------


def test_no_call_starts_past_the_last_stream_id() -> None:
    pair = Pair()
    pair.client._set_next_stream_id(2**31 - 1)  # type: ignore[attr-defined]
    assert pair.client.start_call("Ack", b"x") == 2**31 - 1
    pair.client.data_to_send()
    with pytest.raises(StreamIdsExhausted):
        pair.client.start_call("Ack", b"x")
    assert pair.client.active_calls == 1
    assert pair.client.data_to_send() == b""
