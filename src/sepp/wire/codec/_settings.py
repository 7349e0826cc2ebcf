"""SETTINGS (RFC 9113 §6.5): the ones we send in our preface, and reading the server's."""

from __future__ import annotations

import struct

from .._constants import DEFAULT_MAX_FRAME_SIZE, DEFAULT_MAX_HEADER_LIST_SIZE
from ._frames import (
    ACK,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    MAX_FRAME_SIZE_LIMIT,
    MIN_FRAME_SIZE,
    PREFACE,
    PROTOCOL_ERROR,
    SETTINGS,
    PeerConnectionError,
    frame,
)
from ._windows import MAX_WINDOW

# Settings (RFC 9113 §6.5.2).
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6
SETTINGS_ENABLE_CONNECT_PROTOCOL = 0x8  # RFC 8441

_SETTING = struct.Struct(">HL")

SETTINGS_ACK = frame(SETTINGS, ACK, 0)


def client_preface(stream_window: int) -> bytes:
    """The connection preface and our SETTINGS: no push, our stream window, frame size and
    header list limit (the connection window is raised by a WINDOW_UPDATE after it)."""
    settings = b"".join(
        _SETTING.pack(code, value)
        for code, value in (
            (SETTINGS_ENABLE_PUSH, 0),
            (SETTINGS_INITIAL_WINDOW_SIZE, stream_window),
            (SETTINGS_MAX_FRAME_SIZE, DEFAULT_MAX_FRAME_SIZE),
            (SETTINGS_MAX_HEADER_LIST_SIZE, DEFAULT_MAX_HEADER_LIST_SIZE),
        )
    )
    return PREFACE + frame(SETTINGS, 0, 0, settings)


def read_settings(
    data: bytes, start: int, stop: int, flags: int, stream_id: int
) -> dict[int, int] | None:
    """A SETTINGS frame from the server: None for an ACK of ours, else what it sets among
    MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE and MAX_HEADER_LIST_SIZE.
    Raises PeerConnectionError for a malformed frame or value."""
    if stream_id != 0:
        raise PeerConnectionError(PROTOCOL_ERROR, "SETTINGS frame on a stream")
    if flags & ACK:
        if stop != start:
            raise PeerConnectionError(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
        return None
    if (stop - start) % 6:
        raise PeerConnectionError(FRAME_SIZE_ERROR, "SETTINGS payload is not a multiple of 6")
    # Every value is checked in order (RFC 9113 §6.5.3), but a setting named many times
    # takes effect once, with its last value: a frame of many entries costs its length.
    values: dict[int, int] = {}
    for offset in range(start, stop, 6):
        code, value = _SETTING.unpack_from(data, offset)
        if code == SETTINGS_MAX_CONCURRENT_STREAMS:
            values[code] = value
        elif code == SETTINGS_INITIAL_WINDOW_SIZE:
            if value > MAX_WINDOW:
                raise PeerConnectionError(FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
            values[code] = value
        elif code == SETTINGS_MAX_FRAME_SIZE:
            if not MIN_FRAME_SIZE <= value <= MAX_FRAME_SIZE_LIMIT:
                raise PeerConnectionError(PROTOCOL_ERROR, f"invalid MAX_FRAME_SIZE {value}")
            values[code] = value
        elif code == SETTINGS_ENABLE_PUSH and value != 0:
            raise PeerConnectionError(PROTOCOL_ERROR, "a server cannot enable push")
        elif code == SETTINGS_ENABLE_CONNECT_PROTOCOL and value > 1:
            raise PeerConnectionError(PROTOCOL_ERROR, f"invalid ENABLE_CONNECT_PROTOCOL {value}")
        elif code == SETTINGS_MAX_HEADER_LIST_SIZE:
            # Advisory in RFC 9113, but a server refuses a bigger block (or ends the
            # connection): start_call refuses it first.
            values[code] = value
        # HEADER_TABLE_SIZE: our encoder never indexes, so the server's table size is moot.
        # Unknown settings are ignored (§6.5.2).
    return values
