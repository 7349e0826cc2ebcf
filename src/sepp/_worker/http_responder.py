"""A tiny HTTP/1.1 responder for probes and metrics scrapes: GET only, one request per
connection (Connection: close), a bounded request head and a read deadline, so a slow or
hostile client can hold neither memory nor a task for long. Not a web server. The
WorkerMonitor's answers are served off the event loop, from a thread (`probe_server`); the
`Responder` can also serve on trio sockets here, and `anyio_http` under asyncio."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import trio

from .._runtime.concurrency import CancelScope

MAX_REQUEST_BYTES = 8192  # the request line and headers; a probe sends a few hundred
READ_TIMEOUT_S = 5.0  # to receive the whole request head
WRITE_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 32  # served at once; more are closed unanswered

Response = tuple[int, str, bytes]  # status, content type, body
Route = Callable[[], Response]

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
TEXT = "text/plain; charset=utf-8"
TOO_LARGE: Response = (431, TEXT, b"request too large\n")
INCOMPLETE: Response = (400, TEXT, b"incomplete request\n")
TIMED_OUT: Response = (408, TEXT, b"request timeout\n")


def render(status: int, content_type: str, body: bytes, *, head_only: bool = False) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + (b"" if head_only else body)


def parse_request_line(head: bytes) -> str | Response:
    """The path (without the query) a GET request head asks for, or the error response."""
    line, _, _ = head.partition(b"\r\n")
    parts = line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return 400, TEXT, b"bad request line\n"
    try:
        method, target = parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        return 400, TEXT, b"bad request line\n"
    if method != "GET":
        return 405, TEXT, b"only GET\n"
    return target.partition("?")[0]


async def read_head(
    receive_some: Callable[[int], Awaitable[bytes | bytearray]],
    move_on_after: Callable[[float], CancelScope] = trio.move_on_after,
) -> bytes | Response:
    """The request head (up to the blank line), or the error response to send instead;
    `receive_some` returns b"" at the end of the stream."""
    data = b""
    with move_on_after(READ_TIMEOUT_S):
        while (head := head_of(data)) is None:
            chunk = await receive_some(4096)
            if not chunk:
                return INCOMPLETE
            data += chunk
        return head
    return TIMED_OUT


def head_of(data: bytes) -> bytes | Response | None:
    """The request head (up to the blank line) in the bytes received so far, the error
    response to send instead, or None while more is needed."""
    if b"\r\n\r\n" not in data:
        return TOO_LARGE if len(data) > MAX_REQUEST_BYTES else None
    head = data.partition(b"\r\n\r\n")[0]
    return TOO_LARGE if len(head) > MAX_REQUEST_BYTES else head


class Responder:
    """Serves `routes` (path -> function returning the response) on TCP listeners."""

    def __init__(self, routes: Mapping[str, Route]) -> None:
        self._routes = dict(routes)
        self._active = 0  # connections being served (one run's tasks: no lock needed)

    def take_slot(self) -> bool:
        """Whether another connection may be served now; `release_slot()` when it ends."""
        if self._active >= MAX_CONNECTIONS:
            return False
        self._active += 1
        return True

    def release_slot(self) -> None:
        self._active -= 1

    def respond(self, head: bytes) -> Response:
        path = parse_request_line(head)
        if not isinstance(path, str):
            return path
        route = self._routes.get(path)
        if route is None:
            known = ", ".join(sorted(self._routes))
            return 404, TEXT, f"not found; try {known}\n".encode()
        try:
            return route()
        except Exception as exc:  # a probe must get an answer, and the server must live on
            return 500, TEXT, f"{type(exc).__name__}: {exc}\n".encode()

    async def handle(self, stream: trio.abc.Stream) -> None:
        """One connection: one request, one response, close. Never raises."""
        try:
            if not self.take_slot():
                return  # too many at once: close without reading
            try:
                head = await read_head(stream.receive_some)
                status, content_type, body = head if isinstance(head, tuple) else self.respond(head)
                with trio.move_on_after(WRITE_TIMEOUT_S):
                    await stream.send_all(render(status, content_type, body))
            finally:
                self.release_slot()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the client went away
        finally:
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                await trio.aclose_forcefully(stream)

    async def serve(
        self,
        port: int,
        *,
        host: str | None = None,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on `host:port` (None: every interface; port 0: any free one) until
        cancelled; `nursery.start()` returns the bound port."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            task_status.started(bound)
            await trio.serve_listeners(self.handle, listeners, handler_nursery=nursery)
