"""The trio driver for GrpcConnection: TCP/TLS, one reader, direct writes with a writer task
for what the socket cannot take at once, keepalive and call deadlines; what a connection does
with what it reads, and how the channel connects, is the core's (`_core`). Every socket, ssl,
h2 and trio failure is mapped to `RpcError`; background tasks never raise into the caller's
code.
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import trio

from .._engine import GrpcConnection
from .._events import CallFinished
from .._failure import FailureKind
from ._base import MAX_TRANSPARENT_ATTEMPTS as MAX_TRANSPARENT_ATTEMPTS
from ._base import (
    Attempt,
    ChannelOptions,
    Endpoint,
    RpcError,
    closed_error,
    conn_reason,
    deadline_exceeded,
)
from ._base import describe_io_error as _describe_io_error
from ._base import unprocessed_error as _unprocessed_error
from ._core import ChannelCore, ConnectionCore, Dialling
from ._sending import Buffers, advance, send_some
from ._tls import Tls

if TYPE_CHECKING:
    from typing_extensions import Unpack
from ._waiters import Deadlines, Waiter

__all__ = ["MAX_TRANSPARENT_ATTEMPTS", "Channel", "Endpoint", "RpcError", "conn_reason"]

_RECEIVE_BYTES = 256 * 1024
_GOAWAY_FLUSH_S = 0.25
# After a write fails because the server reset the connection, what it sent before (answers,
# a GOAWAY naming the calls it never processed) is still to be read: the reader has this long.
_READ_AFTER_WRITE_FAILURE_S = 1.0


class _Connection(ConnectionCore[Waiter]):
    """One live HTTP/2 connection and the tasks that drive it."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        proto: GrpcConnection,
        channel: Channel,
        tls: Tls | None = None,
    ) -> None:
        super().__init__(proto, channel, tls)
        self.stream = stream
        self.deadlines = Deadlines(self._expire)
        self.slots = trio.lowlevel.ParkingLot()
        self.cancel_scope = trio.CancelScope()
        # Set once the server's SETTINGS arrived (or the connection died before that).
        self.ready = trio.Event()
        self._wake = trio.Event()
        # Bytes the socket did not take at once; while any wait, only the writer task sends.
        self._backlog: Buffers = []
        self._writing = False
        self._raw = _raw_socket(stream)
        self._ping_acks: dict[bytes, trio.Event] = {}

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

    def _ended(self, goodbye: bool) -> None:
        # run() sends a GOAWAY and closes the stream as its tasks end.
        self.ready.set()
        self.slots.unpark_all()
        self.cancel_scope.cancel()

    def unpark_all(self) -> None:
        self.slots.unpark_all()

    def _streams_freed(self, capacity_changed: bool, finished: int) -> None:
        if capacity_changed:
            if self.proto.remote_settings_received:
                self.ready.set()
            self.wake_parked()

    def _ping_acknowledged(self, opaque: bytes) -> None:
        ack = self._ping_acks.pop(opaque, None)
        if ack is not None:
            ack.set()

    def _read_before_dying(self, reason: str) -> None:
        # The reader takes in what is left until it meets the reset; the writer stops writing
        # and ends the connection after _READ_AFTER_WRITE_FAILURE_S.
        self._wake.set()

    def abandon(self, waiter: Waiter) -> None:
        """The caller gave up (cancelled, or its deadline passed): reset the stream."""
        if self._reset_call(waiter):
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
                if not self._received(data):
                    return
                self.flush()
        except Exception as exc:
            self.die(_describe_io_error(_cause(exc)))

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
            self._write_failed(_cause(exc))
        if self.write_failed is not None:
            await trio.sleep(_READ_AFTER_WRITE_FAILURE_S)
            self.die(self.write_failed)

    async def _keepalive(self) -> None:
        interval = self._channel.keepalive_interval
        timeout = self._channel.keepalive_timeout
        assert interval is not None
        while True:
            await trio.sleep(interval)
            opaque = os.urandom(8)
            try:
                sent = self.proto.send_ping(opaque)
            except Exception as exc:
                self.die(f"cannot send keepalive ping: {exc!r}")
                return
            if not sent:  # the ping policy: none until a call's frames go out; look again later
                continue
            ack = trio.Event()
            self._ping_acks[opaque] = ack
            self.flush()
            with trio.move_on_after(timeout):
                await ack.wait()
            if not ack.is_set():
                self.die(f"keepalive ping not answered within {timeout:g}s")
                return


