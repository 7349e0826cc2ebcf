"""Differential fuzzing: the codec and the h2 reference engine fed the same server bytes.

Hypothesis writes what a server could send after three calls were started: its SETTINGS, then
valid responses (split over frames, padded, with CONTINUATION), resets, GOAWAYs, PINGs,
SETTINGS, WINDOW_UPDATEs, PRIORITY, unknown frames, and mutated frames (wrong lengths, bad
flags, a header block interrupted by another frame, oversized frames, frames on stream 0 or on
streams never opened, garbage). Both engines get the same bytes, split at different points, and
must agree on every call's outcome (status code and body, or still pending) and on whether the
connection died.

The h2 engine loses the results of calls completed earlier in a read when h2 raises later in
the same read (h2 returns no events for that read), so it is fed one frame at a time; the codec
gets arbitrary splits. Where the engines disagree by design, or h2 is wrong, the generator
steers clear and a test below pins both behaviours down (if h2 changes, they fail):

- a frame longer than our MAX_FRAME_SIZE: the codec refuses it at its 9-byte header, h2 only
  once the whole frame (up to 16 MiB) has arrived;
- ALTSVC (type 10): the codec ignores it like any extension frame; h2 parses it and ends the
  connection over a malformed one;
- HEADERS opening an even-numbered (server-initiated) stream: h2 takes it as a new inbound
  stream; the codec refuses it (a server opens streams only by PUSH_PROMISE, which we disable);
- frames for a call above a GOAWAY's last stream id: the codec ignores them (the server said it
  never processed the call); h2 still tracks the stream and ends the connection when it closes
  twice;
- padding that leaves a HEADERS frame no header block: valid per RFC 9113 §6.2, which forbids
  only padding as long as the whole payload; hyperframe does not count the pad length byte,
  refuses it, and h2 ends the connection;
- an informational (1xx) header block on a stream already reset: h2's state machine raises a
  connection error where it ignores any other late frame; the codec ignores it;
- a SETTINGS frame naming one setting twice: the codec checks each value in order (RFC 9113
  §6.5.3), hyperframe keeps only the last one, so h2 misses an invalid earlier value;
- frames on a stream the server already ended: the codec ignores them, like frames on any
  closed stream, so that it needs no memory of how each stream closed (a late frame can then
  never end the connection); h2 answers DATA with RST_STREAM (a stream error) and ends the
  connection over HEADERS;
- a content-length that is not a number: the codec fails that call, as RFC 9113 §8.1.1 makes a
  malformed response a stream error; h2 ends the connection;
- a PUSH_PROMISE (we disable push) whose header block goes on in CONTINUATION frames: the codec
  refuses it at once, h2 only once the block is complete (`settled` completes the last frames
  and ends the bytes with a PING, so that h2 gets there too);
- a server's SETTINGS with ENABLE_PUSH=1: the codec ends the connection (RFC 9113 §6.5.2), as h2
  does from 4.4 on; h2 4.1 to 4.3 (our floor is 4.1) accepts it.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass, field
from importlib.metadata import version

import hpack
import pytest
from fixtures.fuzz import examples
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from sepp.wire import CallFinished, connection_class
from sepp.wire._constants import DEFAULT_MAX_FRAME_SIZE
from sepp.wire._engine import GrpcConnection
from sepp.wire._framing import encode_message
from sepp.wire._status import StatusCode

# In the smoke selection of the emulated architectures' parts (tests/conftest.py).
pytestmark = pytest.mark.arch_smoke

_FRAME = struct.Struct(">HBBBL")
CALLS = (1, 3, 5)
MAX_RECEIVE = 64


def raw_frame(
    frame_type: int, flags: int, stream_id: int, payload: bytes, length: int | None = None
) -> bytes:
    n = len(payload) if length is None else length
    return _FRAME.pack(n >> 8, n & 0xFF, frame_type, flags, stream_id) + payload


@dataclass
class Script:
    """Server bytes built in order; the HPACK encoder's table follows what was emitted."""

    encoder: hpack.Encoder = field(default_factory=hpack.Encoder)
    parts: list[bytes] = field(default_factory=list)
    # Calls above a GOAWAY's last stream id get no more responses: see
    # test_responses_after_goaway_doomed_the_stream.
    doomed: set[int] = field(default_factory=set)
    # Streams that got any frame: an informational (1xx) block goes only to a fresh one (see
    # test_informational_headers_on_a_reset_stream).
    touched: set[int] = field(default_factory=set)
    # Streams the server ended: no more frames go to them (see test_frames_after_the_stream_ended).
    ended: set[int] = field(default_factory=set)

    def add(self, data: bytes) -> None:
        self.parts.append(data)

    def block(self, headers: list[tuple[bytes, bytes]]) -> bytes:
        return bytes(self.encoder.encode(headers))

    def data(self) -> bytes:
        return b"".join(self.parts)


