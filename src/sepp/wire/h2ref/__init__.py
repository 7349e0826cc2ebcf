"""The reference engine: the same sans-IO gRPC connection on h2's general HTTP/2 state machine,
kept as the selectable alternative (`wire_engine="h2"`) and the codec's test oracle."""

from ._connection import H2GrpcConnection as H2GrpcConnection

__all__ = ["H2GrpcConnection"]
