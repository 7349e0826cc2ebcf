"""The trio driver for GrpcConnection: TCP/TLS, one reader, direct writes with a writer task
for what the socket cannot take at once, keepalive, call deadlines, and reconnect-on-next-call.
Every socket, ssl, h2 and trio failure is mapped here, once, to `RpcError`; background tasks
never raise into the caller's code.
"""

from __future__ import annotations

import os
import socket
import ssl
from typing import TYPE_CHECKING

import trio

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
from ._base import MAX_TRANSPARENT_ATTEMPTS as MAX_TRANSPARENT_ATTEMPTS
from ._base import (
    Attempt,
    ChannelBase,
    ChannelOptions,
    EndedBeforeUse,
    Endpoint,
    RpcError,
    closed_error,
    conn_reason,
    deadline_exceeded,
    ended_before_use,
    no_alpn_h2_error,
)
from ._base import describe_io_error as _describe_io_error
from ._base import unprocessed_error as _unprocessed_error
from ._sending import Buffers, advance, send_some, take_output
from ._tls import HANDSHAKE_EOF, Tls

if TYPE_CHECKING:
    from typing_extensions import Unpack
from ._waiters import Deadlines, Waiter

__all__ = ["MAX_TRANSPARENT_ATTEMPTS", "Channel", "Endpoint", "RpcError", "conn_reason"]

_RECEIVE_BYTES = 256 * 1024
_GOAWAY_FLUSH_S = 0.25
# After a write fails because the server reset the connection, what it sent before (answers,
# a GOAWAY naming the calls it never processed) is still to be read: the reader has this long.
_READ_AFTER_WRITE_FAILURE_S = 1.0