_STREAMS = st.sampled_from([*CALLS, *CALLS, *CALLS, 0, 2, 7, 9, 2**31 - 1])
# HEADERS never go to an even (server-initiated) stream: see test_headers_opening_a_server_stream.
_HEADER_STREAMS = st.sampled_from([*CALLS, *CALLS, *CALLS, 0, 7, 9, 2**31 - 1])
_RESPONSE_HEADERS = st.sampled_from(
    [
        [(b":status", b"200"), (b"content-type", b"application/grpc")],
        [(b":status", b"200"), (b"content-type", b"application/grpc")],
        [(b":status", b"200"), (b"content-type", b"application/grpc+proto")],
        [(b":status", b"200")],
        [(b":status", b"503"), (b"content-type", b"text/html")],
        [(b"content-type", b"application/grpc")],
        [(b":status", b"200"), (b"content-type", b"text/plain")],
    ]
)
_TRAILERS = st.sampled_from(
    [
        [(b"grpc-status", b"0")],
        [(b"grpc-status", b"0")],
        [(b"grpc-status", b"5"), (b"grpc-message", b"no%20job")],
        [(b"grpc-status", b"14")],
        [(b"grpc-status", b"x")],
        [],
    ]
)
_OK_TRAILERS = [(b"grpc-status", b"0")]


def _split(draw: st.DrawFn, data: bytes, max_parts: int) -> list[bytes]:
    if not data:
        return [b""]
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(data) - 1)), max_size=max_parts)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


def _header_frames(
    draw: st.DrawFn, script: Script, sid: int, block: bytes, end_stream: bool, hostile: bool
) -> None:
    """HEADERS (maybe padded, maybe with PRIORITY) plus CONTINUATIONs for one block."""
    pieces = _split(draw, block, 2) if draw(st.booleans()) else [block]
    flags = 0x1 if end_stream else 0
    prefix = b""
    suffix = b""
    # Padding around no block is refused by hyperframe: see test_padding_that_fills_the_frame.
    if pieces[0] and draw(st.integers(0, 4)) == 0:
        pad = draw(st.integers(0, 4))
        flags |= 0x8
        prefix = bytes([pad])
        suffix = b"\0" * pad
    if draw(st.integers(0, 4)) == 0:
        flags |= 0x20
        depends_on = draw(st.sampled_from([0, 1, 3, sid])) if hostile else 0
        prefix += struct.pack(">LB", depends_on, 16)
    if len(pieces) == 1:
        script.add(raw_frame(0x1, flags | 0x4, sid, prefix + pieces[0] + suffix))
        return
    script.add(raw_frame(0x1, flags, sid, prefix + pieces[0] + suffix))
    for index, piece in enumerate(pieces[1:], start=1):
        if hostile and draw(st.integers(0, 9)) == 0:  # another frame inside the block
            script.add(raw_frame(0x6, 0, 0, b"12345678"))
        last = index == len(pieces) - 1
        script.add(raw_frame(0x9, 0x4 if last else 0, sid, piece))


