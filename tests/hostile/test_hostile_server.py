"""The public client against a deliberately misbehaving HTTP/2 server (issue 6, §2 and §4).

Every case drives `sepp.open(...)` and the Client's methods — never the wire layer directly —
against `fixtures.h2_server.H2Server` (or a plain TCP / TLS peer), and checks three things:

- the outcome: a typed `sepp.SeppError` subclass with the right code, or a correct recovery;
- time: the failure arrives within the call's deadline (every test also runs under
  `trio.fail_after(GUARD_S)`, so a hang fails the test instead of the run);
- hygiene: the client's `async with` exits cleanly, no task started by sepp outlives it, and
  every connection it opened is closed (`hostile()` checks this after each test body; on the
  blocking front end, which starts no tasks, that its own sockets are closed too).

Each case runs on every front end (`front_end`): the trio `sepp.Client`; the blocking
`sepp.SyncClient` behind `Threaded`, which runs each blocking call in a worker thread; and the
client opened under asyncio, in a loop of its own (`fixtures.asyncio_front`), so the test
bodies are the same. A test marked `@trio_only("why")` runs on the trio front end alone. On
the asyncio front end, as on the blocking one, the hygiene check is that its sockets are
closed (it starts no connection tasks), and that no asyncio task outlives the client.
"""

from __future__ import annotations

import datetime as dt
import functools
import gc
import gzip
import os
import ssl
import struct
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar, cast

import pytest
import trio
from fixtures.asyncio_front import open_on_asyncio
from fixtures.certificates import CA, self_signed
from fixtures.h2_server import GRPC_HEADERS, H2Server, ServerCall, frame_message
from fixtures.interpreters import FREE_THREADED, PYPY
from h2.errors import ErrorCodes
from hpack.hpack import encode_integer as hpack_integer
from hyperframe.frame import ContinuationFrame, DataFrame, HeadersFrame
from trio.testing import wait_all_tasks_blocked

import sepp
from sepp._pb import queue_pb2 as pb

pytestmark = pytest.mark.both_engines
# Once per message codec (ours and the generated protobuf classes): what the response bodies feed
# the client.
both_codecs = pytest.mark.both_codecs

GUARD_S = 10.0  # no test may take longer than this
CHEAP_FREEZE = not (PYPY or FREE_THREADED)  # gc.freeze() is a list splice on these alone
E = TypeVar("E", bound=BaseException)


# -- responses a well-behaved server would send ----------------------------------------------


def info_message(version: str = "hostile-1") -> bytes:
    msg = pb.GetServerInfoResponse(server_version=version, supported_protocol_versions=["v1"])
    msg.server_time.FromSeconds(1_700_000_000)
    return msg.SerializeToString()


def job_message(job_id: str = "j1", **fields: Any) -> pb.Job:
    defaults: dict[str, Any] = {"job_type": "email", "queue": "q", "priority": 3, "attempt": 1}
    job = pb.Job(id=job_id, **{**defaults, "max_attempts": 5, **fields})
    if "enqueued_at" not in fields:
        job.enqueued_at.FromSeconds(1_700_000_000)
    if "lease_expires_at" not in fields:
        job.lease_expires_at.FromSeconds(1_700_000_030)
    return job


def reserve_message(*jobs: pb.Job) -> bytes:
    return pb.ReserveResponse(jobs=list(jobs)).SerializeToString()


def enqueue_message(count: int, prefix: str = "id") -> bytes:
    results = [
        pb.JobResult(success=pb.EnqueueResponse(job_id=f"{prefix}-{i}")) for i in range(count)
    ]
    return pb.EnqueueBatchResponse(results=results).SerializeToString()


def sized_enqueue_message(size: int) -> bytes:
    """A valid one-result EnqueueBatchResponse of exactly `size` bytes."""
    for pad in range(size, 0, -1):
        message = enqueue_message(1, prefix="id-" + "x" * pad)
        if len(message) == size:
            return message
    raise AssertionError(f"no message of {size} bytes")


def good_response(call: ServerCall) -> bytes:
    """What a correct server answers to each method the tests use."""
    if call.method == "GetServerInfo":
        return info_message()
    if call.method == "EnqueueBatch":
        jobs = len(pb.EnqueueBatchRequest.FromString(call.message).jobs)
        return enqueue_message(jobs, prefix=f"c{call.conn.index}")
    if call.method == "Reserve":
        return reserve_message(job_message())
    if call.method == "Ack":
        return pb.AckResponse(job_id="j1").SerializeToString()
    if call.method == "Extend":
        msg = pb.ExtendResponse(job_id="j1")
        msg.lease_expires_at.FromSeconds(1_700_000_100)
        return msg.SerializeToString()
    raise AssertionError(f"unexpected method {call.method}")


async def behave(call: ServerCall) -> None:
    await call.respond(good_response(call))


def only(method: str, script: Callable[[ServerCall], Awaitable[None]]) -> Any:
    """A handler that misbehaves (with `script`) for `method` on the first connection only,
    and answers everything else correctly."""

    async def handler(call: ServerCall) -> None:
        if call.method == method and call.conn.index == 0:
            await script(call)
        else:
            await behave(call)

    return handler


def first_call(script: Callable[[ServerCall], Awaitable[None]]) -> Any:
    """A handler that misbehaves on the very first call and behaves afterwards."""

    async def handler(call: ServerCall) -> None:
        if call.index == 0:
            await script(call)
        else:
            await behave(call)

    return handler


# -- harness --------------------------------------------------------------------------------

FRONT_ENDS = ("trio", "blocking", "asyncio")
_front_end: ContextVar[str] = ContextVar("front_end")
F = TypeVar("F", bound=Callable[..., Any])


def only_on(front_end: str, reason: str) -> Callable[[F], F]:
    """Run this test on one front end alone, for `reason`."""

    def mark(test: F) -> F:
        test.only_on = (front_end, reason)  # type: ignore[attr-defined]
        return test

    return mark


def trio_only(reason: str) -> Callable[[F], F]:
    """Run this test on the trio front end alone, for `reason`."""
    return only_on("trio", reason)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    only = getattr(metafunc.function, "only_on", None)
    metafunc.parametrize("front_end", FRONT_ENDS if only is None else (only[0],))


@pytest.fixture(autouse=True)
def _on_front_end(front_end: str) -> Any:
    token = _front_end.set(front_end)
    yield
    _front_end.reset(token)


def blocking() -> bool:
    return _front_end.get() == "blocking"


def on_trio() -> bool:
    return _front_end.get() == "trio"


class Threaded:
    """A `sepp.SyncClient` whose methods are awaitables: each call runs the blocking method
    in a worker thread, so a test drives it as it drives a `sepp.Client`. A cancelled wait
    abandons its thread (a thread cannot be cancelled): GUARD_S still ends a hung test."""

    def __init__(self, sync: sepp.SyncClient) -> None:
        self._sync = sync

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self._sync, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            run = functools.partial(method, *args, **kwargs)
            return await trio.to_thread.run_sync(run, abandon_on_cancel=True)

        return call


@asynccontextmanager
async def open_client(address: str, **options: Any) -> AsyncIterator[sepp.Client]:
    """`sepp.open(address, **options)` on the trio front end; on the blocking one, a
    `sepp.SyncClient` with the same options, connected (as open() connects) and closed; on
    the asyncio one, the client opened in an asyncio loop of its own (`open_on_asyncio`, which
    checks that no asyncio task outlives it)."""
    if _front_end.get() == "asyncio":
        async with open_on_asyncio(address, **options) as client:
            yield client
        return
    if not blocking():
        async with sepp.open(address, **options) as client:
            yield client
        return
    sync = sepp.SyncClient(address, **options)
    try:
        await trio.to_thread.run_sync(sync.connect, abandon_on_cancel=True)
        yield cast(sepp.Client, Threaded(sync))
    finally:
        sync.close()  # never blocks: it shuts the sockets, waking any thread still reading


def leaked_tasks() -> list[str]:
    """The trio tasks running sepp code (the blocking and asyncio front ends start none)."""
    return sepp_tasks() if on_trio() else []


