"""One call's stream: what its response said so far (`ResponseState`), the request bytes not
sent yet, and its two flow-control windows."""

from __future__ import annotations

from .._response import ResponseState

EMPTY = memoryview(b"")


class Stream(ResponseState):
    __slots__ = ("later", "outbound", "prefix", "recv_window", "send_window")

    def __init__(self, max_receive_bytes: int | None, send_window: int, recv_window: int) -> None:
        super().__init__(max_receive_bytes)
        # The request not sent yet: the part of its gRPC length prefix left, then the message.
        # `outbound` is the rest of the message's current part, `later` the parts after it
        # (a request given in parts); `outbound` is empty only when nothing is left.
        self.prefix = b""
        self.outbound = EMPTY
        self.later: list[memoryview] | None = None
        self.send_window = send_window
        self.recv_window = recv_window
