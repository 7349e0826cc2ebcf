"""The driver core: the connection state every driver shares, written once. A driver does its
I/O and its wake-ups and calls in here for the rest.

- `ConnectionCore`, one HTTP/2 connection: the calls in flight and what its death does to them
  (those provably never sent fail as UNSENT, so they go out again), the engine's events, a
  failed write (the server's last answers and GOAWAY are read before the connection dies), a
  caller giving up, starting a stream.
- `ChannelCore`, a channel's connections: the one new calls go on, retiring it (GOAWAY, a
  failed write, stream ids spent) so the callers parked on it move on, the GOAWAY verdicts,
  connecting (the TCP connection, the TLS handshake and its ALPN check, the server's
  SETTINGS, and what each failure is called: one `connect_error` for every driver), dialling
  again while the server ends new connections before use, the connect-failure gate, close.

What a driver implements is under "what a driver supplies" in each class: its I/O (trio
streams, asyncio's loop, blocking sockets) and wake-ups. It runs a connection's methods one at
a time (the trio driver in its one thread, the asyncio one in its loop's, the blocking one
under the connection's lock). No event loop here: the shared coroutines await only what the
driver supplies, and the blocking driver's never suspend.
"""

from __future__ import annotations

import math
import ssl
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from .._calls import HeaderListTooLarge
from .._engine import GrpcConnection
from .._events import (
    CallFinished,
    ConnectionBroken,
    GoAwayReceived,
    PingAcknowledged,
    StreamCapacityChanged,
)
from .._failure import FailureKind
from .._status import StatusCode
from ._base import (
    CLOSED_REASON,
    MAX_TRANSPARENT_ATTEMPTS,
    Attempt,
    ChannelBase,
    ChannelOptions,
    EndedBeforeUse,
    Endpoint,
    RpcError,
    closed_error,
    conn_reason,
    connect_error,
    describe_io_error,
    no_alpn_h2_error,
)
from ._sending import Buffers, take_output
from ._tls import HANDSHAKE_EOF, Tls

if TYPE_CHECKING:
    from typing_extensions import Unpack

_ENHANCE_YOUR_CALM = 0xB
_TOO_MANY_PINGS = b"too_many_pings"


class CallWaiter(Protocol):
    """A caller waiting for its call's result, as the driver parks it."""

    stream_id: int
    done: bool  # finished, or given up by its caller

    def finish(self, result: CallFinished) -> None:
        """Hand the caller its result and wake it (nothing if it is done already)."""


W = TypeVar("W", bound=CallWaiter)
ConnT = TypeVar("ConnT", bound="ConnectionCore[Any]")
TransportT = TypeVar("TransportT")


