"""The asyncio driver for GrpcConnection (also under uvloop): a non-blocking socket watched with
the loop's `add_reader`/`add_writer`, no task of its own.

The loop calls the connection when the socket is readable: it reads, feeds the core (which
hands each result to its caller's future) and sends what the engine queued, all in that one
callback. Callers write straight to the socket; what it cannot take at once waits for a
writable callback. Deadlines and keepalive are the loop's timers. TLS is `_tls`'s memory BIO, as
for the other drivers, rather than an asyncio transport's: a transport closes its read side on
a failed write, and the core must still read what the server sent before resetting the
connection (nginx's answers and GOAWAY on reload). What a connection does with what it reads,
and how the channel connects, is the core's (`_core`).
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .._engine import GrpcConnection
from .._events import CallFinished
from .._failure import FailureKind
from .._status import StatusCode
from ._asyncio_scopes import MoveOnAt, enclosing_deadline
from ._base import (
    Attempt,
    ChannelOptions,
    Endpoint,
    RpcError,
    deadline_exceeded,
    describe_io_error,
    unprocessed_error,
)
from ._core import ChannelCore, ConnectionCore, Dialling
from ._sending import Buffers, advance, send_some
from ._tls import Tls

if TYPE_CHECKING:
    from typing_extensions import Unpack

_RECEIVE_BYTES = 256 * 1024
# After a write fails because the server reset the connection, what it sent before is still to
# be read: the reader has this long (as in the trio driver).
_READ_AFTER_WRITE_FAILURE_S = 1.0


class _Waiter:
    """One call in flight: the future its caller awaits, and its result once it has one."""

    __slots__ = ("deadline", "done", "future", "result", "stream_id", "timer")

    def __init__(self, stream_id: int, deadline: float, future: asyncio.Future[None]) -> None:
        self.stream_id = stream_id
        self.deadline = deadline
        self.future = future
        self.result: CallFinished | None = None  # None when its own deadline passed
        self.done = False
        self.timer: asyncio.TimerHandle | None = None

    def finish(self, result: CallFinished) -> None:
        if not self.done:
            self.done = True
            self.result = result
            if self.timer is not None:
                self.timer.cancel()
            if not self.future.done():
                self.future.set_result(None)


class _Slots:
    """Callers waiting for a stream slot (trio's ParkingLot, with futures)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._parked: deque[asyncio.Future[None]] = deque()

    async def park(self) -> None:
        future = self._loop.create_future()
        self._parked.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.unpark(1)  # woken, then cancelled: the wake-up goes to the next caller
            else:
                future.cancel()
                self._parked.remove(future)
            raise

    def unpark(self, count: int) -> None:
        while count and self._parked:
            future = self._parked.popleft()
            if not future.done():
                future.set_result(None)
                count -= 1

    def unpark_all(self) -> None:
        self.unpark(len(self._parked))


class _Connection(ConnectionCore[_Waiter]):
    """One live HTTP/2 connection, driven by the loop's callbacks on its socket."""

    def __init__(
        self,
        sock: socket.socket,
        proto: GrpcConnection,
        channel: AsyncioChannel,
        tls: Tls | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        super().__init__(proto, channel, tls)
        self.sock = sock
        self.loop = loop
        self.slots = _Slots(loop)
        self.ready = loop.create_future()  # SETTINGS arrived, or the connection died first
        self._fd = sock.fileno()
        self._backlog: Buffers = []  # bytes the socket did not take at once
        self._writing = False  # a writable callback is waiting to send the backlog
        self._flush_due = False  # a flush is scheduled for the loop's next pass
        self._timers: set[asyncio.TimerHandle] = set()
        self._ping: bytes | None = None
        self._ping_timer: asyncio.TimerHandle | None = None
        loop.add_reader(self._fd, self._readable)
        interval = channel.keepalive_interval
        if interval is not None:
            self._ping_timer = loop.call_later(interval, self._send_ping)

    # -- reading and writing --------------------------------------------------------------------

    def _readable(self) -> None:
        try:
            data = self.sock.recv(_RECEIVE_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.die(describe_io_error(exc))
            return
        if not data:
            self.die("connection closed by the server")
            return
        try:
            if self._received(data):
                self.flush()
        except Exception as exc:  # pragma: no cover - the engine maps its own errors
            self.die(f"internal error in connection: {exc!r}")

    def flush(self) -> None:
        """Send what the connection has queued, from the caller's own task when the socket
        takes it at once, else from a writable callback (bytes stay in order)."""
        if self._writing or self.dead or self.write_failed is not None:
            return
        data = self._output()
        if not data:
            return
        self.written_through = self.last_started
        self._send(data)

    def flush_soon(self) -> None:
        """Flush on the loop's next pass: calls started in this one (callers woken by one
        read) share one write."""
        if not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_due = False
        self.flush()

    def _send(self, data: Buffers) -> None:
        try:
            while data:
                data = advance(data, send_some(self.sock, data))
        except BlockingIOError:
            self._backlog = data
            if not self._writing:
                self._writing = True
                self.loop.add_writer(self._fd, self._writable)
        except OSError as exc:
            self._write_failed(exc)

    def _writable(self) -> None:
        data = self._backlog + self._output()
        self._backlog = []
        self.written_through = self.last_started
        self._writing = False
        self.loop.remove_writer(self._fd)
        if data and not self.dead:
            self._send(data)

    # -- what the core asks of a driver ---------------------------------------------------------

    def _ended(self, goodbye: bool) -> None:
        if not self.ready.done():
            self.ready.set_result(None)
        self.slots.unpark_all()
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        if self._ping_timer is not None:
            self._ping_timer.cancel()
        loop = self.loop
        try:
            loop.remove_reader(self._fd)
            if self._writing:
                loop.remove_writer(self._fd)
        except Exception:  # pragma: no cover - a loop already closed
            pass
        try:  # best effort: a GOAWAY, if the socket takes it at once
            self.proto.close()
            data = b"".join(self._backlog + self._output())
            if data and self.write_failed is None:
                self.sock.send(data)
        except Exception:
            pass
        self._backlog = []
        self.sock.close()

    def unpark_all(self) -> None:
        self.slots.unpark_all()

    def _streams_freed(self, capacity_changed: bool, finished: int) -> None:
        if capacity_changed:
            if self.proto.remote_settings_received and not self.ready.done():
                self.ready.set_result(None)
            self.wake_parked()

    def wake_parked(self) -> None:
        """As many parked callers as may start a stream now (all, if none can start here)."""
        if not self.proto.usable:
            self.slots.unpark_all()
            return
        free = self.proto.free_streams
        if free:
            self.slots.unpark(free)

    def _ping_acknowledged(self, opaque: bytes) -> None:
        if opaque == self._ping:
            self._ping = None
            interval = self._channel.keepalive_interval
            if self._ping_timer is not None:
                self._ping_timer.cancel()
            if interval is not None and not self.dead:
                self._ping_timer = self.loop.call_later(interval, self._send_ping)

    def _read_before_dying(self, reason: str) -> None:
        # The reader takes in what is left until it meets the reset; then, at the latest, die.
        self._timers.add(self.loop.call_later(_READ_AFTER_WRITE_FAILURE_S, self.die, reason))

    # -- keepalive and deadlines ----------------------------------------------------------------

    def _send_ping(self) -> None:
        if self.dead:
            return
        opaque = os.urandom(8)
        try:
            sent = self.proto.send_ping(opaque)
        except Exception as exc:
            self.die(f"cannot send keepalive ping: {exc!r}")
            return
        if not sent:  # the ping policy: none until a call's frames go out; look again later
            interval = self._channel.keepalive_interval
            if interval is not None:
                self._ping_timer = self.loop.call_later(interval, self._send_ping)
            return
        self._ping = opaque
        self.flush()
        timeout = self._channel.keepalive_timeout
        self._ping_timer = self.loop.call_later(timeout, self._ping_unanswered, opaque, timeout)

    def _ping_unanswered(self, opaque: bytes, timeout: float) -> None:
        if self._ping == opaque:
            self.die(f"keepalive ping not answered within {timeout:g}s")

    def abandon(self, waiter: _Waiter) -> None:
        """The caller gave up (cancelled, or its deadline passed): reset the stream."""
        if waiter.timer is not None:
            waiter.timer.cancel()
        if self._reset_call(waiter):
            self.flush()
            self.wake_parked()

    def _expire(self, waiter: _Waiter) -> None:
        self.abandon(waiter)
        if not waiter.future.done():
            waiter.future.set_result(None)  # result None: its own deadline passed

    async def wait(self, waiter: _Waiter) -> CallFinished | None:
        """Wait for the call's result (None: its own deadline passed)."""
        try:
            await waiter.future
        except asyncio.CancelledError:
            # The caller was cancelled: stop the call, and let the cancellation go on.
            self.abandon(waiter)
            raise
        return waiter.result


class AsyncioChannel(ChannelCore[_Connection, socket.socket]):
    """Places unary calls on one shared HTTP/2 connection from the tasks of one event loop,
    opening a new connection when needed."""

    def __init__(self, endpoint: Endpoint, **options: Unpack[ChannelOptions]) -> None:
        super().__init__(endpoint, **options)
        self._loop = asyncio.get_running_loop()
        self._connect_lock = asyncio.Lock()

    def _now(self) -> float:
        return self._loop.time()

    def _connect_turn(self, own_deadline: float, timeout: float | None) -> asyncio.Lock:
        return self._connect_lock  # _wait_for_slot's scope bounds the wait

    async def _attempt(self, call: Attempt) -> CallFinished | None:
        conn = self._current
        if conn is None or not conn.usable or not conn.proto.can_start_call:
            try:
                conn = await self._wait_for_slot(call.own_deadline, call.timeout)
            except RpcError as exc:
                if call.unprocessed is None or exc.kind is not FailureKind.DEADLINE:
                    raise
                # Nothing of this call was ever processed: say so, not "deadline".
                raise unprocessed_error(call.unprocessed) from None
        own_deadline = call.own_deadline
        loop = self._loop
        now = loop.time()
        enclosing = enclosing_deadline()
        deadline = min(own_deadline, enclosing)
        stream_id = conn.open_stream(call, deadline, now)
        waiter = _Waiter(stream_id, own_deadline, loop.create_future())
        waiters = conn.waiters
        waiters[stream_id] = waiter
        if own_deadline != math.inf:
            waiter.timer = loop.call_at(own_deadline, conn._expire, waiter)
        # A lone call writes at once; with others in flight, calls starting in the same pass
        # of the loop share one write.
        if len(waiters) == 1:
            conn.flush()
        else:
            conn.flush_soon()
        result = await conn.wait(waiter)
        if (
            enclosing < own_deadline
            and result is not None
            and result.code is StatusCode.CANCELLED
            and loop.time() >= enclosing
        ):
            # The server enforced the enclosing anyio scope's deadline (sent as grpc-timeout)
            # a moment before the scope itself: its cancellation is due, let it arrive, as
            # it would have had the answer come later.
            for _ in range(3):
                await asyncio.sleep(0)
        return result

    async def _wait_for_slot(self, own_deadline: float, timeout: float | None) -> _Connection:
        """The slow path: connect, or wait for a stream slot, within the call's deadline."""
        with MoveOnAt(own_deadline):
            conn = await self._ready_connection()
            while not conn.proto.can_start_call:
                if not conn.usable:
                    conn = await self._ready_connection()
                    continue
                await conn.slots.park()
            return conn
        raise deadline_exceeded(timeout)

    # -- connecting: the core's steps (`ChannelCore._connect`), on the loop's sockets ----------

    @contextmanager
    def _connect_limit(self, dialling: Dialling[_Connection, socket.socket]) -> Iterator[None]:
        # The call's own deadline reaches this through _wait_for_slot's scope.
        scope = MoveOnAt(dialling.limit)
        with scope:
            yield
        if scope.cancelled_caught:
            raise self._connect_timed_out(connected=dialling.conn is not None)

    async def _open_transport(
        self, dialling: Dialling[_Connection, socket.socket]
    ) -> socket.socket:
        return await _open_socket(self._loop, self.endpoint.host, self.endpoint.port)

    async def _send_handshake(
        self, dialling: Dialling[_Connection, socket.socket], data: bytes
    ) -> None:
        assert dialling.transport is not None
        await self._loop.sock_sendall(dialling.transport, data)

    async def _receive_handshake(self, dialling: Dialling[_Connection, socket.socket]) -> bytes:
        assert dialling.transport is not None
        return await self._loop.sock_recv(dialling.transport, _RECEIVE_BYTES)

    async def _start_connection(
        self, dialling: Dialling[_Connection, socket.socket], tls: Tls | None
    ) -> _Connection:
        assert dialling.transport is not None
        conn = _Connection(dialling.transport, self.new_protocol(), self, tls, self._loop)
        dialling.conn = conn
        conn.flush()  # the preface
        await conn.ready
        return conn

    async def _abandon_connect(
        self, dialling: Dialling[_Connection, socket.socket], reason: str
    ) -> None:
        if dialling.conn is not None:
            dialling.conn.die(reason)  # closes the socket
        elif dialling.transport is not None:
            dialling.transport.close()


async def _open_socket(loop: asyncio.AbstractEventLoop, host: str, port: int) -> socket.socket:
    """A connected non-blocking TCP socket (the first address that answers; else the first
    address's error, as the blocking driver words it)."""
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    first: OSError | None = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            if first is None:
                # Worded as the OS words it ("[Errno 111] Connection refused"), as the other
                # drivers' errors are, not asyncio's "Connect call failed (address)".
                errno = exc.errno
                first = type(exc)(errno, os.strerror(errno)) if errno else exc
            continue
        except BaseException:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise first or OSError(f"no address for {host}")
