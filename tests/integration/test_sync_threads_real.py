"""Many threads sharing one sepp.SyncClient against the real server: no call lost, none doubled.

The threads take turns reading the client's one connection and hand each other results and
the reader's role (wire/_blocking.py); on a free-threaded CPython they also run at once. Every
call here is accounted for: each keyed job is on the server exactly once, each reserved job
was enqueued here and is acked exactly once, and each ack the server confirmed. Then the same
with the connection reset under the calls (a relay in front of the server cuts it), which
keyed jobs and a RetryPolicy ride out.

The blocking code runs in worker threads (`trio.to_thread`) while trio runs the relay in the
test's own thread. No timing is asserted; the guard only turns a hang into a failure.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import pytest
import trio
from fixtures.proxy_load import (
    QUEUE,
    Load,
    arrival_problems,
    check_all_arrived,
    jobs_on_server,
    payload_of,
)
from fixtures.proxy_load_sync import enqueue_through_sync
from fixtures.tcp_relay import TcpRelay

import sepp
from sepp.testing import SeppServer

pytestmark = pytest.mark.both_engines

THREADS = 8
GUARD_S = 120.0  # a hung thread fails the test here; never part of an assertion


def run_threads(count: int, work: Callable[[int], None]) -> list[str]:
    """`work(i)` in `count` threads at once; the exceptions they raised, as text."""
    errors: list[str] = []

    def guarded(index: int) -> None:
        try:
            work(index)
        except BaseException as exc:  # a thread's exception would be lost: keep it
            errors.append(f"thread {index}: {exc!r}")

    threads = [threading.Thread(target=guarded, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


async def test_threads_enqueue_reserve_and_ack_on_one_client_lose_and_double_nothing(
    sepp_server: SeppServer,
) -> None:
    per_thread = 150
    producers = consumers = THREADS // 2
    expected = {payload_of("job", i) for i in range(producers * per_thread)}
    acked_enqueues: dict[str, bytes] = {}  # job id -> payload, from the enqueue acks
    reserved: Counter[bytes] = Counter()
    reserved_ids: Counter[str] = Counter()
    failures: list[str] = []
    lock = threading.Lock()
    enqueued = threading.Event()

    def produce(client: sepp.SyncClient, index: int) -> None:
        for n in range(index * per_thread, (index + 1) * per_thread):
            payload = payload_of("job", n)
            key = payload.decode()
            ack = client.enqueue(
                QUEUE, "t", payload=sepp.Payload.bytes(payload), idempotency_key=key
            )
            with lock:
                if ack.deduplicated:  # each key is sent once: the server saw it twice
                    failures.append(f"{key}: deduplicated")
                acked_enqueues[ack.job_id] = payload

    def consume(client: sepp.SyncClient) -> None:
        # Short long-polls, in flight next to the enqueues; once every enqueue is acked, an
        # empty reserve means what is left is leased by another consumer, which acks it.
        while True:
            done = enqueued.is_set()
            jobs = client.reserve(QUEUE, max_jobs=4, wait_timeout=0.05, lease_duration=60)
            if jobs is None:
                if done:
                    return
                continue
            for job in jobs:
                client.ack(job.ctx)  # raises JobNotFoundError for a job acked before
                with lock:
                    reserved[job.payload.data if job.payload else b""] += 1
                    reserved_ids[job.ctx.id] += 1

    def scenario() -> list[str]:
        producing = [producers]
        with sepp.SyncClient(sepp_server.address) as client:

            def work(index: int) -> None:
                if index >= producers:
                    consume(client)
                    return
                try:
                    produce(client, index)
                finally:  # even after a failure, so that the consumers end
                    with lock:
                        producing[0] -= 1
                        if not producing[0]:
                            enqueued.set()

            errors = run_threads(producers + consumers, work)
            assert client._current is not None
            opened = client._current.client._channel.connections_opened
        return [*errors, *([] if opened == 1 else [f"{opened} connections opened"])]

    with trio.fail_after(GUARD_S):
        errors = await trio.to_thread.run_sync(scenario)
        left = await jobs_on_server(sepp_server.address)
    assert errors == [] and failures == []
    assert len(acked_enqueues) == len(expected)  # one distinct job id per enqueue
    assert set(acked_enqueues.values()) == expected
    assert arrival_problems(reserved, expected) == (0, 0, 0)  # (missing, unexpected, twice)
    assert set(reserved_ids) == set(acked_enqueues) and max(reserved_ids.values()) == 1
    assert left == Counter()  # every job reserved was acked: none came back


async def test_threads_keyed_enqueues_survive_their_connection_reset_under_them(
    sepp_server: SeppServer,
) -> None:
    jobs, cuts = 1200, (300, 600, 900)
    load = Load()
    retry = sepp.RetryPolicy(max_attempts=5, initial_backoff=0.01, max_backoff=0.05)
    reset: list[int] = []

    async def cut_at_marks(relay: TcpRelay) -> None:
        for mark in cuts:
            await load.reached(mark)  # polls the threads' count, never a deadline
            reset.append(relay.cut())

    with trio.fail_after(GUARD_S):
        async with trio.open_nursery() as nursery:
            relay = await TcpRelay(sepp_server.address).start(nursery)
            nursery.start_soon(cut_at_marks, relay)
            await trio.to_thread.run_sync(
                lambda: enqueue_through_sync(
                    relay.address,
                    jobs,
                    threads=THREADS,
                    load=load,
                    all_keyed=True,
                    retry_policy=retry,
                )
            )
            nursery.cancel_scope.cancel()
        # Each cut ended the one connection, and the client dialled once after each.
        assert reset == [1, 1, 1] and relay.accepted == len(cuts) + 1
        # Not one call failed, and every job is on the server exactly once (a call whose
        # answer the reset threw away was retried and deduplicated).
        await check_all_arrived(sepp_server.address, load, retried=True)
