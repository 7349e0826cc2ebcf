"""What both engines keep the same way: the calls in flight on a connection, what limits new
ones, and the first bytes that tell an HTTP/2 server from anything else."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

from ._constants import MAX_STREAM_ID
from ._events import CallFinished, ConnectionBroken, Event
from ._failure import FailureKind
from ._response import FRAME_HEADER_BYTES, ResponseState, not_http2_reason
from ._status import StatusCode

CallT = TypeVar("CallT", bound=ResponseState)


def without_streams_above(queued: bytes, last_stream_id: int) -> bytes:
    """Our own queued output (whole frames) minus every frame of a stream above a GOAWAY's
    `last_stream_id`. Those calls already failed as never processed and go out again on
    another connection; sending their frames anyway hands a closing server bytes it will not
    read, and nginx, closing a socket with unread bytes, resets it and drops the answers it
    had not yet flushed to calls it did process. No HEADERS follow a GOAWAY, so the
    server's HPACK table never needs the blocks dropped here."""
    kept: list[bytes] = []
    at = keep_from = 0
    size = len(queued)
    while at + FRAME_HEADER_BYTES <= size:
        end = at + FRAME_HEADER_BYTES + int.from_bytes(queued[at : at + 3], "big")
        if int.from_bytes(queued[at + 5 : at + 9], "big") & MAX_STREAM_ID > last_stream_id:
            kept.append(queued[keep_from:at])
            keep_from = end
        at = end
    if not keep_from:
        return queued
    kept.append(queued[keep_from:])
    return b"".join(kept)


# RFC 9113 §6.5.2 (and RFC 7541 §4.1): a header list's size is each field's name and value,
# uncompressed, plus 32 bytes.
FIELD_OVERHEAD = 32
# The header list limit until the server sets one (RFC 9113 §6.5.2: unlimited); an int above
# any 32-bit setting, so that comparing sizes with it stays an int comparison.
NO_HEADER_LIST_LIMIT = 1 << 62


def header_list_size(fields: Iterable[tuple[bytes, bytes]]) -> int:
    return sum(len(name) + len(value) + FIELD_OVERHEAD for name, value in fields)


class HeaderListTooLarge(Exception):
    """start_call with request headers over the server's SETTINGS_MAX_HEADER_LIST_SIZE: refused
    before anything was queued, so the connection stays as it was (a server refuses such a
    block, or ends the connection for it)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"the request's headers come to {size} bytes, over the {limit}-byte header list "
            "limit the server set (SETTINGS_MAX_HEADER_LIST_SIZE; each field counts its name, "
            "its value and 32): nothing was sent"
        )
        self.size = size
        self.limit = limit


class StreamIdsExhausted(Exception):
    """start_call on a connection whose stream ids are spent (2^31-1 is the last, RFC 9113
    §5.1.1). The connection drains once it hands out the last id; new calls need a new one."""


class CallTable(Generic[CallT]):
    """The base of an engine: calls by stream id, the server's stream limit, and the state
    (draining after GOAWAY, broken) that decides whether new calls may start."""

    def __init__(self) -> None:
        # Looked up with `in` and `[]`, never `.get()`: on free-threaded CPython 3.13,
        # dict.get with a key equal to (not the same object as) one another thread stored
        # takes a lock it already holds, spins and parks (~20 µs; `in` and `[]` take ~60 ns),
        # and here the reader looks up calls other threads started (SyncClient's threads).
        self._calls: dict[int, CallT] = {}
        self._remote_max_streams: int | None = None
        # The server's SETTINGS_MAX_HEADER_LIST_SIZE: unlimited until it says (RFC 9113 §6.5.2).
        self._remote_max_header_list = NO_HEADER_LIST_LIMIT
        self._settings_received = False
        # The server's first bytes, held until a frame header is complete (see _take_preface).
        self._preface: bytearray | None = bytearray()
        self.draining = False
        self.broken: str | None = None

    @property
    def active_calls(self) -> int:
        return len(self._calls)

    @property
    def remote_settings_received(self) -> bool:
        """Whether the server's connection preface (its first SETTINGS frame) has arrived."""
        return self._settings_received

    @property
    def can_start_call(self) -> bool:
        """False while the server's MAX_CONCURRENT_STREAMS is reached, or after GOAWAY.

        Until the server's first SETTINGS arrives its limit is unknown, so only one call may be
        in flight: a server with a low limit would refuse the excess streams.
        """
        if self.draining or self.broken is not None:
            return False
        limit = self._remote_max_streams
        if limit is None:
            return self._settings_received or not self._calls
        return len(self._calls) < limit

    @property
    def free_streams(self) -> int:
        """How many more calls may start now (MAX_STREAM_ID when the server set no limit)."""
        if self.draining or self.broken is not None:
            return 0
        limit = self._remote_max_streams
        if limit is None:
            return MAX_STREAM_ID if self._settings_received else int(not self._calls)
        return max(0, limit - len(self._calls))

    @property
    def usable(self) -> bool:
        """Whether new calls may be placed on this connection (now or once a slot frees)."""
        return not self.draining and self.broken is None

    def connection_lost(self, reason: str) -> list[CallFinished]:
        """The transport died: finish every call with UNAVAILABLE."""
        if self.broken is None:
            self.broken = reason
        return self._fail_all(StatusCode.UNAVAILABLE, reason, FailureKind.CONNECTION)

    def _take_preface(self, data: bytes) -> tuple[bytes | None, list[Event]]:
        """Hold received bytes until the server's first frame header is complete, and check it
        is a SETTINGS frame. Returns the bytes to parse (None: not yet, or never), and the
        events of a connection that turned out not to be HTTP/2."""
        assert self._preface is not None
        self._preface += data
        if len(self._preface) < FRAME_HEADER_BYTES:
            return None, []
        data, self._preface = bytes(self._preface), None
        reason = not_http2_reason(data)
        if reason is None:
            return data, []
        self.broken = reason
        return None, [
            *self._fail_all(StatusCode.UNAVAILABLE, reason, FailureKind.PROTOCOL),
            ConnectionBroken(reason),
        ]

    def _fail_all(self, code: StatusCode, reason: str, kind: FailureKind) -> list[CallFinished]:
        finished = [CallFinished(sid, code, reason, None, kind) for sid in self._calls]
        self._calls.clear()
        return finished