def open_sockets() -> set[str]:
    """The sockets this process holds open (Linux: their inodes, from /proc/self/fd)."""
    sockets = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # the listing's own descriptor, closed already
            continue
        if target.startswith("socket:"):
            sockets.add(target)
    return sockets


@contextmanager
def every_socket_closed() -> Iterator[None]:
    """On the blocking front end (whose only resources are its sockets, as the trio one's are
    its tasks), check that each socket opened in the block was closed by its owner in the
    block: none is still open, and none was left for the garbage collector to close."""
    if on_trio():
        yield
        return
    # No gc.collect() (two per test cost 0.1-0.3 s each in a full session: a fifth of a
    # part's time): a socket dropped unclosed warns at once (refcounting), or stays open
    # until collected (a cycle; PyPy) and the fd check sees it. Freezing what is older keeps
    # a collection in the block from closing an earlier test's socket here.
    if CHEAP_FREEZE:
        gc.freeze()
    before = open_sockets()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            yield
    finally:
        if CHEAP_FREEZE:
            gc.unfreeze()
    assert open_sockets() <= before, "a socket was left open"
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not unclosed, unclosed


def sepp_tasks() -> list[str]:
    """Names of every live trio task that runs sepp code."""
    names: list[str] = []
    stack = [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        if task.name.startswith("sepp."):
            names.append(task.name)
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return names


class Recorder:
    """A logger that keeps what it is given."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str]] = []

    def _log(self, level: str, msg: str, *args: object) -> None:
        self.records.append((level, msg % args if args else msg))

    def debug(self, msg: str, *args: object) -> None:
        self._log("debug", msg, *args)

    def info(self, msg: str, *args: object) -> None:
        self._log("info", msg, *args)

    def warning(self, msg: str, *args: object) -> None:
        self._log("warning", msg, *args)

    def error(self, msg: str, *args: object) -> None:
        self._log("error", msg, *args)

    def at(self, level: str) -> list[str]:
        return [text for lvl, text in self.records if lvl == level]


@asynccontextmanager
async def hostile(handler: Any, **options: Any) -> AsyncIterator[tuple[H2Server, sepp.Client]]:
    """The fixture server (H2Server options among `options`) and a client to it, on the
    test's front end (`open_client`).

    The remaining `options` go to `sepp.open`. Local validation is off so that an enqueue is
    exactly one call (no GetServerInfo first), and keepalive is the default."""
    server_keys = {
        "max_concurrent_streams",
        "initial_window_size",
        "silent",
        "settings_delay",
        "window_updates",
        "ping_min_time",
        "max_header_list_size",
    }
    server_kwargs = {k: v for k, v in options.items() if k in server_keys}
    open_kwargs: dict[str, Any] = {"validate_locally": False, "connect_timeout": 3.0}
    open_kwargs.update({k: v for k, v in options.items() if k not in server_keys})
    with trio.fail_after(GUARD_S), every_socket_closed():
        async with trio.open_nursery() as nursery:
            server = await H2Server(handler, **server_kwargs).start(nursery)
            async with open_client(f"127.0.0.1:{server.port}", **open_kwargs) as client:
                if on_trio():
                    assert sepp_tasks(), "the client's connection tasks should be running"
                yield server, client
            assert not leaked_tasks(), f"tasks leaked past the client: {leaked_tasks()}"
            # Every connection the client opened is closed, none left half-open.
            await server.wait_until(lambda: all(c.closed for c in server.connections))
            nursery.cancel_scope.cancel()
    assert not server.errors, server.errors  # every script ran as written
    assert not server.protocol_errors, server.protocol_errors  # the client never broke HTTP/2


async def raises(expected: type[E], call: Awaitable[object]) -> E:
    """Await `call`, expecting `expected` (a hang ends at the test's GUARD_S, and fails it)."""
    with pytest.raises(expected) as info:
        await call
    return info.value


async def reserved_job(client: sepp.Client) -> sepp.Job:
    jobs = await client.reserve("q", wait_timeout=0)
    assert jobs is not None and len(jobs) == 1
    return jobs[0]


# -- HTTP status and gRPC status ------------------------------------------------------------


@pytest.mark.parametrize(
    ("http_status", "error", "code"),
    [
        (503, sepp.TransportError, sepp.StatusCode.UNAVAILABLE),
        (429, sepp.TransportError, sepp.StatusCode.UNAVAILABLE),
        (401, sepp.UnauthenticatedError, sepp.StatusCode.UNAUTHENTICATED),
        (404, sepp.UnexpectedStatusError, sepp.StatusCode.UNIMPLEMENTED),
        (500, sepp.ServerInternalError, sepp.StatusCode.UNKNOWN),
    ],
)
async def test_non_200_status_maps_to_a_typed_error_and_keeps_the_connection(
    http_status: int, error: type[sepp.ClientError], code: sepp.StatusCode
) -> None:
    async def proxy_page(call: ServerCall) -> None:
        await call.send_headers(
            [(b":status", b"%d" % http_status), (b"content-type", b"text/html")]
        )
        await call.send_data(b"<html><body>upstream trouble</body></html>", end=True)

    async with hostile(only("GetServerInfo", proxy_page)) as (server, client):
        exc = await raises(error, client.get_server_info(timeout=5))
        assert exc.code is code
        assert f"HTTP {http_status}" in str(exc)
        # A proxy's 429/503 means a busy or absent backend; any other HTTP answer, another
        # HTTP server where sepp's gRPC port was meant (its admin UI answers 404).
        hint = "is probably not sepp's gRPC port" in str(exc)
        assert hint is (code is not sepp.StatusCode.UNAVAILABLE), str(exc)
        assert exc.details == f"server answered HTTP {http_status} instead of 200"
        assert await client.enqueue("q", "t") == sepp.EnqueueAck("c0-0", False)
        assert len(server.connections) == 1


@both_codecs
@pytest.mark.parametrize("shape", ["trailers_without_status", "no_trailers", "headers_only"])
async def test_missing_grpc_status_is_a_malformed_response(shape: str) -> None:
    async def no_status(call: ServerCall) -> None:
        if shape == "headers_only":  # END_STREAM on the response headers, nothing else
            await call.send_headers(end=True)
            return
        await call.send_headers()
        if shape == "no_trailers":  # END_STREAM on the message's DATA frame
            await call.send_data(frame_message(info_message()), end=True)
        else:
            await call.send_data(frame_message(info_message()))
            await call.send_headers([(b"x-something", b"else")], end=True)

    async with hostile(first_call(no_status)) as (_, client):
        exc = await raises(sepp.MalformedResponseError, client.get_server_info(timeout=5))
        assert "grpc-status" in str(exc)
        assert (await client.get_server_info()).server_version == "hostile-1"


@pytest.mark.parametrize("garbage", [b"banana", b"-1", b"17", b"99999", b"0x0", b"\xff"])
async def test_garbage_grpc_status_is_a_server_internal_error(garbage: bytes) -> None:
    async def bad_status(call: ServerCall) -> None:
        await call.send_headers()
        await call.send_data(frame_message(info_message()))
        await call.send_trailers(garbage, b"what")

    async with hostile(first_call(bad_status)) as (_, client):
        exc = await raises(sepp.ServerInternalError, client.get_server_info(timeout=5))
        assert exc.code is sepp.StatusCode.UNKNOWN
        assert exc.details == "what"
        # A garbage status is never read as OK, even though a message arrived.
        assert (await client.get_server_info()).server_version == "hostile-1"


async def test_bad_percent_encoding_in_grpc_message_is_decoded_and_the_error_typed() -> None:
    raw = b"job %ZZ gone %E2%9C%97 %FF tail %"

    async def not_found(call: ServerCall) -> None:
        await call.trailers_only(sepp.StatusCode.NOT_FOUND, raw)

    async def invalid(call: ServerCall) -> None:
        await call.send_headers()
        await call.send_trailers(sepp.StatusCode.INVALID_ARGUMENT, raw)

    async def handler(call: ServerCall) -> None:
        if call.method == "Ack":
            await not_found(call)
        elif call.method == "GetServerInfo":
            await invalid(call)
        else:
            await behave(call)

    expected = "job %ZZ gone \u2717 \ufffd tail %"
    async with hostile(handler) as (_, client):
        job = await reserved_job(client)
        lost = await raises(sepp.JobNotFoundError, client.ack(job.ctx, timeout=5))
        assert (lost.code, lost.details) == (sepp.StatusCode.NOT_FOUND, expected)
        bad = await raises(sepp.InvalidRequestError, client.get_server_info(timeout=5))
        assert (bad.code, bad.details) == (sepp.StatusCode.INVALID_ARGUMENT, expected)


@both_codecs
async def test_response_headers_without_status_pseudo_header_are_malformed() -> None:
    async def no_status_line(call: ServerCall) -> None:
        await call.send_headers([(b"content-type", b"application/grpc")])
        await call.send_data(frame_message(info_message()))
        await call.send_trailers(0)

    async with hostile(first_call(no_status_line)) as (_, client):
        exc = await raises(sepp.MalformedResponseError, client.get_server_info(timeout=5))
        assert ":status" in str(exc)
        assert (await client.get_server_info()).server_version == "hostile-1"


async def test_informational_headers_before_the_response_are_skipped() -> None:
    async def with_100(call: ServerCall) -> None:
        await call.send_headers([(b":status", b"100")])
        await call.respond(good_response(call))

    async with hostile(first_call(with_100)) as (_, client):
        info = await client.get_server_info(timeout=5)
        assert info.server_version == "hostile-1"


@both_codecs
@pytest.mark.parametrize(
    "content_type", [b"text/html", b"application/json", b"application/grpcx", b"application/grp"]
)
async def test_wrong_content_type_is_a_malformed_response(content_type: bytes) -> None:
    async def wrong_type(call: ServerCall) -> None:
        await call.send_headers([(b":status", b"200"), (b"content-type", content_type)])
        await call.send_data(frame_message(info_message()))
        await call.send_trailers(0)

    async with hostile(first_call(wrong_type)) as (_, client):
        exc = await raises(sepp.MalformedResponseError, client.get_server_info(timeout=5))
        assert "content-type" in str(exc)
        assert (await client.get_server_info()).server_version == "hostile-1"


@both_codecs
async def test_html_page_with_status_200_is_a_malformed_response() -> None:
    async def html(call: ServerCall) -> None:
        await call.send_headers([(b":status", b"200"), (b"content-type", b"text/html")])
        await call.send_data(b"<html>maintenance</html>", end=True)

    async with hostile(first_call(html)) as (_, client):
        await raises(sepp.MalformedResponseError, client.enqueue("q", "t", timeout=5))


# -- gRPC message framing -------------------------------------------------------------------


async def test_length_prefix_over_the_receive_cap_is_refused_unread() -> None:
    async def oversized(call: ServerCall) -> None:
        await call.send_headers()
        await call.send_data(struct.pack(">BI", 0, 4096))  # the prefix alone: 4 KiB announced
        await call.stall()  # the body never comes; the client must not wait for it

    async with hostile(first_call(oversized), max_receive_message_bytes=1024) as (
        server,
        client,
    ):
        exc = await raises(sepp.MessageTooLargeError, client.get_server_info(timeout=5))
        assert exc.code is sepp.StatusCode.RESOURCE_EXHAUSTED
        assert "4096" in str(exc) and "1024" in str(exc)
        # The stream is cancelled, the connection kept.
        await server.wait_until(lambda: server.resets.get((0, 1)) == ErrorCodes.CANCEL)
        assert (await client.get_server_info()).server_version == "hostile-1"
        assert len(server.connections) == 1


@pytest.mark.parametrize(("declared", "ok"), [(1024, True), (1025, False)])
async def test_receive_cap_is_exact(declared: int, ok: bool) -> None:
    """The cap counts the message: exactly the cap is accepted, one byte more is not."""
    message = sized_enqueue_message(declared)

    async def sized(call: ServerCall) -> None:
        await call.respond(message)

    async with hostile(sized, max_receive_message_bytes=1024) as (_, client):
        if ok:
            ack = await client.enqueue("q", "t", timeout=5)
            assert ack.job_id.startswith("id-xxx") and ack.job_id.endswith("-0")
        else:
            await raises(sepp.MessageTooLargeError, client.enqueue("q", "t", timeout=5))


async def test_message_split_across_one_byte_data_frames_is_reassembled() -> None:
    async def trickle(call: ServerCall) -> None:
        await call.send_headers()
        for byte in frame_message(good_response(call)):
            await call.send_data(bytes([byte]))
        await call.send_trailers(0)

    async with hostile(trickle) as (server, client):
        info = await client.get_server_info(timeout=5)
        assert info.server_version == "hostile-1"
        assert info.server_time == dt.datetime.fromtimestamp(1_700_000_000, dt.timezone.utc)
        jobs = await client.reserve("q", wait_timeout=0)
        assert jobs is not None and [j.ctx.id for j in jobs] == ["j1"]
        assert len(server.calls) == 2


@both_codecs
@pytest.mark.parametrize("how", ["extra_bytes_same_frame", "extra_bytes_later", "second_message"])
async def test_more_data_than_the_length_prefix_is_malformed(how: str) -> None:
    async def overflow(call: ServerCall) -> None:
        framed = frame_message(info_message())
        await call.send_headers()
        if how == "extra_bytes_same_frame":
            await call.send_data(framed + b"\x00junk")
        elif how == "extra_bytes_later":
            await call.send_data(framed)
            await call.send_data(b"junk")
        else:
            await call.send_data(framed + framed)
        await call.send_trailers(0)

    async with hostile(first_call(overflow)) as (_, client):
        exc = await raises(sepp.MalformedResponseError, client.get_server_info(timeout=5))
        assert "length prefix" in str(exc) or "more than one message" in str(exc)
        assert (await client.get_server_info()).server_version == "hostile-1"


@both_codecs
@pytest.mark.parametrize("flag", [1, 2, 0x80, 0xFF])
async def test_compressed_or_unknown_flag_is_malformed(flag: int) -> None:
    async def compressed(call: ServerCall) -> None:
        message = info_message()
        await call.send_headers([*GRPC_HEADERS, (b"grpc-encoding", b"gzip")])
        await call.send_data(struct.pack(">BI", flag, len(message)) + message)
        await call.send_trailers(0)

    async with hostile(first_call(compressed)) as (_, client):
        exc = await raises(sepp.MalformedResponseError, client.get_server_info(timeout=5))
        assert "compress" in str(exc)
        assert (await client.get_server_info()).server_version == "hostile-1"


def gzip_framed(message: bytes) -> bytes:
    packed = gzip.compress(message)
    return struct.pack(">BI", 1, len(packed)) + packed


async def gzip_everything(call: ServerCall) -> None:
    """A grpcio server with `compression=Gzip`: it compresses every response, whether or not
    the client said it accepts gzip."""
    await call.send_headers([*GRPC_HEADERS, (b"grpc-encoding", b"gzip")])
    await call.send_data(gzip_framed(good_response(call)))
    await call.send_trailers(0)


async def test_a_server_that_gzips_every_response_is_understood() -> None:
    async with hostile(gzip_everything) as (server, client):
        assert (await client.get_server_info(timeout=5)).server_version == "hostile-1"
        ack = await client.enqueue("q", "t", timeout=5)
        assert ack.job_id == "c0-0"
        assert [j.ctx.id for j in await client.reserve("q", wait_timeout=0) or []] == ["j1"]
        assert [call.header(b"grpc-accept-encoding") for call in server.calls] == [b"gzip"] * 3
        assert len(server.connections) == 1


async def test_a_gzip_bomb_is_too_large_and_the_connection_stays() -> None:
    async def bomb(call: ServerCall) -> None:
        # 64 MiB of zeros in 64 KiB: far below the receive cap until decompressed.
        await call.send_headers([*GRPC_HEADERS, (b"grpc-encoding", b"gzip")])
        await call.send_data(gzip_framed(bytes(64 << 20)))
        await call.stall()  # trailers never come: the client must not wait for them

    async with hostile(first_call(bomb), max_receive_message_bytes=1 << 20) as (server, client):
        with pytest.raises(sepp.MessageTooLargeError) as info:
            await client.get_server_info(timeout=5)
        assert info.value.code is sepp.StatusCode.RESOURCE_EXHAUSTED
        assert "decompresses to more than the 1048576-byte receive limit" in str(info.value)
        await server.wait_until(lambda: server.resets.get((0, 1)) == ErrorCodes.CANCEL)
        assert (await client.get_server_info()).server_version == "hostile-1"
        assert len(server.connections) == 1


async def test_a_message_compressed_in_an_encoding_never_accepted_names_it() -> None:
    async def snappy(call: ServerCall) -> None:
        message = info_message()
        await call.send_headers([*GRPC_HEADERS, (b"grpc-encoding", b"snappy")])
        await call.send_data(struct.pack(">BI", 1, len(message)) + message)
        await call.send_trailers(0)

    async with hostile(first_call(snappy)) as (_, client):
        with pytest.raises(sepp.MalformedResponseError) as info:
            await client.get_server_info(timeout=5)
        assert info.value.code is sepp.StatusCode.INTERNAL
        assert "'snappy'" in str(info.value)
        assert (await client.get_server_info()).server_version == "hostile-1"


@both_codecs
async def test_truncated_message_followed_by_ok_status_is_malformed() -> None:
    async def truncated(call: ServerCall) -> None:
        await call.send_headers()
        await call.send_data(frame_message(info_message())[:12])
        await call.send_trailers(0)

    async with hostile(first_call(truncated)) as (_, client):
        exc = await raises(sepp.MalformedResponseError, client.get_server_info(timeout=5))
        assert "truncated" in str(exc)


@both_codecs
async def test_ok_status_without_any_message_is_malformed() -> None:
    async def empty(call: ServerCall) -> None:
        await call.trailers_only(0)

    async with hostile(first_call(empty)) as (_, client):
        exc = await raises(sepp.MalformedResponseError, client.enqueue("q", "t", timeout=5))
        assert "no response message" in str(exc)


# -- stalls, deadlines, cancellation ---------------------------------------------------------


async def _stall_before_headers(call: ServerCall) -> None:
    await call.stall()


async def _stall_after_headers(call: ServerCall) -> None:
    await call.send_headers()
    await call.stall()


async def _stall_mid_message(call: ServerCall) -> None:
    await call.send_headers()
    await call.send_data(frame_message(info_message())[:9])
    await call.stall()


async def _trailers_never_come(call: ServerCall) -> None:
    await call.send_headers()
    await call.send_data(frame_message(info_message()))
    await call.stall()


STALLS = {
    "before_headers": _stall_before_headers,
    "after_headers": _stall_after_headers,
    "mid_message": _stall_mid_message,
    "trailers_never_come": _trailers_never_come,
}


@pytest.mark.parametrize("stage", list(STALLS))
async def test_stall_with_a_deadline_is_deadline_exceeded_in_time(stage: str) -> None:
    timeout = 0.3
    async with hostile(first_call(STALLS[stage])) as (server, client):
        start = trio.current_time()
        exc = await raises(sepp.TransportError, client.get_server_info(timeout=timeout))
        assert trio.current_time() - start >= timeout
        assert exc.code is sepp.StatusCode.DEADLINE_EXCEEDED
        await server.wait_until(lambda: server.resets.get((0, 1)) == ErrorCodes.CANCEL)
        # The connection was not given up over one slow stream.
        assert (await client.get_server_info()).server_version == "hostile-1"
        assert len(server.connections) == 1


async def test_stall_with_the_client_wide_rpc_timeout_is_deadline_exceeded() -> None:
    async with hostile(first_call(_trailers_never_come), rpc_timeout=0.3) as (_, client):
        exc = await raises(sepp.TransportError, client.enqueue("q", "t"))
        assert exc.code is sepp.StatusCode.DEADLINE_EXCEEDED


@trio_only("a trio cancel scope around the call: a thread blocked in a call cannot be cancelled")
@pytest.mark.parametrize("stage", ["before_headers", "trailers_never_come"])
async def test_stall_without_a_deadline_is_bounded_by_the_callers_cancel_scope(
    stage: str,
) -> None:
    async with hostile(first_call(STALLS[stage]), rpc_timeout=None) as (server, client):
        start = trio.current_time()
        with trio.move_on_after(0.3) as scope:
            await client.get_server_info()
        assert scope.cancelled_caught  # a trio cancellation stays a cancellation
        assert trio.current_time() - start >= 0.3
        await server.wait_until(lambda: server.resets.get((0, 1)) == ErrorCodes.CANCEL)
        # The same connection serves the next call.
        assert (await client.get_server_info()).server_version == "hostile-1"
        assert len(server.connections) == 1
        assert server.calls[1].stream_id == 3


@pytest.mark.parametrize("behind", ["a_call_in_flight", "a_lost_connection"])
async def test_a_deadline_gone_before_the_call_can_wait_fails_it_typed_and_in_time(
    behind: str,
) -> None:
    # The call must wait behind something (on SyncClient: for the thread reading the
    # connection, or for a new connection), and its deadline is gone by then: that is still a
    # TransportError in time, and whatever it waited behind goes on undisturbed.
    release = trio.Event()

    async def held(call: ServerCall) -> None:
        await release.wait()
        await behave(call)

    async with hostile(held) as (server, client), trio.open_nursery() as nursery:
        if behind == "a_call_in_flight":
            nursery.start_soon(client.get_server_info)
            await server.wait_until(lambda: len(server.calls) == 1)
        else:
            release.set()
            await server.connections[0].close()
            await wait_all_tasks_blocked()  # the trio client saw it; SyncClient reads when used
        exc = await raises(sepp.TransportError, client.get_server_info(timeout=1e-6))
        expected = {sepp.StatusCode.DEADLINE_EXCEEDED}
        if behind == "a_lost_connection":  # or it went out on the lost one, and died with it
            expected.add(sepp.StatusCode.UNAVAILABLE)
        assert exc.code in expected
        release.set()
        assert (await client.get_server_info(timeout=5)).server_version == "hostile-1"


# -- resets, GOAWAY, dropped connections ------------------------------------------------------


@pytest.mark.parametrize(
    ("rst", "error", "code"),
    [
        (ErrorCodes.REFUSED_STREAM, sepp.TransportError, sepp.StatusCode.UNAVAILABLE),
        (ErrorCodes.CANCEL, sepp.TransportError, sepp.StatusCode.CANCELLED),
        (ErrorCodes.ENHANCE_YOUR_CALM, sepp.OverloadedError, sepp.StatusCode.RESOURCE_EXHAUSTED),
        (ErrorCodes.INTERNAL_ERROR, sepp.ServerInternalError, sepp.StatusCode.INTERNAL),
        (ErrorCodes.PROTOCOL_ERROR, sepp.ServerInternalError, sepp.StatusCode.INTERNAL),
    ],
)
async def test_rst_stream_mid_response_is_typed_and_keeps_the_connection(
    rst: ErrorCodes, error: type[sepp.ClientError], code: sepp.StatusCode
) -> None:
    async def reset_mid_response(call: ServerCall) -> None:
        await call.send_headers()
        await call.send_data(frame_message(info_message())[:10])
        await call.reset(rst)

    async with hostile(first_call(reset_mid_response)) as (server, client):
        exc = await raises(error, client.get_server_info(timeout=5))
        assert exc.code is code
        assert (await client.get_server_info()).server_version == "hostile-1"
        assert len(server.connections) == 1


async def test_refused_stream_is_retried_by_the_retry_policy() -> None:
    async def refuse(call: ServerCall) -> None:
        await call.reset(ErrorCodes.REFUSED_STREAM)

    policy = sepp.RetryPolicy(max_attempts=3, initial_backoff=0.01, jitter=False)
    async with hostile(first_call(refuse), retry_policy=policy) as (server, client):
        ack = await client.enqueue("q", "t", timeout=5)  # un-keyed: refused = never processed
        assert ack.job_id == "c0-0"
        assert [c.method for c in server.calls] == ["EnqueueBatch", "EnqueueBatch"]


async def _goaway_scenario(
    client: sepp.Client, server: H2Server, release: trio.Event
) -> tuple[object, object]:
    """Call A (stream 1) is in flight and below last_stream_id; call B (stream 3) is in flight
    and above it when the server says GOAWAY(last_stream_id=1). Returns both outcomes."""
    outcomes: dict[str, object] = {}
    b_done = trio.Event()

    async def run(name: str, call: Awaitable[object]) -> None:
        try:
            outcomes[name] = await call
        except sepp.SeppError as exc:
            outcomes[name] = exc
        if name == "b":
            b_done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, "a", client.get_server_info(timeout=5))
        await server.wait_until(lambda: len(server.calls) == 1)
        nursery.start_soon(run, "b", client.enqueue("q", "t", timeout=5))
        await server.wait_until(lambda: len(server.calls) == 2)
        assert [c.stream_id for c in server.calls] == [1, 3]
        await server.connections[0].goaway(1)
        await b_done.wait()  # failed, or retried on a new connection, without waiting for A
        assert "a" not in outcomes  # the stream below last_stream_id is still allowed to finish
        release.set()
    return outcomes["a"], outcomes["b"]


def _goaway_handler(release: trio.Event) -> Any:
    async def handler(call: ServerCall) -> None:
        if call.conn.index == 0 and call.stream_id == 1:
            await release.wait()
            await behave(call)
        elif call.conn.index == 0:
            await call.stall()  # the server will not process it (it is above last_stream_id)
        else:
            await behave(call)

    return handler


async def test_goaway_resends_calls_above_last_stream_id_and_completes_those_below() -> None:
    release = trio.Event()
    async with hostile(_goaway_handler(release)) as (server, client):
        a, b = await _goaway_scenario(client, server, release)
        assert isinstance(a, sepp.ServerInfo) and a.server_version == "hostile-1"
        # No retry policy, un-keyed: sent again all the same, as it was never processed.
        assert b == sepp.EnqueueAck("c1-0", False)
        # New calls go to the new connection; the drained one is closed by the client.
        assert await client.enqueue("q", "t", timeout=5) == sepp.EnqueueAck("c1-0", False)
        assert len(server.connections) == 2
        await server.wait_until(lambda: server.connections[0].closed)


async def test_goaway_above_last_stream_id_is_retried_on_a_new_connection() -> None:
    release = trio.Event()
    policy = sepp.RetryPolicy(max_attempts=3, initial_backoff=0.01, jitter=False)
    async with hostile(_goaway_handler(release), retry_policy=policy) as (server, client):
        a, b = await _goaway_scenario(client, server, release)
        assert isinstance(a, sepp.ServerInfo)
        # Un-keyed, yet retried: a stream above last_stream_id was never processed.
        assert b == sepp.EnqueueAck("c1-0", False)
        assert [(c.conn.index, c.method) for c in server.calls] == [
            (0, "GetServerInfo"),
            (0, "EnqueueBatch"),
            (1, "EnqueueBatch"),
        ]


@pytest.mark.parametrize("cut_at", [0, 3, 12])
async def test_connection_closed_mid_message_then_the_next_call_reconnects(cut_at: int) -> None:
    async def cut(call: ServerCall) -> None:
        await call.send_headers()
        if cut_at:
            await call.send_data(frame_message(info_message())[:cut_at])
        await call.conn.close()

    async with hostile(only("GetServerInfo", cut)) as (server, client):
        exc = await raises(sepp.TransportError, client.get_server_info(timeout=5))
        assert exc.code is sepp.StatusCode.UNAVAILABLE
        assert await client.enqueue("q", "t", timeout=5) == sepp.EnqueueAck("c1-0", False)
        assert len(server.connections) == 2


async def test_connection_dropped_before_the_response_is_retried_for_a_keyed_enqueue() -> None:
    async def drop(call: ServerCall) -> None:
        await call.conn.close()

    policy = sepp.RetryPolicy(max_attempts=2, initial_backoff=0.01, jitter=False)
    async with hostile(only("EnqueueBatch", drop), retry_policy=policy) as (server, client):
        ack = await client.enqueue("q", "t", idempotency_key="k-1", timeout=5)
        assert ack == sepp.EnqueueAck("c1-0", False)
        assert len(server.connections) == 2
        sent = [pb.EnqueueBatchRequest.FromString(c.message).jobs[0] for c in server.calls]
        assert [job.idempotency_key for job in sent] == ["k-1", "k-1"]  # the same job, twice


async def test_a_hostile_response_fails_only_its_own_call() -> None:
    async def handler(call: ServerCall) -> None:
        if call.index == 3:
            message = info_message()
            await call.send_headers()
            await call.send_data(struct.pack(">BI", 1, len(message)) + message)
            await call.send_trailers(0)
        else:  # answered once the hostile response went out: in flight when it came
            server = call.conn.server
            await server.wait_until(lambda: len(server.calls) > 3 and server.calls[3].finished)
            await behave(call)

    async with hostile(handler) as (server, client):
        outcomes: list[object] = []

        async def one() -> None:
            try:
                outcomes.append(await client.get_server_info(timeout=5))
            except sepp.SeppError as exc:
                outcomes.append(exc)

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(one)
        failed = [o for o in outcomes if isinstance(o, sepp.SeppError)]
        assert len(outcomes) == 8
        assert len(failed) == 1 and isinstance(failed[0], sepp.MalformedResponseError)
        assert len(server.connections) == 1


# -- HTTP/2 abuse -----------------------------------------------------------------------------


async def test_headers_over_the_servers_header_list_limit_fail_locally_unsent() -> None:
    """A server that advertised SETTINGS_MAX_HEADER_LIST_SIZE 16 KiB refuses a bigger header
    block (RESOURCE_EXHAUSTED, or HTTP 431): the call fails before anything is sent."""
    key = "k" * (63 * 1024)
    async with hostile(behave, max_header_list_size=16 * 1024, api_key=key) as (server, client):
        with pytest.raises(sepp.MessageTooLargeError) as info:
            await client.get_server_info(timeout=5)
        assert info.value.code is sepp.StatusCode.RESOURCE_EXHAUSTED
        assert "16384-byte header list limit" in str(info.value)
        assert key not in str(info.value)
        with pytest.raises(sepp.MessageTooLargeError):
            await client.enqueue("q", "t", timeout=5)
        assert server.calls == []  # no HEADERS ever reached the server
        assert len(server.connections) == 1 and not server.connections[0].closed


async def test_keepalive_during_a_long_call_never_trips_a_grpc_go_ping_policy() -> None:
    """A grpc-go server (keepalive enforcement, MinTime 5 min) ends the connection at the
    third early PING while it sends nothing. Keepalive every 50 ms here, so that a call of
    twenty intervals is long (trio's MockClock plays the default 30 s over 3 minutes in
    tests/unit/test_wire_transport.py)."""

    async def long_call(call: ServerCall) -> None:
        conn = call.conn
        await conn.server.wait_until(lambda: conn.pings_received >= 2 or conn.closed)
        await trio.sleep(1.0)  # at least twenty more keepalive intervals, to ping in
        await behave(call)

    async with hostile(
        long_call, ping_min_time=300.0, keepalive_interval=0.05, keepalive_timeout=5.0
    ) as (server, client):
        assert (await client.get_server_info(timeout=5)).server_version == "hostile-1"
        conn = server.connections[0]
        assert (conn.pings_received, conn.too_many_pings) == (2, False)
        assert len(server.connections) == 1
        # The next call lets two more go.
        assert await client.enqueue("q", "t", timeout=5) == sepp.EnqueueAck("c0-0", False)
        assert (conn.pings_received, conn.too_many_pings) == (4, False)
        assert len(server.connections) == 1


async def test_ping_flood_is_answered_and_calls_keep_working() -> None:
    async def flood(call: ServerCall) -> None:
        await call.conn.ping_flood(5000)
        await behave(call)

    async with hostile(first_call(flood)) as (server, client):
        assert (await client.get_server_info(timeout=5)).server_version == "hostile-1"
        conn = server.connections[0]
        await server.wait_until(lambda: conn.ping_acks == 5000)
        assert await client.enqueue("q", "t", timeout=5) == sepp.EnqueueAck("c0-0", False)
        assert len(server.connections) == 1


async def test_ping_flood_from_a_server_that_never_reads_fails_the_call_in_time() -> None:
    # Our PING ACKs cannot all leave: the server reads nothing, so the socket fills up. The
    # client must not wait on the full socket past the call's deadline (nor for keepalive):
    # it goes on reading, and either the engine's cap on unsent ACKs ends the connection or
    # the deadline ends the call, whichever comes first (with h2, parsing is the bottleneck).
    async def flood(call: ServerCall) -> None:
        call.conn.stop_reading()
        while not call.conn.closed:
            await call.conn.ping_flood(10_000)

    # The hang this guards against lasts until keepalive (GUARD_S), and ends as a keepalive
    # failure or at the test's guard: either fails it. (Parsing 10,000 PINGs per burst with h2
    # under a loaded CI took the call 1.7 s past its deadline.)
    timeout = 2.0
    async with hostile(first_call(flood), keepalive_timeout=GUARD_S) as (server, client):
        exc = await raises(
            sepp.TransportError,
            client.get_server_info(timeout=timeout),
        )
        if exc.code is sepp.StatusCode.UNAVAILABLE:
            assert "did not read" in str(exc)
        else:
            assert exc.code is sepp.StatusCode.DEADLINE_EXCEEDED
        server.connections[0].discarding = True  # only to see the close: what we sent is moot
        server.connections[0].resume_reading()


async def test_zero_window_forever_ends_every_call_at_its_deadline() -> None:
    # The server never lets a single request byte through; each call's HEADERS get out but
    # its body cannot. The client cannot tell this from a slow server: it keeps the
    # connection, ends each call at its deadline, and resets its stream so that the server's
    # two stream slots are freed for the next call.
    async with hostile(behave, initial_window_size=0, max_concurrent_streams=2) as (
        server,
        client,
    ):
        for i in range(4):
            start = trio.current_time()
            exc = await raises(sepp.TransportError, client.get_server_info(timeout=0.2))
            assert exc.code is sepp.StatusCode.DEADLINE_EXCEEDED
            assert trio.current_time() - start >= 0.2
            await server.wait_until(lambda i=i: len(server.resets) == i + 1)
        assert len(server.calls) == 4
        assert set(server.resets.values()) == {ErrorCodes.CANCEL}
        assert not any(c.ended for c in server.calls)
        assert len(server.connections) == 1


async def test_withheld_window_blocks_only_the_request_that_needs_it() -> None:
    # 1 KiB per stream and never a WINDOW_UPDATE: a 64 KiB enqueue can never finish sending,
    # but small calls, each with a fresh stream window, still go through on the same connection.
    async with hostile(behave, initial_window_size=1024, window_updates=False) as (
        server,
        client,
    ):
        big = sepp.Payload(b"x" * 65536, "application/octet-stream")
        outcome: list[BaseException] = []

        async def big_enqueue() -> None:
            try:
                await client.enqueue("q", "t", payload=big, timeout=0.5)
            except sepp.SeppError as exc:
                outcome.append(exc)

        async with trio.open_nursery() as nursery:
            start = trio.current_time()
            nursery.start_soon(big_enqueue)
            await server.wait_until(lambda: len(server.calls) == 1)
            for _ in range(3):
                assert (await client.get_server_info(timeout=5)).server_version == "hostile-1"
        assert trio.current_time() - start >= 0.5
        assert len(outcome) == 1 and isinstance(outcome[0], sepp.TransportError)
        assert outcome[0].code is sepp.StatusCode.DEADLINE_EXCEEDED
        assert not server.calls[0].ended
        assert len(server.calls[0].body) == 1024  # exactly the window, not a byte more
        assert len(server.connections) == 1


async def test_window_opened_late_lets_the_request_through() -> None:
    async with hostile(behave, initial_window_size=0, window_updates=False) as (server, client):
        async with trio.open_nursery() as nursery:
            result: list[sepp.EnqueueAck] = []

            async def enqueue() -> None:
                result.append(
                    await client.enqueue(
                        "q", "t", payload=sepp.Payload(b"p" * 5000, "text/plain"), timeout=5
                    )
                )

            nursery.start_soon(enqueue)
            await server.wait_until(lambda: len(server.calls) == 1)
            await wait_all_tasks_blocked()  # the client sent all it would, the server read it
            assert not server.calls[0].body  # nothing got through a zero window
            await server.calls[0].open_window(1 << 20)
        assert result == [sepp.EnqueueAck("c0-0", False)]


def literal_header_block(headers: list[tuple[bytes, bytes]]) -> bytes:
    """An HPACK block of never-indexed literals without Huffman coding (RFC 7541 §6.2.3).

    Cheap to build at any size (h2's own Huffman encoder takes seconds for 256 KiB, which would
    stall the event loop the client shares), and it leaves the HPACK tables untouched, so the
    server's h2 encoder and the client's decoder stay in step."""
    block = bytearray()
    for name, value in headers:
        block += b"\x10" + bytes(hpack_integer(len(name), 7)) + name
        block += bytes(hpack_integer(len(value), 7)) + value
    return bytes(block)


@pytest.mark.parametrize(("size", "ok"), [(32 * 1024, True), (256 * 1024, False)])
async def test_response_header_block_over_the_limit_breaks_only_that_connection(
    size: int, ok: bool
) -> None:
    async def big_headers(call: ServerCall) -> None:
        # Written around h2 (see literal_header_block), so the whole response is raw frames.
        block = literal_header_block([*GRPC_HEADERS, (b"x-huge", b"h" * size)])
        frames = HeadersFrame(call.stream_id, data=block)
        frames.flags.add("END_HEADERS")
        data = DataFrame(call.stream_id, data=frame_message(good_response(call)))
        trailers = HeadersFrame(call.stream_id, data=literal_header_block([(b"grpc-status", b"0")]))
        trailers.flags.add("END_HEADERS")
        trailers.flags.add("END_STREAM")
        await call.conn.send_raw(frames.serialize() + data.serialize() + trailers.serialize())
        await call.stall()

    async with hostile(only("GetServerInfo", big_headers)) as (server, client):
        if ok:
            assert (await client.get_server_info(timeout=5)).server_version == "hostile-1"
            assert await client.enqueue("q", "t", timeout=5) == sepp.EnqueueAck("c0-0", False)
            assert len(server.connections) == 1
        else:
            exc = await raises(sepp.TransportError, client.get_server_info(timeout=5))
            assert exc.code is sepp.StatusCode.UNAVAILABLE
            assert await client.enqueue("q", "t", timeout=5) == sepp.EnqueueAck("c1-0", False)
            assert len(server.connections) == 2


async def test_continuation_flood_is_refused() -> None:
    async def flood(call: ServerCall) -> None:
        frames = [HeadersFrame(call.stream_id, data=b"\x88").serialize()]  # no END_HEADERS
        frames += [ContinuationFrame(call.stream_id, data=b"\x00").serialize()] * 10_000
        await call.conn.send_raw(b"".join(frames))
        await call.stall()

    async with hostile(only("GetServerInfo", flood)) as (server, client):
        exc = await raises(sepp.TransportError, client.get_server_info(timeout=5))
        assert exc.code is sepp.StatusCode.UNAVAILABLE
        assert "CONTINUATION" in str(exc) or "continuation" in str(exc)
        assert await client.enqueue("q", "t", timeout=5) == sepp.EnqueueAck("c1-0", False)
        assert len(server.connections) == 2


async def test_frame_larger_than_the_advertised_max_frame_size_is_refused() -> None:
    # The client advertises MAX_FRAME_SIZE = 1 MiB; this DATA frame is 2 MiB long.
    async def oversized_frame(call: ServerCall) -> None:
        await call.send_headers()
        message = frame_message(b"z" * (2 * 1024 * 1024))
        await call.conn.send_raw(DataFrame(call.stream_id, data=message).serialize())
        await call.stall()

    async with hostile(only("GetServerInfo", oversized_frame)) as (server, client):
        exc = await raises(sepp.TransportError, client.get_server_info(timeout=5))
        assert exc.code is sepp.StatusCode.UNAVAILABLE
        assert "protocol error" in str(exc)
        assert await client.enqueue("q", "t", timeout=5) == sepp.EnqueueAck("c1-0", False)
        assert len(server.connections) == 2


async def test_data_before_response_headers_is_refused() -> None:
    async def data_first(call: ServerCall) -> None:
        frame = DataFrame(call.stream_id, data=frame_message(info_message()))
        frame.flags.add("END_STREAM")
        await call.conn.send_raw(frame.serialize())
        await call.stall()

    async with hostile(only("GetServerInfo", data_first)) as (server, client):
        exc = await raises(sepp.TransportError, client.get_server_info(timeout=5))
        assert exc.code is sepp.StatusCode.UNAVAILABLE
        assert "data before headers" in str(exc).lower()
        # A peer that breaks HTTP/2 is not trusted again: the next call gets a new connection.
        assert await client.enqueue("q", "t", timeout=5) == sepp.EnqueueAck("c1-0", False)
        assert len(server.connections) == 2


# -- response bodies that are valid gRPC but not valid sepp ---------------------------------


@both_codecs
@pytest.mark.parametrize("method", ["GetServerInfo", "EnqueueBatch", "Reserve", "Extend"])
async def test_response_protobuf_that_does_not_parse_is_malformed(method: str) -> None:
    async def garbage(call: ServerCall) -> None:
        await call.respond(b"\xff\xff\xff\xff\x0f")  # a truncated varint tag

    async with hostile(only(method, garbage)) as (_, client):
        job = await reserved_job(client) if method == "Extend" else None
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "GetServerInfo": lambda: client.get_server_info(timeout=5),
            "EnqueueBatch": lambda: client.enqueue("q", "t", timeout=5),
            "Reserve": lambda: client.reserve("q", wait_timeout=0),
            "Extend": lambda: client.extend(job.ctx, 30, timeout=5),  # type: ignore[union-attr]
        }
        exc = await raises(sepp.MalformedResponseError, calls[method]())
        assert method in str(exc)


