"""The one HTTP server of sepp-trio: probes and metrics served from a thread of its own, off
any event loop, so that it serves a trio or asyncio run and blocking code alike, and a handler
that holds the loop (CPU work in an `async def` handler) cannot delay an answer: a liveness
probe with a 1 s timeout still gets one, and it can say how long the loop has not run. The
requests and answers are `http1`'s. A route answers at once (the monitor's, from its locked
state) or returns a `concurrent.futures.Future` that any thread completes later (the
supervisor's, which ask its children on trio); meanwhile the server serves the others.

One thread serves every connection, on non-blocking sockets and a selector: it starts no thread
per connection (on a free-threaded build, starting one waited up to a few hundred ms for a
handler burning CPU), makes few calls into the kernel (on a build with the GIL, each waits up to
the 5 ms switch interval for a handler burning CPU), and a slow client holds nothing but its
socket until its deadline. At most `MAX_CONNECTIONS` at once; more are closed unanswered. The
thread is not a daemon: `close()` stops and joins it."""

from __future__ import annotations

import collections
import errno
import math
import selectors
import socket
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from types import TracebackType

from .http1 import (
    INCOMPLETE,
    MAX_CONNECTIONS,
    READ_TIMEOUT_S,
    TIMED_OUT,
    WRITE_TIMEOUT_S,
    Response,
    Route,
    failed,
    head_of,
    not_found,
    parse_request_line,
    render,
)

LINGER_S = 1.0  # how long an answered connection with bytes unread is read to its end, at most
LINGER_BYTES = 65536  # how much of it


class _Connection:
    """One connection's state: reading its request, waiting for a route's later answer (not
    watched meanwhile), writing its answer, or lingering."""

    __slots__ = ("data", "deadline", "linger", "lingering", "out", "sock")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline  # math.inf while a route's answer is awaited
        self.data = b""  # the request so far
        self.out: bytes | None = None  # the answer still to send, once there is one
        self.linger = False  # bytes may be left unread: read them before closing
        self.lingering = 0  # bytes read and dropped after the answer


