"""Scatter/gather writes for both drivers: an engine's output goes to the socket as the list
of buffers it queued (frame headers and views of big request bodies), with `sendmsg`, so a
big request is copied only by the kernel."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._engine import GrpcConnection
    from ._tls import Tls

Buffers = list[bytes | memoryview]

# Buffers per sendmsg call. CPython costs about 25 ns per buffer, taken or not, and a socket
# takes a few MiB at most per call: 256 frames of 16 KiB are 4 MiB. (POSIX allows 1024 on
# Linux, the BSDs and macOS.)
_MAX_BUFFERS = 256
HAS_SENDMSG = hasattr(socket.socket, "sendmsg")  # not on Windows


def take_output(proto: GrpcConnection, tls: Tls | None) -> Buffers:
    """What the engine queued for the socket, as the buffers to send: joined into one for TLS
    (its records need contiguous plaintext) and where the platform has no sendmsg."""
    if tls is not None:
        data = tls.encrypt(proto.data_to_send())
        return [data] if data else []
    buffers = proto.buffers_to_send()
    if len(buffers) > 1 and not HAS_SENDMSG:
        return [b"".join(buffers)]
    return buffers


def send_some(sock: socket.socket, buffers: Buffers) -> int:
    """One send of as much of `buffers` as the socket takes now; returns the byte count.
    Raises what the socket raises (BlockingIOError when it takes nothing)."""
    if len(buffers) == 1:
        return sock.send(buffers[0])
    return sock.sendmsg(buffers if len(buffers) <= _MAX_BUFFERS else buffers[:_MAX_BUFFERS])


def advance(buffers: Buffers, sent: int) -> Buffers:
    """Drop the first `sent` bytes from `buffers`, in place (a partly sent buffer becomes a
    view of its rest, no copy); returns `buffers`."""
    if not sent:
        return buffers
    for index, buf in enumerate(buffers):
        size = len(buf)
        if sent < size:
            del buffers[:index]
            buffers[0] = memoryview(buf)[sent:]
            return buffers
        sent -= size
    buffers.clear()
    return buffers
