"""The gRPC length-prefixed message decoder: reassembly, limits and hostile input."""

from __future__ import annotations

import gzip
import itertools
import struct
import zlib

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sepp.wire._failure import FailureKind
from sepp.wire._framing import PREFIX_BYTES, FramingError, MessageDecoder, encode_message

# In the smoke selection of the emulated architectures' parts (tests/conftest.py).
pytestmark = pytest.mark.arch_smoke


def prefix(length: int, flag: int = 0) -> bytes:
    return struct.pack(">BI", flag, length)


def decode_all(
    chunks: list[bytes], max_bytes: int | None = None, encoding: bytes | None = None
) -> MessageDecoder:
    decoder = MessageDecoder(max_bytes)
    if encoding is not None:  # what the response headers said (ResponseState does this)
        decoder = decoder.with_encoding(encoding)
    for chunk in chunks:
        decoder.feed(chunk)
    return decoder


def test_encode_message_prefixes_flag_and_big_endian_length() -> None:
    assert encode_message(b"") == b"\x00\x00\x00\x00\x00"
    assert encode_message(b"abc") == b"\x00\x00\x00\x00\x03abc"
    assert encode_message(b"x" * 0x01020304)[:PREFIX_BYTES] == b"\x00\x01\x02\x03\x04"


def test_whole_message_in_one_chunk() -> None:
    decoder = decode_all([encode_message(b"hello")])
    assert decoder.message == b"hello"
    assert not decoder.incomplete


def test_empty_message() -> None:
    decoder = decode_all([encode_message(b"")])
    assert decoder.message == b""


def test_nothing_fed_is_neither_complete_nor_incomplete() -> None:
    decoder = MessageDecoder(None)
    assert decoder.message is None
    assert not decoder.incomplete
    decoder.feed(b"")
    assert decoder.message is None
    assert not decoder.incomplete


def test_message_one_byte_at_a_time() -> None:
    framed = encode_message(b"split across many frames")
    decoder = MessageDecoder(None)
    for i in range(len(framed) - 1):
        decoder.feed(framed[i : i + 1])
        assert decoder.message is None
        assert decoder.incomplete
    decoder.feed(framed[-1:])
    assert decoder.message == b"split across many frames"


def test_partial_prefix_and_partial_body_are_incomplete() -> None:
    assert decode_all([b"\x00\x00"]).incomplete
    assert decode_all([prefix(10), b"abc"]).incomplete


def test_a_second_message_is_malformed() -> None:
    decoder = decode_all([encode_message(b"one")])
    with pytest.raises(FramingError) as info:
        decoder.feed(encode_message(b"two"))
    assert info.value.kind is FailureKind.MALFORMED


def test_two_messages_in_one_chunk_are_malformed() -> None:
    with pytest.raises(FramingError) as info:
        decode_all([encode_message(b"one") + encode_message(b"two")])
    assert info.value.kind is FailureKind.MALFORMED


def test_more_data_than_the_prefix_declared_is_malformed() -> None:
    with pytest.raises(FramingError) as info:
        decode_all([prefix(3) + b"abcd"])
    assert info.value.kind is FailureKind.MALFORMED
    with pytest.raises(FramingError):
        decode_all([prefix(3), b"ab", b"cd"])


def test_empty_chunk_after_the_message_is_fine() -> None:
    decoder = decode_all([encode_message(b"ok"), b""])
    assert decoder.message == b"ok"


def gzipped(body: bytes) -> bytes:
    """`body` compressed as a gRPC server compresses it, framed with the flag set."""
    packed = gzip.compress(body)
    return prefix(len(packed), flag=1) + packed


@pytest.mark.parametrize("encoding", [None, b"identity"])
def test_compressed_flag_without_an_encoding_is_a_typed_error(encoding: bytes | None) -> None:
    with pytest.raises(FramingError) as info:
        decode_all([gzipped(b"abc")], encoding=encoding)
    assert info.value.kind is FailureKind.COMPRESSED
    assert "without a grpc-encoding" in str(info.value)


@pytest.mark.parametrize("encoding", [b"snappy", b"deflate", b"GZIP"])
def test_compressed_in_an_encoding_we_never_accepted_names_it(encoding: bytes) -> None:
    with pytest.raises(FramingError) as info:
        decode_all([prefix(3, flag=1) + b"abc"], encoding=encoding)
    assert info.value.kind is FailureKind.COMPRESSED
    assert repr(encoding.decode()) in str(info.value) and "gzip" in str(info.value)


def test_a_gzip_message_is_decompressed() -> None:
    body = b"a response that a server compressed " * 10
    assert decode_all([gzipped(body)], encoding=b"gzip").message == body
    assert decode_all([gzipped(b"")], encoding=b"gzip").message == b""


def test_an_uncompressed_message_under_a_gzip_encoding_is_read_as_it_is() -> None:
    # grpc-encoding names what compressed messages use; each message's flag says if it is.
    assert decode_all([encode_message(b"plain")], encoding=b"gzip").message == b"plain"


def test_the_cap_applies_to_what_a_message_decompresses_to() -> None:
    body = b"x" * 1000
    framed = gzipped(body)
    assert len(framed) < 100  # far below the cap: only decompressing tells
    assert decode_all([framed], max_bytes=1000, encoding=b"gzip").message == body
    with pytest.raises(FramingError) as info:
        decode_all([framed], max_bytes=999, encoding=b"gzip")
    assert info.value.kind is FailureKind.TOO_LARGE
    assert "999-byte receive limit" in str(info.value)


