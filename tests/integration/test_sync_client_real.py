"""sepp.SyncClient against the real server: every call, the async client's errors, threads
sharing one connection, and fork() safety (os.fork and multiprocessing) for both clients.

The tests are trio tests (the server fixture is async) that run the blocking code in a worker
thread with `trio.to_thread.run_sync`: a thread where no event loop runs, while trio runs in
another one, as in an application that mixes the two.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import multiprocessing
import os
import random
import threading
from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

import pytest
import trio

import sepp
from sepp.testing import SeppServer

pytestmark = [pytest.mark.both_engines, pytest.mark.arch_smoke]

T = TypeVar("T")
FORK_WAIT_S = 60  # only a bound on a hung child; never part of an assertion


async def in_thread(fn: Callable[[], T]) -> T:
    return await trio.to_thread.run_sync(fn)


async def test_every_call_of_the_async_client(sepp_server: SeppServer) -> None:
    def scenario() -> None:
        with sepp.connect(sepp_server.address) as client:
            assert client.address == sepp_server.address
            info = client.get_server_info(timeout=5)
            assert isinstance(info, sepp.ServerInfo) and info.max_enqueue_batch == 256
            ack = client.enqueue("sq", "kind", payload=sepp.Payload.json({"n": 1}), priority=3)
            assert isinstance(ack, sepp.EnqueueAck) and not ack.deduplicated
            again = client.enqueue(sepp.EnqueueRequest("sq", "kind", idempotency_key="k"))
            assert client.enqueue("sq", "kind", idempotency_key="k").deduplicated
            batch = client.enqueue_batch([sepp.EnqueueRequest("sq", "kind")] * 3)
            assert all(isinstance(r, sepp.EnqueueAck) for r in batch) and len(batch) == 3
            atomic = client.enqueue_atomic([sepp.EnqueueRequest("other", "kind")] * 2)
            assert len(atomic) == 2

            jobs = client.reserve("sq", max_jobs=10, wait_timeout=0, worker_id="w")
            assert jobs is not None and len(jobs) == 5
            assert all(j.ctx.client is client for j in jobs)  # usable from this thread
            assert {j.ctx.id for j in jobs} == {ack.job_id, again.job_id} | {
                r.job_id for r in batch if isinstance(r, sepp.EnqueueAck)
            }
            first, second, *rest = jobs
            assert isinstance(client.extend(first.ctx, 60), datetime)
            client.ack(first.ctx)
            with pytest.raises(sepp.JobNotFoundError):
                client.ack(first.ctx)
            assert client.nack(second.ctx, retry=sepp.Retry.DEAD_LETTER, reason="bad") is True
            for job in rest:
                client.ack(job.ctx)
            records = client.drain_dead_letters("sq")
            assert [r.job_id for r in records] == [second.ctx.id]
            assert client.drain_dead_letters("sq", max=0) == []
            assert client.reserve("sq", wait_timeout=0) is None

    await in_thread(scenario)


@dataclasses.dataclass(frozen=True)
class Welcome:
    user: int


SEND_WELCOME = sepp.Task("emails", "send_welcome", Welcome)


@pytest.mark.parametrize("batching", [False, True], ids=["direct", "batching"])
async def test_a_tasks_enqueue_through_the_blocking_client_sends_the_job_and_returns_its_ack(
    sepp_server: SeppServer, batching: bool
) -> None:
    # What a Flask view with a module-level SyncClient writes first.
    def produce() -> tuple[sepp.EnqueueAck, sepp.EnqueueAck]:
        options = {"enqueue_batching": sepp.Batching()} if batching else {}
        with sepp.SyncClient(sepp_server.address, **options) as client:  # type: ignore[arg-type]
            ack = SEND_WELCOME.enqueue(client, Welcome(42), idempotency_key="welcome-42")
            return ack, SEND_WELCOME.enqueue(client, Welcome(42), idempotency_key="welcome-42")

    ack, again = await in_thread(produce)
    assert isinstance(ack, sepp.EnqueueAck) and not ack.deduplicated
    assert again.deduplicated and again.job_id == ack.job_id
    async with sepp.open(sepp_server.address) as client:
        jobs = await client.reserve("emails", wait_timeout=0)
    assert jobs is not None and [job.ctx.id for job in jobs] == [ack.job_id]
    assert SEND_WELCOME.decode(jobs[0].payload) == Welcome(42)


async def test_errors_and_validation_are_the_async_clients(sepp_server: SeppServer) -> None:
    def blocking_errors() -> list[str]:
        out = []
        with sepp.connect(sepp_server.address) as client:
            for call in BAD_CALLS:
                try:
                    call(client)
                except Exception as exc:
                    out.append(f"{type(exc).__name__}: {exc}")
        return out

    async_errors = []
    async with sepp.open(sepp_server.address) as client:
        for call in BAD_CALLS:
            try:
                await call(client)
            except Exception as exc:
                async_errors.append(f"{type(exc).__name__}: {exc}")
    assert len(async_errors) == len(BAD_CALLS)
    assert await in_thread(blocking_errors) == async_errors


BAD_CALLS: list[Callable[[sepp.Client | sepp.SyncClient], object]] = [
    lambda c: c.enqueue("q", ""),
    lambda c: c.enqueue(sepp.EnqueueRequest("q", "t"), priority=1),  # type: ignore[call-overload]
    lambda c: c.enqueue("q", "t", payload=sepp.Payload.bytes(b"x" * 2_000_000)),
    lambda c: c.enqueue_batch([]),
    lambda c: c.enqueue_atomic([sepp.EnqueueRequest("q", "t", priority=2**40)]),
    lambda c: c.reserve([]),
    lambda c: c.reserve("q", lease_duration=-1),
    lambda c: c.nack("not a ctx"),  # type: ignore[arg-type]
    lambda c: c.drain_dead_letters(max=-1),
    lambda c: c.get_server_info(timeout=0),
]


async def test_a_calls_timeout_applies(sepp_server: SeppServer) -> None:
    def scenario() -> sepp.TransportError:
        with sepp.connect(sepp_server.address) as client:
            # 8 MiB to send in a millisecond: the deadline passes before any answer can come.
            big = sepp.EnqueueRequest("q", "t", payload=sepp.Payload.bytes(b"x" * 32768))
            with pytest.raises(sepp.TransportError) as caught:
                client.enqueue_batch([big] * 256, timeout=0.001)
            return caught.value

    error = await in_thread(scenario)
    assert error.code is sepp.StatusCode.DEADLINE_EXCEEDED


async def test_threads_calls_are_in_flight_together_on_one_connection(
    sepp_server: SeppServer,
) -> None:
    client = sepp.SyncClient(sepp_server.address)

    def long_poll() -> list[sepp.Job] | None:
        # Only returns early if the other thread's enqueues got through meanwhile: with a lock
        # around each round trip they would wait for this reserve's 30 s to pass.
        return client.reserve("slow", wait_timeout=30)

    def many_enqueues() -> list[str]:
        acks: list[str] = []
        lock = threading.Lock()

        def worker() -> None:
            for _ in range(10):
                ack = client.enqueue("fast", "t")
                with lock:
                    acks.append(ack.job_id)

        threads = [threading.Thread(target=worker) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        client.enqueue("slow", "wake")
        return acks

    try:
        client.connect()
        async with trio.open_nursery() as nursery:
            polled: list[list[sepp.Job] | None] = []

            async def poll() -> None:
                polled.append(await in_thread(long_poll))

            nursery.start_soon(poll)
            acks = await in_thread(many_enqueues)
        assert len(acks) == len(set(acks)) == 160
        assert polled[0] is not None and polled[0][0].ctx.job_type == "wake"
        assert client._current is not None
        assert client._current.client._channel.connections_opened == 1
    finally:
        client.close()


async def test_works_from_threads_running_asyncio_or_trio(sepp_server: SeppServer) -> None:
    with sepp.SyncClient(sepp_server.address) as client:
        # From this trio thread itself (a blocking call, so only in a test): the client runs
        # its own trio.run in its own thread.
        assert client.enqueue("q", "from-trio").job_id

        async def from_asyncio() -> str:
            return client.enqueue("q", "from-asyncio").job_id

        assert await in_thread(lambda: asyncio.run(from_asyncio()))


async def test_options_are_checked_at_construction_and_close_is_final(
    sepp_server: SeppServer,
) -> None:
    with pytest.raises(TypeError, match="rpc_timout"):
        sepp.SyncClient(sepp_server.address, rpc_timout=3)  # type: ignore[call-arg]
    with pytest.raises(sepp.ValidationError, match="connect_timeout"):
        sepp.SyncClient(sepp_server.address, connect_timeout=-1)
    with pytest.raises(sepp.ConnectError):
        with sepp.connect("127.0.0.1:1", connect_timeout=2):
            pass

    def scenario() -> None:
        client = sepp.SyncClient(sepp_server.address)
        assert "not connected" in repr(client)
        client.enqueue("q", "t")  # connects on first use
        assert "connected" in repr(client)
        client.close()
        with pytest.raises(sepp.ClientError, match="closed"):
            client.enqueue("q", "t")

    await in_thread(scenario)


async def test_close_while_threads_call_fails_their_calls_and_hangs_none(
    sepp_server: SeppServer,
) -> None:
    client = sepp.SyncClient(sepp_server.address)
    client.connect()
    outcomes: list[str] = []
    started = threading.Barrier(9, timeout=FORK_WAIT_S)

    def caller() -> None:
        started.wait()
        try:
            while True:
                client.enqueue("closing", "t")
        except sepp.ClientError as exc:  # the closed client, or a call cut short by close()
            outcomes.append(type(exc).__name__)

    def scenario() -> list[bool]:
        threads = [threading.Thread(target=caller) for _ in range(8)]
        for t in threads:
            t.start()
        started.wait()
        client.enqueue("closing", "t")  # the callers are under way
        client.close()
        for t in threads:
            t.join(FORK_WAIT_S)
        return [t.is_alive() for t in threads]

    assert await in_thread(scenario) == [False] * 8
    assert len(outcomes) == 8 and set(outcomes) <= {"ClientError", "TransportError"}


async def test_a_call_the_closing_portal_never_started_fails_instead_of_hanging(
    sepp_server: SeppServer,
) -> None:
    # With auto-batching the client runs in a trio portal thread (its linger timer is a task).
    client = sepp.SyncClient(sepp_server.address, enqueue_batching=sepp.Batching())
    client.connect()
    portal = client._current
    assert portal is not None
    calls = portal._calls  # type: ignore[union-attr]
    real_call_soon = calls._call_soon

    def dropping_call_soon(fn: object) -> bool:  # the run ends before it gets to the call
        return True

    calls._call_soon = dropping_call_soon
    errors: list[BaseException] = []

    def caller() -> None:
        try:
            client.enqueue("dropped", "t")
        except BaseException as exc:
            errors.append(exc)

    def scenario() -> bool:
        thread = threading.Thread(target=caller)
        thread.start()
        for _ in range(FORK_WAIT_S * 100):
            if calls._waiting:
                break
            threading.Event().wait(0.01)
        real_call_soon(portal._stop.set)  # type: ignore[union-attr]
        thread.join(FORK_WAIT_S)
        return thread.is_alive()

    assert await in_thread(scenario) is False
    assert len(errors) == 1 and isinstance(errors[0], sepp.ClientError)
    assert "closed" in str(errors[0])


# -- fork -----------------------------------------------------------------------------------


def wait_child(pid: int) -> int:
    """The child's exit code; a child that hangs fails the test rather than hanging it."""
    for _ in range(FORK_WAIT_S * 10):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        threading.Event().wait(0.1)
    os.kill(pid, 9)
    raise AssertionError("the child hung")