@both_codecs
async def test_unknown_protobuf_fields_from_a_newer_server_are_ignored() -> None:
    async def newer(call: ServerCall) -> None:
        # Field 999 (varint) and field 998 (bytes) do not exist in our schema.
        unknown = b"\xb8\x3e\x2a" + b"\xb2\x3e\x03abc"
        await call.respond(good_response(call) + unknown)

    async with hostile(newer) as (_, client):
        assert (await client.get_server_info(timeout=5)).server_version == "hostile-1"
        jobs = await client.reserve("q", wait_timeout=0)
        assert jobs is not None and jobs[0].ctx.id == "j1"


@both_codecs
async def test_reserve_skips_malformed_jobs_logs_them_and_delivers_the_rest() -> None:
    no_lease = job_message("no-lease")
    no_lease.ClearField("lease_expires_at")
    jobs = [
        job_message("good-1"),
        job_message("prio-12", priority=12),
        job_message(""),  # no id
        pb.Job(id="no-type", queue="q", attempt=1, max_attempts=1),
        job_message("attempt-0", attempt=0),
        no_lease,
        job_message("good-2", payload=pb.Payload(data=b"hi", encoding="text/plain")),
    ]

    async def mixed(call: ServerCall) -> None:
        await call.respond(reserve_message(*jobs))

    log = Recorder()
    async with hostile(only("Reserve", mixed), logger=log) as (_, client):
        got = await client.reserve("q", wait_timeout=0, worker_id="w1")
        assert got is not None
        assert [j.ctx.id for j in got] == ["good-1", "good-2"]
        assert got[1].payload == sepp.Payload(b"hi", "text/plain")
        assert got[0].ctx.worker_id == "w1"
        warnings = log.at("warning")
        assert len(warnings) == 5
        assert all("malformed job" in w for w in warnings)
        assert any("prio-12" in w and "priority 12" in w for w in warnings)
        assert any("attempt-0" in w for w in warnings)
        assert any("no-lease" in w for w in warnings)


