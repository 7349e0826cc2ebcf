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
import select
import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING

from ._channel_base import (
    Attempt,
    ChannelBase,
    ChannelOptions,
    Endpoint,
    RpcError,
    closed_error,
    conn_reason,
    deadline_exceeded,
    describe_io_error,
    no_alpn_h2_error,
    unprocessed_error,
)
from ._engine import GrpcConnection
from ._events import (
    CallFinished,
    ConnectionBroken,
    GoAwayReceived,
    PingAcknowledged,
    StreamCapacityChanged,
)
from ._failure import FailureKind
from ._status import StatusCode

if TYPE_CHECKING:
    from typing_extensions import Unpack

_RECEIVE_BYTES = 256 * 1024
_POLL_IN = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP
_POLL_OUT = select.POLLOUT | select.POLLERR | select.POLLHUP


def _poll_ms(seconds: float) -> int:
    return -1 if seconds == math.inf else max(0, math.ceil(seconds * 1000))


class _Waiter:
    """One call in flight and the thread waiting for it. `wake` is held until the reader
    hands this caller its result or the reader's role."""

    __slots__ = ("deadline", "done", "lead", "result", "signalled", "stream_id", "wake")

    def __init__(self, stream_id: int, deadline: float) -> None:
        self.stream_id = stream_id
        self.deadline = deadline
        self.wake = threading.Lock()
        self.wake.acquire()
        self.signalled = False
        self.lead = False  # this caller is (to become) the connection's reader
        self.done = False
        self.result: CallFinished | None = None

    def signal(self) -> None:  # under the connection's lock
        if not self.signalled:
            self.signalled = True
            self.wake.release()


