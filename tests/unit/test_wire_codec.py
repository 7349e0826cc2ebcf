"""What only the codec does: batched flow-control credit, and its cache of decoded header blocks.

The behaviour both engines share is tested on both in test_wire_connection.py; these tests run
on the codec (the default engine) against a server-side h2 connection in memory.
"""

from __future__ import annotations

import h2.events
import hpack
import pytest
from fixtures.fuzz import examples
from hpack import NeverIndexedHeaderTuple
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_wire_connection import OK_HEADERS, Pair

from sepp.wire import CallFinished, CodecGrpcConnection, ConnectionBroken
from sepp.wire._constants import DEFAULT_CONNECTION_WINDOW, DEFAULT_STREAM_WINDOW
from sepp.wire._framing import encode_message
from sepp.wire._status import StatusCode
from sepp.wire.codec._frames import frame
from sepp.wire.codec._header_blocks import ResponseHeaderBlocks

# In the smoke selection of the emulated architectures' parts (tests/conftest.py).
pytestmark = pytest.mark.arch_smoke


def window_updates(pair: Pair) -> list[h2.events.WindowUpdated]:
    return [e for e in pair.server_events if isinstance(e, h2.events.WindowUpdated)]


def test_the_default_engine_is_the_codec() -> None:
    assert isinstance(Pair().client, CodecGrpcConnection)


def test_connection_credit_is_sent_in_batches_of_a_quarter_window() -> None:
    pair = Pair()
    quarter = DEFAULT_CONNECTION_WINDOW // 4
    chunk = 1024 * 1024 - 5
    sent = 0
    sid = 0
    before = len(window_updates(pair))
    while sent + chunk + 5 < quarter:  # just under a quarter of the window: no credit yet
        sid = pair.call()
        pair.respond(sid, b"x" * chunk)
        pair.to_server()
        sent += chunk + 5
    assert len(window_updates(pair)) == before
    assert pair.server.outbound_flow_control_window == DEFAULT_CONNECTION_WINDOW - sent
    rest = quarter - sent - 5
    sid = pair.call()
    pair.respond(sid, b"y" * rest)  # exactly a quarter: one WINDOW_UPDATE for all of it
    pair.to_server()
    credits = window_updates(pair)[before:]
    assert [(e.stream_id, e.delta) for e in credits] == [(0, quarter)]
    assert pair.server.outbound_flow_control_window == DEFAULT_CONNECTION_WINDOW


