"""A gRPC call as both HTTP/2 sides of the memory server see it (our codec's and h2's), and
what they do alike with one: read its headers, answer what the headers alone decide (the
API key, an unknown method, a compressed request), check the message's 5-byte prefix as it
arrives, and take the message out once the request has ended — with tonic's statuses and
messages for each way a request can be wrong."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable
from typing import Protocol

from .service import INTERNAL, UNIMPLEMENTED, Reply

CANCELLED, OUT_OF_RANGE = 1, 11
PREFIX = struct.Struct(">BI")
Extra = tuple[tuple[bytes, bytes], ...]  # headers a reply adds
_ACCEPT_IDENTITY: Extra = ((b"grpc-accept-encoding", b"identity"),)
# tonic's percent-encoding of grpc-message: controls, space and " # % < > ` ? { }, and
# every byte outside ASCII.
_PLAIN = frozenset(range(0x21, 0x7F)) - set(b'"#%<>`?{}')
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


def grpc_message(text: str) -> bytes:
    raw = text.encode("utf-8")
    if all(byte in _PLAIN for byte in raw):
        return raw
    return b"".join(bytes((byte,)) if byte in _PLAIN else b"%%%02X" % byte for byte in raw)


def parse_grpc_timeout(value: bytes) -> float | None:
    """Seconds, or None for an absent or malformed header (which tonic ignores)."""
    if not value or len(value) > 9:
        return None
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit():
        return None
    scale = _TIMEOUT_UNITS.get(unit)
    return None if scale is None else int(digits) * scale


class Responder(Protocol):
    """A connection, as its calls see it."""

    def respond(self, call: Call, reply: Reply, *, extra: Extra = ()) -> None: ...


class Call:
    """One request stream."""

    __slots__ = (
        "answered",
        "authorization",
        "body",
        "connection",
        "deadline",
        "dispatched",
        "encoding",
        "path",
        "stream_id",
        "waiter",
    )

    def __init__(self, connection: Responder, stream_id: int) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.path = ""
        self.authorization: bytes | None = None
        self.encoding: bytes | None = None
        self.deadline = math.inf  # the runtime's clock; from grpc-timeout
        self.body = bytearray()
        self.answered = False
        self.dispatched = False
        self.waiter: object = None  # the dispatcher's, while a Reserve waits

    def respond(self, reply: Reply) -> None:
        self.connection.respond(self, reply)

    def read_headers(self, headers: Iterable[tuple[bytes, bytes]], now: float) -> None:
        for name, value in headers:
            if name == b":path":
                self.path = value.decode("utf-8", "replace")
            elif name == b"authorization":
                self.authorization = value
            elif name == b"grpc-timeout":
                timeout = parse_grpc_timeout(value)
                if timeout is not None:
                    self.deadline = now + timeout
            elif name == b"grpc-encoding":
                self.encoding = value


class Dispatcher(Protocol):
    def admit(self, call: Call) -> Reply | None:
        """The reply to give from the headers alone (auth, unknown method), or None."""

    def dispatch(self, call: Call, body: bytes) -> None:
        """Answer the call (now or later) with `call.respond`."""

    def forget(self, call: Call) -> None:
        """The call ended without a reply from the dispatcher (reset, or the connection)."""

    def started(self, call: Call) -> None:
        """A call began (its deadline is known): for the dispatcher's timers."""


def begin(dispatcher: Dispatcher, call: Call) -> None:
    """The call's headers are read: answer it now if they decide it, else tell the
    dispatcher it began."""
    early = dispatcher.admit(call)
    if early is None and call.encoding is not None and call.encoding != b"identity":
        encoding = call.encoding.decode("utf-8", "replace")
        early = Reply(
            UNIMPLEMENTED, f"Content is compressed with `{encoding}` which isn't supported"
        )
        call.connection.respond(call, early, extra=_ACCEPT_IDENTITY)
    elif early is not None:
        call.respond(early)
    else:
        dispatcher.started(call)


def check_prefix(call: Call, max_message_bytes: int) -> None:
    """Refuse a message whose prefix is wrong as soon as the prefix is in."""
    if len(call.body) < PREFIX.size:
        return
    flag, length = PREFIX.unpack_from(call.body)
    if flag == 1:
        call.respond(
            Reply(
                INTERNAL,
                "protocol error: received message with compressed-flag but no grpc-encoding"
                " was specified",
            )
        )
    elif flag:
        call.respond(
            Reply(
                INTERNAL,
                f"protocol error: received message with invalid compression flag: {flag}"
                " (valid flags are 0 and 1), while sending request",
            )
        )
    elif length > max_message_bytes:
        call.respond(
            Reply(
                OUT_OF_RANGE,
                f"Error, decoded message length too large: found {length} bytes, the limit"
                f" is: {max_message_bytes} bytes",
            )
        )


def ended(dispatcher: Dispatcher, call: Call | None) -> None:
    """The request has ended: dispatch its message (once), or say why there is none."""
    if call is None or call.answered or call.dispatched:
        return
    call.dispatched = True
    body = call.body
    if not body:
        call.respond(Reply(INTERNAL, "Missing request message."))
        return
    length = PREFIX.unpack_from(body)[1] if len(body) >= PREFIX.size else -1
    if length < 0 or len(body) < PREFIX.size + length:
        call.respond(Reply(INTERNAL, "Unexpected EOF decoding stream."))
        return
    message = bytes(body[PREFIX.size : PREFIX.size + length])
    call.body = bytearray()
    dispatcher.dispatch(call, message)


class ServerSide:
    """What both HTTP/2 sides keep alike: their calls, the replies still being sent, and the
    end of the connection. `on_output` is called whenever bytes wait to be sent."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        max_message_bytes: int,
        runtime_now: Callable[[], float],
        on_output: Callable[[], None],
    ) -> None:
        self._dispatcher = dispatcher
        self._max_message_bytes = max_message_bytes
        self._now = runtime_now
        self._on_output = on_output
        self._calls: dict[int, Call] = {}
        self._sending: dict[int, list[bytes]] = {}  # stream → [the reply's bytes still to send]
        self.closed = False  # no more to read or send: the driver may close the socket
        self._going_away = False
        self._open_connection()

    def _open_connection(self) -> None:
        """The side's own state, and what it sends first."""

    @property
    def idle(self) -> bool:
        """No call begun and not answered, nothing left to send."""
        return not self._calls and not self._sending

    # What each side implements (the drivers and the core call these).
    def data_to_send(self) -> bytes:
        """The bytes to send now (and forget)."""
        raise NotImplementedError

    def receive(self, data: bytes) -> None:
        """Bytes from the client (b"": it closed its side)."""
        raise NotImplementedError

    def respond(self, call: Call, reply: Reply, *, extra: Extra = ()) -> None:
        """Send `reply` on `call`'s stream (once; later replies are dropped)."""
        raise NotImplementedError

    def goaway(self) -> None:
        """No new streams; those begun are answered, then the connection closes."""
        raise NotImplementedError

    def _claim(self, call: Call) -> bool:
        """Whether `call` is this connection's and still unanswered; it is answered now."""
        if call.answered:
            return False
        call.answered = True
        return self._calls.get(call.stream_id) is call

    def connection_lost(self) -> None:
        """The socket is gone: every call still waiting is forgotten."""
        self.closed = True
        self._sending.clear()
        calls, self._calls = self._calls, {}
        for call in calls.values():
            if not call.answered:
                call.answered = True
                self._dispatcher.forget(call)