class _Connection:
    """One live HTTP/2 connection and the tasks that drive it."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        proto: GrpcConnection,
        channel: Channel,
        tls: Tls | None = None,
    ) -> None:
        self.stream = stream
        self.proto = proto
        self._tls = tls
        self.waiters: dict[int, Waiter] = {}
        self.deadlines = Deadlines(self._expire)
        self.slots = trio.lowlevel.ParkingLot()
        self.cancel_scope = trio.CancelScope()
        self.dead = False
        self.reason = ""
        # The socket refused our bytes (reset by the server): no new calls, and the reader
        # takes in what is left to read before the connection dies (see _write_failed).
        self.write_failed: str | None = None
        self.broke_protocol = False  # the server's bytes were not HTTP/2 as it must speak it
        # Set once the server's SETTINGS arrived (or the connection died before that).
        self.ready = trio.Event()
        self._channel = channel
        self._wake = trio.Event()
        # Bytes the socket did not take at once; while any wait, only the writer task sends.
        self._backlog: Buffers = []
        self._writing = False
        self._raw = _raw_socket(stream)
        self._ping_acks: dict[bytes, trio.Event] = {}
        # The newest stream started, and the newest whose request bytes went (at least in part)
        # to the socket: when the connection dies, the calls above `written_through` provably
        # never left this client, and may go out again on another connection.
        self.last_started = 0
        self.written_through = 0

    @property
    def usable(self) -> bool:
        return not self.dead and self.write_failed is None and self.proto.usable

    def flush(self, *, direct: bool = True) -> None:
        """Send what the connection has queued: straight from the calling task when the socket
        takes it all at once (no task switch), else through the writer task. With `direct`
        False the writer sends it: calls started together then share one write."""
        if self._writing or self._raw is None or not direct or self.write_failed:
            self._wake.set()
            return
        data = self._output()
        if not data:
            return
        try:
            sent = send_some(self._raw, data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._write_failed(exc)
            return
        self.written_through = self.last_started
        rest = advance(data, sent)
        if rest:
            self._backlog = rest
            self._writing = True
            self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            with self.cancel_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._reader)
                    nursery.start_soon(self._writer)
                    nursery.start_soon(self.deadlines.keep)
                    if self._channel.keepalive_interval is not None:
                        nursery.start_soon(self._keepalive)
                    task_status.started()
        except Exception as exc:  # pragma: no cover - the tasks catch their own errors
            self.die(f"internal error in connection task: {exc!r}")
        finally:
            self.die("connection closed")
            with trio.CancelScope(shield=True):
                await self._close_stream()

    def _output(self) -> Buffers:
        """What the engine queued for the socket (encrypted with TLS), as buffers to send."""
        return take_output(self.proto, self._tls)

    async def _send_all(self, data: Buffers) -> None:
        """Send every buffer, waiting while the socket is full (the writer task's write)."""
        raw = self._raw
        if raw is None:  # not a socket (tests' memory streams)
            await self.stream.send_all(b"".join(data))
            return
        assert isinstance(self.stream, trio.SocketStream)
        sock = self.stream.socket
        while data:
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                data = advance(data, send_some(raw, data))
            except BlockingIOError:
                await trio.lowlevel.wait_writable(sock)

    async def _close_stream(self) -> None:
        try:
            self.proto.close()
            data = b"".join(self._backlog + self._output())
            if data:
                with trio.move_on_after(_GOAWAY_FLUSH_S):
                    await self.stream.send_all(data)
        except Exception:
            pass  # best effort: the socket is going away anyway
        if self._raw is not None:
            self._raw.close()
        await trio.aclose_forcefully(self.stream)

    def die(self, reason: str) -> None:
        """Fail every waiting call with UNAVAILABLE and stop this connection's tasks."""
        if self.dead:
            return
        self.dead = True
        self.reason = reason
        self.ready.set()
        # Requests still queued in the engine are dropped unsent (only the GOAWAY that
        # _close_stream queues goes out), so the calls they belong to may be sent again.
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
        self.slots.unpark_all()
        self.cancel_scope.cancel()
        self._channel.forget(self)

    def _deliver(self, finished: CallFinished) -> None:
        waiter = self.waiters.pop(finished.stream_id, None)
        if waiter is not None:
            waiter.finish(finished)

    def abandon(self, waiter: Waiter) -> None:
        """The caller gave up (cancelled, or its deadline passed): reset the stream."""
        waiter.done = True
        if self.waiters.pop(waiter.stream_id, None) is not None and not self.dead:
            self.proto.cancel_call(waiter.stream_id)
            self.flush()
            self.wake_parked()

    def wake_parked(self) -> None:
        """Wake as many callers parked for a stream as may start one now (not all of them:
        each would find no stream and park again, O(parked) task switches per event). On a
        connection that takes no more calls (draining, stream ids spent), all of them: they
        go on to another connection."""
        if not self.proto.usable:
            self.slots.unpark_all()
            return
        free = self.proto.free_streams
        if free:
            self.slots.unpark(count=free)

    def _expire(self, waiter: Waiter) -> None:
        self.abandon(waiter)
        if waiter.parked:
            trio.lowlevel.reschedule(waiter.task)  # result None: its own deadline passed

    async def wait(self, waiter: Waiter) -> CallFinished | None:
        """Park until the call's result arrives (None: its own deadline passed)."""

        def abort(_: object) -> trio.lowlevel.Abort:
            # An enclosing cancel scope: stop the call, and let trio raise Cancelled.
            self.abandon(waiter)
            return trio.lowlevel.Abort.SUCCEEDED

        return await waiter.park(abort)

    async def _reader(self) -> None:
        stream = self.stream
        # Straight to the socket when there is one: SocketStream adds a context manager and
        # a conflict check per read.
        receive = stream.socket.recv if isinstance(stream, trio.SocketStream) else None
        data: bytes | bytearray
        try:
            while True:
                if receive is not None:
                    data = await receive(_RECEIVE_BYTES)
                else:
                    data = await stream.receive_some(_RECEIVE_BYTES)
                if not data:
                    self.die("connection closed by the server")
                    return
                if self._tls is not None:
                    data = self._tls.decrypt(data)  # ssl.SSLError: a broken record
                    if not data:
                        continue
                capacity_changed = False
                for event in self.proto.receive_data(bytes(data)):
                    if type(event) is CallFinished:
                        self._deliver(event)
                    elif type(event) is StreamCapacityChanged:
                        capacity_changed = True
                        if self.proto.remote_settings_received:
                            self.ready.set()
                    elif type(event) is PingAcknowledged:
                        ack = self._ping_acks.pop(event.opaque, None)
                        if ack is not None:
                            ack.set()
                    elif type(event) is GoAwayReceived:
                        self._channel.goaway_received(self, event)
                    elif type(event) is ConnectionBroken:
                        self.broke_protocol = True
                        self.die(event.reason)
                        return
                if capacity_changed:
                    self.wake_parked()
                if self.proto.draining and self.proto.active_calls == 0:
                    self.die("connection drained after GOAWAY")
                    return
                self.flush()
        except Exception as exc:
            self.die(_describe_io_error(exc))

    async def _writer(self) -> None:
        try:
            while self.write_failed is None:
                await self._wake.wait()
                self._wake = trio.Event()
                while self.write_failed is None:
                    data = self._backlog + self._output()
                    self._backlog = []
                    if not data:
                        break
                    self._writing = True
                    self.written_through = self.last_started
                    await self._send_all(data)
                self._writing = False
        except Exception as exc:
            self._write_failed(exc)
        if self.write_failed is not None:
            await trio.sleep(_READ_AFTER_WRITE_FAILURE_S)
            self.die(self.write_failed)

    def _write_failed(self, exc: BaseException) -> None:
        """A write failed. A server that reset the connection (nginx ending a TLS connection
        on reload) may have sent answers and a GOAWAY naming the calls it never processed just
        before: the connection takes no new calls, and the reader takes those in (the answered
        calls succeed, those above the GOAWAY go out again) until it meets the reset, or the
        writer ends the connection after _READ_AFTER_WRITE_FAILURE_S."""
        reason = _describe_io_error(exc)
        cause = exc.__cause__ if isinstance(exc, trio.BrokenResourceError) else exc
        if not isinstance(cause, ConnectionError) or self.write_failed is not None:
            self.die(reason)  # a stalled or broken socket: nothing more will come either
            return
        self.write_failed = reason
        self._channel._retire(self)
        self._wake.set()  # the writer stops writing and keeps the time

    async def _keepalive(self) -> None:
        interval = self._channel.keepalive_interval
        timeout = self._channel.keepalive_timeout
        assert interval is not None
        while True:
            await trio.sleep(interval)
            opaque = os.urandom(8)
            ack = trio.Event()
            self._ping_acks[opaque] = ack
            try:
                self.proto.send_ping(opaque)
            except Exception as exc:
                self.die(f"cannot send keepalive ping: {exc!r}")
                return
            self.flush()
            with trio.move_on_after(timeout):
                await ack.wait()
            if not ack.is_set():
                self.die(f"keepalive ping not answered within {timeout:g}s")
                return


def _raw_socket(stream: trio.abc.Stream) -> socket.socket | None:
    """A non-blocking stdlib twin of a TCP stream's socket, for sending without a task switch
    (TLS too: its records are encrypted before they reach the socket)."""
    if not isinstance(stream, trio.SocketStream):
        return None
    sock = stream.socket
    try:
        raw = socket.fromfd(sock.fileno(), sock.family, sock.type, sock.proto)
        raw.setblocking(False)
    except OSError:
        return None
    return raw


class Channel(ChannelBase):
    """Places unary calls on one shared HTTP/2 connection, opening a new one when needed;
    its connections' tasks run in `nursery`."""

    def __init__(
        self, endpoint: Endpoint, nursery: trio.Nursery, **options: Unpack[ChannelOptions]
    ) -> None:
        super().__init__(endpoint, **options)
        self._nursery = nursery
        self._current: _Connection | None = None
        self._all: set[_Connection] = set()
        self._connect_lock = trio.Lock()
        self._connect_attempts = 0
        # (code, details, kind) of the latest connect attempt, if it failed
        self._connect_failure: tuple[StatusCode, str, FailureKind | None] | None = None

    def _now(self) -> float:
        return trio.current_time()

    def forget(self, conn: _Connection) -> None:
        """Stop placing new calls on `conn` (GOAWAY or death)."""
        if self._current is conn:
            self._current = None
        if conn.dead:
            self._all.discard(conn)

    def _retire(self, conn: object) -> None:
        """`conn` takes no new calls: the next call opens one new connection, and the callers
        parked for a stream on `conn` move to it; `conn`'s own calls finish where they are."""
        assert isinstance(conn, _Connection)
        self.forget(conn)
        conn.slots.unpark_all()

    async def _attempt(self, call: Attempt) -> CallFinished | None:
        conn = self._current
        if conn is None or not conn.usable or not conn.proto.can_start_call:
            try:
                conn = await self._wait_for_slot(call.own_deadline, call.timeout)
            except RpcError as exc:
                if call.unprocessed is None or exc.kind is not FailureKind.DEADLINE:
                    raise
                # Nothing of this call was ever processed: say so, not "deadline" (which
                # would stop a retry policy, as if it might have been committed).
                raise _unprocessed_error(call.unprocessed) from None
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
        own_deadline = call.own_deadline
        deadline = min(own_deadline, trio.current_effective_deadline())
        stream_id = self.open_stream(conn, call, deadline, trio.current_time())
        waiter = Waiter(stream_id, own_deadline)
        waiters = conn.waiters
        waiters[stream_id] = waiter
        conn.deadlines.add(waiter, len(waiters))
        # A lone call writes at once; with others in flight, calls starting in the same
        # scheduler pass (typically woken by one read) share the writer task's next write.
        conn.flush(direct=len(waiters) == 1)
        return await conn.wait(waiter)

    async def _wait_for_slot(self, own_deadline: float, timeout: float | None) -> _Connection:
        """The slow path: connect, or wait for a stream slot, within the call's deadline."""
        with trio.move_on_at(own_deadline):
            conn = await self._ready_connection()
            while not conn.proto.can_start_call:
                if not conn.usable:
                    conn = await self._ready_connection()
                    continue
                await conn.slots.park()
            return conn
        raise deadline_exceeded(timeout)

    async def connect(self) -> None:
        """Open a connection now (calls otherwise connect on first use); raises RpcError."""
        await self._ready_connection()

    async def _ready_connection(self) -> _Connection:
        conn = self._current
        if conn is not None and conn.usable:
            return conn
        attempt = self._connect_attempts
        async with self._connect_lock:
            conn = self._current
            if conn is not None and conn.usable:
                return conn
            failure = self._connect_failure
            if failure is not None and self._connect_attempts != attempt:
                # An attempt made while we queued for the lock just failed: share its verdict
                # instead of queueing up one more full connect timeout per waiting call.
                raise RpcError(*failure)
            self._connect_attempts += 1
            self._connect_failure = None
            try:
                conn = await self._dial()
            except RpcError as exc:
                self._connect_failure = (exc.code, exc.details, exc.kind)
                raise
            if self._closed:  # aclose() ran while we were connecting
                conn.die("the client is closed")
                raise closed_error()
            self._current = conn
            self._all.add(conn)
            return conn

    async def _dial(self) -> _Connection:
        """`_connect`, again if the server ends the new connection before any call went on it
        (an nginx worker exiting on reload took it): nothing was sent, so dialling is safe."""
        for _ in range(MAX_TRANSPARENT_ATTEMPTS - 1):
            try:
                return await self._connect()
            except EndedBeforeUse:
                pass
        return await self._connect()

    async def _connect(self) -> _Connection:
        if self._closed:
            raise closed_error()
        ep = self.endpoint
        stream: trio.abc.Stream | None = None
        conn: _Connection | None = None
        try:
            with trio.fail_after(self._connect_timeout):
                stream = await trio.open_tcp_stream(ep.host, ep.port)
                tls = None
                if ep.ssl_context is not None:
                    tls = Tls(ep)
                    await _handshake(tls, stream)
                    if not tls.alpn_h2:
                        raise no_alpn_h2_error()
                proto = self.new_protocol()
                preface = proto.data_to_send()
                await stream.send_all(preface if tls is None else tls.encrypt(preface))
                conn = _Connection(stream, proto, self, tls)
                try:
                    await self._nursery.start(conn.run)
                except RuntimeError as exc:  # the client's nursery is closing
                    conn = None
                    raise closed_error() from exc
                # The server's SETTINGS frame is its half of the connection preface: until it
                # arrives its MAX_CONCURRENT_STREAMS is unknown, and a peer that never sends it is
                # not an HTTP/2 server. (grpc-go also waits for it before using a connection.)
                await conn.ready.wait()
                if conn.dead:
                    failure = RpcError if conn.broke_protocol else EndedBeforeUse
                    raise failure(StatusCode.UNAVAILABLE, conn.reason, FailureKind.CONNECT)
        except trio.TooSlowError:
            reason = self._connect_timeout_reason(connected=conn is not None)
            await _abandon_connect(stream, conn, reason)
            raise RpcError(StatusCode.UNAVAILABLE, reason, FailureKind.CONNECT) from None
        except RpcError as exc:
            await _abandon_connect(stream, conn, exc.details)
            raise
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError) as exc:
            await _abandon_connect(stream, conn, conn_reason(exc))
            ended = ended_before_use(exc, connected=stream is not None)
            failure = EndedBeforeUse if ended else RpcError
            raise failure(StatusCode.UNAVAILABLE, conn_reason(exc), FailureKind.CONNECT) from exc
        except BaseException:
            # Cancelled mid-connect (the caller's deadline or scope): do not leak the socket.
            await _abandon_connect(stream, conn, "connect cancelled")
            raise
        self.connections_opened += 1
        return conn

    async def aclose(self) -> None:
        """Fail in-flight calls, close every connection, refuse new calls."""
        self._closed = True
        for conn in list(self._all):
            conn.die("the client is closed")
        self._all.clear()
        self._current = None


async def _handshake(tls: Tls, stream: trio.abc.Stream) -> None:
    done, data = tls.handshake_step()
    while True:
        if data:
            await stream.send_all(data)
        if done:
            return
        received = await stream.receive_some(_RECEIVE_BYTES)
        if not received:
            raise ConnectionResetError(HANDSHAKE_EOF)
        done, data = tls.handshake_step(bytes(received))


async def _close_quietly(stream: trio.abc.Stream | None) -> None:
    if stream is not None:
        await trio.aclose_forcefully(stream)


async def _abandon_connect(
    stream: trio.abc.Stream | None, conn: _Connection | None, reason: str
) -> None:
    if conn is not None:
        conn.die(reason)  # its run() closes the stream
    else:
        await _close_quietly(stream)
