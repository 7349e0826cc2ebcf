"""Big requests and responses on both engines: framed exactly as the plain slicing would frame
them, sent without copies, and read back whole however the reads split them.

The codec sends a big request as views of the caller's bytes between the frame headers (see
`buffers_to_send`), the gRPC length prefix queued apart from the message, and parses a read
after a partial frame without copying the read. None of that may change a byte on the wire:
`OldSlicing` below is the slicing the codec had before (the request and its prefix joined,
each DATA frame as much as both windows and MAX_FRAME_SIZE allow, blocked streams resumed in
the order they blocked), and hypothesis drives both engines and it through the same server
SETTINGS, calls and WINDOW_UPDATEs.
"""

from __future__ import annotations

import itertools
import random
import struct
from dataclasses import dataclass, field

import hpack
import pytest
from fixtures.fuzz import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sepp.wire import CallFinished, connection_class
from sepp.wire._engine import WIRE_ENGINES, GrpcConnection
from sepp.wire._framing import Request, encode_message
from sepp.wire._status import StatusCode
from sepp.wire.codec._connection import CodecGrpcConnection
from sepp.wire.codec._windows import VIEW_MIN_BYTES
from sepp.wire.drivers._sending import advance

# In the smoke selection of the emulated architectures' parts (tests/conftest.py).
pytestmark = pytest.mark.arch_smoke

_FRAME = struct.Struct(">HBBBL")
DATA, HEADERS, SETTINGS, WINDOW_UPDATE = 0x0, 0x1, 0x4, 0x8
END_STREAM, END_HEADERS = 0x1, 0x4
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 0x4, 0x5
DEFAULT_WINDOW = 65_535


def raw_frame(frame_type: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _FRAME.pack(n >> 8, n & 0xFF, frame_type, flags, stream_id) + payload


def settings_frame(**values: int) -> bytes:
    codes = {"initial_window": INITIAL_WINDOW_SIZE, "max_frame": MAX_FRAME_SIZE}
    payload = b"".join(struct.pack(">HL", codes[k], v) for k, v in values.items())
    return raw_frame(SETTINGS, 0, 0, payload)


def window_update(stream_id: int, increment: int) -> bytes:
    return raw_frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">L", increment))


