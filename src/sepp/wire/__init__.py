"""gRPC over HTTP/2 for sepp's one service: a sans-IO core (`GrpcConnection`) and a trio driver."""

from ._connection import GrpcConnection as GrpcConnection
from ._events import CallFinished as CallFinished
from ._events import ConnectionBroken as ConnectionBroken
from ._events import GoAwayReceived as GoAwayReceived
from ._events import PingAcknowledged as PingAcknowledged
from ._events import StreamCapacityChanged as StreamCapacityChanged
from ._framing import MessageDecoder as MessageDecoder
from ._framing import encode_message as encode_message
from ._status import StatusCode as StatusCode

__all__ = [
    "CallFinished",
    "ConnectionBroken",
    "GoAwayReceived",
    "GrpcConnection",
    "MessageDecoder",
    "PingAcknowledged",
    "StatusCode",
    "StreamCapacityChanged",
    "encode_message",
]