class _BlockingConnection:
    """One HTTP/2 connection over a non-blocking socket. `lock` guards the sans-IO connection,
    the TLS object and the call table; `write_lock` keeps the socket's bytes in order."""

    def __init__(
        self,
        sock: socket.socket,
        tls: _Tls | None,
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
        self.last_started = 0
        self.written_through = 0  # as in the trio driver: above it, provably never sent
        self._channel = channel
        self._tls = tls
        self._poll = select.poll()
        self._poll.register(sock, _POLL_IN)
        self._in_io = 0  # threads inside a socket call: the socket closes when none is
        # Bytes taken for the socket that it would not take before the writer's own deadline:
        # the next flush sends them first, and until then the engine keeps what is queued
        # behind them (so its cap on unsent PING/SETTINGS ACKs sees a server that stops
        # reading). Set only with write_lock free; `_blocked_since`: when the socket last
        # refused bytes, None once it takes some.
        self._unsent = b""
        self._blocked_since: float | None = None
        self._closed = False
        self._heard_at = time.monotonic()  # when the server last sent anything
        self._ping: bytes | None = None  # an unanswered keepalive ping's payload
        self._ping_sent_at = 0.0

    @property
    def usable(self) -> bool:
        return not self.dead and self.proto.usable

    # -- sending --------------------------------------------------------------------------------

    def start(self, call: Attempt) -> _Waiter | None:
        """Open the call's stream and queue its request (`wait` sends it); None if this
        connection takes no new calls after all (died, or GOAWAY): the caller goes on to
        another one. Raises the deadline RpcError if no stream frees up in time."""
        own_deadline = call.own_deadline
        with self.lock:
            if not self.reading and not self.waiters:
                self._read_what_arrived()  # a GOAWAY or a close that came while idle
            while not self.proto.can_start_call:
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
        """Send what the connection has queued, in order, waiting for a full socket at most
        until `until` (the caller's own deadline): what it has not taken then waits for the
        next flush (the reader's, as soon as the socket takes bytes). Never waits for another
        thread's write: the thread writing sends what was queued meanwhile before it stops."""
        with self.lock:
            if not self.write_lock.acquire(blocking=False):
                return  # the writer sends it
            data = self._take_output()
            if not data:
                self.write_lock.release()
                return
            self._in_io += 1
        while True:
            failure = None
            try:
                data = self._send_all(data, until)
            except OSError as exc:
                failure = describe_io_error(exc)
            except BaseException:  # KeyboardInterrupt mid-write: a frame may be cut short
                with self.lock:
                    self.die("interrupted while writing")
                    self._in_io -= 1
                    self.write_lock.release()
                    self._close_if_unused()
                raise
            with self.lock:
                if failure is not None:
                    self.die(failure)
                    data = b""
                elif data:  # the socket is full at `until`
                    self._unsent = data
                    data = b""
                else:
                    data = self._take_output()
                if not data:
                    self._in_io -= 1
                    self.write_lock.release()
                    self._close_if_unused()
                    return

    def _take_output(self) -> bytes:
        """Under the lock: the bytes for the socket (encrypted with TLS)."""
        if self.dead:
            return b""
        if self._unsent:
            data, self._unsent = self._unsent, b""
            return data
        data = self.proto.data_to_send()
        if self._tls is not None:
            data = self._tls.encrypt(data)
        if data:
            self.written_through = self.last_started
        return data

    def _send_all(self, data: bytes, until: float) -> bytes:
        """Send `data`; returns what the socket did not take by `until`. TimeoutError if it
        has taken nothing for keepalive_timeout."""
        view = memoryview(data)
        poller: select.poll | None = None
        while view:
            try:
                view = view[self.sock.send(view) :]
                self._blocked_since = None
                continue
            except BlockingIOError:
                pass
            now = time.monotonic()
            if self._blocked_since is None:
                self._blocked_since = now
            stall = self._channel.keepalive_timeout
            if now >= self._blocked_since + stall:
                raise TimeoutError(f"the server took no bytes for {stall:g}s")
            if now >= until:
                return bytes(view)
            if poller is None:
                poller = select.poll()
                poller.register(self.sock, _POLL_OUT)
            poller.poll(_poll_ms(min(until, self._blocked_since + stall) - now))
        return b""

    # -- waiting and reading --------------------------------------------------------------------

    def wait(self, me: _Waiter) -> CallFinished | None:
        """Block until the call's result arrives (None: its own deadline passed), reading the
        socket whenever this caller holds the reader's role. Sends the request first."""
        try:
            self.flush(me.deadline)
            while not me.lead:
                left = max(me.deadline - time.monotonic(), 0)  # a lock takes no negative timeout
                woken = me.wake.acquire(timeout=left) if left != math.inf else me.wake.acquire()
                with self.lock:
                    if woken:
                        me.signalled = False
                    # Handed the reader's role: _lead returns at once if the result is here too.
                    if me.done and not me.lead:
                        return me.result
                    expired = not (woken or me.lead or me.done)
                    if expired:
                        self._abandon(me)
                if expired:
                    self.flush(until=0)  # the stream's reset
                    return None
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
        self.flush(until=0)

    def _lead(self, me: _Waiter) -> CallFinished | None:
        try:
            while True:
                with self.lock:
                    if me.done:
                        return me.result
                    if self.dead:  # pragma: no cover - _die finishes every waiter
                        return me.result
                    now = time.monotonic()
                    if now >= me.deadline:
                        self._abandon(me)
                        expired = True
                    else:
                        expired = False
                        until = self._keepalive_due(now)
                        # Bytes waiting for the socket: wake when it takes more, or to give up.
                        events = _POLL_IN
                        if self._unsent:
                            events |= select.POLLOUT
                            assert self._blocked_since is not None
                            until = min(
                                until, self._blocked_since + self._channel.keepalive_timeout
                            )
                        self._poll.modify(self.sock, events)
                        self._in_io += 1
                if expired:
                    self.flush(until=0)
                    return None
                failure = data = None
                try:
                    ready = self._poll.poll(_poll_ms(min(me.deadline, until) - now))
                    if any(event & ~select.POLLOUT for _, event in ready):
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
                    else:
                        self._keepalive_check(time.monotonic())
                self.flush(until=0)  # the reader never waits on the socket: it goes on reading
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
            data = self._tls.decrypt(data)
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
            data = self._unsent + data  # after the rest of a frame cut short, not inside it
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


class _Tls:
    """TLS over memory buffers (`ssl.SSLObject`): the socket carries what `encrypt` returns
    and feeds `decrypt`; the connection's lock serialises both."""

    def __init__(self, ep: Endpoint) -> None:
        assert ep.ssl_context is not None
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = ep.ssl_context.wrap_bio(
            self._incoming,
            self._outgoing,
            server_side=False,
            server_hostname=ep.server_hostname or ep.host,
        )

    def encrypt(self, data: bytes) -> bytes:
        if data:
            self.obj.write(data)
        return self._outgoing.read()

    def decrypt(self, data: bytes) -> bytes:
        self._incoming.write(data)
        chunks = []
        while True:
            try:
                chunk = self.obj.read(_RECEIVE_BYTES)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            if not chunk:  # close_notify
                break
            chunks.append(chunk)
        return b"".join(chunks)

    def handshake(self, sock: socket.socket, deadline: float) -> None:
        while True:
            try:
                self.obj.do_handshake()
                done = True
            except ssl.SSLWantReadError:
                done = False
            data = self._outgoing.read()
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
            data = sock.recv(_RECEIVE_BYTES)
            if not data:
                raise ConnectionResetError("the server closed the connection in the TLS handshake")
            self._incoming.write(data)


class BlockingChannel(ChannelBase):
    """Places unary calls from any number of threads on one shared HTTP/2 connection, opening
    a new one when needed."""

    def __init__(self, endpoint: Endpoint, **options: Unpack[ChannelOptions]) -> None:
        super().__init__(endpoint, **options)
        self._current: _BlockingConnection | None = None
        self._all: set[_BlockingConnection] = set()
        self._connect_lock = threading.Lock()
        self._connect_attempts = 0
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
        attempt = self._connect_attempts
        left = max(own_deadline - time.monotonic(), 0)
        if not self._connect_lock.acquire(timeout=left if left != math.inf else -1):
            raise deadline_exceeded(timeout)
        try:
            conn = self._current
            if conn is not None and conn.usable:
                return conn
            failure = self._connect_failure
            if failure is not None and self._connect_attempts != attempt:
                # An attempt made while we queued for the lock just failed: share its verdict.
                raise RpcError(failure.code, failure.details, failure.kind)
            self._connect_attempts += 1
            self._connect_failure = None
            try:
                conn = self._connect(own_deadline, timeout)
            except RpcError as exc:
                if exc.kind is not FailureKind.DEADLINE:
                    self._connect_failure = exc
                raise
            if self._closed:  # close() ran while we were connecting
                conn.close(_CLOSED)
                raise closed_error()
            self._current = conn
            self._all.add(conn)
            return conn
        finally:
            self._connect_lock.release()

    def _connect(self, own_deadline: float, timeout: float | None) -> _BlockingConnection:
        if self._closed:
            raise closed_error()
        ep = self.endpoint
        limit = time.monotonic() + self._connect_timeout
        deadline = min(limit, own_deadline)
        sock: socket.socket | None = None
        tls: _Tls | None = None
        connected = False
        try:
            sock = socket.create_connection(
                (ep.host, ep.port), timeout=max(deadline - time.monotonic(), 1e-3)
            )
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            if ep.ssl_context is not None:
                tls = _Tls(ep)
                tls.handshake(sock, deadline)
                if tls.obj.selected_alpn_protocol() != "h2":
                    raise no_alpn_h2_error()
            connected = True  # as the trio driver counts it: TCP and TLS are up, HTTP/2 is next
            proto = self.new_protocol()
            conn = _BlockingConnection(sock, tls, proto, self)
            conn.flush(deadline)
            # The server's SETTINGS is its half of the preface: until it arrives its stream
            # limit is unknown, and a peer that never sends it is not an HTTP/2 server.
            while not proto.remote_settings_received:
                if conn.dead:
                    raise RpcError(StatusCode.UNAVAILABLE, conn.reason, FailureKind.CONNECT)
                if not _wait_for(sock, _POLL_IN, deadline):
                    raise TimeoutError
                with conn.lock:
                    conn._read_what_arrived()
                conn.flush(deadline)
            if conn.dead:
                raise RpcError(StatusCode.UNAVAILABLE, conn.reason, FailureKind.CONNECT)
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
            raise RpcError(StatusCode.UNAVAILABLE, conn_reason(exc), FailureKind.CONNECT) from exc
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