def frames_of(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream id, payload) of every frame in `data`, which holds whole frames."""
    frames, pos = [], 0
    while pos < len(data):
        high, low, frame_type, flags, stream_id = _FRAME.unpack_from(data, pos)
        stop = pos + 9 + ((high << 8) | low)
        frames.append((frame_type, flags, stream_id, data[pos + 9 : stop]))
        pos = stop
    assert pos == len(data)
    return frames


def data_frames(data: bytes) -> list[bytes]:
    return [raw_frame(t, f, s, p) for t, f, s, p in frames_of(data) if t == DATA]


@dataclass
class OldSlicing:
    """The DATA frames the codec sent before requests went out as views: the reference."""

    initial_window: int
    max_frame: int
    connection_window: int = DEFAULT_WINDOW
    windows: dict[int, int] = field(default_factory=dict)
    left: dict[int, bytes] = field(default_factory=dict)
    blocked: dict[int, None] = field(default_factory=dict)
    frames: list[bytes] = field(default_factory=list)

    def start(self, stream_id: int, request: bytes) -> None:
        self.windows[stream_id] = self.initial_window
        self.left[stream_id] = encode_message(request)
        self._send(stream_id)

    def window_update(self, stream_id: int, increment: int) -> None:
        if stream_id == 0:
            self.connection_window += increment
            self._resume()
        else:
            self.windows[stream_id] += increment
            if self.left[stream_id]:
                self._send(stream_id)

    def new_initial_window(self, window: int) -> None:
        delta = window - self.initial_window
        self.initial_window = window
        for stream_id in self.windows:
            self.windows[stream_id] += delta
        if delta > 0:
            self._resume()

    def _resume(self) -> None:
        for stream_id in list(self.blocked):
            if self.connection_window <= 0:
                return
            self._send(stream_id)

    def _send(self, stream_id: int) -> None:
        body = self.left[stream_id]
        while body:
            n = min(len(body), self.connection_window, self.windows[stream_id], self.max_frame)
            if n <= 0:
                self.left[stream_id] = body
                self.blocked[stream_id] = None
                return
            flags = END_STREAM if n == len(body) else 0
            self.frames.append(raw_frame(DATA, flags, stream_id, body[:n]))
            self.connection_window -= n
            self.windows[stream_id] -= n
            body = body[n:]
        self.left[stream_id] = b""
        self.blocked.pop(stream_id, None)


SIZES = st.one_of(
    st.sampled_from(
        # 16_379, 32_763, 65_531 and 163_835 fill whole 16 KiB frames exactly with the prefix.
        [0, 1, 5, 6, 16_378, 16_379, 16_380, 16_384, 32_763, 40_000, 65_531, 65_536, 163_835]
    ),
    st.integers(0, 300_000),
)
WINDOWS = st.sampled_from([0, 1, 5, 6, 100, 16_384, 65_535, 70_000, 1 << 20])
INCREMENTS = st.sampled_from([1, 3, 5, 9, 16_384, 16_389, 65_535, 100_000, 1 << 20])
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("call"), SIZES),
        st.tuples(st.just("credit"), INCREMENTS),
        st.tuples(st.just("stream_credit"), st.integers(0, 15), INCREMENTS),
        st.tuples(st.just("initial_window"), WINDOWS),
    ),
    min_size=1,
    max_size=12,
)


def in_parts(request: bytes, rng: random.Random) -> Request:
    """`request` as it is, or cut into parts (some empty) as a big payload's enqueue gives it."""
    if rng.random() < 0.3:
        return request
    cuts = sorted(rng.choices(range(len(request) + 1), k=rng.randint(0, 4)))
    bounds = [0, *cuts, len(request)]
    return tuple(request[a:b] for a, b in itertools.pairwise(bounds))


def _connect(engine: str, initial_window: int, max_frame: int) -> GrpcConnection:
    conn = connection_class(engine)(authority="localhost")
    conn.initiate()
    conn.receive_data(settings_frame(initial_window=initial_window, max_frame=max_frame))
    return conn


@pytest.mark.parametrize("engine", WIRE_ENGINES)
@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    initial_window=WINDOWS,
    max_frame=st.sampled_from([16_384, 16_385, 20_000, 65_536, 1 << 20]),
    steps=STEPS,
    seed=st.integers(0, 2**32 - 1),
)
def test_requests_are_framed_exactly_as_the_plain_slicing_frames_them(
    engine: str,
    initial_window: int,
    max_frame: int,
    steps: list[tuple[object, ...]],
    seed: int,
) -> None:
    conn = _connect(engine, initial_window, max_frame)
    conn.data_to_send()  # the preface and the SETTINGS ACK
    reference = OldSlicing(initial_window, max_frame)
    rng = random.Random(seed)
    streams: list[int] = []
    sent = b""
    credited = dict.fromkeys([0], DEFAULT_WINDOW)  # keeps every window below 2^31
    for step in steps:
        if step[0] == "call":
            request = rng.randbytes(int(step[1]))  # type: ignore[call-overload]
            stream_id = conn.start_call("Enqueue", in_parts(request, rng))
            streams.append(stream_id)
            reference.start(stream_id, request)
        elif step[0] == "initial_window":
            window = int(step[1])  # type: ignore[call-overload]
            conn.receive_data(settings_frame(initial_window=window))
            reference.new_initial_window(window)
        else:
            stream_id = 0
            if step[0] == "stream_credit":
                if not streams:
                    continue
                stream_id = streams[int(step[1]) % len(streams)]  # type: ignore[call-overload]
            increment = int(step[-1])  # type: ignore[call-overload]
            if credited.get(stream_id, 0) + increment >= 2**30:
                continue
            credited[stream_id] = credited.get(stream_id, 0) + increment
            conn.receive_data(window_update(stream_id, increment))
            reference.window_update(stream_id, increment)
        buffers = conn.buffers_to_send()
        out = b"".join(buffers)
        sent += out
        # What went out so far is exactly what the old slicing sent, frame by frame.
        assert data_frames(sent) == reference.frames
    assert all(t in (DATA, HEADERS, SETTINGS, WINDOW_UPDATE) for t, *_ in frames_of(sent))


