"""The probes and metrics served from threads of their own, off the event loop: a handler that
holds the loop (CPU work in an `async def` handler) cannot delay an answer, so a liveness probe
with a 1 s timeout still gets one, and it can say how long the loop has not run. The requests
and answers are `http_responder`'s; its routes read the monitor's locked state.

One thread accepts, and answers a request that came with its connection (a probe's) at once; any
other connection gets a thread of its own for its one request (at most `MAX_CONNECTIONS` at
once, more are closed unanswered). No thread is a daemon: `close()` stops and joins them all."""

from __future__ import annotations

import errno
import selectors
import socket
import threading
import time

from .http_responder import (
    INCOMPLETE,
    MAX_CONNECTIONS,
    MAX_REQUEST_BYTES,
    READ_TIMEOUT_S,
    TIMED_OUT,
    WRITE_TIMEOUT_S,
    Responder,
    Response,
    head_of,
    render,
)

LINGER_S = 1.0  # how long an answered connection is read to its end, at most
LINGER_BYTES = 65536  # how much of it
# recv and send without blocking, on a blocking socket (Linux, macOS, the BSDs; elsewhere every
# connection gets a thread).
_DONT_WAIT: int = getattr(socket, "MSG_DONTWAIT", 0)


class ProbeServer:
    """Listens on `host:port` (None: every interface; port 0: any free one) at construction,
    serves `responder`'s routes once `start()`ed, until `close()`."""

    def __init__(self, responder: Responder, port: int, *, host: str | None = None) -> None:
        self._responder = responder
        self._listeners = _listen(host, port)
        self.port: int = self._listeners[0].getsockname()[1]
        # close() writes a byte here to wake the accepting thread's select.
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._lock = threading.Lock()  # guards the three below
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._ending: list[threading.Thread] = []  # done serving, maybe not yet exited
        self._closing = False
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"sepp probes :{self.port}", daemon=False
        )

    def start(self) -> None:
        self._acceptor.start()

    def close(self) -> None:
        """Stop accepting, cut off the connections being served, and join every thread.
        Idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            connections = list(self._connections.items())
            ending = self._ending
        try:
            self._wake_writer.send(b"x")
        except OSError:
            pass
        for conn, _ in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv or send
            except OSError:
                pass
        if self._acceptor.ident is not None:
            self._acceptor.join()
        for thread in (*(thread for _, thread in connections), *ending):
            thread.join()
        for sock in (*self._listeners, self._wake_reader, self._wake_writer):
            sock.close()

    # -- the threads ----------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        with selectors.DefaultSelector() as selector:
            for listener in self._listeners:
                listener.setblocking(False)
                selector.register(listener, selectors.EVENT_READ)
            selector.register(self._wake_reader, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select():
                    if key.fileobj is self._wake_reader:
                        return
                    try:
                        conn, _ = key.fileobj.accept()  # type: ignore[union-attr]
                    except OSError:
                        continue  # the client gave up before we took it, or too many files
                    self._take(conn)

    def _take(self, conn: socket.socket) -> None:
        """Serve `conn` here if its request has come and its answer fits the socket's buffer
        (a probe's does), else in a thread of its own. Each call into the kernel waits for the
        GIL again, up to the switch interval (5 ms) while a handler burns CPU: the fewer calls
        and threads on the way to an answer, the sooner it comes."""
        data = b""
        if _DONT_WAIT:
            try:
                data = conn.recv(MAX_REQUEST_BYTES + 1, _DONT_WAIT)
                head = head_of(data)
                # Only a request read to its end: closing with bytes unread would reset the
                # connection, and the client might lose the answer (a thread lingers instead).
                if isinstance(head, bytes) and len(data) == len(head) + 4:
                    out = render(*self._responder.respond(head))
                    sent = conn.send(out, _DONT_WAIT)
                    if sent == len(out):
                        conn.close()
                        return
                    self._in_thread(conn, b"", out[sent:])
                    return
            except BlockingIOError:
                pass  # nothing yet (or no room for the answer): a thread waits for it
            except OSError:
                conn.close()  # the client went away
                return
        self._in_thread(conn, data, None)

    def _in_thread(self, conn: socket.socket, data: bytes, unsent: bytes | None) -> None:
        conn.setblocking(True)
        thread = threading.Thread(
            target=self._serve,
            args=(conn, data, unsent),
            name="sepp probe connection",
            daemon=False,
        )
        with self._lock:  # started under the lock, so close() joins only started threads
            self._ending = [thread for thread in self._ending if thread.is_alive()]
            if self._closing or len(self._connections) >= MAX_CONNECTIONS:
                conn.close()  # too many at once: close without reading
                return
            self._connections[conn] = thread
            thread.start()

    def _serve(self, conn: socket.socket, data: bytes, unsent: bytes | None) -> None:
        """The rest of one connection: read the request (after `data`) and answer it, or send
        the `unsent` end of the answer; close. Never raises."""
        try:
            if unsent is None:
                answer = _read_head(conn, data)
                if not isinstance(answer, tuple):
                    answer = self._responder.respond(answer)
                unsent = render(*answer)
            conn.settimeout(WRITE_TIMEOUT_S)
            conn.sendall(unsent)
            _linger(conn)
        except OSError:
            pass  # the client went away, or was too slow to take the answer
        finally:
            conn.close()
            with self._lock:
                self._ending.append(self._connections.pop(conn))


def _read_head(conn: socket.socket, data: bytes) -> bytes | Response:
    deadline = time.monotonic() + READ_TIMEOUT_S
    while (head := head_of(data)) is None:
        left = deadline - time.monotonic()
        if left <= 0:
            return TIMED_OUT
        conn.settimeout(left)
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            return TIMED_OUT
        if not chunk:
            return INCOMPLETE
        data += chunk
    return head


def _linger(conn: socket.socket) -> None:
    """Read what the client still sends (a request head too large, say) before closing, for a
    while: a close with bytes unread resets the connection, and the answer may be lost."""
    conn.shutdown(socket.SHUT_WR)
    conn.settimeout(LINGER_S)
    unread = LINGER_BYTES
    while unread > 0:
        chunk = conn.recv(min(unread, 16384))
        if not chunk:
            return
        unread -= len(chunk)


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