@pytest.mark.needs("tracemalloc")
def test_a_decompression_bomb_costs_the_cap_not_what_it_expands_to() -> None:
    import tracemalloc

    # 256 MiB of zeros in a quarter MiB of gzip: decompressed, it would take all of that.
    deflater = zlib.compressobj(1, zlib.DEFLATED, 31)
    chunk = bytes(1 << 20)
    packed = b"".join(deflater.compress(chunk) for _ in range(256)) + deflater.flush()
    cap = 4 << 20
    tracemalloc.start()
    try:
        with pytest.raises(FramingError) as info:
            decode_all([prefix(len(packed), flag=1) + packed], max_bytes=cap, encoding=b"gzip")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.kind is FailureKind.TOO_LARGE
    assert str(cap) in str(info.value)
    assert peak < 4 * cap  # the input's copies and the cap's worth of output, no more


def test_a_compressed_message_over_the_cap_is_refused_before_its_body() -> None:
    decoder = MessageDecoder(100).with_encoding(b"gzip")
    with pytest.raises(FramingError) as info:
        decoder.feed(prefix(101, flag=1))
    assert info.value.kind is FailureKind.TOO_LARGE


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda packed: b"not gzip at all", "does not decompress"),
        (lambda packed: packed[:-9], "truncated"),
        (lambda packed: packed + b"junk", "after the gzip stream"),
        (lambda packed: packed[:-4] + b"\x00\x00\x00\x00", "does not decompress"),  # length
    ],
    ids=["garbage", "truncated", "trailing", "bad-trailer"],
)
def test_a_broken_gzip_message_is_malformed(damage: object, words: str) -> None:
    packed = damage(gzip.compress(b"hello " * 50))  # type: ignore[operator]
    with pytest.raises(FramingError) as info:
        decode_all([prefix(len(packed), flag=1) + packed], encoding=b"gzip")
    assert info.value.kind is FailureKind.MALFORMED
    assert words in str(info.value)


@pytest.mark.parametrize("flag", [2, 0x80, 0xFF])
def test_unknown_flag_is_malformed(flag: int) -> None:
    with pytest.raises(FramingError) as info:
        decode_all([prefix(3, flag=flag) + b"abc"])
    assert info.value.kind is FailureKind.MALFORMED


def test_huge_length_prefix_is_refused_before_the_body_arrives() -> None:
    decoder = MessageDecoder(4 * 1024 * 1024)
    with pytest.raises(FramingError) as info:
        decoder.feed(prefix(0xFFFFFFFF))  # only the prefix: nothing of the body yet
    assert info.value.kind is FailureKind.TOO_LARGE
    assert str(4 * 1024 * 1024) in str(info.value)


def test_limit_is_inclusive() -> None:
    assert decode_all([encode_message(b"x" * 8)], max_bytes=8).message == b"x" * 8
    with pytest.raises(FramingError) as info:
        decode_all([prefix(9)], max_bytes=8)
    assert info.value.kind is FailureKind.TOO_LARGE


def test_no_limit_accepts_a_large_declared_length() -> None:
    decoder = decode_all([prefix(0xFFFFFFFF)], max_bytes=None)
    assert decoder.incomplete


def test_prefix_split_across_chunks_is_checked_once_complete() -> None:
    decoder = MessageDecoder(100)
    raw = prefix(1000)
    for i in range(PREFIX_BYTES - 1):
        decoder.feed(raw[i : i + 1])
    with pytest.raises(FramingError):
        decoder.feed(raw[-1:])


# -- properties --------------------------------------------------------------------------------


@st.composite
def chunked(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """`data` cut at arbitrary points (empty chunks included)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=20)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


@given(st.data(), st.binary(max_size=300))
def test_reassembly_under_any_chunking(data: st.DataObject, body: bytes) -> None:
    chunks = data.draw(chunked(encode_message(body)))
    decoder = decode_all(chunks, max_bytes=len(body))
    assert decoder.message == body
    assert not decoder.incomplete


@given(st.data(), st.binary(max_size=300))
def test_gzip_reassembly_under_any_chunking(data: st.DataObject, body: bytes) -> None:
    framed = gzipped(body)
    # The cap holds both what arrives and what it decompresses to.
    cap = max(len(body), len(framed) - PREFIX_BYTES)
    decoder = decode_all(data.draw(chunked(framed)), max_bytes=cap, encoding=b"gzip")
    assert decoder.message == body
    assert not decoder.incomplete


@given(st.data(), st.binary(max_size=100), st.binary(min_size=1, max_size=20))
def test_trailing_garbage_under_any_chunking_is_malformed(
    data: st.DataObject, body: bytes, extra: bytes
) -> None:
    chunks = data.draw(chunked(encode_message(body) + extra))
    with pytest.raises(FramingError) as info:
        decode_all(chunks)
    assert info.value.kind is FailureKind.MALFORMED


@given(
    st.lists(st.binary(max_size=40), max_size=10),
    st.one_of(st.none(), st.integers(0, 64)),
    st.sampled_from([None, b"gzip", b"snappy"]),
)
@example([b"\x00\x00\x00\x00\x00", b"\x00"], None, None)
@example([b"\x01\xff\xff\xff\xff"], 10, None)
@example([b"\x01\x00\x00\x00\x14", gzip.compress(b"x" * 65)], 64, b"gzip")
def test_arbitrary_bytes_only_raise_framing_error(
    chunks: list[bytes], max_bytes: int | None, encoding: bytes | None
) -> None:
    decoder = MessageDecoder(max_bytes)
    if encoding is not None:
        decoder = decoder.with_encoding(encoding)
    try:
        for chunk in chunks:
            decoder.feed(chunk)
    except FramingError as exc:
        assert exc.kind in {FailureKind.MALFORMED, FailureKind.COMPRESSED, FailureKind.TOO_LARGE}
        return
    if decoder.message is not None:
        assert max_bytes is None or len(decoder.message) <= max_bytes
        assert not decoder.incomplete