def _data_frames(draw: st.DrawFn, script: Script, sid: int, body: bytes) -> None:
    for piece in _split(draw, body, 3):
        if piece and draw(st.integers(0, 5)) == 0:
            pad = draw(st.integers(0, 3))
            script.add(raw_frame(0x0, 0x8, sid, bytes([pad]) + piece + b"\0" * pad))
        else:
            script.add(raw_frame(0x0, 0, sid, piece))


_OK_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]


@st.composite
def response(draw: st.DrawFn, script: Script, hostile: bool) -> None:
    """A whole response for one stream: in a hostile script, often an odd one."""
    if hostile:
        sid = draw(_HEADER_STREAMS.filter(lambda s: s not in script.doomed | script.ended))
    else:
        fresh = [c for c in CALLS if c not in script.touched]
        if not fresh:
            return
        sid = draw(st.sampled_from(fresh))
    if sid not in script.touched and draw(st.integers(0, 5)) == 0:
        _header_frames(draw, script, sid, script.block([(b":status", b"100")]), False, hostile)
    script.touched.add(sid)
    headers = draw(_RESPONSE_HEADERS) if hostile else _OK_HEADERS
    trailers = draw(_TRAILERS) if hostile or draw(st.integers(0, 3)) == 0 else _OK_TRAILERS
    if draw(st.integers(0, 5)) == 0:  # trailers-only
        _header_frames(draw, script, sid, script.block(headers + trailers), True, hostile)
        script.ended.add(sid)
        return
    _header_frames(draw, script, sid, script.block(headers), False, hostile)
    message = draw(st.binary(max_size=MAX_RECEIVE + 8 if hostile else MAX_RECEIVE))
    body = encode_message(message)
    if hostile:
        body = draw(
            st.sampled_from(
                [
                    body,
                    body + b"\x00",  # more than the prefix declares
                    body[:-1],  # truncated
                    b"\x01" + body[1:],  # compressed flag
                    b"",
                ]
            )
        )
    if body:
        _data_frames(draw, script, sid, body)
    _header_frames(draw, script, sid, script.block(trailers), True, hostile)
    script.ended.add(sid)


@st.composite
def benign(draw: st.DrawFn, script: Script) -> None:
    """A control frame a well-behaved server may send between responses."""
    kind = draw(st.integers(0, 5))
    if kind == 0:
        script.add(raw_frame(0x6, draw(st.sampled_from([0, 1])), 0, b"pingpong"))
    elif kind == 1:
        code, value = draw(
            st.sampled_from([(1, 0), (1, 4096), (3, 100), (4, 65_535), (4, 2**20), (5, 2**14)])
        )
        script.add(raw_frame(0x4, 0, 0, struct.pack(">HL", code, value)))
    elif kind == 2:
        sid = draw(st.sampled_from([0, *CALLS]))
        script.add(raw_frame(0x8, 0, sid, struct.pack(">L", draw(st.integers(1, 2**20)))))
    elif kind == 3:
        script.add(raw_frame(draw(st.integers(11, 255)), 0, draw(st.sampled_from(CALLS)), b"?"))
    elif kind == 4:
        script.add(raw_frame(0x2, 0, draw(st.sampled_from(CALLS)), struct.pack(">LB", 0, 7)))
    else:  # a reset: the call fails with the mapped status
        sid = draw(st.sampled_from([c for c in CALLS if c not in script.touched] or [1]))
        script.touched.add(sid)
        code = draw(st.sampled_from([0, 2, 7, 8, 11]))
        script.add(raw_frame(0x3, 0, sid, struct.pack(">L", code)))


def _names_no_content_length(block: bytes) -> bool:
    try:
        headers = hpack.Decoder().decode(block, raw=True)
    except Exception:  # not HPACK: what this kind is for
        return True
    return all(name != b"content-length" for name, _ in headers)


