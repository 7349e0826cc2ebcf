"""The blocking driver for GrpcConnection, for `SyncClient`: plain sockets (TLS through
`ssl.SSLObject` and memory buffers), no event loop and no thread of its own.

The calling threads take turns as the connection's reader (leader/follower): the first caller
with a call in flight reads the socket and hands each result to its caller; when its own call
is done it passes the reader's role to another waiting caller. A lone caller thus sends and
reads its answer itself, with no thread hop. Deadlines are each caller's own (a timed wait);
keepalive pings go out while a reader waits on a silent connection.

`call`, `connect` and `aclose` are coroutine functions that never suspend: the shared client
code awaits them, and the blocking front end steps each operation to its end in one go.
"""

from __future__ import annotations

import math
import os
import queue
import select
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING

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
    MAX_TRANSPARENT_ATTEMPTS,
    Attempt,
    ChannelBase,
    ChannelOptions,
    EndedBeforeUse,
    Endpoint,
    RpcError,
    closed_error,
    conn_reason,
    deadline_exceeded,
    describe_io_error,
    ended_before_use,
    no_alpn_h2_error,
    unprocessed_error,
)
from ._sending import Buffers, advance, send_some, take_output
from ._tls import HANDSHAKE_EOF, Tls

if TYPE_CHECKING:
    from typing_extensions import Unpack

_RECEIVE_BYTES = 256 * 1024
_POLL_IN = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP
_POLL_OUT = select.POLLOUT | select.POLLERR | select.POLLHUP


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


class _BlockingConnection:
    """One HTTP/2 connection over a non-blocking socket. `lock` guards the sans-IO connection,
    the TLS object and the call table; `write_lock` keeps the socket's bytes in order."""

    def __init__(
        self,
        sock: socket.socket,
        tls: Tls | None,
        proto: GrpcConnection,
        channel: BlockingChannel,
    ) -> None:
        self.sock = sock
        self.proto = proto
        self.lock = threading.Lock()
        self.write_lock = threading.Lock()
        self.slots = threading.Condition(self.lock)  # callers waiting for a stream slot
        self.waiters: dict[int, _Waiter] = {}
        self.reading = False
        self.dead = False
        self.reason = ""
        # The socket refused our bytes (reset by the server); the reader empties the receive
        # buffer before the connection dies (see _send_failed).
        self.write_failed: str | None = None
        self.broke_protocol = False  # the server's bytes were not HTTP/2 as it must speak it
        self.last_started = 0
        self.written_through = 0  # as in the trio driver: above it, provably never sent
        self._channel = channel
        self._tls = tls
        self._poll = select.poll()
        self._poll.register(sock, _POLL_IN)
        self._in_io = 0  # threads inside a socket call: the socket closes when none is
        self._closed = False
        self._heard_at = time.monotonic()  # when the server last sent anything
        self._ping: bytes | None = None  # an unanswered keepalive ping's payload
        self._ping_sent_at = 0.0

    @property
    def usable(self) -> bool:
        return not self.dead and self.write_failed is None and self.proto.usable

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
                    raise deadline_exceeded(None)
                self.slots.wait(None if left == math.inf else left)
            stream_id = self._channel.open_stream(self, call, own_deadline, time.monotonic())
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
                writer.start()
                return
            with self.lock:
                if failure is not None:
                    if not sent:  # its requests never left: may go out again
                        self.written_through = written_before
                    self._send_failed(failure)
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

    def _send_failed(self, exc: OSError) -> None:
        """Under the lock: a send failed. A server that resets the connection (nginx ending
        a TLS connection on reload) may have sent responses and a GOAWAY naming the calls it
        never processed just before: they wait in the receive buffer, so read them before the
        calls fail (those answered succeed, those above the GOAWAY go out again)."""
        failure = describe_io_error(exc)
        if not isinstance(exc, ConnectionError) or self.write_failed is not None:
            self.die(failure)  # a stalled server: nothing more will come either
            return
        self.write_failed = failure
        self._channel._retire(self)
        if not self.reading:  # else the reader reads it all, and meets the end
            self._read_what_arrived()
            self.die(failure)

    def _take_output(self) -> Buffers:
        """Under the lock: the bytes for the socket (encrypted with TLS), as buffers to send."""
        if self.dead or self.write_failed is not None:
            return []
        data = take_output(self.proto, self._tls)
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

    def _received(self, data: bytes) -> None:
        """Under the lock: feed bytes from the socket, deliver what finished."""
        self._heard_at = time.monotonic()
        if self._tls is not None:
            try:
                data = self._tls.decrypt(data)
            except ssl.SSLError as exc:  # a broken record: the connection is unusable
                self.die(describe_io_error(exc))
                return
            if not data:
                return
        freed = 0
        for event in self.proto.receive_data(data):
            if type(event) is CallFinished:
                waiter = self.waiters.pop(event.stream_id, None)
                freed += 1
                if waiter is not None:
                    waiter.result = event
                    waiter.done = True
                    waiter.signal()
            elif type(event) is StreamCapacityChanged:
                self.slots.notify_all()
            elif type(event) is PingAcknowledged:
                if event.opaque == self._ping:
                    self._ping = None
            elif type(event) is GoAwayReceived:
                self._channel.goaway_received(self, event)
                self.slots.notify_all()
            elif type(event) is ConnectionBroken:
                self.broke_protocol = True
                self.die(event.reason)
                return
        if freed:
            self.slots.notify(freed)
        if self.proto.draining and self.proto.active_calls == 0:
            self.die("connection drained after GOAWAY", goodbye=True)

    def _abandon(self, waiter: _Waiter) -> None:
        """Under the lock: the caller gave up (its deadline passed): reset the stream."""
        waiter.done = True
        if self.waiters.pop(waiter.stream_id, None) is not None and not self.dead:
            self.proto.cancel_call(waiter.stream_id)
            self.slots.notify()

    # -- keepalive ------------------------------------------------------------------------------

    def _keepalive_due(self, now: float) -> float:
        """When the reader must wake to ping, or to give up on an unanswered ping."""
        interval = self._channel.keepalive_interval
        if interval is None:
            return math.inf
        if self._ping is not None:
            return self._ping_sent_at + self._channel.keepalive_timeout
        return self._heard_at + interval

    def _keepalive_check(self, now: float) -> None:
        """Under the lock, after a read timed out: ping a silent connection, or end it."""
        interval = self._channel.keepalive_interval
        if interval is None:
            return
        if self._ping is not None:
            if now >= self._ping_sent_at + self._channel.keepalive_timeout:
                timeout = self._channel.keepalive_timeout
                self.die(f"keepalive ping not answered within {timeout:g}s")
        elif now >= self._heard_at + interval:
            self._ping = os.urandom(8)
            self._ping_sent_at = now
            self.proto.send_ping(self._ping)

    # -- ending ---------------------------------------------------------------------------------

    def die(self, reason: str, *, goodbye: bool = False) -> None:
        """Under the lock: fail every waiting call with UNAVAILABLE and shut the socket (with a
        GOAWAY first when `goodbye`)."""
        if self.dead:
            return
        self.dead = True
        self.reason = reason
        # Requests still queued are dropped unsent, so their calls may be sent again.
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
            waiter = self.waiters.pop(finished.stream_id, None)
            if waiter is not None:
                waiter.result = finished
                waiter.done = True
                waiter.signal()
        for waiter in self.waiters.values():  # defensive: nothing should be left
            waiter.result = CallFinished(
                waiter.stream_id, StatusCode.UNAVAILABLE, reason, None, FailureKind.CONNECTION
            )
            waiter.done = True
            waiter.signal()
        self.waiters.clear()
        self.slots.notify_all()
        self._channel.forget(self)
        if goodbye or reason == _CLOSED:
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
            data = self.proto.data_to_send()
            if self._tls is not None:
                data = self._tls.encrypt(data)
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


