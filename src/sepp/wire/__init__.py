"""gRPC over HTTP/2 for sepp's one service, with no domain types.

Two sans-IO engines behind one interface (`_engine`): our codec (`codec/`, the default) and h2
(`h2ref/`, the reference). The pieces both share sit here: gRPC framing (`_framing`), the calls
in flight (`_calls`), reading a response (`_response`), HPACK (`_hpack`), events, status codes,
failure kinds and constants. `drivers/` gives an engine its socket: trio, asyncio (uvloop too)
or blocking."""

from typing import TYPE_CHECKING

from ._engine import DEFAULT_WIRE_ENGINE as DEFAULT_WIRE_ENGINE
from ._engine import WIRE_ENGINES as WIRE_ENGINES
from ._engine import GrpcConnection as GrpcConnection
from ._engine import WireEngine as WireEngine
from ._engine import connection_class as connection_class
from ._events import CallFinished as CallFinished
from ._events import ConnectionBroken as ConnectionBroken
from ._events import GoAwayReceived as GoAwayReceived
from ._events import PingAcknowledged as PingAcknowledged
from ._events import StreamCapacityChanged as StreamCapacityChanged
from ._failure import FailureKind as FailureKind
from ._framing import MessageDecoder as MessageDecoder
from ._framing import Request as Request
from ._framing import encode_message as encode_message
from ._framing import request_size as request_size
from ._status import StatusCode as StatusCode

if TYPE_CHECKING:
    from ._hpack import BoundedDecoder as BoundedDecoder
    from ._hpack import encode_field as encode_field
    from .codec import CodecGrpcConnection as CodecGrpcConnection

__all__ = [
    "DEFAULT_WIRE_ENGINE",
    "WIRE_ENGINES",
    "BoundedDecoder",
    "CallFinished",
    "CodecGrpcConnection",
    "ConnectionBroken",
    "FailureKind",
    "GoAwayReceived",
    "GrpcConnection",
    "MessageDecoder",
    "PingAcknowledged",
    "Request",
    "StatusCode",
    "StreamCapacityChanged",
    "WireEngine",
    "connection_class",
    "encode_field",
    "encode_message",
    "request_size",
]

# HPACK's encoder and bounded decoder (the pure-Python server's too) load hpack: on first use.
_HPACK = ("BoundedDecoder", "encode_field")


if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        # The codec (and hpack under it) loads with the first connection: `connection_class`.
        if name == "CodecGrpcConnection":
            return connection_class("codec")
        if name in _HPACK:
            from . import _hpack

            return getattr(_hpack, name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*globals(), "CodecGrpcConnection", *_HPACK})