class ProbeServer:
    """Listens on `host:port` (None: every interface; port 0: any free one) at construction,
    serves `routes` (path -> its answer) from a thread once `start()`ed (or entered as a
    context manager), until `close()`."""

    def __init__(self, routes: Mapping[str, Route], port: int, *, host: str | None = None) -> None:
        self._routes = dict(routes)
        self._listeners = _listen(host, port)
        self.port: int = self._listeners[0].getsockname()[1]
        # A byte here wakes the serving thread's select: close(), or an answer that came later.
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._wake_lock = threading.Lock()  # the writer is closed under it
        self._later: collections.deque[tuple[_Connection, Future[Response]]] = collections.deque()
        self._connections: dict[socket.socket, _Connection] = {}  # the serving thread's only
        self._selector = selectors.DefaultSelector()
        self._thread = threading.Thread(
            target=self._serve, name=f"sepp probes :{self.port}", daemon=False
        )
        self._closed = False

    @property
    def connections(self) -> int:
        """Connections being served now."""
        return len(self._connections)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop serving (connections still open are closed unanswered) and join the thread.
        Call from the thread that started it."""
        if self._closed:
            return
        self._closed = True
        self._wake()
        if self._thread.ident is not None:
            self._thread.join()
        with self._wake_lock:
            for sock in (*self._listeners, self._wake_reader, self._wake_writer):
                sock.close()
        self._selector.close()

    def __enter__(self) -> ProbeServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def respond(self, head: bytes) -> Response | Future[Response]:
        """The answer to a request head: its route's (at once or later), or an error."""
        path = parse_request_line(head)
        if not isinstance(path, str):
            return path
        route = self._routes.get(path)
        if route is None:
            return not_found(self._routes)
        try:
            return route()
        except Exception as exc:
            return failed(exc)

    def _wake(self) -> None:
        with self._wake_lock:
            try:
                self._wake_writer.send(b"x")
            except OSError:
                pass  # closed, or full of wake-ups already

    # -- the serving thread ------------------------------------------------------------------------

    def _serve(self) -> None:
        selector = self._selector
        for listener in self._listeners:
            listener.setblocking(False)
            selector.register(listener, selectors.EVENT_READ)
        selector.register(self._wake_reader, selectors.EVENT_READ)
        try:
            while True:
                deadlines = [
                    c.deadline for c in self._connections.values() if c.deadline != math.inf
                ]
                timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
                for key, mask in selector.select(timeout):
                    if key.fileobj is self._wake_reader:
                        if self._closed:
                            return
                        self._woken()
                    elif key.data is None:
                        self._accept(key.fileobj)  # type: ignore[arg-type]
                    elif mask & selectors.EVENT_READ:
                        self._readable(key.data)
                    else:
                        self._writable(key.data)
                self._expire(time.monotonic())
        finally:
            for conn in list(self._connections.values()):
                self._drop(conn)

    def _accept(self, listener: socket.socket) -> None:
        try:
            sock, _ = listener.accept()
        except OSError:
            return  # the client gave up before we took it, or too many files
        if len(self._connections) >= MAX_CONNECTIONS:
            sock.close()  # too many at once: close without reading
            return
        sock.setblocking(False)
        conn = self._connections[sock] = _Connection(sock, time.monotonic() + READ_TIMEOUT_S)
        self._selector.register(sock, selectors.EVENT_READ, conn)
        self._readable(conn)  # a probe's request has often come with its connection

    def _readable(self, conn: _Connection) -> None:
        try:
            chunk = conn.sock.recv(16384 if conn.out is not None else 4096)
        except BlockingIOError:
            return
        except OSError:
            self._drop(conn)  # the client went away
            return
        if conn.out is not None:  # lingering: read and drop until the end, or enough
            conn.lingering += len(chunk)
            if not chunk or conn.lingering > LINGER_BYTES:
                self._drop(conn)
            return
        if not chunk:
            self._answer(conn, INCOMPLETE, linger=False)
            return
        conn.data += chunk
        head = head_of(conn.data)
        if head is None:
            return
        if isinstance(head, tuple):  # too large: the rest was not read
            self._answer(conn, head, linger=True)
            return
        # A GET has no body: any byte past the head is one the client should not have sent.
        linger = len(conn.data) > len(head) + 4
        answer = self.respond(head)
        if isinstance(answer, Future):
            self._await(conn, answer, linger=linger)
        else:
            self._answer(conn, answer, linger=linger)

    def _await(self, conn: _Connection, answer: Future[Response], *, linger: bool) -> None:
        """A route answers later: the connection waits unwatched (its client's bytes or its end
        are read after the answer), and the thread that completes `answer` wakes us."""
        conn.linger = linger
        conn.deadline = math.inf
        self._selector.unregister(conn.sock)

        def done(future: Future[Response]) -> None:
            self._later.append((conn, future))
            self._wake()

        answer.add_done_callback(done)  # at once, here, if it is done already

    def _woken(self) -> None:
        try:
            while self._wake_reader.recv(4096):
                pass
        except BlockingIOError:
            pass
        while self._later:
            conn, future = self._later.popleft()
            if self._connections.get(conn.sock) is not conn:
                continue  # dropped meanwhile
            try:
                answer = future.result()
            except Exception as exc:
                answer = failed(exc)
            self._selector.register(conn.sock, selectors.EVENT_WRITE, conn)
            self._answer(conn, answer, linger=conn.linger)

    def _answer(self, conn: _Connection, answer: Response, *, linger: bool) -> None:
        conn.out = render(*answer)
        conn.linger = linger
        conn.deadline = time.monotonic() + WRITE_TIMEOUT_S
        self._writable(conn)  # most answers fit the socket's buffer: sent at once

    def _writable(self, conn: _Connection) -> None:
        assert conn.out is not None
        try:
            sent = conn.sock.send(conn.out)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._drop(conn)
            return
        conn.out = conn.out[sent:]
        if conn.out:
            self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
            return
        if not conn.linger:
            self._drop(conn)
            return
        # Read what the client still sends before closing, for a while: a close with bytes
        # unread resets the connection, and the answer could be lost.
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._drop(conn)
            return
        conn.deadline = time.monotonic() + LINGER_S
        self._selector.modify(conn.sock, selectors.EVENT_READ, conn)

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._connections.values() if c.deadline <= now]:
            if conn.out is None:
                self._answer(conn, TIMED_OUT, linger=True)  # a slow client: 408
            else:
                self._drop(conn)  # too slow to take the answer, or done lingering

    def _drop(self, conn: _Connection) -> None:
        if self._connections.pop(conn.sock, None) is None:
            return
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()


def _listen(host: str | None, port: int) -> list[socket.socket]:
    """Listening sockets for `host:port`, as trio's open_tcp_listeners binds them: every
    address `host` names (None: the IPv4 and IPv6 wildcards), SO_REUSEADDR, IPv6 only on IPv6
    sockets."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    listeners: list[socket.socket] = []
    try:
        for family, type_, proto, _, address in infos:
            if any(s.family == family and s.getsockname()[0] == address[0] for s in listeners):
                continue  # getaddrinfo may name an address twice
            try:
                sock = socket.socket(family, type_, proto)
            except OSError as exc:
                if exc.errno == errno.EAFNOSUPPORT:
                    continue  # IPv6 switched off in this kernel, say
                raise
            listeners.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(listeners) > 1:  # one port for every address
                address = (address[0], listeners[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(MAX_CONNECTIONS)
    except BaseException:
        for sock in listeners:
            sock.close()
        raise
    if not listeners:
        raise OSError(errno.EAFNOSUPPORT, f"no address to listen on for {host}:{port}")
    return listeners