class ConnectionCore(Generic[W]):
    """One HTTP/2 connection's shared state; a driver subclass does its I/O and wake-ups."""

    def __init__(
        self, proto: GrpcConnection, channel: ChannelCore[Any, Any], tls: Tls | None
    ) -> None:
        self.proto = proto
        self.waiters: dict[int, W] = {}
        self.dead = False
        self.reason = ""
        # The socket refused our bytes (reset by the server): no new calls, and what is left
        # to read is read before the connection dies (see _write_failed).
        self.write_failed: str | None = None
        self.broke_protocol = False  # the server's bytes were not HTTP/2 as it must speak it
        # The newest stream started, and the newest whose request bytes went (at least in part)
        # to the socket: when the connection dies, the calls above `written_through` provably
        # never left this client, and may go out again on another connection.
        self.last_started = 0
        self.written_through = 0
        self._channel = channel
        self._tls = tls

    # -- what a driver supplies -----------------------------------------------------------------

    def _ended(self, goodbye: bool) -> None:
        """`die` has failed every call: wake every caller parked on this connection and stop
        its I/O (with a GOAWAY first when `goodbye`, if the driver does not always send one)."""
        raise NotImplementedError

    def unpark_all(self) -> None:
        """Wake every caller parked for a stream: this connection takes no new calls."""
        raise NotImplementedError

    def _streams_freed(self, capacity_changed: bool, finished: int) -> None:
        """After a read: `finished` calls ended, and the server's stream limit may let parked
        callers start (`capacity_changed`); wake as many as may."""
        raise NotImplementedError

    def _ping_acknowledged(self, opaque: bytes) -> None:
        raise NotImplementedError

    def _read_before_dying(self, reason: str) -> None:
        """A write failed with a reset: let what the server sent before it be read, then die
        with `reason` (see _write_failed)."""
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        return not self.dead and self.write_failed is None and self.proto.usable

    def open_stream(self, call: Attempt, deadline: float, now: float) -> int:
        """Start `call`, its grpc-timeout what is left until `deadline`; returns the stream id.
        A connection that cannot start one is ended (RpcError); a call whose headers are over
        the server's header list limit fails alone (RpcError TOO_LARGE), nothing sent."""
        try:
            stream_id = self.proto.start_call(
                call.method,
                call.request,
                timeout=deadline - now if deadline != math.inf else None,
                metadata=call.metadata,
            )
        except HeaderListTooLarge as exc:  # nothing was queued: the connection is as it was
            raise RpcError(StatusCode.RESOURCE_EXHAUSTED, str(exc), FailureKind.TOO_LARGE) from None
        except Exception as exc:
            self.die(f"cannot start a call: {exc!r}")
            raise RpcError(
                StatusCode.UNAVAILABLE, conn_reason(exc), FailureKind.CONNECTION
            ) from exc
        self.last_started = stream_id
        if self.proto.draining:  # its stream ids ran out: later calls go elsewhere
            self._channel._retire(self)
        return stream_id

    def _output(self) -> Buffers:
        """What the engine queued for the socket (encrypted with TLS), as buffers to send."""
        return take_output(self.proto, self._tls)

    def _received(self, data: bytes | bytearray) -> bool:
        """Feed bytes from the socket and act on the events; False once the connection has
        ended (broken, or drained after GOAWAY)."""
        if self._tls is not None:
            try:
                data = self._tls.decrypt(data)
            except ssl.SSLError as exc:  # a broken record: the connection is unusable
                self.die(describe_io_error(exc))
                return False
            if not data:
                return True
        capacity_changed = False
        finished = 0
        for event in self.proto.receive_data(bytes(data)):
            if type(event) is CallFinished:
                self._deliver(event)
                finished += 1
            elif type(event) is StreamCapacityChanged:
                capacity_changed = True
            elif type(event) is PingAcknowledged:
                self._ping_acknowledged(event.opaque)
            elif type(event) is GoAwayReceived:
                self._channel.goaway_received(self, event)
            elif type(event) is ConnectionBroken:
                self.broke_protocol = True
                self.die(event.reason)
                return False
        if capacity_changed or finished:
            self._streams_freed(capacity_changed, finished)
        if self.proto.draining and self.proto.active_calls == 0:
            self.die("connection drained after GOAWAY", goodbye=True)
            return False
        return True

    def _deliver(self, finished: CallFinished) -> None:
        waiter = self.waiters.pop(finished.stream_id, None)
        if waiter is not None:
            waiter.finish(finished)

    def _reset_call(self, waiter: W) -> bool:
        """The caller gave up (cancelled, or its deadline passed): forget its call and queue
        its stream's reset; True when it was in flight on this live connection."""
        waiter.done = True
        if self.waiters.pop(waiter.stream_id, None) is None or self.dead:
            return False
        self.proto.cancel_call(waiter.stream_id)
        return True

    def _write_failed(self, exc: BaseException) -> None:
        """A write failed with `exc` (the OS or TLS error itself). A server that reset the
        connection (nginx ending a TLS connection on reload) may have sent answers and a GOAWAY
        naming the calls it never processed just before: the connection takes no new calls,
        and those are read (the answered calls succeed, those above the GOAWAY go out again)
        before the connection dies."""
        reason = describe_io_error(exc)
        if not isinstance(exc, ConnectionError) or self.write_failed is not None:
            self.die(reason)  # a stalled or broken socket: nothing more will come either
            return
        self.write_failed = reason
        self._channel._retire(self)
        self._read_before_dying(reason)

    def die(self, reason: str, *, goodbye: bool = False) -> None:
        """Fail every waiting call with UNAVAILABLE and end the connection."""
        if self.dead:
            return
        self.dead = True
        self.reason = reason
        # Requests still queued in the engine are dropped unsent (only a closing GOAWAY goes
        # out), so the calls they belong to may be sent again.
        self.proto.data_to_send()
        written = self.written_through
        for finished in self.proto.connection_lost(reason):
            if finished.stream_id > written and finished.error_kind is FailureKind.CONNECTION:
                finished = CallFinished(
                    finished.stream_id,
                    StatusCode.UNAVAILABLE,
                    f"{reason} (before the request was sent)",
                    None,
                    FailureKind.UNSENT,
                )
            self._deliver(finished)
        for waiter in self.waiters.values():  # defensive: nothing should be left
            waiter.finish(
                CallFinished(
                    waiter.stream_id, StatusCode.UNAVAILABLE, reason, None, FailureKind.CONNECTION
                )
            )
        self.waiters.clear()
        self._channel.forget(self)
        self._ended(goodbye)

    def close(self, reason: str) -> None:
        """`die`, from outside the driver's own I/O (the channel closing)."""
        self.die(reason)

    def died_connecting(self) -> RpcError:
        """The error of a connect whose new connection died before the server's SETTINGS:
        dialled again (EndedBeforeUse) unless the server broke HTTP/2."""
        failure = RpcError if self.broke_protocol else EndedBeforeUse
        return failure(StatusCode.UNAVAILABLE, self.reason, FailureKind.CONNECT)


