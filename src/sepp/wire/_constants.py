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