@both_codecs
async def test_reserve_with_only_malformed_jobs_returns_none_and_logs() -> None:
    async def all_bad(call: ServerCall) -> None:
        await call.respond(reserve_message(job_message("p", priority=12), job_message("")))

    log = Recorder()
    async with hostile(only("Reserve", all_bad), logger=log) as (_, client):
        assert await client.reserve("q", wait_timeout=0) is None
        assert len(log.at("warning")) == 2


@both_codecs
@pytest.mark.parametrize(("sent", "returned"), [(1, 2), (1, 0), (3, 1), (3, 4)])
async def test_enqueue_batch_with_the_wrong_number_of_results_is_malformed(
    sent: int, returned: int
) -> None:
    async def miscount(call: ServerCall) -> None:
        await call.respond(enqueue_message(returned))

    async with hostile(only("EnqueueBatch", miscount)) as (_, client):
        if sent == 1:
            call = client.enqueue("q", "t", timeout=5)
        else:
            call = client.enqueue_batch([sepp.EnqueueRequest("q", "t")] * sent, timeout=5)
        exc = await raises(sepp.MalformedResponseError, call)
        assert f"expected {sent} results, got {returned}" in str(exc)


@both_codecs
@pytest.mark.parametrize("defect", ["no_outcome", "empty_job_id"])
async def test_enqueue_result_without_an_outcome_or_job_id_is_malformed(defect: str) -> None:
    async def broken(call: ServerCall) -> None:
        result = pb.JobResult() if defect == "no_outcome" else pb.JobResult(success={})
        await call.respond(pb.EnqueueBatchResponse(results=[result]).SerializeToString())

    async with hostile(only("EnqueueBatch", broken)) as (_, client):
        await raises(sepp.MalformedResponseError, client.enqueue("q", "t", timeout=5))


