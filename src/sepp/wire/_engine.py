"""The two HTTP/2 engines behind one interface.

`codec` (`codec/`) is our purpose-built client codec and the default. `h2`
(`h2ref/`) runs on the h2 state machine: the reference that tests check the codec
against, and a way for users to rule the codec out. A driver (`drivers/`) only sees
`GrpcConnection`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal, Protocol

from ._constants import DEFAULT_CONNECTION_WINDOW, DEFAULT_STREAM_WINDOW, Header
from ._events import CallFinished, Event
from ._framing import Request

WireEngine = Literal["codec", "h2"]
WIRE_ENGINES: tuple[WireEngine, ...] = ("codec", "h2")
DEFAULT_WIRE_ENGINE: WireEngine = "codec"


class GrpcConnection(Protocol):
    """A sans-IO HTTP/2 client connection carrying unary gRPC calls: bytes and calls in,
    events and bytes out. No sockets, clocks or tasks."""

    draining: bool
    broken: str | None

    def __init__(
        self,
        *,
        authority: str,
        scheme: str = "http",
        user_agent: str = "sepp-trio",
        metadata: Sequence[Header] = (),
        secret_metadata: Sequence[Header] = (),
        max_receive_message_bytes: int | None = None,
        stream_window: int = DEFAULT_STREAM_WINDOW,
        connection_window: int = DEFAULT_CONNECTION_WINDOW,
    ) -> None: ...

    def initiate(self) -> None:
        """Queue the connection preface and our SETTINGS."""

    def data_to_send(self) -> bytes:
        """Bytes queued for the socket since the last call."""

    def buffers_to_send(self) -> list[bytes | memoryview]:
        """The same bytes as `data_to_send`, as the buffers they would be joined from (big
        request bodies as views of the caller's bytes), for a scatter/gather write."""

    @property
    def active_calls(self) -> int: ...

    @property
    def remote_settings_received(self) -> bool: ...

    @property
    def can_start_call(self) -> bool:
        """False while the server's MAX_CONCURRENT_STREAMS is reached, or after GOAWAY."""

    @property
    def free_streams(self) -> int:
        """How many more calls may start now (MAX_STREAM_ID when the server set no limit)."""

    @property
    def usable(self) -> bool:
        """Whether new calls may be placed on this connection (now or once a slot frees)."""

    def start_call(
        self,
        method: str,
        request: Request,
        *,
        timeout: float | None = None,
        metadata: Iterable[Header] = (),
    ) -> int:
        """Open a stream for `method` and queue its request; returns the stream id. Raises
        StreamIdsExhausted past the last stream id, and HeaderListTooLarge (queueing nothing)
        when the headers are over the server's SETTINGS_MAX_HEADER_LIST_SIZE."""

    def cancel_call(self, stream_id: int) -> None:
        """Forget a call and reset its stream with CANCEL; the connection stays usable."""

    def send_ping(self, opaque: bytes) -> bool:
        """Queue a PING, unless MAX_PINGS_WITHOUT_DATA went out since our last HEADERS or DATA
        frame (none before the first): then queue nothing and return False."""

    def close(self) -> None:
        """Queue a GOAWAY; the driver sends it and closes the socket."""

    def connection_lost(self, reason: str) -> list[CallFinished]:
        """The transport died: finish every call with UNAVAILABLE."""

    def receive_data(self, data: bytes) -> list[Event]:
        """Feed bytes from the socket; returns the resulting events in order."""


def connection_class(engine: WireEngine) -> type[GrpcConnection]:
    """The engine's connection class (the reference engine imports h2 only when chosen)."""
    if engine == "codec":
        from .codec import CodecGrpcConnection

        return CodecGrpcConnection
    if engine == "h2":
        from .h2ref import H2GrpcConnection

        return H2GrpcConnection
    raise ValueError(f"unknown wire engine {engine!r}; expected one of {WIRE_ENGINES}")
