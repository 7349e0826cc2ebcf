"""HPACK (RFC 7541) for both engines: a stateless encoder for request headers (the codec calls
`encode_field`; h2 gets it plugged in as `StatelessEncoder`) and a decoder with bounds.

Every field is sent as a static-table index or a literal that is *not* added to the dynamic
table, so a field's encoding never depends on what was sent before and can be cached: the
headers that stay the same for every call (method, path, authority, content-type, te,
user-agent) cost a dict lookup each instead of hpack's table search, integer and Huffman
coding. Secret or per-call fields (HeaderTuple with indexable=False: authorization,
grpc-timeout, traceparent) are sent "never indexed" and are not cached. The first block
shrinks our dynamic table to 0, so the peer's SETTINGS_HEADER_TABLE_SIZE never matters.
"""

from __future__ import annotations

from collections.abc import Iterable

from hpack import Decoder, HeaderTuple
from hpack.exceptions import HPACKDecodingError, OversizedHeaderListError
from hpack.table import HeaderTable

from ._constants import MAX_HEADER_BLOCK_BYTES, MAX_TABLE_SIZE_UPDATES

_STATIC_FULL: dict[tuple[bytes, bytes], int] = {}
_STATIC_NAME: dict[bytes, int] = {}
for _index, (_name, _value) in enumerate(HeaderTable.STATIC_TABLE, start=1):
    _STATIC_FULL.setdefault((_name, _value), _index)
    _STATIC_NAME.setdefault(_name, _index)

_TABLE_SIZE_ZERO = b"\x20"  # dynamic table size update to 0 (§6.3)
_WITHOUT_INDEXING = 0x00  # §6.2.2
_NEVER_INDEXED = 0x10  # §6.2.3
_MAX_CACHED_FIELDS = 512


def encode_authority(authority: str) -> bytes:
    """`:authority` as sent: ASCII as it is (the idna codec costs an import of stringprep)."""
    return authority.encode("ascii") if authority.isascii() else authority.encode("idna")


def encode_integer(value: int, prefix_bits: int, first_byte: int = 0) -> bytes:
    """§5.1 integer representation with an N-bit prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first_byte | value])
    out = bytearray([first_byte | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(data: bytes) -> bytes:
    # Raw octets (H=0): Huffman saves a few bytes but costs more than the rest of the encode.
    return encode_integer(len(data), 7) + data


def encode_field(name: bytes, value: bytes, *, sensitive: bool) -> bytes:
    if not sensitive:
        full = _STATIC_FULL.get((name, value))
        if full is not None:
            return encode_integer(full, 7, 0x80)  # §6.1 indexed, static table only
    prefix = _NEVER_INDEXED if sensitive else _WITHOUT_INDEXING
    name_index = _STATIC_NAME.get(name)
    if name_index is not None:
        return encode_integer(name_index, 4, prefix) + _string(value)
    return bytes([prefix]) + _string(name) + _string(value)


class BoundedDecoder(Decoder):
    """hpack's Decoder with the two limits it lacks, for both engines: a compressed block over
    MAX_HEADER_BLOCK_BYTES is refused unread, and so is a block that starts with more than two
    dynamic table size updates (hpack takes any number, at about 1 µs each)."""

    def decode(self, data: bytes, raw: bool = False) -> Iterable[HeaderTuple]:
        if len(data) > MAX_HEADER_BLOCK_BYTES:
            raise OversizedHeaderListError(
                f"a compressed header block of {len(data)} bytes exceeds our limit"
            )
        if data and data[0] & 0xE0 == 0x20:
            _check_table_size_updates(data)
        return super().decode(data, raw)


def _check_table_size_updates(data: bytes) -> None:
    pos = updates = 0
    end = len(data)
    while pos < end and data[pos] & 0xE0 == 0x20:  # §6.3: 001xxxxx, a 5-bit prefix integer
        updates += 1
        if updates > MAX_TABLE_SIZE_UPDATES:
            raise HPACKDecodingError("more than two dynamic table size updates in one block")
        pos += 1
        if data[pos - 1] & 0x1F == 0x1F:
            while pos < end and data[pos] & 0x80:
                pos += 1
            pos += 1


class StatelessEncoder:
    """Drop-in for hpack.Encoder as h2 uses it (`encode(headers)`, `header_table_size`)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[bytes, bytes], bytes] = {}
        self._first_block = True
        # h2 sets this when the peer's SETTINGS_HEADER_TABLE_SIZE changes; our table stays 0.
        self.header_table_size = 4096

    def encode(self, headers: Iterable[tuple[bytes, bytes]], huffman: bool = True) -> bytes:
        parts: list[bytes] = []
        if self._first_block:
            self._first_block = False
            parts.append(_TABLE_SIZE_ZERO)
        cache = self._cache
        for header in headers:
            name, value = header[0], header[1]
            sensitive = isinstance(header, HeaderTuple) and not header.indexable
            if sensitive:
                parts.append(encode_field(name, value, sensitive=True))
                continue
            key = (name, value)
            if key in cache:  # not .get(): see CallTable._calls
                encoded = cache[key]
            else:
                encoded = encode_field(name, value, sensitive=False)
                if len(cache) < _MAX_CACHED_FIELDS:
                    cache[key] = encoded
            parts.append(encoded)
        return b"".join(parts)