@st.composite
def control(draw: st.DrawFn, script: Script) -> None:
    """One control or odd frame."""
    kind = draw(st.integers(0, 13))
    sid = draw(_STREAMS.filter(lambda s: s not in script.ended | script.doomed))
    script.touched.add(sid)
    if kind == 0:
        script.add(raw_frame(0x3, 0, sid, struct.pack(">L", draw(st.integers(0, 15)))))
    elif kind == 1:
        last = draw(st.sampled_from([0, 1, 3, 5, 2**31 - 1]))
        script.doomed.update(c for c in CALLS if c > last)
        payload = struct.pack(">LL", last, draw(st.integers(0, 13))) + draw(st.binary(max_size=4))
        script.add(raw_frame(0x7, 0, 0, payload))
    elif kind == 2:
        script.add(
            raw_frame(
                0x6, draw(st.sampled_from([0, 1])), 0, draw(st.binary(min_size=8, max_size=8))
            )
        )
    elif kind == 3:
        # Each identifier once: see test_repeated_setting_identifiers.
        values = draw(
            st.dictionaries(
                st.sampled_from([1, 2, 3, 4, 5, 6, 8, 0x99]),
                st.sampled_from([0, 1, 2, 100, 16_384, 65_535, 2**24, 2**31 - 1, 2**31]),
                max_size=3,
            )
        )
        payload = b"".join(struct.pack(">HL", k, v) for k, v in values.items())
        script.add(raw_frame(0x4, 0, 0, payload))
    elif kind == 4:
        script.add(raw_frame(0x4, 0x1, 0, b""))  # SETTINGS ACK
    elif kind == 5:
        increment = draw(st.sampled_from([0, 1, 1000, 2**31 - 1]))
        script.add(raw_frame(0x8, 0, draw(st.sampled_from([0, sid])), struct.pack(">L", increment)))
    elif kind == 6:
        script.add(raw_frame(0x2, 0, sid, struct.pack(">LB", draw(st.sampled_from([0, 1])), 5)))
    elif kind == 7:
        # Unknown types are ignored (10, ALTSVC, is h2's: see test_altsvc_frames_are_ignored).
        script.add(raw_frame(draw(st.integers(11, 255)), draw(st.integers(0, 255)), sid, b"xyz"))
    elif kind == 8:
        script.add(raw_frame(0x5, 0x4, sid, struct.pack(">L", 2) + script.block([])))
    elif kind == 9:  # a frame whose declared length disagrees with what follows
        script.add(raw_frame(draw(st.integers(0, 9)), 0, sid, b"abcd", draw(st.integers(0, 12))))
    elif kind == 10:  # any frame type, any flags, arbitrary payload
        frame_type = draw(st.sampled_from([0, 2, 3, 4, 5, 6, 7, 8, 9]))
        flags = draw(st.integers(0, 255))
        script.add(raw_frame(frame_type, flags, sid, draw(st.binary(min_size=0, max_size=12))))
        if frame_type == 0x0 and flags & 0x1:  # DATA with END_STREAM may end the stream
            script.ended.add(sid)
    elif kind == 11:  # longer than our MAX_FRAME_SIZE (only the header is sent)
        script.add(raw_frame(0x0, 0, sid, b"", draw(st.sampled_from([2**20 + 1, 2**24 - 1]))))
    elif kind == 12:
        script.add(draw(st.binary(min_size=1, max_size=16)))
    else:  # a header block that is not HPACK
        # A content-length in it: see test_a_content_length_that_is_not_a_number.
        block = draw(st.binary(min_size=1, max_size=8).filter(_names_no_content_length))
        stream = draw(_HEADER_STREAMS.filter(lambda s: s not in script.ended))
        script.add(raw_frame(0x1, 0x5, stream, block))
        script.ended.add(stream)  # END_STREAM: a block that decodes ends the stream


@st.composite
def server_bytes(draw: st.DrawFn) -> bytes:
    script = Script()
    if draw(st.integers(0, 40)):
        settings = draw(
            st.sampled_from([b"", struct.pack(">HL", 3, 100), struct.pack(">HL", 4, 1)])
        )
        script.add(raw_frame(0x4, 0, 0, settings))
    else:
        script.add(draw(st.binary(min_size=9, max_size=24)))  # not an HTTP/2 server
    # Half the scripts come from a well-behaved server (the calls must come out right), half
    # from a hostile one.
    hostile = draw(st.booleans())
    for _ in range(draw(st.integers(1, 8))):
        if draw(st.integers(0, 2)):
            draw(response(script, hostile))
        elif hostile:
            draw(control(script))
        else:
            draw(benign(script))
    data = settled(script.data())
    # Garbage and wrong lengths shift what follows into frames of any shape: not into those
    # where the engines part by design (context-free ones; the script keeps track of the rest).
    assume(not any(map(_apart_by_design, frame_pieces(data))))
    return data


