"""What every driver of a GrpcConnection shares: the endpoint, the error a call raises, and one
unary call's loop: deadline and transparent retry of calls the server never processed. A
driver (the trio `Channel`, the asyncio `AsyncioChannel`, the blocking `BlockingChannel`)
supplies the clock and one attempt on a connection; the connections themselves are `_core`'s.
No event loop here: a driver hands these helpers the OS or TLS error itself, unwrapped from its
library's own exceptions, and `connect_error` words a failed connect the same for all three.
"""

from __future__ import annotations

import logging
import math
import os
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypedDict

from .. import _engine
from .._constants import Header
from .._engine import GrpcConnection, WireEngine, connection_class
from .._events import CallFinished
from .._failure import FailureKind
from .._framing import Request
from .._status import StatusCode

# How many times in all a call the server provably never processed (FailureKind.unprocessed)
# is sent; a peer that refuses every stream must not keep a caller busy until its deadline.
MAX_TRANSPARENT_ATTEMPTS = 8
CLOSED_REASON = "the client is closed"


class Logger(Protocol):
    def debug(self, msg: str, /, *args: object) -> None: ...
    def warning(self, msg: str, /, *args: object) -> None: ...


class RpcError(Exception):
    """A call failed: a gRPC status from the server, or a local verdict (`kind`)."""

    def __init__(self, code: StatusCode, details: str, kind: FailureKind | None = None) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int
    ssl_context: ssl.SSLContext | None = None
    server_hostname: str | None = None

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def request_authority(self) -> str:
        """What `:authority` carries: the TLS server-name override when one is set (as
        grpc's `ssl_target_name_override` does, so a proxy routes by the name), else host:port."""
        return self.server_hostname or self.authority


@dataclass(slots=True)
class Attempt:
    """One call as the loop sends it: `request` changes for a long poll's re-send, and
    `unprocessed` is the previous attempt's result when this one is a transparent retry."""

    method: str
    request: Request
    metadata: Sequence[Header]
    own_deadline: float
    timeout: float | None
    unprocessed: CallFinished | None = None


class ChannelOptions(TypedDict, total=False):
    """What every channel is built with, besides its endpoint (`user_agent` is required)."""

    user_agent: str
    metadata: Sequence[Header]
    secret_metadata: Sequence[Header]
    connect_timeout: float
    max_receive_message_bytes: int | None
    keepalive_interval: float | None
    keepalive_timeout: float
    wire_engine: WireEngine | None
    log: Logger | None
    on_transparent_retry: Callable[[str, FailureKind], None] | None


class ChannelBase:
    """Unary calls over HTTP/2 connections to one endpoint; a driver subclass does the I/O."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        user_agent: str,
        metadata: Sequence[Header] = (),
        secret_metadata: Sequence[Header] = (),
        connect_timeout: float = 5.0,
        max_receive_message_bytes: int | None = None,
        keepalive_interval: float | None = 30.0,
        keepalive_timeout: float = 10.0,
        wire_engine: WireEngine | None = None,
        log: Logger | None = None,
        on_transparent_retry: Callable[[str, FailureKind], None] | None = None,
    ) -> None:
        self.endpoint = endpoint
        # None: the package default, read here so tests can run a whole suite on each engine.
        self._connection_class = connection_class(wire_engine or _engine.DEFAULT_WIRE_ENGINE)
        self.keepalive_interval = keepalive_interval
        self.keepalive_timeout = keepalive_timeout
        self._user_agent = user_agent
        self._metadata = tuple(metadata)
        self._secret_metadata = tuple(secret_metadata)
        self._connect_timeout = connect_timeout
        self._max_receive = max_receive_message_bytes
        self._closed = False
        self.connections_opened = 0
        self._log: Logger = log if log is not None else logging.getLogger("sepp.wire")
        self._on_transparent_retry = on_transparent_retry

    # -- what a driver supplies -----------------------------------------------------------------

    def _now(self) -> float:
        """The driver's clock, in seconds."""
        raise NotImplementedError

    async def _attempt(self, call: Attempt) -> CallFinished | None:
        """Send the call once on a usable connection and return how it finished (None: its own
        deadline passed). When it is a transparent retry, running out of time before it is sent
        fails it as `call.unprocessed`."""
        raise NotImplementedError

    async def connect(self) -> None:
        """Open a connection now (calls otherwise connect on first use); raises RpcError."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Fail in-flight calls, close every connection, refuse new calls."""
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------------

    def new_protocol(self) -> GrpcConnection:
        """A fresh sans-IO connection for this endpoint, its preface queued."""
        ep = self.endpoint
        proto = self._connection_class(
            authority=ep.request_authority,
            scheme="https" if ep.ssl_context is not None else "http",
            user_agent=self._user_agent,
            metadata=self._metadata,
            secret_metadata=self._secret_metadata,
            max_receive_message_bytes=self._max_receive,
        )
        proto.initiate()
        return proto

    async def call(
        self,
        method: str,
        request: Request,
        *,
        timeout: float | None,
        metadata: Sequence[Header] = (),
        retry_request: Callable[[float], bytes] | None = None,
    ) -> bytes:
        """Make one unary call; returns the response message or raises RpcError.

        `timeout` bounds this call (a trio caller's own deadline also applies, and the smaller
        of the two is sent as grpc-timeout). Cancellation resets the stream.

        A call the server provably never processed (above a GOAWAY's last stream id, refused
        with REFUSED_STREAM, or never written before its connection died) is sent again,
        within the same deadline, up to MAX_TRANSPARENT_ATTEMPTS times in all: it cannot
        have had any effect. `retry_request(elapsed_s)`, if given, builds the request for such
        a retry (a long poll's remaining wait).
        """
        started = self._now()
        own_deadline = started + timeout if timeout is not None else math.inf
        call = Attempt(method, request, metadata, own_deadline, timeout)
        attempts = 1
        while True:
            result = await self._attempt(call)
            if result is None:
                raise deadline_exceeded(timeout)
            code = result.code
            if code is StatusCode.OK and result.body is not None:
                return result.body
            kind = result.error_kind
            if kind is None or not kind.unprocessed:
                break
            self._before_transparent_retry(method, result, attempts, own_deadline)
            call.unprocessed = result
            attempts += 1
            if retry_request is not None:
                call.request = retry_request(self._now() - started)
        if code is StatusCode.CANCELLED and self._now() >= own_deadline:
            # The server enforced the grpc-timeout we sent (tonic answers CANCELLED "Timeout
            # expired") just before our own deadline check ran: it is the same deadline.
            raise deadline_exceeded(timeout)
        raise RpcError(code, result.details, result.error_kind)

    def _before_transparent_retry(
        self, method: str, result: CallFinished, attempts: int, own_deadline: float
    ) -> None:
        """Let a call the server never processed go out again, or raise RpcError: attempts
        used up, or its deadline passed (then it fails as unprocessed, not as a timeout that
        might hide a commit)."""
        kind = result.error_kind
        assert kind is not None
        if attempts >= MAX_TRANSPARENT_ATTEMPTS:
            raise RpcError(
                result.code,
                f"{result.details}; gave up after {attempts} attempts, none processed by the "
                "server (sent again transparently)",
                kind,
            )
        if self._now() >= own_deadline:
            raise unprocessed_error(result)
        self._log.debug(
            "sepp: %s was not processed by the server (%s: %s); sending it again (attempt %d)",
            method,
            kind,
            result.details,
            attempts + 1,
        )
        if self._on_transparent_retry is not None:
            self._on_transparent_retry(method, kind)

    def _connect_timed_out(self, connected: bool) -> RpcError:
        """The error of a connect that ran out of its connect timeout (`connected`: the
        socket, and TLS, were up; the server's SETTINGS never came)."""
        if not connected:
            reason = f"could not connect within {self._connect_timeout:g}s"
        else:
            reason = f"the server sent no HTTP/2 SETTINGS within {self._connect_timeout:g}s"
        return RpcError(StatusCode.UNAVAILABLE, reason, FailureKind.CONNECT)