def _cause(exc: BaseException) -> BaseException:
    """What broke under trio's BrokenResourceError wrapper (the OSError or ssl.SSLError)."""
    if isinstance(exc, trio.BrokenResourceError) and exc.__cause__ is not None:
        return exc.__cause__
    return exc


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


class Channel(ChannelCore[_Connection, trio.abc.Stream]):
    """Places unary calls on one shared HTTP/2 connection, opening a new one when needed;
    its connections' tasks run in `nursery`."""

    def __init__(
        self, endpoint: Endpoint, nursery: trio.Nursery, **options: Unpack[ChannelOptions]
    ) -> None:
        super().__init__(endpoint, **options)
        self._nursery = nursery
        self._connect_lock = trio.Lock()

    def _now(self) -> float:
        return trio.current_time()

    def _connect_turn(self, own_deadline: float, timeout: float | None) -> trio.Lock:
        return self._connect_lock  # the caller's cancel scope bounds the wait

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
        stream_id = conn.open_stream(call, deadline, trio.current_time())
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

    # -- connecting: the core's steps (`ChannelCore._connect`), on trio's streams --------------

    @contextmanager
    def _connect_limit(self, dialling: Dialling[_Connection, trio.abc.Stream]) -> Iterator[None]:
        # The call's own deadline reaches this through the caller's cancel scope.
        try:
            with trio.fail_after(self._connect_timeout):
                yield
        except trio.TooSlowError:
            raise self._connect_timed_out(connected=dialling.conn is not None) from None

    async def _open_transport(
        self, dialling: Dialling[_Connection, trio.abc.Stream]
    ) -> trio.abc.Stream:
        return await trio.open_tcp_stream(self.endpoint.host, self.endpoint.port)

    async def _send_handshake(
        self, dialling: Dialling[_Connection, trio.abc.Stream], data: bytes
    ) -> None:
        assert dialling.transport is not None
        await dialling.transport.send_all(data)

    async def _receive_handshake(self, dialling: Dialling[_Connection, trio.abc.Stream]) -> bytes:
        assert dialling.transport is not None
        return bytes(await dialling.transport.receive_some(_RECEIVE_BYTES))

    async def _start_connection(
        self, dialling: Dialling[_Connection, trio.abc.Stream], tls: Tls | None
    ) -> _Connection:
        stream = dialling.transport
        assert stream is not None
        proto = self.new_protocol()
        preface = proto.data_to_send()
        await stream.send_all(preface if tls is None else tls.encrypt(preface))
        conn = dialling.conn = _Connection(stream, proto, self, tls)
        try:
            await self._nursery.start(conn.run)
        except RuntimeError as exc:  # the client's nursery is closing
            dialling.conn = None
            raise closed_error() from exc
        await conn.ready.wait()
        return conn

    def _io_failure(self, exc: BaseException) -> BaseException | None:
        if isinstance(
            exc, (OSError, trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError)
        ):
            return _cause(exc)
        return None

    async def _abandon_connect(
        self, dialling: Dialling[_Connection, trio.abc.Stream], reason: str
    ) -> None:
        if dialling.conn is not None:
            dialling.conn.die(reason)  # its run() closes the stream
        else:
            await _close_quietly(dialling.transport)


async def _close_quietly(stream: trio.abc.Stream | None) -> None:
    if stream is not None:
        await trio.aclose_forcefully(stream)