def _apart_by_design(frame: bytes) -> bool:
    """ALTSVC (test_altsvc_frames_are_ignored), HEADERS on an even stream
    (test_headers_opening_a_server_stream), or before h2 4.4 a server's ENABLE_PUSH=1
    (test_a_server_that_enables_push)."""
    if len(frame) < 9:
        return False
    sid = int.from_bytes(frame[5:9], "big") & 0x7FFF_FFFF
    if frame[3] == 0x4 and not frame[4] & 0x1 and not _H2_REFUSES_SERVER_PUSH:
        payload = frame[9:]
        pairs = (payload[i : i + 6] for i in range(0, len(payload) - 5, 6))
        if any(struct.unpack(">HL", pair) == (2, 1) for pair in pairs):
            return True
    return frame[3] == 0xA or (frame[3] == 0x1 and sid > 0 and sid % 2 == 0)


# RFC 9113 §6.5.2: a client refuses ENABLE_PUSH=1 from a server; h2 checks it from 4.4 on.
_H2_REFUSES_SERVER_PUSH = tuple(map(int, version("h2").split(".")[:2])) >= (4, 4)


def settled(data: bytes) -> bytes:
    """`data`, with its last frame completed if it is cut short, and a PING after it.

    Mutated lengths leave a frame half-sent at the end; and h2 holds back a PUSH_PROMISE
    until its header block ends, where the codec refuses it at once. What the last frames
    left open is settled by completing them, so both engines reach their verdicts.
    """
    pos = 0
    while len(data) > pos:
        if len(data) - pos < 9:  # a partial header: completed too, then its frame
            data += bytes(pos + 9 - len(data))
        length = (data[pos] << 16) | (data[pos + 1] << 8) | data[pos + 2]
        if pos + 9 + length > len(data) and length <= DEFAULT_MAX_FRAME_SIZE:
            data += bytes(pos + 9 + length - len(data))
        pos += 9 + length
    if pos > len(data):  # an oversized frame: the codec refuses its header, h2 its whole
        return data
    return data + raw_frame(0x6, 0, 0, b"the end.")


def frame_pieces(data: bytes) -> list[bytes]:
    """`data` split after every frame its headers declare (a last partial frame included).

    h2 checks a frame's length against our MAX_FRAME_SIZE only once the whole frame has
    arrived (the codec refuses it at its header), so a last, oversized, partial frame is
    completed here with filler for h2 to reach that verdict too.
    """
    out, pos = [], 0
    while pos < len(data):
        if len(data) - pos < 9:
            out.append(data[pos:])
            break
        length = (data[pos] << 16) | (data[pos + 1] << 8) | data[pos + 2]
        piece = data[pos : pos + 9 + length]
        if length > DEFAULT_MAX_FRAME_SIZE and len(piece) < 9 + length:
            piece += bytes(9 + length - len(piece))
        out.append(piece)
        pos += 9 + length
    return out


Outcome = tuple[StatusCode, bytes | None] | None