@pytest.mark.parametrize("engine", WIRE_ENGINES)
@pytest.mark.parametrize("frames", [1, 2, 3, 4, 10, 64])
@pytest.mark.parametrize("credit_first", [True, False])
def test_messages_of_whole_frames_end_the_stream_on_their_last_frame(
    engine: str, frames: int, credit_first: bool
) -> None:
    conn = _connect(engine, 1 << 20, 16_384)
    conn.data_to_send()
    reference = OldSlicing(1 << 20, 16_384)
    request = random.Random(frames).randbytes(frames * 16_384 - 5)  # prefix: 5 bytes
    if credit_first:
        conn.receive_data(window_update(0, 1 << 20))
        reference.window_update(0, 1 << 20)
    stream_id = conn.start_call("Enqueue", request)
    reference.start(stream_id, request)
    if not credit_first:
        conn.receive_data(window_update(0, 1 << 20))
        reference.window_update(0, 1 << 20)
    sent = data_frames(conn.data_to_send())
    assert sent == reference.frames
    assert [f[4] for f in sent] == [0] * (len(sent) - 1) + [END_STREAM]


@pytest.mark.parametrize("engine", WIRE_ENGINES)
def test_data_to_send_is_the_buffers_joined(engine: str) -> None:
    request = random.Random(7).randbytes(300_000)
    conns = [_connect(engine, 1 << 20, 16_384) for _ in range(2)]
    for conn in conns:
        conn.data_to_send()
        conn.start_call("Enqueue", request)
        conn.receive_data(window_update(0, 1 << 20))
    joined = conns[0].data_to_send()
    assert joined == b"".join(conns[1].buffers_to_send())
    assert b"".join(p for t, _f, _s, p in frames_of(joined) if t == DATA) == encode_message(request)


def test_a_big_request_goes_out_as_views_of_the_callers_bytes() -> None:
    request = random.Random(8).randbytes(1 << 20)
    conn = _connect("codec", 1 << 20, 16_384)
    conn.data_to_send()
    conn.start_call("Enqueue", request)
    conn.receive_data(window_update(0, 1 << 20))
    buffers = conn.buffers_to_send()
    views = [b for b in buffers if isinstance(b, memoryview)]
    # Every byte but those of the frames cut short (by the prefix or a window edge: copied,
    # as they are under VIEW_MIN_BYTES) is a slice of `request` itself.
    assert all(v.obj is request for v in views)
    assert sum(map(len, views)) >= len(request) - 3 * VIEW_MIN_BYTES
    copied = sum(len(b) for b in buffers if not isinstance(b, memoryview))
    assert copied < 3 * VIEW_MIN_BYTES + 1024  # + HEADERS and the frame headers


def test_a_big_part_goes_out_as_views_of_the_callers_bytes() -> None:
    # An enqueue of a big payload: the fields before it, the payload, the fields after it.
    payload = random.Random(9).randbytes(1 << 20)
    head, tail = b"h" * 40, b"t" * 30
    conn = _connect("codec", 2 << 20, 16_384)
    conn.data_to_send()
    conn.start_call("Enqueue", (head, payload, tail))
    conn.receive_data(window_update(0, 2 << 20))
    buffers = conn.buffers_to_send()
    sent = frames_of(b"".join(buffers))
    assert b"".join(p for t, _f, _s, p in sent if t == DATA) == encode_message(
        head + payload + tail
    )
    views = [b for b in buffers if isinstance(b, memoryview)]
    assert all(v.obj in (payload, head, tail) for v in views)
    # The payload is never copied: views of it cover all of it but what shares a frame cut
    # short by the window's edges and the prefix (under VIEW_MIN_BYTES each, copied).
    assert sum(len(v) for v in views if v.obj is payload) >= len(payload) - 2 * VIEW_MIN_BYTES
    copied = sum(len(b) for b in buffers if not isinstance(b, memoryview))
    assert copied < 2 * VIEW_MIN_BYTES + 1024