async def test_sync_client_reconnects_in_a_forked_child(sepp_server: SeppServer) -> None:
    def scenario() -> dict[str, object]:
        client = sepp.SyncClient(sepp_server.address)
        client.enqueue("fork", "parent-before")
        parent_portal = client._current
        assert parent_portal is not None
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without running the parent's cleanup
            code = 1
            try:
                ack = client.enqueue("fork", "child")
                report = {
                    "ack": ack.job_id,
                    "new_portal": client._current is not parent_portal,
                }
                os.write(write, json.dumps(report).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        assert wait_child(pid) == 0
        report: dict[str, object] = json.loads(os.read(read, 4096))
        os.close(read)
        # The parent's connection was never touched: same portal, still the one connection.
        client.enqueue("fork", "parent-after")
        assert client._current is parent_portal
        assert parent_portal.client._channel.connections_opened == 1
        client.close()
        return report

    report = await in_thread(scenario)
    assert report["new_portal"] is True
    async with sepp.open(sepp_server.address) as client:
        jobs = await client.reserve("fork", max_jobs=10, wait_timeout=0)
    assert jobs is not None
    assert sorted(j.ctx.job_type for j in jobs) == ["child", "parent-after", "parent-before"]
    assert report["ack"] in {j.ctx.id for j in jobs}


MODULE_CLIENT: sepp.SyncClient | None = None  # as an application would hold it


def enqueue_in_pool_child(n: int) -> str:
    assert MODULE_CLIENT is not None
    return MODULE_CLIENT.enqueue("pool", "t", idempotency_key=f"job-{n}").job_id


async def test_sync_client_in_multiprocessing_fork_children(sepp_server: SeppServer) -> None:
    global MODULE_CLIENT

    def scenario() -> list[str]:
        global MODULE_CLIENT
        MODULE_CLIENT = sepp.SyncClient(sepp_server.address)
        MODULE_CLIENT.connect()  # connected before the fork, as with gunicorn --preload
        context = multiprocessing.get_context("fork")
        with context.Pool(3) as pool:
            ids = pool.map_async(enqueue_in_pool_child, range(12)).get(FORK_WAIT_S)
        MODULE_CLIENT.enqueue("pool", "parent")
        return ids

    try:
        ids = await in_thread(scenario)
    finally:
        if MODULE_CLIENT is not None:
            MODULE_CLIENT.close()
            MODULE_CLIENT = None
    assert len(set(ids)) == 12
    async with sepp.open(sepp_server.address) as client:
        jobs = await client.reserve("pool", max_jobs=20, wait_timeout=0)
    assert jobs is not None and len(jobs) == 13
    assert set(ids) <= {j.ctx.id for j in jobs}


async def test_the_async_client_refuses_use_after_fork(sepp_server: SeppServer) -> None:
    async with sepp.open(sepp_server.address) as client:
        await client.enqueue("afork", "before")
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its own trio.run, in a thread of its own
            code = 1
            try:
                out: list[str] = []

                def child() -> None:
                    try:
                        trio.run(client.enqueue, "afork", "child")
                        out.append("no error")
                    except sepp.ClientError as exc:
                        out.append(str(exc))

                thread = threading.Thread(target=child)
                thread.start()
                thread.join()
                os.write(write, out[0].encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        assert await in_thread(lambda: wait_child(pid)) == 0
        message = os.read(read, 4096).decode()
        os.close(read)
        assert "cannot be used after fork()" in message and "Open a new client" in message
        await client.enqueue("afork", "after")  # the parent's connection is intact
        jobs = await client.reserve("afork", max_jobs=10, wait_timeout=0)
    assert jobs is not None and sorted(j.ctx.job_type for j in jobs) == ["after", "before"]


async def test_tls_verifies_and_carries_the_api_key(tmp_path: object) -> None:
    from pathlib import Path

    from fixtures.certificates import CA

    from sepp.testing import sepp_server

    tmp = Path(str(tmp_path))
    ca = CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    (tmp / "c.pem").write_bytes(cert.cert_chain_pem)
    (tmp / "k.pem").write_bytes(cert.key_pem)
    key = "sync-s3cr3t"
    cfg = {
        "admin": {"enabled": False},
        "server": {"tls_cert_path": str(tmp / "c.pem"), "tls_key_path": str(tmp / "k.pem")},
        "auth": {"api_keys": [{"name": "app", "key": key}]},
    }
    async with sepp_server(cfg) as server:

        def scenario() -> tuple[str, str, int]:
            # System roots do not know this private CA: refused, never downgraded.
            with pytest.raises(sepp.ConnectError) as refused:
                sepp.connect(f"https://{server.address}", connect_timeout=3).__enter__()
            with sepp.connect(
                f"https://{server.address}", tls_ca_cert=ca.cert_pem, api_key=key
            ) as client:
                # Enough calls from threads at once for TLS records to interleave both ways.
                results: list[str] = []

                def many() -> None:
                    for _ in range(20):
                        results.append(client.enqueue("tls", "t").job_id)

                threads = [threading.Thread(target=many) for _ in range(8)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(FORK_WAIT_S)
                jobs = client.reserve("tls", max_jobs=200, wait_timeout=1)
                assert jobs is not None
                for job in jobs:
                    client.ack(job.ctx)
            with sepp.connect(
                f"https://{server.address}", tls_ca_cert=ca.cert_pem, api_key=key + "x"
            ) as wrong:
                with pytest.raises(sepp.UnauthenticatedError) as auth:
                    wrong.get_server_info()
            return str(refused.value), str(auth.value), len(set(results) & {j.id for j in jobs})

        refused, unauthenticated, acked = await in_thread(scenario)
    assert "certificate" in refused.lower()
    assert key not in unauthenticated
    assert acked == 160


def requests_out(client: sepp.SyncClient, calls: int) -> bool:
    """Whether `calls` calls are in flight and every request has left for the socket (the
    last stream's bytes were taken and no write is under way): a Ctrl-C from now on lands
    in a wait, not in the middle of a frame (which ends the connection for every call)."""
    engine = client._current
    conn = engine.client._channel._current if engine is not None else None  # type: ignore[attr-defined]
    return (
        conn is not None
        and len(conn.waiters) == calls
        and conn.written_through == conn.last_started
        and not conn.write_lock.locked()
    )


def wait_until(condition: Callable[[], bool]) -> bool:
    """Whether `condition()` came to hold (checked every 10 ms; FORK_WAIT_S bounds a hang)."""
    for _ in range(FORK_WAIT_S * 100):
        if condition():
            return True
        threading.Event().wait(0.01)
    return False


def interrupt_this_thread_once(condition: Callable[[], bool]) -> None:
    """Ctrl-C (SIGINT) for the calling thread, the main one, from another once `condition()`
    holds."""
    import signal

    main = threading.get_ident()

    def interrupt() -> None:
        if wait_until(condition):
            signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()


async def test_an_interrupted_call_gives_up_its_stream(sepp_server: SeppServer) -> None:
    """Ctrl-C during a blocking long poll: the poll's stream is reset, so the server does not
    lease the next job to a caller that is gone, and the client goes on working."""
    client = sepp.SyncClient(sepp_server.address)
    try:
        client.connect()
        interrupt_this_thread_once(lambda: requests_out(client, 1))
        with pytest.raises(KeyboardInterrupt):
            client.reserve("interrupted", wait_timeout=30)  # in this (the main) thread
        client.enqueue("interrupted", "t")
        jobs = await in_thread(lambda: client.reserve("interrupted", wait_timeout=10))
        assert jobs is not None and jobs[0].ctx.job_type == "t"
    finally:
        client.close()


async def test_an_interrupted_follower_gives_up_its_stream_and_the_reader_goes_on(
    sepp_server: SeppServer,
) -> None:
    """Ctrl-C in a thread waiting for its result while another thread reads the connection:
    its stream is reset, and the reader's own call ends as it would have."""
    client = sepp.SyncClient(sepp_server.address)
    try:
        client.connect()
        read: list[list[sepp.Job] | None] = []
        reader = threading.Thread(
            target=lambda: read.append(client.reserve("reader", wait_timeout=30)), daemon=True
        )
        reader.start()
        wait_until(lambda: requests_out(client, 1))  # the reader's poll: it reads
        interrupt_this_thread_once(lambda: requests_out(client, 2))
        with pytest.raises(KeyboardInterrupt):
            client.reserve("follower", wait_timeout=30)  # in this (the main) thread
        client.enqueue("follower", "t")
        jobs = await in_thread(lambda: client.reserve("follower", wait_timeout=10))
        assert jobs is not None and jobs[0].ctx.job_type == "t"
        client.enqueue("reader", "wake")
        await in_thread(reader.join)
        assert read[0] is not None and read[0][0].ctx.job_type == "wake"
    finally:
        client.close()


async def test_a_batch_over_the_servers_limits_goes_out_in_chunks(sepp_server: SeppServer) -> None:
    def scenario() -> tuple[int, int, int]:
        with sepp.connect(sepp_server.address) as client:
            jobs = [sepp.EnqueueRequest("chunks", "t", idempotency_key=f"k{n}") for n in range(600)]
            results = client.enqueue_batch(jobs)  # 256 jobs per call at most: 3 calls, in order
            acks = [r for r in results if isinstance(r, sepp.EnqueueAck)]
            again = client.enqueue_batch(jobs[:300])
            return len(acks), len({a.job_id for a in acks}), sum(a.deduplicated for a in again)  # type: ignore[union-attr]

    assert await in_thread(scenario) == (600, 600, 300)


async def test_payloads_of_up_to_one_mib_from_threads_make_the_round_trip_intact(
    sepp_server: SeppServer,
) -> None:
    # 1 MiB (the server's max_payload_bytes) and 64 KiB payloads from 6 threads at once: the
    # blocking driver's scatter/gather writes interleave and wait for the server's windows.
    rng = random.Random(27)
    payloads = [sepp.Payload.bytes(rng.randbytes(size)) for size in [1_048_576] * 6 + [65_536] * 6]

    def scenario() -> list[bytes]:
        with sepp.SyncClient(sepp_server.address) as client:
            threads = [
                threading.Thread(target=client.enqueue, args=("big", "t"), kwargs={"payload": p})
                for p in payloads
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            reserved: list[bytes] = []
            while len(reserved) < len(payloads):
                jobs = client.reserve("big", max_jobs=4, wait_timeout=2)
                assert jobs, f"only {len(reserved)} of {len(payloads)} jobs came back"
                reserved.extend(job.payload.data for job in jobs if job.payload)
            return reserved

    assert sorted(await in_thread(scenario)) == sorted(p.data for p in payloads)