@both_codecs
async def test_extend_response_without_lease_expires_at_is_malformed() -> None:
    async def no_expiry(call: ServerCall) -> None:
        await call.respond(pb.ExtendResponse(job_id="j1").SerializeToString())

    async with hostile(only("Extend", no_expiry)) as (_, client):
        job = await reserved_job(client)
        before = job.ctx.lease_expires_at
        exc = await raises(sepp.MalformedResponseError, client.extend(job.ctx, 60, timeout=5))
        assert "lease_expires_at" in str(exc)
        assert job.ctx.lease_expires_at == before  # the lease record was not touched


@both_codecs
async def test_server_info_without_server_time_is_malformed() -> None:
    async def no_time(call: ServerCall) -> None:
        await call.respond(pb.GetServerInfoResponse(server_version="x").SerializeToString())

    async with hostile(first_call(no_time)) as (_, client):
        exc = await raises(sepp.MalformedResponseError, client.get_server_info(timeout=5))
        assert "server_time" in str(exc)


# -- receive cap against a server that lies about sizes (§4) ----------------------------------


@pytest.mark.parametrize("then", ["stall", "trailers"])
@pytest.mark.parametrize("sent", [64 * 1024, 2 * 1024 * 1024])
async def test_receive_cap_holds_when_the_server_declares_small_and_sends_more(
    sent: int, then: str
) -> None:
    async def liar(call: ServerCall) -> None:
        await call.send_headers()
        await call.send_windowed(struct.pack(">BI", 0, 16) + b"L" * sent)
        if then == "stall":
            await call.stall()
        else:
            await call.send_trailers(0)

    async with hostile(first_call(liar), max_receive_message_bytes=1024) as (server, client):
        exc = await raises(sepp.MalformedResponseError, client.get_server_info(timeout=5))
        assert "more data than the length prefix" in str(exc)
        if then == "stall":
            # Refused on the first byte too many, not at the end of the stream.
            await server.wait_until(lambda: server.resets.get((0, 1)) == ErrorCodes.CANCEL)
        assert (await client.get_server_info(timeout=5)).server_version == "hostile-1"
        assert len(server.connections) == 1


