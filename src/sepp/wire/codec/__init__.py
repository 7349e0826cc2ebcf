"""The default engine: our purpose-built sans-IO HTTP/2 client codec for unary gRPC calls
(`_connection.CodecGrpcConnection`), in h2's rooms: `_frames` (types, flags, error codes, the
header's layout), `_frame_buffer` (bytes into frames), `_header_blocks` (our request blocks,
the server's decoded behind a cache), `_windows` (flow control both ways: when to send
WINDOW_UPDATE, request bodies within the server's windows), `_settings` (ours and reading the
server's), `_stream` (one call's state), and `_connection`, the glue."""

from ._connection import CodecGrpcConnection as CodecGrpcConnection

__all__ = ["CodecGrpcConnection"]
