"""Header blocks both ways: ours, a request's, encoded once per method (`_hpack.encode_field`)
with the room its header list leaves under the server's limit; and the server's, decoded
behind a cache of whole blocks (`ResponseHeaderBlocks`)."""

from __future__ import annotations

from collections.abc import Sequence

from hpack.exceptions import OversizedHeaderListError

from .._calls import FIELD_OVERHEAD, CallTable, HeaderListTooLarge, header_list_size
from .._constants import SERVICE_PATH, Header
from .._framing import ACCEPT_ENCODING
from .._hpack import BoundedDecoder, encode_authority, encode_field
from .._status import encode_grpc_timeout
from ._frames import COMPRESSION_ERROR, ENHANCE_YOUR_CALM, PeerConnectionError
from ._stream import Stream

TABLE_SIZE_ZERO = b"\x20"  # our first header block sets the server's table for us to 0
TIMEOUT_FIELD = encode_field(b"grpc-timeout", b"", sensitive=True)[:-1]  # minus the 0 length
TIMEOUT_FIELD_SIZE = len(b"grpc-timeout") + FIELD_OVERHEAD  # plus its value's length
# The most a grpc-timeout field can count (encode_grpc_timeout: at most 8 digits and a unit).
MAX_TIMEOUT_FIELD_SIZE = TIMEOUT_FIELD_SIZE + 9
# The response fields we read; the rest of a block is dropped as it is decoded.
INTERESTING = frozenset(
    {b":status", b"content-type", b"grpc-status", b"grpc-message", b"grpc-encoding"}
)


class RequestHeaders(CallTable[Stream]):
    """Our requests' header blocks: a base class of `CodecGrpcConnection`, whose `start_call`
    takes a method's block from `_method_blocks` (adding the call's own fields) and asks
    `_method_entry` on a miss and `_check_header_list` when the call's metadata may take its
    header list over the server's limit."""

    def _init_request_headers(
        self,
        *,
        authority: str,
        scheme: str,
        user_agent: str,
        metadata: Sequence[Header],
        secret_metadata: Sequence[Header],
    ) -> None:
        # The fields before and after :path, which varies by method.
        before_path = [(b":method", b"POST"), (b":scheme", scheme.encode("ascii"))]
        after_path: list[tuple[bytes, bytes, bool]] = [
            (b":authority", encode_authority(authority), False),
            (b"te", b"trailers", False),
            (b"content-type", b"application/grpc", False),
            (b"user-agent", user_agent.encode("ascii"), False),
            (b"grpc-accept-encoding", ACCEPT_ENCODING, False),
            *((k, v, False) for k, v in metadata),
            # Credentials must never enter the HPACK dynamic table (RFC 7541 §7.1.3).
            *((k, v, True) for k, v in secret_metadata),
        ]
        self._before_path = b"".join(encode_field(n, v, sensitive=False) for n, v in before_path)
        self._after_path = b"".join(encode_field(n, v, sensitive=s) for n, v, s in after_path)
        # What those fields count against the server's header list limit, :path aside.
        self._fields_size = header_list_size(before_path) + header_list_size(
            (n, v) for n, v, _ in after_path
        )
        # Per method: its header block, and the room its header list leaves under the server's
        # limit with the longest grpc-timeout (recomputed when the limit changes). A call
        # counts its exact size only when its metadata takes more than that room.
        self._method_blocks: dict[str, tuple[bytes, int]] = {}
        # The first block of the connection starts with TABLE_SIZE_ZERO.
        self._first_block = True

    def _method_entry(self, method: str) -> tuple[bytes, int]:
        path = SERVICE_PATH + method.encode("ascii")
        block = self._before_path + encode_field(b":path", path, sensitive=False) + self._after_path
        size = self._fields_size + header_list_size(((b":path", path),))
        entry = block, self._remote_max_header_list - size - MAX_TIMEOUT_FIELD_SIZE
        self._method_blocks[method] = entry
        return entry

    def _check_header_list(self, method: str, timeout: float | None, metadata_size: int) -> None:
        """Raise HeaderListTooLarge if the call's headers come to more than the server's
        limit (start_call's slow path, when they may)."""
        path = SERVICE_PATH + method.encode("ascii")
        size = self._fields_size + header_list_size(((b":path", path),)) + metadata_size
        if timeout is not None:
            size += TIMEOUT_FIELD_SIZE + len(encode_grpc_timeout(timeout))
        if size > self._remote_max_header_list:
            raise HeaderListTooLarge(size, self._remote_max_header_list)

    def _header_list_limit_changed(self, limit: int) -> None:
        """The server's SETTINGS_MAX_HEADER_LIST_SIZE is now `limit`."""
        if limit != self._remote_max_header_list:
            self._remote_max_header_list = limit
            self._method_blocks.clear()  # their room was reckoned with the old limit


class ResponseHeaderBlocks:
    """Decodes response header blocks, remembering the result of each distinct block.

    A block's meaning depends on the HPACK dynamic table, which only changes when a block
    inserts an entry or resizes the table. So a block is remembered only if decoding it left
    the table untouched, and everything remembered is forgotten whenever the table changes:
    a remembered result is always what decoding the block now would give. The server encodes
    its steady responses (`:status 200`, content-type, `grpc-status 0`) as references to
    entries it inserted once, so after the first calls nearly every block is a dict hit. Only
    small blocks are remembered (block and fields within _MAX_ENTRY_BYTES), so the cache holds
    at most _MAX_ENTRIES * _MAX_ENTRY_BYTES bytes of them whatever the server sends.
    """

    __slots__ = ("_cache", "_decoder")

    _MAX_ENTRIES = 128
    _MAX_ENTRY_BYTES = 1024

    def __init__(self, max_header_list_size: int) -> None:
        self._decoder = BoundedDecoder(max_header_list_size=max_header_list_size)
        self._cache: dict[bytes, tuple[Header, ...]] = {}

    def decode(self, block: bytes) -> tuple[Header, ...]:
        """The fields we read from a block (:status, content-type, grpc-status, grpc-message,
        grpc-encoding), in order; raises PeerConnectionError if it cannot be decoded."""
        if block in self._cache:  # not .get(): see CallTable._calls
            return self._cache[block]
        table = self._decoder.header_table
        entries = table.dynamic_entries
        count = len(entries)
        newest = entries[0] if count else None
        max_size = table.maxsize
        try:
            headers = self._decoder.decode(block, raw=True)
        except OversizedHeaderListError as exc:
            raise PeerConnectionError(ENHANCE_YOUR_CALM, f"oversized header block: {exc}") from None
        except Exception as exc:  # hpack raises assorted types on garbage
            raise PeerConnectionError(
                COMPRESSION_ERROR, f"cannot decode a header block: {type(exc).__name__}: {exc}"
            ) from None
        fields = tuple((n, v) for n, v in headers if n in INTERESTING)
        if (
            len(entries) != count
            or table.maxsize != max_size
            or (entries[0] if entries else None) is not newest
        ):
            self._cache.clear()
        elif len(block) + sum(len(n) + len(v) for n, v in fields) <= self._MAX_ENTRY_BYTES:
            if len(self._cache) >= self._MAX_ENTRIES:
                self._cache.clear()
            self._cache[bytes(block)] = fields
        return fields