@pytest.mark.parametrize("cap", [None, 1024])
async def test_receive_cap_holds_when_the_server_declares_a_huge_message(cap: int | None) -> None:
    async def liar(call: ServerCall) -> None:
        await call.send_headers()
        await call.send_data(struct.pack(">BI", 0, 0xFFFFFFFF) + b"tiny")
        await call.stall()

    async with hostile(first_call(liar), max_receive_message_bytes=cap) as (server, client):
        exc = await raises(sepp.MessageTooLargeError, client.get_server_info(timeout=5))
        assert str(0xFFFFFFFF) in str(exc)
        limit = cap if cap is not None else sepp.DEFAULT_MAX_RECEIVE_MESSAGE_BYTES
        assert str(limit) in str(exc)
        await server.wait_until(lambda: server.resets.get((0, 1)) == ErrorCodes.CANCEL)


# -- connection setup: no SETTINGS, HTTP/1.1, TLS (§4) ----------------------------------------


@pytest.mark.parametrize(
    ("scheme", "reason"),
    [
        ("", "the server sent no HTTP/2 SETTINGS"),
        ("https://", "could not connect"),  # the TLS handshake never ends: no HTTP/2 yet
    ],
)
async def test_server_that_never_sends_settings_is_a_connect_error_within_connect_timeout(
    scheme: str, reason: str
) -> None:
    with trio.fail_after(GUARD_S), every_socket_closed():
        async with trio.open_nursery() as nursery:
            server = await H2Server(behave, silent=True).start(nursery)
            start = trio.current_time()
            with pytest.raises(sepp.ConnectError) as info:
                async with open_client(f"{scheme}127.0.0.1:{server.port}", connect_timeout=0.3):
                    raise AssertionError("connected to a server that never sent SETTINGS")
            assert trio.current_time() - start >= 0.3
            assert info.value.reason.startswith(reason)
            assert "within 0.3s" in info.value.reason  # its connect timeout, no other
            assert info.value.addr == f"127.0.0.1:{server.port}"
            assert not leaked_tasks()
            await server.wait_until(lambda: all(c.closed for c in server.connections))
            nursery.cancel_scope.cancel()