@dataclass(slots=True)
class Dialling(Generic[ConnT, TransportT]):
    """One connect attempt, as far as it got: what a failure closes, and what it is called."""

    own_deadline: float  # the call's own (inf: none); a trio caller's cancel scopes bound it too
    timeout: float | None  # the call's, for its deadline_exceeded
    limit: float  # the connect timeout's end, on the channel's clock
    transport: TransportT | None = None  # the TCP connection, once up
    conn: ConnT | None = None  # the connection, once TLS (if any) is up and the preface goes

    @property
    def deadline(self) -> float:
        """When the attempt gives up, for a driver that bounds each of its I/O itself."""
        return min(self.limit, self.own_deadline)


class ChannelCore(ChannelBase, Generic[ConnT, TransportT]):
    """A channel's connections to its endpoint; a driver subclass does their I/O and places
    calls."""

    def __init__(self, endpoint: Endpoint, **options: Unpack[ChannelOptions]) -> None:
        super().__init__(endpoint, **options)
        self._current: ConnT | None = None
        self._all: set[ConnT] = set()
        self._connects_ended = 0  # connect attempts that have ended, either way
        self._connect_failure: RpcError | None = None  # the latest attempt's, if it failed
        self._warned_too_many_pings = False

    # -- what a driver supplies -----------------------------------------------------------------

    def _connect_turn(
        self, own_deadline: float, timeout: float | None
    ) -> AbstractAsyncContextManager[object]:
        """One connect attempt at a time: held while connecting. Waiting for it ends at the
        call's own deadline (deadline_exceeded(timeout)) unless the driver's cancel scopes
        already bound it."""
        raise NotImplementedError

    def _connect_limit(
        self, dialling: Dialling[ConnT, TransportT]
    ) -> AbstractContextManager[object]:
        """Around a connect attempt: ends it at `dialling.limit`, raising the connect
        timeout's error (`_connect_timed_out`), or at the call's own deadline
        (deadline_exceeded) where the driver's cancel scopes do not already bound it."""
        raise NotImplementedError

    async def _open_transport(self, dialling: Dialling[ConnT, TransportT]) -> TransportT:
        """A TCP connection to the endpoint (the first address that answers; else the OSError
        of the first address, worded as the OS words it)."""
        raise NotImplementedError

    async def _send_handshake(self, dialling: Dialling[ConnT, TransportT], data: bytes) -> None:
        """Send TLS handshake bytes on `dialling.transport`."""
        raise NotImplementedError

    async def _receive_handshake(self, dialling: Dialling[ConnT, TransportT]) -> bytes:
        """What the server sent next on `dialling.transport` (b"" once it closed it)."""
        raise NotImplementedError

    async def _start_connection(
        self, dialling: Dialling[ConnT, TransportT], tls: Tls | None
    ) -> ConnT:
        """The connection on `dialling.transport`: set as `dialling.conn` as soon as it owns the
        transport, its preface sent, returned once the server's SETTINGS (its half of the
        preface: until it arrives its stream limit is unknown, and a peer that never sends it
        is not an HTTP/2 server; grpc-go waits for it too) arrived or the connection died."""
        raise NotImplementedError

    def _io_failure(self, exc: BaseException) -> BaseException | None:
        """The OSError or ssl.SSLError that `exc`, raised by the driver's I/O, is (unwrapped from
        its library's own exceptions); None for anything else (a cancellation, a bug)."""
        return exc if isinstance(exc, (OSError, ssl.SSLError)) else None

    async def _abandon_connect(self, dialling: Dialling[ConnT, TransportT], reason: str) -> None:
        """Close what a failed or cancelled attempt opened: the connection (dying of `reason`)
        or else the transport, so that no socket leaks."""
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------------

    async def _connect(self, own_deadline: float, timeout: float | None) -> ConnT:
        """A new connection, the server's SETTINGS received. Raises RpcError: EndedBeforeUse
        when the server ended it before use (see connect_error, died_connecting), and the
        connect timeout's error (_connect_timed_out)."""
        dialling: Dialling[ConnT, TransportT] = Dialling(
            own_deadline, timeout, self._now() + self._connect_timeout
        )
        try:
            with self._connect_limit(dialling):
                dialling.transport = await self._open_transport(dialling)
                tls = None
                if self.endpoint.ssl_context is not None:
                    tls = Tls(self.endpoint)
                    await self._tls_handshake(dialling, tls)
                    if not tls.alpn_h2:
                        raise no_alpn_h2_error()
                if self._closed:
                    raise closed_error()
                conn = await self._start_connection(dialling, tls)
                if conn.dead:
                    raise conn.died_connecting()
        except RpcError as exc:
            await self._abandon_connect(dialling, exc.details)
            raise
        except BaseException as exc:
            cause = self._io_failure(exc)
            if cause is None:
                # Cancelled mid-connect (the caller's deadline or task): no socket leaks.
                await self._abandon_connect(dialling, "connect cancelled")
                raise
            failure = connect_error(cause, connected=dialling.transport is not None)
            await self._abandon_connect(dialling, failure.details)
            raise failure from exc
        return conn

    async def _tls_handshake(self, dialling: Dialling[ConnT, TransportT], tls: Tls) -> None:
        done, data = tls.handshake_step()
        while True:
            if data:
                await self._send_handshake(dialling, data)
            if done:
                return
            received = await self._receive_handshake(dialling)
            if not received:
                raise ConnectionResetError(HANDSHAKE_EOF)
            done, data = tls.handshake_step(received)

    def forget(self, conn: ConnT) -> None:
        """Stop placing new calls on `conn` (GOAWAY or death)."""
        if self._current is conn:
            self._current = None
        if conn.dead:
            self._all.discard(conn)

    def _retire(self, conn: ConnT) -> None:
        """`conn` takes no new calls: the next call opens one new connection, and the callers
        parked for a stream on `conn` move to it; `conn`'s own calls finish where they are."""
        self.forget(conn)
        conn.unpark_all()

    def goaway_received(self, conn: ConnT, event: GoAwayReceived) -> None:
        self._log.debug(
            "sepp: server sent GOAWAY (last stream %d, error code %d); draining its connection",
            event.last_stream_id,
            event.error_code,
        )
        self._retire(conn)
        interval = self.keepalive_interval
        if (
            event.error_code == _ENHANCE_YOUR_CALM
            and event.debug_data == _TOO_MANY_PINGS
            and interval is not None
        ):
            # gRFC A8: the server thinks we ping too often; back off on later connections.
            self.keepalive_interval = interval * 2
            if self._warned_too_many_pings:
                log = self._log.debug
            else:
                self._warned_too_many_pings = True
                log = self._log.warning
            log(
                "sepp: the server ended a connection for too many pings (GOAWAY "
                "too_many_pings); keepalive interval doubled to %gs",
                interval * 2,
            )

    async def connect(self) -> None:
        """Open a connection now (calls otherwise connect on first use); raises RpcError."""
        await self._ready_connection()

    async def _ready_connection(
        self, own_deadline: float = math.inf, timeout: float | None = None
    ) -> ConnT:
        """The connection new calls go on, connecting if there is none; raises RpcError."""
        conn = self._current
        if conn is not None and conn.usable:
            return conn
        ended = self._connects_ended
        async with self._connect_turn(own_deadline, timeout):
            conn = self._current
            if conn is not None and conn.usable:
                return conn
            failure = self._connect_failure
            if failure is not None and self._connects_ended != ended:
                # An attempt under way (or queued) when we came just failed: share its verdict
                # instead of queueing up one more full connect timeout per waiting call.
                raise RpcError(failure.code, failure.details, failure.kind)
            self._connect_failure = None
            try:
                conn = await self._dial(own_deadline, timeout)
            except RpcError as exc:
                if exc.kind is not FailureKind.DEADLINE:  # the caller's time, not the server
                    self._connect_failure = exc
                raise
            finally:
                self._connects_ended += 1
            self._all.add(conn)  # before the check: a close() from now on closes it too
            if self._closed:  # close() ran while we were connecting
                conn.close(CLOSED_REASON)
                raise closed_error()
            self._current = conn
            return conn

    async def _dial(self, own_deadline: float, timeout: float | None) -> ConnT:
        """`_connect`, again if the server ends the new connection before any call went on it
        (an nginx worker exiting on reload took it): nothing was sent, so dialling is safe."""
        attempts = 1
        while True:
            if self._closed:
                raise closed_error()
            try:
                conn = await self._connect(own_deadline, timeout)
            except EndedBeforeUse:
                if attempts >= MAX_TRANSPARENT_ATTEMPTS:
                    raise
                attempts += 1
                continue
            self.connections_opened += 1
            return conn

    def close(self) -> None:
        """Fail in-flight calls, close every connection, refuse new calls."""
        self._closed = True
        for conn in list(self._all):
            conn.close(CLOSED_REASON)
        self._all.clear()
        self._current = None

    async def aclose(self) -> None:
        """Fail in-flight calls, close every connection, refuse new calls."""
        self.close()