def test_a_request_in_parts_that_fits_one_frame_goes_out_as_its_parts() -> None:
    payload = random.Random(10).randbytes(40_000)
    conn = _connect("codec", 1 << 20, 1 << 20)
    conn.receive_data(window_update(0, 1 << 20))
    conn.data_to_send()
    conn.start_call("Enqueue", (b"head", payload, b"tail"))
    buffers = conn.buffers_to_send()
    assert payload in buffers  # the caller's bytes object itself, behind the frame headers
    ((_type, flags, _sid, body),) = [f for f in frames_of(b"".join(buffers)) if f[0] == DATA]
    assert flags == END_STREAM and body == encode_message(b"head" + payload + b"tail")


def test_small_requests_are_joined_into_one_buffer() -> None:
    conn = _connect("codec", 1 << 20, 16_384)
    conn.data_to_send()
    for _ in range(3):
        conn.start_call("Enqueue", b"x" * (VIEW_MIN_BYTES - 1))
    buffers = conn.buffers_to_send()
    assert len(buffers) == 1 and isinstance(buffers[0], bytes)


@given(
    sizes=st.lists(st.integers(0, 40_000), min_size=1, max_size=8),
    sent=st.integers(0, 400_000),
)
def test_advance_drops_exactly_the_bytes_sent(sizes: list[int], sent: int) -> None:
    buffers: list[bytes | memoryview] = [
        bytes([i % 251]) * size if i % 2 else memoryview(bytes([i % 251]) * size)
        for i, size in enumerate(sizes)
    ]
    joined = b"".join(buffers)
    sent = min(sent, len(joined))
    assert b"".join(advance(list(buffers), sent)) == joined[sent:]


# -- big responses, however the reads split them ---------------------------------------------


def _response(stream_id: int, message: bytes, frame_sizes: list[int]) -> bytes:
    """A gRPC response: HEADERS, the message in DATA frames of the given sizes, trailers."""
    encoder = hpack.Encoder()
    body = encode_message(message)
    out = [
        raw_frame(
            HEADERS,
            END_HEADERS,
            stream_id,
            encoder.encode([(b":status", b"200"), (b"content-type", b"application/grpc")]),
        )
    ]
    pos = 0
    for size in frame_sizes:
        out.append(raw_frame(DATA, 0, stream_id, body[pos : pos + size]))
        pos += size
        if pos >= len(body):
            break
    while pos < len(body):
        out.append(raw_frame(DATA, 0, stream_id, body[pos : pos + 16_384]))
        pos += 16_384
    out.append(
        raw_frame(
            HEADERS, END_HEADERS | END_STREAM, stream_id, encoder.encode([(b"grpc-status", b"0")])
        )
    )
    return b"".join(out)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    size=st.sampled_from([0, 1, 16_379, 16_384, 65_536, 300_000, 1 << 20]),
    frame_sizes=st.lists(st.sampled_from([0, 1, 8, 9, 16_384, 100_000, 1 << 20]), max_size=6),
    cuts=st.lists(st.integers(0, 2_000_000), max_size=40),
)
def test_a_big_response_arrives_whole_however_the_reads_split_it(
    size: int, frame_sizes: list[int], cuts: list[int]
) -> None:
    message = random.Random(size).randbytes(size)
    conn = CodecGrpcConnection(authority="localhost", max_receive_message_bytes=2 << 20)
    conn.initiate()
    conn.receive_data(settings_frame(initial_window=1 << 20))
    stream_id = conn.start_call("Reserve", b"")
    wire = _response(stream_id, message, frame_sizes)
    bounds = sorted({c % (len(wire) + 1) for c in cuts} | {0, len(wire)})
    events: list[object] = []
    for a, b in itertools.pairwise(bounds):
        events += conn.receive_data(wire[a:b])
    finished = [e for e in events if isinstance(e, CallFinished)]
    assert len(finished) == 1
    assert finished[0].code is StatusCode.OK
    assert finished[0].body == message
    assert conn.broken is None