@only_on("blocking", "the trio client connects in open(), never in a call")
async def test_a_first_call_that_connects_keeps_to_its_own_timeout() -> None:
    """A SyncClient used without `connect()` first: the call connects, and its own timeout
    bounds that too (not only connect_timeout), against a server whose SETTINGS come late."""
    with trio.fail_after(GUARD_S), every_socket_closed():
        async with trio.open_nursery() as nursery:
            server = await H2Server(behave, settings_delay=3.0).start(nursery)
            sync = sepp.SyncClient(f"127.0.0.1:{server.port}", validate_locally=False)
            try:
                with pytest.raises(sepp.TransportError) as info:
                    await Threaded(sync).get_server_info(timeout=0.2)
            finally:
                sync.close()
            assert info.value.code is sepp.StatusCode.DEADLINE_EXCEEDED
            nursery.cancel_scope.cancel()


async def _http1_server(nursery: trio.Nursery, *, linger: bool) -> tuple[int, list[bytes]]:
    seen: list[bytes] = []

    async def answer(stream: trio.SocketStream) -> None:
        try:
            seen.append(await stream.receive_some(65536))
            await stream.send_all(
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\n"
                b"Connection: close\r\n\r\nBad Request"
            )
            while linger and await stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass
        finally:
            await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    await nursery.start(trio.serve_listeners, answer, listeners)
    return listeners[0].socket.getsockname()[1], seen