_CLOSED = "the client is closed"


def _handshake(tls: Tls, sock: socket.socket, deadline: float) -> None:
    done, data = tls.handshake_step()
    while True:
        if data:
            sock.setblocking(True)
            sock.settimeout(max(deadline - time.monotonic(), 1e-3))
            try:
                sock.sendall(data)
            finally:
                sock.setblocking(False)
        if done:
            return
        if not _wait_for(sock, _POLL_IN, deadline):
            raise TimeoutError
        received = sock.recv(_RECEIVE_BYTES)
        if not received:
            raise ConnectionResetError(HANDSHAKE_EOF)
        done, data = tls.handshake_step(received)


class BlockingChannel(ChannelBase):
    """Places unary calls from any number of threads on one shared HTTP/2 connection, opening
    a new one when needed."""

    def __init__(self, endpoint: Endpoint, **options: Unpack[ChannelOptions]) -> None:
        super().__init__(endpoint, **options)
        self._current: _BlockingConnection | None = None
        self._all: set[_BlockingConnection] = set()
        self._connect_lock = threading.Lock()
        self._connects_ended = 0  # connect attempts that have ended, either way
        self._connect_failure: RpcError | None = None

    def _now(self) -> float:
        return time.monotonic()

    def forget(self, conn: _BlockingConnection) -> None:
        if self._current is conn:
            self._current = None
        if conn.dead:
            self._all.discard(conn)

    def _retire(self, conn: object) -> None:
        assert isinstance(conn, _BlockingConnection)
        self.forget(conn)

    async def _attempt(self, call: Attempt) -> CallFinished | None:
        while True:
            conn = self._current
            try:
                if conn is None or not conn.usable:
                    conn = self._ready_connection(call.own_deadline, call.timeout)
                waiter = conn.start(call)
            except RpcError as exc:
                if exc.kind is FailureKind.DEADLINE:
                    if call.unprocessed is not None:
                        # Nothing of this call was ever processed: say so, not "deadline".
                        raise unprocessed_error(call.unprocessed) from None
                    raise deadline_exceeded(call.timeout) from None
                raise
            if waiter is not None:
                return conn.wait(waiter)

    async def connect(self) -> None:
        """Open a connection now (calls otherwise connect on first use); raises RpcError."""
        self._ready_connection(math.inf, None)

    def _ready_connection(self, own_deadline: float, timeout: float | None) -> _BlockingConnection:
        conn = self._current
        if conn is not None and conn.usable:
            return conn
        ended = self._connects_ended
        left = max(own_deadline - time.monotonic(), 0)
        if not self._connect_lock.acquire(timeout=left if left != math.inf else -1):
            raise deadline_exceeded(timeout)
        try:
            conn = self._current
            if conn is not None and conn.usable:
                return conn
            failure = self._connect_failure
            if failure is not None and self._connects_ended != ended:
                # An attempt under way (or queued) when we came just failed: share its verdict.
                raise RpcError(failure.code, failure.details, failure.kind)
            self._connect_failure = None
            try:
                conn = self._dial(own_deadline, timeout)
            except RpcError as exc:
                if exc.kind is not FailureKind.DEADLINE:
                    self._connect_failure = exc
                raise
            finally:
                self._connects_ended += 1
            self._all.add(conn)  # before the check: a close() from now on closes it too
            if self._closed:  # close() ran while we were connecting
                conn.close(_CLOSED)
                raise closed_error()
            self._current = conn
            return conn
        finally:
            self._connect_lock.release()

    def _dial(self, own_deadline: float, timeout: float | None) -> _BlockingConnection:
        """`_connect`, again if the server ends the new connection before any call went on it
        (an nginx worker exiting on reload took it): nothing was sent, so dialing is safe."""
        for _ in range(MAX_TRANSPARENT_ATTEMPTS - 1):
            try:
                return self._connect(own_deadline, timeout)
            except EndedBeforeUse:
                pass
        return self._connect(own_deadline, timeout)

    def _connect(self, own_deadline: float, timeout: float | None) -> _BlockingConnection:
        if self._closed:
            raise closed_error()
        ep = self.endpoint
        limit = time.monotonic() + self._connect_timeout
        deadline = min(limit, own_deadline)
        sock: socket.socket | None = None
        tls: Tls | None = None
        connected = False
        try:
            sock = socket.create_connection(
                (ep.host, ep.port), timeout=max(deadline - time.monotonic(), 1e-3)
            )
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            if ep.ssl_context is not None:
                tls = Tls(ep)
                _handshake(tls, sock, deadline)
                if not tls.alpn_h2:
                    raise no_alpn_h2_error()
            connected = True  # a stall from here on is the missing SETTINGS
            proto = self.new_protocol()
            conn = _BlockingConnection(sock, tls, proto, self)
            conn.flush()
            # The server's SETTINGS is its half of the preface: until it arrives its stream
            # limit is unknown, and a peer that never sends it is not an HTTP/2 server.
            while not proto.remote_settings_received:
                if conn.dead:
                    raise _connect_failure(conn)
                if not _wait_for(sock, _POLL_IN, deadline):
                    raise TimeoutError
                with conn.lock:
                    conn._read_what_arrived()
                conn.flush()
            if conn.dead:
                raise _connect_failure(conn)
        except RpcError:
            _close_quietly(sock)
            raise
        except TimeoutError:
            _close_quietly(sock)
            if time.monotonic() >= limit or own_deadline > limit:
                reason = self._connect_timeout_reason(connected)
                raise RpcError(StatusCode.UNAVAILABLE, reason, FailureKind.CONNECT) from None
            raise deadline_exceeded(timeout) from None
        except (OSError, ssl.SSLError) as exc:
            _close_quietly(sock)
            ended = ended_before_use(exc, connected=connected)
            failure = EndedBeforeUse if ended else RpcError
            raise failure(StatusCode.UNAVAILABLE, conn_reason(exc), FailureKind.CONNECT) from exc
        except BaseException:
            _close_quietly(sock)
            raise
        self.connections_opened += 1
        return conn

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Fail in-flight calls, close every connection, refuse new calls."""
        self._closed = True
        for conn in list(self._all):
            conn.close(_CLOSED)
        self._all.clear()
        self._current = None


def _connect_failure(conn: _BlockingConnection) -> RpcError:
    kind = RpcError if conn.broke_protocol else EndedBeforeUse
    return kind(StatusCode.UNAVAILABLE, conn.reason, FailureKind.CONNECT)


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
