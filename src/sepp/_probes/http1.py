"""A probe's HTTP/1.1, with no I/O: a request head read from the bytes received so far, the
path a GET asks for, and an answer rendered to bytes. GET only, one request per connection
(Connection: close), a bounded head: a slow or hostile client can hold neither memory nor the
server for long. Not a web server."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

MAX_REQUEST_BYTES = 8192  # the request line and headers; a probe sends a few hundred
READ_TIMEOUT_S = 5.0  # to receive the whole request head
WRITE_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 32  # served at once; more are closed unanswered

Response = tuple[int, str, bytes]  # status, content type, body
# A path's answer: at once, or later from any thread (the supervisor asks its children on trio).
Route = Callable[[], Response | Future[Response]]

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


def render(status: int, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def head_of(data: bytes) -> bytes | Response | None:
    """The request head (up to the blank line) in the bytes received so far, the error
    response to send instead, or None while more is needed."""
    if b"\r\n\r\n" not in data:
        return TOO_LARGE if len(data) > MAX_REQUEST_BYTES else None
    head = data.partition(b"\r\n\r\n")[0]
    return TOO_LARGE if len(head) > MAX_REQUEST_BYTES else head


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


def not_found(routes: dict[str, Route]) -> Response:
    return 404, TEXT, f"not found; try {', '.join(sorted(routes))}\n".encode()


def failed(exc: BaseException) -> Response:
    """A route that raised: a probe must get an answer, and the server must live on."""
    return 500, TEXT, f"{type(exc).__name__}: {exc}\n".encode()