@pytest.mark.parametrize("linger", [False, True])
async def test_http1_server_on_the_port_is_a_connect_error(linger: bool) -> None:
    with trio.fail_after(GUARD_S), every_socket_closed():
        async with trio.open_nursery() as nursery:
            port, seen = await _http1_server(nursery, linger=linger)
            with pytest.raises(sepp.ConnectError) as info:
                # Refused on sight: a connect timeout past GUARD_S would fail the test.
                async with open_client(f"127.0.0.1:{port}", connect_timeout=2 * GUARD_S):
                    raise AssertionError("connected to an HTTP/1.1 server")
            assert info.value.code is sepp.StatusCode.UNAVAILABLE
            if linger:  # the reply itself gave it away, not the closed socket
                assert "HTTP/2" in info.value.reason and "HTTP/1.1 400" in info.value.reason
            assert seen and seen[0].startswith(b"PRI * HTTP/2.0")
            assert not leaked_tasks()
            nursery.cancel_scope.cancel()


def _tls_server_context(cert: Any) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(ctx)
    ctx.set_alpn_protocols(["h2"])
    return ctx


@asynccontextmanager
async def tls_server(ctx: ssl.SSLContext) -> AsyncIterator[H2Server]:
    with trio.fail_after(GUARD_S), every_socket_closed():
        async with trio.open_nursery() as nursery:
            server = await H2Server(behave, ssl_context=ctx).start(nursery)
            yield server
            assert not leaked_tasks()
            nursery.cancel_scope.cancel()
    assert not server.errors


async def _refused_tls(server: H2Server, **options: Any) -> sepp.ConnectError:
    # Refused by the handshake: a connect timeout past GUARD_S would fail the test.
    address = f"https://127.0.0.1:{server.port}"
    with pytest.raises(sepp.ConnectError) as info:
        async with open_client(address, connect_timeout=2 * GUARD_S, **options):
            raise AssertionError("TLS connection accepted")
    assert not server.calls  # not one request reached the server
    return info.value


async def test_tls_with_a_valid_certificate_works() -> None:
    ca = CA()
    async with tls_server(_tls_server_context(ca.issue_cert("127.0.0.1"))) as server:
        async with open_client(
            f"https://127.0.0.1:{server.port}", tls_ca_cert=ca.cert_pem
        ) as client:
            assert (await client.get_server_info(timeout=5)).server_version == "hostile-1"
        assert server.calls[0].header(b":scheme") == b"https"


async def test_tls_certificate_for_another_host_is_a_connect_error() -> None:
    ca = CA()
    async with tls_server(_tls_server_context(ca.issue_cert("sepp.example"))) as server:
        exc = await _refused_tls(server, tls_ca_cert=ca.cert_pem)
        assert "127.0.0.1" in exc.reason or "match" in exc.reason.lower()


async def test_tls_expired_certificate_is_a_connect_error() -> None:
    ca = CA()
    now = dt.datetime.now(dt.timezone.utc)
    cert = ca.issue_cert(
        "127.0.0.1", not_before=now - dt.timedelta(days=30), not_after=now - dt.timedelta(days=1)
    )
    async with tls_server(_tls_server_context(cert)) as server:
        exc = await _refused_tls(server, tls_ca_cert=ca.cert_pem)
        assert "expired" in exc.reason


def _self_signed_context() -> ssl.SSLContext:
    return _tls_server_context(self_signed("127.0.0.1"))


@pytest.mark.parametrize("trust", ["system_roots", "another_ca"])
async def test_tls_self_signed_certificate_is_a_connect_error(trust: str) -> None:
    options: dict[str, Any] = (
        {"tls": True} if trust == "system_roots" else {"tls_ca_cert": CA().cert_pem}
    )
    async with tls_server(_self_signed_context()) as server:
        exc = await _refused_tls(server, **options)
        assert "certificate" in exc.reason.lower()


async def test_https_address_never_falls_back_to_plaintext() -> None:
    ca = CA()
    with trio.fail_after(GUARD_S), every_socket_closed():
        async with trio.open_nursery() as nursery:
            server = await H2Server(behave).start(nursery)  # plaintext h2
            with pytest.raises(sepp.ConnectError):
                async with open_client(
                    f"https://127.0.0.1:{server.port}",
                    tls_ca_cert=ca.cert_pem,
                    connect_timeout=2 * GUARD_S,  # refused on sight: a timeout fails the guard
                ):
                    raise AssertionError("an https:// address connected without TLS")
            # The server saw a TLS ClientHello, not an HTTP/2 preface, and no request at all.
            assert not server.calls
            # Turning TLS off for an https:// address is refused before any socket is opened.
            connections = len(server.connections)
            with pytest.raises(sepp.ValidationError):
                async with open_client(f"https://127.0.0.1:{server.port}", tls=False):
                    raise AssertionError("https:// with tls=False was accepted")
            assert len(server.connections) == connections
            assert not leaked_tasks()
            nursery.cancel_scope.cancel()
