"""The one HTTP server for probes and metrics (`_probes.server`): malformed, slow, oversized and
too many requests, answers bigger than a socket's buffer, and answers that come later from
another thread (the supervisor's), on real sockets and one thread. Ordered by events; the only
timeouts are deadlock breakers."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future

import pytest

from sepp._probes import server as probe_server
from sepp._probes.http1 import READ_TIMEOUT_S, TEXT, Response
from sepp._probes.server import ProbeServer
from sepp._worker.monitor import MAX_SERIES, WorkerMonitor, feed_of
from sepp.testing import job_context

GIVE_UP_S = 60.0  # a deadlock breaker only


def raw_exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=GIVE_UP_S / 2) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    return answer


def exchange(port: int, request: bytes) -> tuple[int, bytes]:
    """The status and body of the answer to `request`; its headers checked."""
    head, _, body = raw_exchange(port, request).partition(b"\r\n\r\n")
    status_line, *headers = head.decode().split("\r\n")
    assert "Connection: close" in headers
    assert "Cache-Control: no-store" in headers
    assert f"Content-Length: {len(body)}" in headers
    return int(status_line.split()[1]), body


def no_probe_threads() -> bool:
    return not [t for t in threading.enumerate() if t.name.startswith("sepp probe")]


@pytest.fixture
def server() -> Iterator[ProbeServer]:
    with ProbeServer(WorkerMonitor()._routes(), 0, host="127.0.0.1") as served:
        yield served
    assert no_probe_threads()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /healthz HTTP/1.1\r\n\r\n", 200),
        (b"GET /readyz?verbose HTTP/1.0\r\n\r\n", 503),  # the query is not the path
        (b"POST /metrics HTTP/1.1\r\n\r\n", 405),
        (b"HEAD /healthz HTTP/1.1\r\n\r\n", 405),
        (b"GET /nope HTTP/1.1\r\n\r\n", 404),
        (b"GET /metrics\r\n\r\n", 400),
        (b"GET  /metrics HTTP/1.1\r\n\r\n", 400),
        (b"GET /metrics SPDY/3\r\n\r\n", 400),
        (b"GET /\xff HTTP/1.1\r\n\r\n", 400),
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400),  # TLS on plain HTTP
        (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n", 431),
        (b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000, 431),  # no end in sight
    ],
)
def test_each_request_gets_its_answer_and_a_closed_connection(
    server: ProbeServer, request_bytes: bytes, status: int
) -> None:
    assert exchange(server.port, request_bytes)[0] == status


def test_a_missing_path_is_told_the_known_ones(server: ProbeServer) -> None:
    assert exchange(server.port, b"GET /nope HTTP/1.1\r\n\r\n") == (
        404,
        b"not found; try /healthz, /metrics, /readyz\n",
    )


def test_a_client_closing_early_gets_400(server: ProbeServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET /metr")
        sock.shutdown(socket.SHUT_WR)
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert answer.endswith(b"\r\n\r\nincomplete request\n")


def test_a_slow_client_is_cut_off_at_the_read_timeout(
    server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert READ_TIMEOUT_S == 5.0  # what the docs promise
    monkeypatch.setattr(probe_server, "READ_TIMEOUT_S", 0.05)
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # and never the blank line
        assert sock.recv(4096).startswith(b"HTTP/1.1 408 ")


def test_a_route_that_raises_answers_500_and_the_server_lives_on() -> None:
    def broken() -> Response:
        raise KeyError("gone")

    with ProbeServer(
        {"/x": broken, "/ok": lambda: (200, TEXT, b"ok\n")}, 0, host="127.0.0.1"
    ) as served:
        assert exchange(served.port, b"GET /x HTTP/1.1\r\n\r\n") == (500, b"KeyError: 'gone'\n")
        assert exchange(served.port, b"GET /ok HTTP/1.1\r\n\r\n") == (200, b"ok\n")


def test_close_cuts_off_a_connection_waiting_for_its_request() -> None:
    served = ProbeServer({}, 0, host="127.0.0.1")
    served.start()
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.sendall(b"GET /healthz")  # and the server waits for the rest
        while not served.connections:
            time.sleep(0.001)  # until the server took it (polling for that event)
        served.close()  # returns: it stopped serving, not waiting out READ_TIMEOUT_S
        try:
            answer = sock.recv(4096)
        except ConnectionResetError:
            answer = b""
        assert answer == b""
    assert no_probe_threads()


def test_connections_beyond_the_limit_are_closed_unanswered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(probe_server, "MAX_CONNECTIONS", 2)
    with ProbeServer(WorkerMonitor()._routes(), 0, host="127.0.0.1") as served:
        held = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(2)]
        while served.connections < 2:
            time.sleep(0.001)  # until the server took both (polling for that event)
        with socket.create_connection(("127.0.0.1", served.port)) as extra:
            assert extra.recv(4096) == b""  # closed without an answer
        for sock in held:
            sock.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200 ")
            sock.close()
        # One thread served them all.
        assert [t.name for t in threading.enumerate() if t.name.startswith("sepp probe")] == [
            f"sepp probes :{served.port}"
        ]


def test_a_request_sent_in_pieces_and_a_big_answer_are_served() -> None:
    monitor = WorkerMonitor()
    feed = feed_of(monitor)
    feed.worker_started(None)
    for n in range(MAX_SERIES):  # a /metrics answer bigger than a socket's buffer
        feed.job_started(job_context(f"type-{n}", queue="q"))
    served = ProbeServer(monitor._routes(), 0, host="127.0.0.1")
    # A small send buffer (inherited by the accepted socket): the answer goes in many sends.
    served._listeners[0].setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    with served:
        with socket.create_connection(("127.0.0.1", served.port)) as sock:
            for piece in (b"GET /met", b"rics HTTP/1.1\r\n", b"\r\n"):
                sock.sendall(piece)
            answer = b""
            while chunk := sock.recv(1024):
                answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert f"Content-Length: {len(body)}".encode() in head
    assert body.decode() == monitor.prometheus_text()


# -- answers that come later, from another thread --------------------------------------------


def test_a_later_answer_is_sent_when_another_thread_gives_it_and_others_are_served_meanwhile() -> (
    None
):
    asked: list[Future[Response]] = []
    pending = threading.Event()

    def later() -> Future[Response]:
        future: Future[Response] = Future()
        asked.append(future)
        pending.set()
        return future

    routes = {"/later": later, "/now": lambda: (200, TEXT, b"now\n")}
    with ProbeServer(routes, 0, host="127.0.0.1") as served:
        answers: list[tuple[int, bytes]] = []
        waiting = threading.Thread(
            target=lambda: answers.append(exchange(served.port, b"GET /later HTTP/1.1\r\n\r\n"))
        )
        waiting.start()
        assert pending.wait(GIVE_UP_S)
        # The server is not held by the answer it waits for.
        assert exchange(served.port, b"GET /now HTTP/1.1\r\n\r\n") == (200, b"now\n")
        assert not answers
        asked[0].set_result((503, TEXT, b"from elsewhere\n"))
        waiting.join(GIVE_UP_S)
        assert answers == [(503, b"from elsewhere\n")]
        # Done before the server looks, or failed: the same answers.
        done: Future[Response] = Future()
        done.set_result((200, TEXT, b"at once\n"))
        failed: Future[Response] = Future()
        failed.set_exception(TimeoutError("no child answered"))
        for future, expected in [
            (done, (200, b"at once\n")),
            (failed, (500, b"TimeoutError: no child answered\n")),
        ]:
            routes["/later"] = lambda future=future: future  # type: ignore[misc]
            with ProbeServer(routes, 0, host="127.0.0.1") as other:
                assert exchange(other.port, b"GET /later HTTP/1.1\r\n\r\n") == expected
    assert no_probe_threads()


def test_close_drops_a_connection_whose_answer_never_came() -> None:
    pending = threading.Event()

    def never() -> Future[Response]:
        pending.set()
        return Future()

    served = ProbeServer({"/never": never}, 0, host="127.0.0.1")
    served.start()
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.sendall(b"GET /never HTTP/1.1\r\n\r\n")
        assert pending.wait(GIVE_UP_S)
        served.close()
        try:
            assert sock.recv(4096) == b""
        except ConnectionResetError:
            pass
    assert no_probe_threads()


def test_a_later_answer_bigger_than_the_sockets_buffer_is_sent_whole() -> None:
    body = b"x" * 1_000_000
    answer: Future[Response] = Future()
    asked = threading.Event()

    def later() -> Future[Response]:
        asked.set()
        return answer

    served = ProbeServer({"/big": later}, 0, host="127.0.0.1")
    served._listeners[0].setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    with served:
        threading.Thread(
            target=lambda: asked.wait(GIVE_UP_S) and answer.set_result((200, TEXT, body))
        ).start()
        assert exchange(served.port, b"GET /big HTTP/1.1\r\n\r\n") == (200, body)
