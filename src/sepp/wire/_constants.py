"""The HTTP/2 settings, limits and names both engines share."""

from __future__ import annotations

Header = tuple[bytes, bytes]

# Big windows: a 16 MiB Reserve response must not wait on WINDOW_UPDATE round trips.
DEFAULT_STREAM_WINDOW = 16 * 1024 * 1024
DEFAULT_CONNECTION_WINDOW = 64 * 1024 * 1024
DEFAULT_MAX_FRAME_SIZE = 1024 * 1024
DEFAULT_MAX_HEADER_LIST_SIZE = 64 * 1024
MAX_STREAM_ID = 2**31 - 1
SERVICE_PATH = b"/sepp.v1.QueueService/"

# Limits against a hostile peer, the same in both engines (docs/wire-engines.md, "Resource
# limits"). A compressed header block (HEADERS plus CONTINUATIONs) that could not decode within
# our header list limit anyway is refused before it is buffered or decoded.
MAX_HEADER_BLOCK_BYTES = 2 * DEFAULT_MAX_HEADER_LIST_SIZE
# RFC 7541 §4.2: a block starts with at most two dynamic table size updates.
MAX_TABLE_SIZE_UPDATES = 2
# Informational (1xx) responses before the real one; gRPC never sends any (Go's net/http: 5).
MAX_INFORMATIONAL_RESPONSES = 5
# Bytes of PING and SETTINGS ACKs queued while the driver has not taken our output: twice
# what one 256 KiB read can ask for (an ACK is no longer than its frame), so a peer that reads
# is never cut off however it batches, and one that floods and never reads costs at most this.
MAX_QUEUED_CONTROL_REPLY_BYTES = 512 * 1024

# Keepalive PINGs we send before a HEADERS or DATA frame of ours must go out again: grpc-core's
# `max_pings_without_data` (2). grpc-go and grpc-core servers allow one PING per 5 minutes while
# they send nothing and end the connection (GOAWAY too_many_pings) at the third early one, so a
# long call on a quiet connection gets two pings and then none until the next call.
MAX_PINGS_WITHOUT_DATA = 2

# What a call or the connection fails with at those limits (the same in both engines).
TOO_MANY_REPLIES = (
    f"more than {MAX_QUEUED_CONTROL_REPLY_BYTES // 1024} KiB of PING or SETTINGS acknowledgements "
    "queued while the server did not read"
)
TOO_MANY_1XX = f"more than {MAX_INFORMATIONAL_RESPONSES} informational (1xx) responses"
