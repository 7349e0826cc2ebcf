"""The stateless request-header encoder decodes to exactly what was given, block after block."""

from __future__ import annotations

import pytest
from hpack import Decoder, NeverIndexedHeaderTuple
from hypothesis import given
from hypothesis import strategies as st

from sepp.wire._hpack import StatelessEncoder, encode_integer

# In the smoke selection of the emulated architectures' parts (tests/conftest.py).
pytestmark = pytest.mark.arch_smoke

names = st.one_of(
    st.sampled_from([b":method", b":path", b":authority", b"content-type", b"te", b"user-agent"]),
    st.binary(min_size=1, max_size=40).map(lambda b: b.lower()),
)
fields = st.tuples(names, st.binary(max_size=300), st.booleans())


@given(st.lists(st.lists(fields, max_size=12), min_size=1, max_size=6))
def test_blocks_decode_to_the_same_headers_with_sensitivity_kept(
    blocks: list[list[tuple[bytes, bytes, bool]]],
) -> None:
    encoder, decoder = StatelessEncoder(), Decoder()
    for block in blocks:
        headers = [NeverIndexedHeaderTuple(n, v) if s else (n, v) for n, v, s in block]
        decoded = decoder.decode(encoder.encode(headers), raw=True)
        assert [(bytes(n), bytes(v)) for n, v in decoded] == [(n, v) for n, v, _ in block]
        for (_, _, sensitive), out in zip(block, decoded, strict=True):
            if sensitive:
                assert isinstance(out, NeverIndexedHeaderTuple)
        assert len(decoder.header_table.dynamic_entries) == 0  # nothing was ever inserted


def test_constant_headers_use_static_indices_and_are_cached() -> None:
    encoder = StatelessEncoder()
    first = encoder.encode([(b":method", b"POST"), (b"te", b"trailers")])
    assert first == b"\x20\x83" + bytes([0x00, 2]) + b"te" + bytes([8]) + b"trailers"
    second = encoder.encode([(b":method", b"POST"), (b"te", b"trailers")])
    assert second == first[1:]  # the table-size update goes only in the first block


def test_integer_encoding_matches_rfc_examples() -> None:
    assert encode_integer(10, 5) == bytes([10])
    assert encode_integer(1337, 5) == bytes([31, 154, 10])
    assert encode_integer(42, 8) == bytes([42])