def run(engine: str, pieces: list[bytes]) -> tuple[dict[int, Outcome], bool]:
    conn: GrpcConnection = connection_class(engine)(  # type: ignore[arg-type]
        authority="test:1", user_agent="diff", max_receive_message_bytes=MAX_RECEIVE
    )
    conn.initiate()
    # The driver would wait for the server's SETTINGS before a second call; the engines
    # themselves do not need to.
    assert [conn.start_call("Ack", b"request") for _ in CALLS] == list(CALLS)
    conn.data_to_send()
    outcomes: dict[int, Outcome] = dict.fromkeys(CALLS)
    for piece in pieces:
        for ev in conn.receive_data(piece):
            if isinstance(ev, CallFinished):
                assert outcomes[ev.stream_id] is None, f"stream {ev.stream_id} finished twice"
                outcomes[ev.stream_id] = (ev.code, ev.body)
        conn.data_to_send()
    return outcomes, conn.broken is not None


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(server_bytes(), st.data())
def test_both_engines_agree_on_every_outcome(data: bytes, draw: st.DataObject) -> None:
    codec_pieces = _split(draw.draw, data, 6)
    codec, codec_dead = run("codec", codec_pieces)
    reference, reference_dead = run("h2", frame_pieces(data))
    event(f"connection died: {codec_dead}")
    event(f"calls answered OK: {sum(1 for o in codec.values() if o and o[0] is StatusCode.OK)}")
    assert (codec_dead, codec) == (reference_dead, reference)


# -- the known differences, pinned down -------------------------------------------------------


def _fresh(engine: str) -> GrpcConnection:
    conn: GrpcConnection = connection_class(engine)(  # type: ignore[arg-type]
        authority="test:1", user_agent="diff", max_receive_message_bytes=MAX_RECEIVE
    )
    conn.initiate()
    for _ in CALLS:
        conn.start_call("Ack", b"request")
    conn.receive_data(raw_frame(0x4, 0, 0, b""))
    return conn


def _both(
    *frames: bytes,
) -> tuple[tuple[dict[int, Outcome], bool], tuple[dict[int, Outcome], bool]]:
    data = raw_frame(0x4, 0, 0, b"") + b"".join(frames)
    return run("codec", [data]), run("h2", _pieces(data))


