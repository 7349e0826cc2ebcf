"""The three drivers (trio, asyncio, blocking) connect through the one core (`_core`): a
connect the OS refuses and a TLS handshake that fails are the same error, worded the same,
whichever front end made the call."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import threading
from collections.abc import Callable, Iterator

import pytest
import trio
from fixtures.certificates import CA

from sepp._runtime.blocking_runtime import run_blocking
from sepp.wire._failure import FailureKind
from sepp.wire._status import StatusCode
from sepp.wire.drivers._asyncio import AsyncioChannel
from sepp.wire.drivers._base import Endpoint, RpcError
from sepp.wire.drivers._blocking import BlockingChannel
from sepp.wire.drivers._trio import Channel

GUARD_S = 10.0  # a hung connect fails the test instead of hanging it
DRIVERS = ("trio", "asyncio", "blocking")


def failed_call(driver: str, endpoint: Endpoint) -> RpcError:
    """The error one call on a new channel of `driver` to `endpoint` raises."""
    options = {"user_agent": "t", "connect_timeout": GUARD_S}
    if driver == "trio":

        async def on_trio() -> RpcError:
            async with trio.open_nursery() as nursery:
                channel = Channel(endpoint, nursery, **options)  # type: ignore[arg-type]
                try:
                    with pytest.raises(RpcError) as info:
                        await channel.call("Ack", b"x", timeout=GUARD_S)
                finally:
                    await channel.aclose()
            return info.value

        return trio.run(on_trio)
    if driver == "asyncio":

        async def on_asyncio() -> RpcError:
            channel = AsyncioChannel(endpoint, **options)  # type: ignore[arg-type]
            try:
                with pytest.raises(RpcError) as info:
                    await channel.call("Ack", b"x", timeout=GUARD_S)
            finally:
                await channel.aclose()
            return info.value

        return asyncio.run(on_asyncio())
    channel = BlockingChannel(endpoint, **options)  # type: ignore[arg-type]
    try:
        with pytest.raises(RpcError) as info:
            run_blocking(channel.call("Ack", b"x", timeout=GUARD_S))
    finally:
        channel.close()
    return info.value


def described(driver: str, endpoint: Endpoint) -> tuple[StatusCode, FailureKind | None, str]:
    error = failed_call(driver, endpoint)
    return error.code, error.kind, error.details


def refused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again before the call: nothing listens


@contextlib.contextmanager
def tls_server(serve: Callable[[socket.socket], None]) -> Iterator[int]:
    """A TCP server in a thread that runs `serve` on each connection; yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    stopping = threading.Event()

    def accept() -> None:
        while not stopping.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                with contextlib.suppress(OSError):
                    serve(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stopping.set()
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (a close alone does not)
        listener.close()
        thread.join(GUARD_S)
        assert not thread.is_alive()


def client_context(trusted: CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    trusted.configure_trust(ctx)
    ctx.set_alpn_protocols(["h2"])
    return ctx


def test_a_refused_connect_is_described_alike_by_every_driver() -> None:
    endpoint = Endpoint("127.0.0.1", refused_port())
    found = {driver: described(driver, endpoint) for driver in DRIVERS}
    expected = (
        StatusCode.UNAVAILABLE,
        FailureKind.CONNECT,
        "ConnectionRefusedError: [Errno 111] Connection refused",
    )
    assert found == dict.fromkeys(DRIVERS, expected)


def test_a_server_certificate_from_an_untrusted_ca_is_described_alike_by_every_driver() -> None:
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    CA("a CA the client does not trust").issue_cert("sepp.test").configure_cert(server_ctx)
    server_ctx.set_alpn_protocols(["h2"])

    def handshake(conn: socket.socket) -> None:
        with contextlib.suppress(ssl.SSLError):
            server_ctx.wrap_socket(conn, server_side=True).close()

    with tls_server(handshake) as port:
        endpoint = Endpoint("127.0.0.1", port, client_context(CA()), server_hostname="sepp.test")
        found = {driver: described(driver, endpoint) for driver in DRIVERS}
    code, kind, details = found["trio"]
    assert (code, kind) == (StatusCode.UNAVAILABLE, FailureKind.CONNECT)
    assert details.startswith("SSLCertVerificationError: [SSL: CERTIFICATE_VERIFY_FAILED]")
    assert found == dict.fromkeys(DRIVERS, found["trio"])


def test_a_server_that_ends_the_tls_handshake_is_described_alike_by_every_driver() -> None:
    hellos = 0

    def read_the_hello_and_close(conn: socket.socket) -> None:
        nonlocal hellos
        if conn.recv(65536):  # read (so the close is a FIN, not a reset), never answer
            hellos += 1

    with tls_server(read_the_hello_and_close) as port:
        endpoint = Endpoint("127.0.0.1", port, client_context(CA()), server_hostname="sepp.test")
        found = {driver: described(driver, endpoint) for driver in DRIVERS}
    expected = (
        StatusCode.UNAVAILABLE,
        FailureKind.CONNECT,
        "ConnectionResetError: the server closed the connection in the TLS handshake",
    )
    assert found == dict.fromkeys(DRIVERS, expected)
    # Ended before use, nothing sent: each driver dialled again, up to its limit, as one.
    assert hellos == 3 * 8
