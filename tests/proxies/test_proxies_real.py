"""Calls through real proxies in front of a real sepp server: not one of them fails.

nginx (`grpc_pass`, its defaults) ends every client connection with GOAWAY after
`keepalive_requests` calls and on every reload, and runs at most 128 calls at once on one
connection; HAProxy speaks HTTP/2 on both sides. The proxies run from the configs the docs
publish (docs/proxies/, see fixtures/proxies.py), and the client runs with its defaults (no
RetryPolicy): a call the proxy never passed on must go out again by itself.

Each test asserts 0 failed calls, then drains the queue from the server directly and checks
that every job is there exactly once (counted by payload). Half the jobs carry an
idempotency key, half none, so a call sent twice after the server had processed it would
show up as a second job (no key) or a deduplicated ack (key). The proxy tests skip, saying
how to get them, only when nginx or HAProxy is not installed (scripts/ensure-proxies.sh).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
from fixtures.fake_client import RecordingLogger
from fixtures.proxies import haproxy_proxy, nginx_proxy

import sepp
from sepp.testing import SeppServer

QUEUE = "proxied"
TEST_TIMEOUT_S = 120.0


@dataclass
class Load:
    """What the producers were told."""

    sent: int = 0
    done: int = 0
    failures: list[str] = field(default_factory=list)
    deduplicated: list[str] = field(default_factory=list)

    def payloads(self, prefix: str) -> set[bytes]:
        return {_payload(prefix, i) for i in range(self.sent)}


def _payload(prefix: str, index: int) -> bytes:
    return f"{prefix}-{index}".encode()


async def enqueue_through(
    address: str,
    count: int,
    *,
    tasks: int,
    prefix: str = "job",
    load: Load | None = None,
    **open_options: Any,
) -> Load:
    """`count` single enqueues from `tasks` tasks on one client; even-numbered jobs keyed."""
    load = load if load is not None else Load()
    load.sent = count
    next_index = iter(range(count))

    async def producer(client: sepp.Client) -> None:
        for index in next_index:
            payload = _payload(prefix, index)
            key = payload.decode() if index % 2 == 0 else None
            try:
                ack = await client.enqueue(
                    QUEUE, "proxied", payload=sepp.Payload.bytes(payload), idempotency_key=key
                )
            except sepp.SeppError as exc:
                load.failures.append(f"{payload.decode()}: {exc!r}")
            else:
                if ack.deduplicated:
                    load.deduplicated.append(payload.decode())
            load.done += 1

    async with sepp.open(address, **open_options) as client, trio.open_nursery() as nursery:
        for _ in range(tasks):
            nursery.start_soon(producer, client)
    return load


async def jobs_on_server(server: SeppServer) -> Counter[bytes]:
    """Reserve everything in QUEUE straight from the server: payload → how many jobs."""
    seen: Counter[bytes] = Counter()
    async with sepp.open(server.address) as client:
        while jobs := await client.reserve(
            QUEUE, lease_duration=300, wait_timeout=0.2, max_jobs=256
        ):
            seen.update(job.payload.data for job in jobs if job.payload is not None)
    return seen


def assert_each_once(seen: Counter[bytes], expected: set[bytes]) -> None:
    missing = sorted(expected - set(seen))
    extra = sorted(set(seen) - expected)
    twice = sorted(p for p, n in seen.items() if n > 1)
    assert (missing[:10], extra[:10], twice[:10]) == ([], [], []), (
        f"{len(missing)} missing, {len(extra)} unexpected, {len(twice)} more than once"
    )


def assert_no_failures(load: Load) -> None:
    assert load.failures == [], f"{len(load.failures)} of {load.sent} failed: {load.failures[:5]}"
    assert load.deduplicated == [], f"calls processed twice: {load.deduplicated[:5]}"
    assert load.done == load.sent


async def check_all_arrived(server: SeppServer, load: Load, prefix: str = "job") -> None:
    assert_no_failures(load)
    assert_each_once(await jobs_on_server(server), load.payloads(prefix))


async def _progress(load: Load, at_least: int) -> None:
    while True:
        if load.done >= at_least:
            return
        await trio.sleep(0.01)


# -- nginx ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keepalive_requests", "jobs"),
    [(1000, 2500), (100, 1000)],
    ids=["keepalive_requests=1000", "keepalive_requests=100"],
)
async def test_nginx_h2c_goaway_after_keepalive_requests_fails_no_call(
    sepp_server: SeppServer, tmp_path: Path, keepalive_requests: int, jobs: int
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with nginx_proxy(
            sepp_server.address, tmp_path, keepalive_requests=keepalive_requests
        ) as proxy:
            load = await enqueue_through(proxy.h2c_address, jobs, tasks=64)
        await check_all_arrived(sepp_server, load)


async def test_nginx_tls_terminated_at_the_proxy_fails_no_call(
    sepp_server: SeppServer, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with nginx_proxy(sepp_server.address, tmp_path, keepalive_requests=100) as proxy:
            load = await enqueue_through(proxy.tls_address, 1000, tasks=64, **proxy.tls_options())
        await check_all_arrived(sepp_server, load)


async def test_nginx_reload_three_times_under_load_fails_no_call(
    sepp_server: SeppServer, tmp_path: Path
) -> None:
    load = Load()
    with trio.fail_after(TEST_TIMEOUT_S):
        async with nginx_proxy(sepp_server.address, tmp_path) as proxy:

            async def reload_three_times() -> None:
                for at in (500, 1200, 1900):
                    await _progress(load, at)
                    await proxy.reload()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(reload_three_times)
                await enqueue_through(proxy.h2c_address, 2500, tasks=32, load=load)
            assert proxy.reloads == 3
        await check_all_arrived(sepp_server, load)


async def test_nginx_more_concurrent_calls_than_its_stream_limit_fails_no_call(
    sepp_server: SeppServer, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with nginx_proxy(sepp_server.address, tmp_path) as proxy:
            # 300 tasks on one connection against nginx's 128 streams, and one GOAWAY.
            load = await enqueue_through(proxy.h2c_address, 1500, tasks=300)
        await check_all_arrived(sepp_server, load)


async def test_long_poll_through_nginx_survives_goaway_and_is_woken_by_an_enqueue(
    sepp_server: SeppServer, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with (
            nginx_proxy(sepp_server.address, tmp_path, keepalive_requests=100) as proxy,
            sepp.open(proxy.h2c_address) as client,
        ):
            reserved: list[sepp.Job] | None = None

            async def long_poll() -> None:
                nonlocal reserved
                reserved = await client.reserve(QUEUE, lease_duration=60, wait_timeout=25)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(long_poll)
                await trio.sleep(0.5)  # let it park on the server (no job yet either way)
                # 150 more calls on the same client: nginx ends the long-poll's connection
                # with GOAWAY after its 100th call, and the long-poll must live on.
                for _ in range(150):
                    await client.get_server_info()
                await client.enqueue(QUEUE, "wake", payload=sepp.Payload.bytes(b"wake"))
            assert reserved is not None
            assert [job.payload for job in reserved] == [sepp.Payload.bytes(b"wake")]


async def test_worker_drains_through_nginx_tls_without_a_failed_ack(
    sepp_server: SeppServer, tmp_path: Path
) -> None:
    jobs = 1200
    expected = {_payload("work", i) for i in range(jobs)}
    async with sepp.open(sepp_server.address) as direct:
        requests = [
            sepp.EnqueueRequest(QUEUE, "work", payload=sepp.Payload.bytes(p)) for p in expected
        ]
        for start in range(0, jobs, 200):
            await direct.enqueue_batch(requests[start : start + 200])
    handled: Counter[bytes] = Counter()
    log = RecordingLogger()
    with trio.fail_after(TEST_TIMEOUT_S):
        async with (
            nginx_proxy(sepp_server.address, tmp_path, keepalive_requests=100) as proxy,
            sepp.open(proxy.tls_address, **proxy.tls_options()) as client,
        ):
            worker = sepp.Worker(
                client, QUEUE, lease_duration=60, max_in_flight=32, wait_timeout=2, logger=log
            )

            @worker.handler("work")
            async def work(payload: sepp.Payload | None, ctx: sepp.JobContext) -> None:
                assert payload is not None
                handled[payload.data] += 1
                if len(handled) == jobs:
                    worker.shutdown()

            await worker.run()
    problems = log.at("warning") + log.at("error")
    assert problems == [], f"{len(problems)} warnings/errors, e.g. {problems[:3]}"
    assert_each_once(handled, expected)
    # Nothing came back for another run (a nack, or an ack that did not stick and a lease
    # that ran out) and nothing is left over.
    assert await jobs_on_server(sepp_server) == Counter()


# -- HAProxy -------------------------------------------------------------------------------------


async def test_haproxy_h2_on_both_sides_fails_no_call(
    sepp_server: SeppServer, tmp_path: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT_S):
        async with haproxy_proxy(sepp_server.address, tmp_path) as proxy:
            load = await enqueue_through(proxy.address, 2000, tasks=64)
        await check_all_arrived(sepp_server, load)