def _pieces(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        length = (data[pos] << 16) | (data[pos + 1] << 8) | data[pos + 2]
        out.append(data[pos : pos + 9 + length])
        pos += 9 + length
    return out


def _ok_response(script: Script, sid: int, message: bytes = b"ok") -> None:
    script.add(raw_frame(0x1, 0x4, sid, script.block(_OK_HEADERS)))
    script.add(raw_frame(0x0, 0, sid, encode_message(message)))
    script.add(raw_frame(0x1, 0x5, sid, script.block(_OK_TRAILERS)))


def test_oversized_frame_refused_at_its_header() -> None:
    header_only = raw_frame(0x0, 0, 1, b"", DEFAULT_MAX_FRAME_SIZE + 1)
    codec, h2 = _fresh("codec"), _fresh("h2")
    codec.receive_data(header_only)
    h2.receive_data(header_only)
    assert codec.broken is not None and "MAX_FRAME_SIZE" in codec.broken
    assert h2.broken is None  # still waiting for the rest of the frame
    h2.receive_data(bytes(DEFAULT_MAX_FRAME_SIZE + 1))
    assert h2.broken is not None


def test_altsvc_frames_are_ignored() -> None:
    (codec, codec_dead), (_h2, h2_dead) = _both(raw_frame(0xA, 0, 1, b"x"))
    assert (codec_dead, h2_dead) == (False, True)
    assert codec == dict.fromkeys(CALLS)


def test_headers_opening_a_server_stream() -> None:
    script = Script()
    script.add(raw_frame(0x1, 0x5, 2, script.block(_OK_HEADERS)))
    (_, codec_dead), (_, h2_dead) = _both(script.data())
    assert (codec_dead, h2_dead) == (True, False)


def test_responses_after_goaway_doomed_the_stream() -> None:
    script = Script()
    script.add(raw_frame(0x7, 0, 0, struct.pack(">LL", 1, 0)))
    _ok_response(script, 3)
    _ok_response(script, 3)  # the stream ends twice
    _ok_response(script, 1, b"survivor")
    (codec, codec_dead), (h2, h2_dead) = _both(script.data())
    assert not codec_dead
    assert codec == {1: (StatusCode.OK, b"survivor"), 3: DOOMED, 5: DOOMED}
    assert h2_dead
    assert h2 == {1: LOST, 3: DOOMED, 5: DOOMED}


def test_padding_that_fills_the_frame() -> None:
    script = Script()
    script.add(raw_frame(0x1, 0x4, 1, script.block(_OK_HEADERS)))
    script.add(raw_frame(0x0, 0, 1, encode_message(b"ok")))
    # Trailers as an empty header block with one byte of padding: a 2-byte payload.
    script.add(raw_frame(0x1, 0xD, 1, b"\x01\0"))
    (codec, codec_dead), (h2, h2_dead) = _both(script.data())
    assert (codec_dead, codec[1]) == (False, (StatusCode.UNKNOWN, None))  # no grpc-status
    assert (h2_dead, h2[1]) == (True, LOST)


def test_informational_headers_on_a_reset_stream() -> None:
    script = Script()
    script.add(raw_frame(0x3, 0, 1, struct.pack(">L", 8)))  # the server cancels call 1
    script.add(raw_frame(0x1, 0x4, 1, script.block([(b":status", b"100")])))
    (codec, codec_dead), (h2, h2_dead) = _both(script.data())
    assert codec_dead is False and h2_dead is True
    assert codec[1] == h2[1] == (StatusCode.CANCELLED, None)


def test_repeated_setting_identifiers() -> None:
    settings = struct.pack(">HLHL", 5, 2, 5, 16_384)  # MAX_FRAME_SIZE 2 (invalid), then 16384
    (_, codec_dead), (_, h2_dead) = _both(raw_frame(0x4, 0, 0, settings))
    assert (codec_dead, h2_dead) == (True, False)


def test_frames_after_the_stream_ended() -> None:
    script = Script()
    _ok_response(script, 1)
    script.add(raw_frame(0x0, 0, 1, encode_message(b"late")))
    (codec, codec_dead), (h2, h2_dead) = _both(script.data())
    assert not codec_dead and not h2_dead  # h2: a stream error, RST_STREAM STREAM_CLOSED
    assert codec == h2 == {1: (StatusCode.OK, b"ok"), 3: None, 5: None}
    script.add(raw_frame(0x1, 0x4, 1, script.block(_OK_HEADERS)))
    (codec, codec_dead), (_, h2_dead) = _both(script.data())
    assert (codec_dead, h2_dead) == (False, True)  # h2: a connection error, STREAM_CLOSED
    assert codec == {1: (StatusCode.OK, b"ok"), 3: None, 5: None}


def test_a_content_length_that_is_not_a_number() -> None:
    # The codec fails the call whatever the value; h2 ends the connection unless it parses.
    for value, h2_ends_it in ((b"", True), (b"x", True), (b"1", False)):
        script = Script()
        script.add(raw_frame(0x1, 0x5, 1, script.block([(b"content-length", value)])))
        (codec, codec_dead), (h2, h2_dead) = _both(script.data())
        assert codec_dead is False
        assert codec == {1: (StatusCode.INTERNAL, None), 3: None, 5: None}
        assert h2_dead is h2_ends_it
        assert h2 == (dict.fromkeys(CALLS, LOST) if h2_ends_it else codec)


def test_a_push_promise_is_refused_before_its_header_block_ends() -> None:
    start = raw_frame(0x5, 0, 1, struct.pack(">L", 2))  # no END_HEADERS: a CONTINUATION is due
    codec, h2 = _fresh("codec"), _fresh("h2")
    codec.receive_data(start)
    h2.receive_data(start)
    assert codec.broken is not None and "PUSH_PROMISE" in codec.broken
    assert h2.broken is None
    h2.receive_data(raw_frame(0x9, 0x4, 1, b""))  # the CONTINUATION that ends the block
    assert h2.broken is not None


def test_a_server_that_enables_push() -> None:
    (_, codec_dead), (_, h2_dead) = _both(raw_frame(0x4, 0, 0, struct.pack(">HL", 2, 1)))
    assert codec_dead is True
    assert h2_dead is _H2_REFUSES_SERVER_PUSH


DOOMED = (StatusCode.UNAVAILABLE, None)  # above the GOAWAY's last stream id
LOST = (StatusCode.UNAVAILABLE, None)  # the connection died first