class EndedBeforeUse(RpcError):
    """The server ended a new connection (closed, reset, GOAWAY) before any call went on it,
    as an exiting proxy worker does on reload: nothing was sent, so it is dialled again."""


def ended_before_use(exc: BaseException, *, connected: bool) -> bool:
    """Whether a connect that failed with `exc` met a server ending the connection (reset,
    even as connect() returns; closed once TCP was up, as in a TLS handshake), rather than
    one refusing it or not being there."""
    return isinstance(exc, ConnectionResetError) or (
        connected and isinstance(exc, (ConnectionError, ssl.SSLEOFError))
    )


def connect_error(exc: BaseException, *, connected: bool) -> RpcError:
    """What a connect that failed with `exc` (an OSError or ssl.SSLError) raises:
    EndedBeforeUse when the server ended the connection (it is dialled again), else RpcError."""
    failure = EndedBeforeUse if ended_before_use(exc, connected=connected) else RpcError
    return failure(StatusCode.UNAVAILABLE, conn_reason(exc), FailureKind.CONNECT)


def unprocessed_error(result: CallFinished) -> RpcError:
    return RpcError(result.code, result.details, result.error_kind)


def deadline_exceeded(timeout: float | None) -> RpcError:
    return RpcError(
        StatusCode.DEADLINE_EXCEEDED,
        f"deadline exceeded after {timeout:g}s" if timeout is not None else "deadline",
        FailureKind.DEADLINE,
    )


def closed_error() -> RpcError:
    return RpcError(StatusCode.UNAVAILABLE, CLOSED_REASON, FailureKind.CLOSED)


def no_alpn_h2_error() -> RpcError:
    return RpcError(
        StatusCode.UNAVAILABLE,
        "the server did not negotiate HTTP/2 (ALPN h2) over TLS",
        FailureKind.CONNECT,
    )


def conn_reason(exc: BaseException) -> str:
    """`Type: message` of what broke, worded the same by every driver: a refused connection
    is `ConnectionRefusedError: [Errno 111] Connection refused` from trio's sockets as from
    asyncio's and the blocking ones."""
    attempt = _first_attempt(exc)
    if attempt is not None:
        if isinstance(attempt.errno, int) and attempt.errno > 0:
            # trio words it "Error connecting to ('127.0.0.1', 1): Connection refused".
            errno = attempt.errno
            return f"{type(attempt).__name__}: [Errno {errno}] {os.strerror(errno)}"
        exc = attempt
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if str(exc) else text


def _first_attempt(exc: BaseException) -> OSError | None:
    """trio's open_tcp_stream raises OSError("all attempts to connect to … failed") from a
    group of each address's error, where socket.create_connection raises the first of them:
    that one (None for any other error)."""
    attempts = getattr(exc.__cause__, "exceptions", None) if type(exc) is OSError else None
    if not attempts:
        return None
    first = attempts[0]
    while getattr(first, "exceptions", None):  # a nested group
        first = first.exceptions[0]
    return first if isinstance(first, OSError) else None


def describe_io_error(exc: BaseException) -> str:
    return f"connection lost: {type(exc).__name__}: {exc}"