def test_a_response_larger_than_the_stream_window_flows_without_stalling() -> None:
    pair = Pair()
    sid = pair.call()
    body = bytes(range(256)) * (40 * 1024 * 1024 // 256)  # 40 MiB: 2.5 stream windows
    pair.server.send_headers(sid, OK_HEADERS)
    message = encode_message(body)
    view = memoryview(message)
    while view:
        # The server sends whatever its windows allow; it must never run dry.
        allowed = min(pair.server.local_flow_control_window(sid), len(view), 1024 * 1024)
        assert allowed > 0, "the server was left without window"
        pair.server.send_data(sid, view[:allowed].tobytes())
        view = view[allowed:]
        pair.to_client()
        pair.to_server()
    pair.trailers(sid)
    result = pair.finished(sid)
    assert (result.code, result.body) == (StatusCode.OK, body)
    stream_credits = [e for e in window_updates(pair) if e.stream_id == sid]
    # Credited when half the stream window is used: a handful of updates, not one per frame.
    assert 1 <= len(stream_credits) <= len(message) // (DEFAULT_STREAM_WINDOW // 2)


def test_no_stream_credit_once_the_response_ends() -> None:
    pair = Pair()
    sid = pair.call()
    body = encode_message(b"z" * (DEFAULT_STREAM_WINDOW // 2 + 10))
    pair.server.send_headers(sid, OK_HEADERS)
    for start in range(0, len(body), 1024 * 1024):
        last = start + 1024 * 1024 >= len(body)
        pair.server.send_data(sid, body[start : start + 1024 * 1024], end_stream=last)
    pair.to_client()
    pair.to_server()
    assert pair.finished(sid).code is StatusCode.UNKNOWN  # (no trailers: no grpc-status)
    assert [e for e in window_updates(pair) if e.stream_id == sid] == []


# -- the decoded header block cache ----------------------------------------------------------------


def test_steady_responses_are_decoded_from_the_cache() -> None:
    pair = Pair()
    for _ in range(3):
        pair.respond(pair.call(), b"warm-up")
    blocks = pair.client._blocks  # type: ignore[attr-defined]
    decode_calls = 0
    real_decode = blocks._decoder.decode

    def counting_decode(data: bytes, raw: bool = False) -> object:
        nonlocal decode_calls
        decode_calls += 1
        return real_decode(data, raw=raw)

    blocks._decoder.decode = counting_decode
    for _ in range(20):
        sid = pair.call()
        pair.respond(sid, b"steady")
        assert pair.finished(sid).body == b"steady"
    assert decode_calls == 0


_FIELDS = st.sampled_from(
    [
        (b"grpc-message", b"q" * 980),
        (b"grpc-message", b"r" * 980),
        (b":status", b"200"),
        (b":status", b"503"),
        (b"content-type", b"application/grpc"),
        (b"grpc-status", b"0"),
        (b"grpc-status", b"14"),
        (b"x-filler", b"a" * 900),
        (b"x-filler", b"b" * 900),
        (b"x-other", b"c"),
    ]
)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.lists(st.tuples(_FIELDS, st.text(max_size=3)), min_size=1, max_size=6),
            st.sampled_from([None, 0, 256, 4096]),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_cached_blocks_always_decode_as_the_table_says(
    blocks: list[tuple[list[tuple[tuple[bytes, bytes], str]], int | None]],
) -> None:
    """Whatever the server's encoder inserts, evicts or resizes, every block decodes to what
    was encoded (a stale cache entry would show the wrong field)."""
    encoder = hpack.Encoder()
    decoder = ResponseHeaderBlocks(64 * 1024)
    for fields, resize in blocks:
        if resize is not None:
            encoder.header_table_size = resize  # emitted as a size update in the next block
        headers = [(name, value + suffix.encode()) for (name, value), suffix in fields]
        expected = tuple(
            (n, v)
            for n, v in headers
            if n in {b":status", b"content-type", b"grpc-status", b"grpc-message"}
        )
        assert decoder.decode(bytes(encoder.encode(headers))) == expected


def test_the_same_bytes_after_the_table_changed_are_decoded_again() -> None:
    encoder = hpack.Encoder()
    decoder = ResponseHeaderBlocks(64 * 1024)
    inserting = bytes(encoder.encode([(b"grpc-status", b"7")]))  # literal with indexing
    assert decoder.decode(inserting) == ((b"grpc-status", b"7"),)
    assert decoder._cache == {}  # a block that changed the table is never remembered
    reference = bytes(encoder.encode([(b"grpc-status", b"7")]))  # the newest table entry
    assert decoder.decode(reference) == ((b"grpc-status", b"7"),)
    assert list(decoder._cache) == [reference]
    # A new entry moves "the newest entry" to another field: the same bytes now mean it.
    assert decoder.decode(bytes(encoder.encode([(b"grpc-status", b"8")]))) == (
        (b"grpc-status", b"8"),
    )
    assert bytes(encoder.encode([(b"grpc-status", b"8")])) == reference
    assert decoder.decode(reference) == ((b"grpc-status", b"8"),)


def test_a_full_table_that_evicts_as_it_inserts_still_invalidates_the_cache() -> None:
    encoder = hpack.Encoder()
    decoder = ResponseHeaderBlocks(64 * 1024)

    def message(digit: str) -> tuple[bytes, bytes]:
        return (b"grpc-message", digit.encode() * 980)  # 32 + 12 + 980: a quarter of 4096

    for digit in "1234":  # the table is now full
        decoder.decode(bytes(encoder.encode([message(digit)])))
    reference = bytes(encoder.encode([message("4")]))
    assert decoder.decode(reference) == (message("4"),)
    decoder.decode(bytes(encoder.encode([message("5")])))  # evicts "1": same entry count
    assert decoder.decode(reference) == (message("5"),)


def test_a_call_finishes_once_per_stream_even_with_cached_blocks() -> None:
    pair = Pair()
    sids = [pair.call() for _ in range(10)]
    for sid in sids:
        pair.respond(sid, b"r%d" % sid, send=False)
    events = pair.to_client()
    finished = [e for e in events if isinstance(e, CallFinished)]
    assert [(e.stream_id, e.body) for e in finished] == [(s, b"r%d" % s) for s in sids]


# -- connection errors name their cause in the GOAWAY ----------------------------------------------


def _goaway_code(data: bytes) -> int | None:
    pos = 0
    while pos + 9 <= len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        if data[pos + 3] == 0x7:
            return int.from_bytes(data[pos + 13 : pos + 17], "big")
        pos += 9 + length
    return None


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        (b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x", 0x1),  # DATA on stream 0: PROTOCOL_ERROR
        (b"\x00\x00\x02\x01\x05\x00\x00\x00\x01\xff\xff", 0x9),  # bad HPACK: COMPRESSION_ERROR
        (b"\x00\x00\x03\x06\x00\x00\x00\x00\x00abc", 0x6),  # a 3-byte PING: FRAME_SIZE_ERROR
        (b"\x00\x00\x04\x08\x00\x00\x00\x00\x00\x7f\xff\xff\xff", 0x3),  # window overflow
        (b"\x00\x00\x00\x05\x04\x00\x00\x00\x01", 0x1),  # PUSH_PROMISE: PROTOCOL_ERROR
        (b"\x00\x00\x02\x09\x04\x00\x00\x00\x01ab", 0x1),  # stray CONTINUATION
        (b"\x00\x00\x00\x00\x00\x00\x00\x00\x05", 0x1),  # DATA on idle stream 5
    ],
)
def test_a_connection_error_sends_goaway_with_its_code(frames: bytes, code: int) -> None:
    pair = Pair()
    a, b = pair.call(), pair.call()
    pair.respond(b)  # stream 3 ended by the server (its late frames are ignored)
    pair.to_server()
    pair.client.data_to_send()
    events = pair.client.receive_data(frames)
    assert isinstance(events[-1], ConnectionBroken)
    assert [e.stream_id for e in events if isinstance(e, CallFinished)] == [a]
    assert _goaway_code(pair.client.data_to_send()) == code


def test_an_oversized_header_list_is_enhance_your_calm() -> None:
    pair = Pair()
    pair.call()
    big = hpack.Encoder().encode([(b"x-big", b"v" * (70 * 1024))], huffman=False)
    frames = frame(0x1, 0x4, 1, big[: 1024 * 1024])
    events = pair.client.receive_data(frames)
    assert isinstance(events[-1], ConnectionBroken)
    assert _goaway_code(pair.client.data_to_send()) == 0xB


def test_the_header_block_cache_is_bounded_in_bytes() -> None:
    """Big blocks that leave the table alone (here on streams already closed, whose blocks are
    still decoded for the table) are decoded but never remembered."""
    pair = Pair()
    sids = [pair.client.start_call("Ack", b"x") for _ in range(ResponseHeaderBlocks._MAX_ENTRIES)]
    for sid in sids:
        pair.client.cancel_call(sid)
    encoder = hpack.Encoder()
    for index, sid in enumerate(sids):
        pad = b"%03d" % index + b"p" * (60 * 1024)
        block = encoder.encode([NeverIndexedHeaderTuple(b"x-pad", pad)], huffman=False)
        assert pair.client.receive_data(frame(0x1, 0x4, sid, block)) == []
    cache = pair.client._blocks._cache  # type: ignore[attr-defined]
    held = sum(len(block) + sum(len(n) + len(v) for n, v in f) for block, f in cache.items())
    assert held <= 128 * 1024  # 128 blocks of at most 1 KiB (docs/wire-engines.md)
    assert pair.client.broken is None
