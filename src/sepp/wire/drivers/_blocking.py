"""The blocking driver for GrpcConnection, for `SyncClient`: plain sockets (TLS through
`ssl.SSLObject` and memory buffers), no event loop and no thread of its own.

The calling threads take turns as the connection's reader (leader/follower): the first caller
with a call in flight reads the socket and hands each result to its caller; when its own call
is done it passes the reader's role to another waiting caller. A lone caller thus sends and
reads its answer itself, with no thread hop. Deadlines are each caller's own (a timed wait);
keepalive pings go out while a reader waits on a silent connection.

What a connection does with what it reads, and how the channel connects, is the core's
(`_core`). `call`, `connect` and `aclose` are coroutine functions that never suspend (nor do
the core's coroutines here, `_connect` and `_connect_turn`): the shared client code awaits
them, and the blocking front end steps each operation to its end in one go.
"""

from __future__ import annotations

import math
import os
import queue
import select
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING

from .._engine import GrpcConnection
from .._events import CallFinished
from .._failure import FailureKind
from ._base import (
    CLOSED_REASON,
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
_POLL_IN = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP
_POLL_OUT = select.POLLOUT | select.POLLERR | select.POLLHUP
_WRITER_JOIN_S = 1.0  # a bound only: the shutdown wakes the writer at once


def _poll_ms(seconds: float) -> int:
    return -1 if seconds == math.inf else max(0, math.ceil(seconds * 1000))


class _Waiter:
    """One call in flight and the thread waiting for it. `wake` gets one item when the reader
    hands this caller its result or the reader's role (`done` or `lead`, set first).

    A SimpleQueue rather than a held Lock: on free-threaded CPython a blocked Lock.acquire()
    first spins (sched_yield, 40 times) while SimpleQueue.get() sleeps at once, and a
    follower waits for a round trip, far longer than any spin pays for."""

    __slots__ = ("deadline", "done", "lead", "result", "signalled", "stream_id", "wake")

    def __init__(self, stream_id: int, deadline: float) -> None:
        self.stream_id = stream_id
        self.deadline = deadline
        self.wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self.signalled = False
        self.lead = False  # this caller is (to become) the connection's reader
        self.done = False
        self.result: CallFinished | None = None

    def signal(self) -> None:  # under the connection's lock
        if not self.signalled:
            self.signalled = True
            self.wake.put(None)

    def finish(self, result: CallFinished) -> None:  # under the connection's lock
        if not self.done:
            self.result = result
            self.done = True
            self.signal()


class _BlockingConnection(ConnectionCore[_Waiter]):
    """One HTTP/2 connection over a non-blocking socket. `lock` guards the sans-IO connection,
    the TLS object and the call table (the core's methods run under it); `write_lock` keeps
    the socket's bytes in order."""

    def __init__(
        self,
        sock: socket.socket,
        tls: Tls | None,
        proto: GrpcConnection,
        channel: BlockingChannel,
    ) -> None:
        super().__init__(proto, channel, tls)
        self.sock = sock
        self.lock = threading.Lock()
        self.write_lock = threading.Lock()
        self.slots = threading.Condition(self.lock)  # callers waiting for a stream slot
        self.reading = False
        self._poll = select.poll()
        self._poll.register(sock, _POLL_IN)
        self._in_io = 0  # threads inside a socket call: the socket closes when none is
        self._closed = False
        self._writer: threading.Thread | None = None  # writes a late caller's unsent bytes
        self._heard_at = time.monotonic()  # when the server last sent anything
        self._ping: bytes | None = None  # an unanswered keepalive ping's payload
        self._ping_sent_at = 0.0
        self._ping_withheld_at = -math.inf  # when the ping policy last kept a ping back

    # -- sending --------------------------------------------------------------------------------

    def start(self, call: Attempt) -> _Waiter | None:
        """Open the call's stream and queue its request (`wait` sends it); None if this
        connection takes no new calls after all (died, or GOAWAY): the caller goes on to
        another one. Raises the deadline RpcError if no stream frees up in time."""
        own_deadline = call.own_deadline
        with self.lock:
            if not self.reading and not self.waiters:
                self._read_what_arrived()  # a GOAWAY or a close that came while idle
            while not (self.proto.can_start_call and self.write_failed is None):
                if not self.usable:
                    return None
                left = own_deadline - time.monotonic()
                if left <= 0:
                    raise deadline_exceeded(call.timeout)
                self.slots.wait(None if left == math.inf else left)
            stream_id = self.open_stream(call, own_deadline, time.monotonic())
            waiter = _Waiter(stream_id, own_deadline)
            self.waiters[stream_id] = waiter
            if not self.reading:
                self.reading = waiter.lead = True
        return waiter

    def flush(self, until: float = math.inf) -> None:
        """Send what the connection has queued, in order. Never waits for another thread's
        write: the thread writing sends what was queued meanwhile before it stops. A socket
        still full at `until` (the caller's deadline) is left to a writer thread."""
        with self.lock:
            if not self.write_lock.acquire(blocking=False):
                return  # the writer sends it
            written_before = self.written_through
            data = self._take_output()
            if not data:
                self.write_lock.release()
                return
            self._in_io += 1
        self._write(data, written_before, until)

    def _write(self, data: Buffers, written_before: int, until: float) -> None:
        """Holding `write_lock` and an `_in_io` count: send `data` and what is queued
        meanwhile. `written_before`: the mark to go back to if none of `data` leaves."""
        while True:
            try:
                failure, rest, sent = self._send_all(data, until)
            except BaseException:  # KeyboardInterrupt mid-write: a frame may be cut short
                with self.lock:
                    self.die("interrupted while writing")
                    self._in_io -= 1
                    self.write_lock.release()
                    self._close_if_unused()
                raise
            if failure is None and rest:
                # The caller's deadline passed with the server not reading: a thread of its
                # own writes the rest (the bytes' order holds), the caller goes.
                if sent:
                    written_before = self.written_through
                writer = threading.Thread(
                    target=self._write,
                    args=(rest, written_before, math.inf),
                    name="sepp-blocking-writer",
                    daemon=True,
                )
                with self.lock:
                    self._writer = writer
                writer.start()
                return
            with self.lock:
                if failure is not None:
                    if not sent:  # its requests never left: may go out again
                        self.written_through = written_before
                    self._write_failed(failure)
                    output: Buffers = []
                else:
                    written_before = self.written_through
                    output = self._take_output()
                if not output:
                    self._in_io -= 1
                    self.write_lock.release()
                    self._close_if_unused()
                    return
            data = output

    def _read_before_dying(self, reason: str) -> None:
        """Under the lock, after a failed send: what the server sent before its reset waits in
        the receive buffer; read it now unless a reader is at it (it reads it all, and meets
        the end)."""
        if not self.reading:
            self._read_what_arrived()
            self.die(reason)

    def _take_output(self) -> Buffers:
        """Under the lock: the bytes for the socket (encrypted with TLS), as buffers to send."""
        if self.dead or self.write_failed is not None:
            return []
        data = self._output()
        if data:
            self.written_through = self.last_started
        return data

    def _send_all(self, data: Buffers, until: float) -> tuple[OSError | None, Buffers, bool]:
        """Write `data` until all is sent or the clock reaches `until`; returns the error the
        socket gave (None: none), what was left unsent, and whether any byte went."""
        view = data
        sent = False
        poller: select.poll | None = None
        try:
            while view:
                try:
                    n = send_some(self.sock, view)
                    view = advance(view, n)
                    sent = sent or n > 0
                    continue
                except BlockingIOError:
                    pass
                if poller is None:
                    poller = select.poll()
                    poller.register(self.sock, _POLL_OUT)
                stall = self._channel.keepalive_timeout
                wait = min(stall, until - time.monotonic())
                if not poller.poll(_poll_ms(wait)):
                    if wait < stall:
                        return None, view, sent  # `until` came first
                    raise TimeoutError(f"the server took no bytes for {stall:g}s")
        except OSError as exc:
            return exc, view, sent
        return None, view, sent

    # -- waiting and reading --------------------------------------------------------------------

    def wait(self, me: _Waiter) -> CallFinished | None:
        """Block until the call's result arrives (None: its own deadline passed), reading the
        socket whenever this caller holds the reader's role. Sends the request first."""
        try:
            self.flush(me.deadline)
            if not me.lead:
                left = me.deadline - time.monotonic()
                try:
                    me.wake.get(timeout=None if left == math.inf else max(left, 0))
                except queue.Empty:  # the deadline passed, unless a signal came just then
                    with self.lock:
                        expired = not (me.lead or me.done)
                        if expired:
                            self._abandon(me)
                    if expired:
                        self.flush(me.deadline)  # the stream's reset
                        return None
                # Signalled, so no lock needed: a waiter is signalled once, after `done` or
                # `lead` is set, and a done waiter has left the table, so `lead` stays as
                # read. Handed the reader's role: _lead returns at once if the result is here.
                if not me.lead:
                    return me.result
            return self._lead(me)
        except BaseException:  # KeyboardInterrupt in the caller: give the call up
            self._interrupted(me)
            raise

    def _interrupted(self, me: _Waiter) -> None:
        with self.lock:
            if not me.done:
                self._abandon(me)
            handed_the_reading = me.lead  # and never got to _lead, which clears it
        if handed_the_reading:
            self._pass_the_reading_on(me)
        self.flush()

    def _lead(self, me: _Waiter) -> CallFinished | None:
        try:
            while True:
                with self.lock:
                    if me.done:
                        return me.result
                    if self.dead:  # pragma: no cover - die() finishes every waiter
                        return me.result
                    now = time.monotonic()
                    if now >= me.deadline:
                        self._abandon(me)
                        expired = True
                    else:
                        expired = False
                        # After a failed write only what the server sent before it ended the
                        # connection is left to read, and it is here already: no waiting.
                        until = now if self.write_failed else self._keepalive_due(now)
                        self._in_io += 1
                if expired:
                    self.flush(me.deadline)
                    return None
                failure = data = None
                try:
                    if self._poll.poll(_poll_ms(min(me.deadline, until) - now)):
                        data = self.sock.recv(_RECEIVE_BYTES)
                        if not data:
                            failure = "connection closed by the server"
                except BlockingIOError:
                    pass
                except OSError as exc:
                    failure = describe_io_error(exc)
                finally:
                    with self.lock:
                        self._in_io -= 1
                with self.lock:
                    if failure is not None:
                        self.die(failure)
                    elif data:
                        self._received(data)
                    elif self.write_failed is not None:
                        self.die(self.write_failed)
                    else:
                        self._keepalive_check(time.monotonic())
                self.flush(me.deadline)
        finally:
            self._pass_the_reading_on(me)

    def _pass_the_reading_on(self, me: _Waiter) -> None:
        with self.lock:
            me.lead = False
            self.reading = False
            if not self.dead:
                for waiter in self.waiters.values():
                    self.reading = waiter.lead = True
                    waiter.signal()
                    break
                else:
                    if self.write_failed is not None:  # no call is left to read for
                        self.die(self.write_failed)
            self._close_if_unused()

    def _read_what_arrived(self) -> None:
        """Under the lock, with no reader: take in what the server sent since the last call
        (without waiting), so a connection closed or drained while idle is not used."""
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
        self._received(data)
        if len(data) == _RECEIVE_BYTES and not self.dead:
            self._read_what_arrived()

    def _received(self, data: bytes | bytearray) -> bool:
        """Under the lock: feed bytes from the socket (see ConnectionCore._received)."""
        self._heard_at = time.monotonic()
        return super()._received(data)

    def _streams_freed(self, capacity_changed: bool, finished: int) -> None:
        if capacity_changed:
            self.slots.notify_all()
        else:
            self.slots.notify(finished)

    def unpark_all(self) -> None:  # under the lock
        self.slots.notify_all()

    def _ping_acknowledged(self, opaque: bytes) -> None:
        if opaque == self._ping:
            self._ping = None

    def _abandon(self, waiter: _Waiter) -> None:
        """Under the lock: the caller gave up (its deadline passed): reset the stream."""
        if self._reset_call(waiter):
            self.slots.notify()

    # -- keepalive ------------------------------------------------------------------------------

    def _keepalive_due(self, now: float) -> float:
        """When the reader must wake to ping, or to give up on an unanswered ping."""
        interval = self._channel.keepalive_interval
        if interval is None:
            return math.inf
        if self._ping is not None:
            return self._ping_sent_at + self._channel.keepalive_timeout
        return max(self._heard_at, self._ping_withheld_at) + interval

    def _keepalive_check(self, now: float) -> None:
        """Under the lock, after a read timed out: ping a silent connection, or end it."""
        interval = self._channel.keepalive_interval
        if interval is None:
            return
        if self._ping is not None:
            if now >= self._ping_sent_at + self._channel.keepalive_timeout:
                timeout = self._channel.keepalive_timeout
                self.die(f"keepalive ping not answered within {timeout:g}s")
        elif now >= max(self._heard_at, self._ping_withheld_at) + interval:
            opaque = os.urandom(8)
            if self.proto.send_ping(opaque):
                self._ping = opaque
                self._ping_sent_at = now
            else:  # the ping policy: none until a call's frames go out; look again later
                self._ping_withheld_at = now

    # -- ending ---------------------------------------------------------------------------------

    def _ended(self, goodbye: bool) -> None:
        """Under the lock, from die(): shut the socket (with a GOAWAY first when `goodbye`)."""
        self.slots.notify_all()
        if goodbye or self.reason == CLOSED_REASON:
            self._say_goodbye()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a reader blocked on this socket
        except OSError:
            pass
        self._close_if_unused()

    def _say_goodbye(self) -> None:
        """Best effort: a GOAWAY, if the socket takes it at once."""
        try:
            self.proto.close()
            data = b"".join(self._output())
            if data and not self._in_io:
                self.sock.send(data)
        except Exception:
            pass

    def _close_if_unused(self) -> None:
        if self.dead and not self._in_io and not self._closed:
            self._closed = True
            self.sock.close()

    def close(self, reason: str) -> None:
        with self.lock:
            self.die(reason)
            writer = self._writer
        # A writer thread holds the socket until its send fails on the shutdown just done:
        # wait for it, so that the socket is closed when close() returns.
        if writer is not None and writer is not threading.current_thread():
            writer.join(_WRITER_JOIN_S)


class BlockingChannel(ChannelCore[_BlockingConnection, socket.socket]):
    """Places unary calls from any number of threads on one shared HTTP/2 connection, opening
    a new one when needed."""

    def __init__(self, endpoint: Endpoint, **options: Unpack[ChannelOptions]) -> None:
        super().__init__(endpoint, **options)
        self._connect_lock = threading.Lock()

    def _now(self) -> float:
        return time.monotonic()

    @asynccontextmanager
    async def _connect_turn(
        self, own_deadline: float, timeout: float | None
    ) -> AsyncIterator[None]:
        left = max(own_deadline - time.monotonic(), 0)
        if not self._connect_lock.acquire(timeout=left if left != math.inf else -1):
            raise deadline_exceeded(timeout)
        try:
            yield
        finally:
            self._connect_lock.release()

    async def _attempt(self, call: Attempt) -> CallFinished | None:
        while True:
            conn = self._current
            try:
                if conn is None or not conn.usable:
                    conn = await self._ready_connection(call.own_deadline, call.timeout)
                waiter = conn.start(call)
            except RpcError as exc:
                if exc.kind is FailureKind.DEADLINE and call.unprocessed is not None:
                    # Nothing of this call was ever processed: say so, not "deadline".
                    raise unprocessed_error(call.unprocessed) from None
                raise
            if waiter is not None:
                return conn.wait(waiter)

    # -- connecting: the core's steps (`ChannelCore._connect`), each I/O bounded by the
    # attempt's deadline (the connect timeout's end, or the call's own if sooner) ------------

    @contextmanager
    def _connect_limit(
        self, dialling: Dialling[_BlockingConnection, socket.socket]
    ) -> Iterator[None]:
        try:
            yield
        except TimeoutError:
            if time.monotonic() >= dialling.limit or dialling.own_deadline > dialling.limit:
                raise self._connect_timed_out(dialling.conn is not None) from None
            raise deadline_exceeded(dialling.timeout) from None

    async def _open_transport(
        self, dialling: Dialling[_BlockingConnection, socket.socket]
    ) -> socket.socket:
        ep = self.endpoint
        sock = socket.create_connection(
            (ep.host, ep.port), timeout=max(dialling.deadline - time.monotonic(), 1e-3)
        )
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
        except BaseException:
            _close_quietly(sock)
            raise
        return sock

    async def _send_handshake(
        self, dialling: Dialling[_BlockingConnection, socket.socket], data: bytes
    ) -> None:
        sock = dialling.transport
        assert sock is not None
        sock.setblocking(True)
        sock.settimeout(max(dialling.deadline - time.monotonic(), 1e-3))
        try:
            sock.sendall(data)
        finally:
            sock.setblocking(False)

    async def _receive_handshake(
        self, dialling: Dialling[_BlockingConnection, socket.socket]
    ) -> bytes:
        sock = dialling.transport
        assert sock is not None
        if not _wait_for(sock, _POLL_IN, dialling.deadline):
            raise TimeoutError
        return sock.recv(_RECEIVE_BYTES)

    async def _start_connection(
        self, dialling: Dialling[_BlockingConnection, socket.socket], tls: Tls | None
    ) -> _BlockingConnection:
        sock = dialling.transport
        assert sock is not None
        proto = self.new_protocol()
        conn = dialling.conn = _BlockingConnection(sock, tls, proto, self)
        conn.flush()
        while not proto.remote_settings_received and not conn.dead:
            if not _wait_for(sock, _POLL_IN, dialling.deadline):
                raise TimeoutError
            with conn.lock:
                conn._read_what_arrived()
            conn.flush()
        return conn

    async def _abandon_connect(
        self, dialling: Dialling[_BlockingConnection, socket.socket], reason: str
    ) -> None:
        _close_quietly(dialling.transport)  # the connection, if any, has no call yet


def _wait_for(sock: socket.socket, events: int, deadline: float) -> bool:
    poller = select.poll()
    poller.register(sock, events)
    return bool(poller.poll(_poll_ms(deadline - time.monotonic())))


def _close_quietly(sock: socket.socket | None) -> None:
    if sock is not None:
        try:
            sock.close()
        except OSError:
            pass
